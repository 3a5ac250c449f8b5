"""What a reader would see as a broken page, found in the rendered HTML by headless Chromium.

:func:`page_defects` loads a page with every host name unresolvable, lets its scripts run (vega-embed, MathJax),
and reports:

* a figure (vega chart) wider than the text column;
* a table wider than the text column with more than :data:`MAX_COLUMNS_UNSCROLLED` columns (wide tables must
  fit, or be designed to scroll);
* text that looks like LaTeX (``$…$`` containing ``\\``, ``^``, ``_`` or ``{``) outside MathJax's output;
* a table cell that reads ``nan``, ``NaN``, ``<NA>`` or ``None``;
* fewer rendered tables than the page's unconditional ``show_table(...)`` calls;
* a page wider than its window (it would scroll sideways as a whole), in a desktop window and on a phone
  (:data:`PHONE`, where a chart or table wider than the column must scroll inside its own box instead:
  :mod:`lmdepth.book.narrow_screens`);
* on a phone, a chart wider than its box that does not say it scrolls (no scroll cue: the reader would not know
  the rest of its axis or its other panels are there).

Layout is measured by a script added to a temporary copy of the page (next to it, so relative links resolve); it
writes its measurements into the DOM, which ``--dump-dom`` returns. Headless Chromium keeps a window at least 500 px
wide, so the phone's width is a frame of that width in a page of our own, to which the script posts what it
measured.
"""

from __future__ import annotations

import html as html_lib
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

MAX_COLUMNS_UNSCROLLED = 6
WINDOW = "1400,1000"  # a desktop window: the book's text column is then at its full width
PHONE = (390, 844)  # px: a phone held upright (the CSS viewport of a 6.1-inch phone)

MEASURE_JS = """
<script>
window.addEventListener('load', () => setTimeout(() => {
  const col = document.querySelector('article.bd-article') || document.querySelector('main') || document.body;
  const width = col.getBoundingClientRect().width;
  const figures = [...document.querySelectorAll('.lmdepth-vega')].map((el, i) => {
    const drawn = el.querySelector('svg, canvas');
    const cue = getComputedStyle(el, '::before').content;
    return {i, width: drawn ? drawn.getBoundingClientRect().width : 0, box: el.clientWidth,
            cue: !['none', 'normal', ''].includes(cue) && getComputedStyle(el).overflowX === 'auto'};
  });
  const tables = [...col.querySelectorAll('table')].map((t, i) => ({
    i, width: t.getBoundingClientRect().width, columns: t.rows.length ? t.rows[0].cells.length : 0,
    id: t.id || ''}));
  const page = {width: document.documentElement.scrollWidth, window: window.innerWidth};
  const pre = document.createElement('pre');
  pre.id = 'lmdepth-measure';
  pre.textContent = JSON.stringify({width, figures, tables, page});
  document.body.appendChild(pre);
  if (window.parent !== window) window.parent.postMessage(pre.textContent, '*');  // framed: the phone's width
}, 3000));
</script>
"""

# The theme may give the <pre> attributes of its own (tabindex="0" on a block wider than the page, once it is there)
_MEASURED = re.compile(r'<pre id="lmdepth-measure"[^>]*>(.*?)</pre>', re.S)
_LATEXISH = re.compile(r"\$[^$<>\n]*[\\^_{][^$<>\n]*\$")
_BAD_CELL = re.compile(r"<td[^>]*>\s*(nan|NaN|&lt;NA&gt;|None)\s*</td>")
_STRIP = re.compile(r"<(mjx-container|script|style|pre|code|svg)\b.*?</\1>", re.S)


def chromium_exe() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def headless(page: Path, *flags: str, budget_ms: int = 12000, timeout: int = 120) -> subprocess.CompletedProcess:
    """Load ``page`` in headless Chromium with every host name unresolvable (a page that needed a CDN fails here
    even on a machine with internet), after its scripts ran for ``budget_ms`` of virtual time; stdout is the DOM.

    Raises:
        RuntimeError: no Chromium on PATH.
    """
    exe = chromium_exe()
    if exe is None:
        raise RuntimeError("headless Chromium is needed: `apt install chromium` (scripts/test.sh does it where it may)")
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--no-first-run", f"--user-data-dir={profile}",
             "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1", *flags,
             f"--virtual-time-budget={budget_ms}", "--dump-dom", page.as_uri()],
            capture_output=True, text=True, timeout=timeout)


#: The page of our own that holds a page in a frame of the phone's size and keeps what the page's script posts.
FRAME_HTML = """<!DOCTYPE html><html><body style="margin:0">
<iframe src="%(src)s" style="border:0; width:%(w)dpx; height:%(h)dpx"></iframe>
<script>window.addEventListener('message', e => { const pre = document.createElement('pre');
  pre.id = 'lmdepth-measure'; pre.textContent = e.data; document.body.appendChild(pre); });</script>
</body></html>"""


