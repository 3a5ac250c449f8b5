"""Pages that fit a phone: a Sphinx extension that ships one small stylesheet with every HTML build.

The book's charts are drawn at fixed widths (up to the 720 px text column: their labels and panels are laid out for
it) and some tables have many columns. On a 390 px screen they made 9 of 13 pages scroll sideways as a whole. The
stylesheet keeps the page at the window's width and lets what is wider scroll inside its own box instead: each chart
(``.lmdepth-vega``, :mod:`lmdepth.charts.vega_offline`), each cell output (tables, printed text) and long inline code,
which may break anywhere. On a desktop window nothing changes (everything already fits the column).

A box that scrolls must say so: phones hide scrollbars until a finger moves, so a reader saw chapter 01's layers
0–14 of 30 and the findings forest without its model-minus-control panel, with nothing to tell that more was there.
A small script marks every chart or output box whose drawing is wider than the box (``lmdepth-wide``, checked
again whenever a box or its drawing changes size: charts are drawn after the page loads); a marked box shows a
line above the drawing that stays in view while it scrolls ("scroll sideways for the rest") and a scrollbar that
is always drawn. Why not redraw the charts for a phone instead: a Vega-Lite chart's layout (its panels, its
layers per row) is fixed when it is drawn, and the same page serves every width.

``scripts/check_pages.py`` and the browser tests measure each page at 390 px and 1,400 px
(:mod:`lmdepth.book.defects`). Why a stylesheet of our own: the theme (pydata-sphinx-theme) wraps Markdown tables
in a scrolling box but not notebook outputs or embedded charts, and no Jupyter Book option does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CSS_NAME = "lmdepth-narrow-screens.css"

JS_NAME = "lmdepth-narrow-screens.js"
#: The class :data:`NARROW_JS` gives a box whose drawing is wider than the box, and the cue it then shows.
WIDE_CLASS = "lmdepth-wide"
SCROLL_CUE = "Wider than the screen: scroll sideways for the rest"

NARROW_CSS = f"""\
/* lmdepth: pages that fit a phone (lmdepth.book.narrow_screens): what is wider than the column scrolls in its box */
.lmdepth-vega, div.cell_output {{ max-width: 100%; overflow-x: auto; }}
code.literal, code.literal span.pre {{ white-space: normal; overflow-wrap: anywhere; }}
/* a box that scrolls says so: a line that stays in view, and a scrollbar that is always drawn */
.{WIDE_CLASS}::before {{ content: "{SCROLL_CUE} \\2192"; display: block; position: sticky; left: 0; width: max-content;
  font-size: 0.8em; color: #4a4a4a; padding: 0 0 0.2em 0; }}
.{WIDE_CLASS} {{ scrollbar-width: thin; scrollbar-color: #8a8a8a #ececec; }}
.{WIDE_CLASS}::-webkit-scrollbar {{ height: 8px; }}
.{WIDE_CLASS}::-webkit-scrollbar-thumb {{ background: #8a8a8a; border-radius: 4px; }}
.{WIDE_CLASS}::-webkit-scrollbar-track {{ background: #ececec; }}
"""

#: Marks every chart or output box whose content is wider than the box (see the module docstring). A
#: ResizeObserver sees a box or its drawing change size (a chart drawn after load, a rotated phone).
NARROW_JS = f"""\
/* lmdepth: mark boxes wider than the screen (lmdepth.book.narrow_screens) */
(function () {{
  var boxes = '.lmdepth-vega, div.cell_output';
  function mark(el) {{ el.classList.toggle('{WIDE_CLASS}', el.scrollWidth > el.clientWidth + 1); }}
  function start() {{
    var seen = new ResizeObserver(function (entries) {{
      entries.forEach(function (e) {{ var box = e.target.closest(boxes); if (box) mark(box); }});
    }});
    document.querySelectorAll(boxes).forEach(function (el) {{
      mark(el); seen.observe(el);
      new MutationObserver(function () {{
        mark(el); el.querySelectorAll('svg, canvas, table, pre').forEach(function (c) {{ seen.observe(c); }});
      }}).observe(el, {{childList: true, subtree: true}});
      el.querySelectorAll('svg, canvas, table, pre').forEach(function (c) {{ seen.observe(c); }});
    }});
  }}
  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start); else start();
}})();
"""


def write_assets(static_dir: Path) -> Path:
    """Write the stylesheet and its script into ``static_dir`` (the HTML output's ``_static``); returns the
    stylesheet's path."""
    static_dir.mkdir(parents=True, exist_ok=True)
    for name, text in ((CSS_NAME, NARROW_CSS), (JS_NAME, NARROW_JS)):
        path = static_dir / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
    return static_dir / CSS_NAME


def setup(app: Any) -> dict[str, Any]:
    """Sphinx extension: write the stylesheet and its script into ``_static`` and load both on every page
    (``_config.yml``: ``sphinx.extra_extensions``)."""

    def _write(app: Any) -> None:
        if app.builder.format == "html":
            write_assets(Path(app.outdir) / "_static")

    app.connect("builder-inited", _write)
    app.add_css_file(CSS_NAME)
    app.add_js_file(JS_NAME)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


__all__ = ["CSS_NAME", "JS_NAME", "NARROW_CSS", "NARROW_JS", "SCROLL_CUE", "WIDE_CLASS", "write_assets", "setup"]
