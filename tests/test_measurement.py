"""Each chapter shows its measurement: one folded cell with the library's own trace and kernel source
(lmdepth.book.measurement), taken from the functions themselves — and the executed page shows their current source,
so the code on the page is the code that runs."""

from __future__ import annotations

import html
import inspect
import re

import jupytext
import nbformat
import pytest

from lmdepth.book.chapters import CHAPTERS
from lmdepth.book.measurement import CSS_CLASS, MEASUREMENTS, TITLE, measurement_html, source_block
from lmdepth.runtime import REPO_ROOT

pytestmark = pytest.mark.unit

#: Chapters 01–07: each shows the code of its measurement.
MEASURED = [key for key, stem in CHAPTERS.items() if "01" <= stem[:2] <= "07"]
#: Chapters whose cell is still to come, each with its reason; an entry whose chapter has the cell fails below, so
#: the set only shrinks.
PENDING: dict[str, str] = {}
CALL = re.compile(r'^show_measurement\("(\w+)"\)$')


def _cells(key: str) -> list:
    nb = jupytext.read(REPO_ROOT / "notebooks" / f"{CHAPTERS[key]}.py")
    return [c for c in nb.cells if c.cell_type == "code" and "show_measurement(" in c.source]


def _code_of(block: str) -> list[str]:
    """The text of each ``<pre>`` of an HTML block, tags stripped and unescaped: what a reader reads."""
    return [html.unescape(re.sub(r"<[^>]+>", "", pre)) for pre in re.findall(r"<pre[^>]*>(.*?)</pre>", block, re.S)]


def test_every_chapter_names_its_measurement_or_why_not_yet():
    assert set(MEASUREMENTS) | set(PENDING) == set(MEASURED) and not set(MEASUREMENTS) & set(PENDING)


@pytest.mark.parametrize("key", sorted(MEASUREMENTS))
def test_the_chapter_has_one_folded_measurement_cell(key):
    cells = _cells(key)
    assert len(cells) == 1, f"{CHAPTERS[key]}: {len(cells)} show_measurement cells (one, folded)"
    call = CALL.match(cells[0].source.strip())
    assert call and call[1] == key, cells[0].source
    assert "hide-input" in cells[0].metadata.get("tags", []), "the cell's code is folded like every call cell"


@pytest.mark.parametrize("key", sorted(PENDING))
def test_a_pending_chapter_has_no_cell_yet(key):
    assert _cells(key) == [], f"{CHAPTERS[key]} has its cell now: name its functions in MEASUREMENTS, drop PENDING"


@pytest.mark.parametrize("fn", sorted({f for fs in MEASUREMENTS.values() for f in fs}, key=lambda f: f.__qualname__),
                         ids=lambda f: f.__name__)
def test_the_block_reads_as_the_functions_own_source(fn):
    assert _code_of(source_block(fn)) == [inspect.getsource(fn)]


@pytest.mark.parametrize("key", sorted(MEASUREMENTS))
def test_the_block_is_folded_under_its_title(key):
    block = measurement_html(key)
    assert block.startswith(f'<details class="lmdepth-folded {CSS_CLASS}"><summary>{TITLE}: ')
    assert _code_of(block) == [inspect.getsource(f) for f in MEASUREMENTS[key]]


@pytest.mark.parametrize("key", sorted(MEASUREMENTS))
def test_the_executed_page_shows_the_current_source(key):
    """The committed page shows what the library's functions are now (a changed function: re-execute the chapter,
    ``lmdepth book --chapters KEY``)."""
    stem = CHAPTERS[key]
    nb = nbformat.read(REPO_ROOT / "book" / f"{stem}.ipynb", as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code" and "show_measurement(" in c.source]
    assert len(cells) == 1, f"book/{stem}.ipynb has no measurement cell: re-execute the chapter"
    shown = [o["data"]["text/html"] for o in cells[0].outputs if "text/html" in o.get("data", {})]
    assert len(shown) == 1 and CSS_CLASS in shown[0]
    assert _code_of(shown[0]) == [inspect.getsource(f) for f in MEASUREMENTS[key]], (
        f"book/{stem}.ipynb shows an older source: re-execute it (lmdepth book --chapters {key})")