def rendered(page: Path, timeout: int = 120, script: str = "", phone: bool = False) -> str:
    """The DOM of ``page`` after its scripts ran, with the layout measurements in ``<pre id="lmdepth-measure">``;
    ``script``: more HTML (a ``<script>`` of a test) added after the measuring one. With ``phone``, the page is
    measured in a frame of :data:`PHONE`'s size and the DOM returned is the frame's holder: the measurements only."""
    return loaded(page, timeout, script, phone)[0]


def loaded(page: Path, timeout: int = 120, script: str = "", phone: bool = False) -> tuple[str, str]:
    """:func:`rendered`'s DOM and the console messages of the same load (Chromium's ``CONSOLE(…)`` lines), so that
    one load serves every check of a page (a load takes seconds)."""
    probe = page.with_name(f".{page.stem}.measure.html")
    frame = page.with_name(f".{page.stem}.phone.html")
    probe.write_text(page.read_text().replace("</body>", MEASURE_JS + script + "</body>", 1))
    try:
        if phone:
            frame.write_text(FRAME_HTML % {"src": probe.name, "w": PHONE[0], "h": PHONE[1]})
        out = headless(frame if phone else probe, f"--window-size={WINDOW}", "--enable-logging=stderr", "--v=0",
                       timeout=timeout)
        return out.stdout, "\n".join(line for line in out.stderr.splitlines() if "CONSOLE" in line)
    finally:
        probe.unlink(missing_ok=True)
        frame.unlink(missing_ok=True)


def expected_tables(source: str) -> int:
    """Unconditional ``show_table(...)`` calls in a chapter's jupytext source (a call with ``if`` may show nothing)."""
    return sum(1 for line in source.splitlines() if line.startswith("show_table(") and " if " not in line)


def measurements(dom: str) -> dict | None:
    """The layout measurements :func:`rendered` left in ``dom`` (the text column's width, each figure's and table's),
    or None where the page's scripts did not finish."""
    m = _MEASURED.search(dom)
    return json.loads(html_lib.unescape(m[1])) if m else None


def page_defects(dom: str, n_tables: int = 0, phone: bool = False) -> list[str]:
    """The defects of one rendered page (see the module docstring); empty when the page is clean.

    Args:
        dom: the page after its scripts ran (:func:`rendered`).
        n_tables: tables the page must show at least (:func:`expected_tables` of its chapter).
        phone: ``dom`` is a phone's rendering (``rendered(..., phone=True)``): the page's own width is checked, and
            that every chart wider than its box shows the scroll cue (the text was checked on the desktop).
    """
    meas = measurements(dom)
    if meas is None:
        return ["no layout measurements: the page's scripts did not finish"]
    page = meas["page"]
    out = ([f"the page is {page['width']} px wide in a {page['window']} px window: it scrolls sideways"]
           if page["width"] > page["window"] else [])
    if phone:
        return out + [f"figure {f['i'] + 1} is {f['width']:.0f} px wide in a {f['box']:.0f} px box with no scroll cue"
                      for f in meas["figures"] if f["width"] > f.get("box", page["window"]) + 1 and not f.get("cue")]
    col = meas["width"]
    out += [f"figure {f['i'] + 1} is {f['width']:.0f} px wide, the text column {col:.0f} px"
            for f in meas["figures"] if f["width"] > col + 1]
    out += [f"table {t['i'] + 1} ({t['columns']} columns) is {t['width']:.0f} px wide, the text column {col:.0f} px"
            for t in meas["tables"] if t["width"] > col + 1 and t["columns"] > MAX_COLUMNS_UNSCROLLED]
    body = _STRIP.sub("", dom[:_MEASURED.search(dom).start()])
    text = html_lib.unescape(re.sub(r"<[^>]+>", " ", body))
    out += [f"raw LaTeX: {s!r}" for s in dict.fromkeys(_LATEXISH.findall(text))]
    bad = _BAD_CELL.findall(body)
    if bad:
        out.append(f"{len(bad)} table cells read {sorted(set(bad))}")
    shown = sum(1 for t in meas["tables"] if t["id"].startswith("T_"))  # pandas Styler tables (show_table)
    if shown < n_tables:
        out.append(f"{shown} of {n_tables} show_table tables rendered")
    return out


__all__ = ["MAX_COLUMNS_UNSCROLLED", "PHONE", "WINDOW", "headless", "rendered", "expected_tables", "measurements", "page_defects"]
