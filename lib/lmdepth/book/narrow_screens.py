"""Pages that fit a phone: a Sphinx extension that ships one small stylesheet with every HTML build.

The book's charts are drawn at fixed widths (up to the 720 px text column: their labels and panels are laid out for
it) and some tables have many columns. On a 390 px screen they made 9 of 13 pages scroll sideways as a whole. The
stylesheet keeps the page at the window's width and lets what is wider scroll inside its own box instead: each chart
(``.lmdepth-vega``, :mod:`lmdepth.charts.vega_offline`), each cell output (tables, printed text) and long inline code,
which may break anywhere. On a desktop window nothing changes (everything already fits the column).

``scripts/check_pages.py`` and the browser tests measure each page at 390 px and 1,400 px
(:mod:`lmdepth.book.defects`). Why a stylesheet of our own: the theme (pydata-sphinx-theme) wraps Markdown tables
in a scrolling box but not notebook outputs or embedded charts, and no Jupyter Book option does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CSS_NAME = "lmdepth-narrow-screens.css"

NARROW_CSS = """\
/* lmdepth: pages that fit a phone (lmdepth.book.narrow_screens): what is wider than the column scrolls in its box */
.lmdepth-vega, div.cell_output { max-width: 100%; overflow-x: auto; }
code.literal, code.literal span.pre { white-space: normal; overflow-wrap: anywhere; }
"""


def write_assets(static_dir: Path) -> Path:
    """Write the stylesheet into ``static_dir`` (the HTML output's ``_static``); returns its path."""
    static_dir.mkdir(parents=True, exist_ok=True)
    path = static_dir / CSS_NAME
    if not path.is_file() or path.read_text(encoding="utf-8") != NARROW_CSS:
        path.write_text(NARROW_CSS, encoding="utf-8")
    return path


def setup(app: Any) -> dict[str, Any]:
    """Sphinx extension: write the stylesheet into ``_static`` and load it on every page (``_config.yml``:
    ``sphinx.extra_extensions``)."""

    def _write(app: Any) -> None:
        if app.builder.format == "html":
            write_assets(Path(app.outdir) / "_static")

    app.connect("builder-inited", _write)
    app.add_css_file(CSS_NAME)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


__all__ = ["CSS_NAME", "NARROW_CSS", "write_assets", "setup"]
