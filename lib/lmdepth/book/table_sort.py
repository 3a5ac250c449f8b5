"""Sortable tables in the book, with no dependency and no network: a Sphinx extension that ships a small script
and stylesheet with every HTML build and loads them on every page.

A table whose ``<table>`` carries the class :data:`SORTABLE_CLASS` (``show_table(df, sortable=True)``,
:mod:`lmdepth.book.notebook`) sorts by a column when its header is clicked (or focused and Enter/Space pressed); a
second click reverses the order, a third gives back the table's own order (the findings: by chapter and claim).
A cell that starts with a number (the "statistic [95 % CI]" cells: "0.656 [0.651, 0.662], n = 20") sorts by that
number, other cells as text; cells with no number ("—") come after the numbers either way; equal keys keep their
order (a stable sort); rows move whole. The headers show a sort mark only once the script has attached itself, so
where it does not run (Jupyter, Colab: their outputs never get the book's scripts) the table reads as computed, in
its own order, with nothing that looks clickable.

Why no library: the book ships every script it loads (the pages must work offline) and none of its dependencies
sorts tables; forty lines of plain JavaScript do what the findings table needs, with nothing to pin or audit.
The script and stylesheet are text here, not package data files, so an installed wheel builds the same book.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: The class a ``<table>`` needs for the script to make its column headers sort it.
SORTABLE_CLASS = "lmdepth-sortable"
JS_NAME = "lmdepth-table-sort.js"
CSS_NAME = "lmdepth-table-sort.css"

SORT_JS = """\
/* lmdepth: sortable tables (lmdepth.book.table_sort). Click a header of a table.%(cls)s to sort its rows by that
   column; again: reversed; a third time: the table's own order. Cells starting with a number sort by it. */
(function () {
  "use strict";
  var NUMBER = /^[-+\\u2212]?(\\d+\\.?\\d*|\\.\\d+)(e[-+\\u2212]?\\d+)?/i;
  function key(cell) {
    var text = cell ? cell.textContent.trim() : "";
    var m = NUMBER.exec(text);
    return {num: m ? parseFloat(m[0].replace(/\\u2212/g, "-")) : null, text: text};
  }
  function compare(a, b, dir) {
    if ((a.num === null) !== (b.num === null)) return a.num === null ? 1 : -1;  // numbers first, either way
    if (a.num !== null && a.num !== b.num) return dir * (a.num - b.num);
    return dir * a.text.localeCompare(b.text, undefined, {numeric: true});
  }
  function sort(table, headers, original, col) {
    var next = {none: "ascending", ascending: "descending", descending: "none"};
    var state = next[headers[col].getAttribute("aria-sort")];
    var dir = state === "descending" ? -1 : 1;
    var body = table.tBodies[0];
    var rows = Array.prototype.map.call(body.rows, function (row, i) {
      return {row: row, i: i, key: key(row.cells[col])};
    });
    rows.sort(function (a, b) { return compare(a.key, b.key, dir) || a.i - b.i; });
    (state === "none" ? original : rows.map(function (r) { return r.row; })).forEach(function (row) {
      body.appendChild(row);
    });
    headers.forEach(function (th, j) { th.setAttribute("aria-sort", j === col ? state : "none"); });
  }
  function attach(table) {
    if (!table.tHead || !table.tBodies.length || table.dataset.sortable) return;
    table.dataset.sortable = "1";
    var row = table.tHead.rows[table.tHead.rows.length - 1];
    var headers = Array.prototype.slice.call(row.cells);
    var original = Array.prototype.slice.call(table.tBodies[0].rows);
    headers.forEach(function (th, col) {
      th.setAttribute("aria-sort", "none");
      th.tabIndex = 0;
      th.title = "Sort by this column (again: reversed; a third time: the table's own order)";
      th.addEventListener("click", function () { sort(table, headers, original, col); });
      th.addEventListener("keydown", function (e) {
        if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sort(table, headers, original, col); }
      });
    });
  }
  function init() { document.querySelectorAll("table.%(cls)s").forEach(attach); }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init); else init();
})();
""" % {"cls": SORTABLE_CLASS}

SORT_CSS = """\
/* lmdepth: sortable tables (lmdepth.book.table_sort); the marks appear only where the script attached itself */
table.%(cls)s th[aria-sort] { cursor: pointer; user-select: none; }
table.%(cls)s th[aria-sort]::after { content: " \\2195"; opacity: 0.35; }
table.%(cls)s th[aria-sort="ascending"]::after { content: " \\25B2"; opacity: 1; }
table.%(cls)s th[aria-sort="descending"]::after { content: " \\25BC"; opacity: 1; }
""" % {"cls": SORTABLE_CLASS}


def write_assets(static_dir: Path) -> list[Path]:
    """Write :data:`JS_NAME` and :data:`CSS_NAME` into ``static_dir`` (left alone where unchanged)."""
    out = []
    for name, text in ((JS_NAME, SORT_JS), (CSS_NAME, SORT_CSS)):
        path = Path(static_dir) / name
        if not (path.is_file() and path.read_text(encoding="utf-8") == text):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        out.append(path)
    return out


def setup(app: Any) -> dict[str, Any]:
    """Sphinx extension: write the script and stylesheet into the HTML output's ``_static`` and load them on every
    page (``_config.yml``: ``sphinx.extra_extensions``)."""

    def _write(app: Any) -> None:
        if app.builder.format == "html":
            write_assets(Path(app.outdir) / "_static")

    app.connect("builder-inited", _write)
    app.add_js_file(JS_NAME)
    app.add_css_file(CSS_NAME)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


__all__ = ["SORTABLE_CLASS", "JS_NAME", "CSS_NAME", "SORT_JS", "SORT_CSS", "write_assets", "setup"]
