"""Chapters narrate and call the library: few code lines, no function or class definitions, no parameter checks;
and a reader finishes them: at most MAX_UNFOLDED_WORDS words show without a click (lmdepth.book.reading).

The limits are the house style of the book (chapter 01 is the model): anything longer than a call belongs in the
library, where it is typed, documented and tested.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import jupytext
import pytest

from lmdepth.book.reading import MAX_UNFOLDED_WORDS, unfolded_words

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
CHAPTERS = sorted(NOTEBOOKS.glob("*.py"))
MAX_CODE_LINES = 80
# parameter checks live in the library's Params classes (lmdepth.params), not in chapters
CHECKS = {"check_type", "check_choice", "check_range", "ParameterError"}

pytestmark = pytest.mark.unit


def code_cells(path: Path) -> list[str]:
    return [c.source for c in jupytext.read(path).cells if c.cell_type == "code"]


def code_lines(path: Path) -> int:
    """Non-blank, non-comment lines of the chapter's code cells (IPython magics included), except the Colab install
    cell: it runs before the library is installed, so it cannot be a library call; it is the same in every chapter
    (``test_the_colab_cell_is_the_same_everywhere``) and tested on its own (tests/test_colab.py)."""
    return sum(1 for src in code_cells(path) if "google.colab" not in src for line in src.splitlines()
               if line.strip() and not line.strip().startswith("#"))


def definitions(path: Path) -> list[str]:
    """Functions, classes and lambdas defined in the chapter's code cells."""
    found = []
    for src in code_cells(path):
        body = "\n".join(line for line in src.splitlines() if not line.lstrip().startswith(("%", "!")))
        for node in ast.walk(ast.parse(body)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.append(f"{type(node).__name__} {node.name}")
            elif isinstance(node, ast.Lambda):
                found.append(f"lambda at line {node.lineno}")
    return found


def test_there_are_chapters():
    assert len(CHAPTERS) >= 10


#: Chapters that still carry the Colab cell from before the by-hand route (it stopped on ``assert REPO`` while no
#: repository address is set), each with its reason; one that has the current cell fails below, so the set only
#: shrinks.
PREVIOUS_COLAB_CELL: dict[str, str] = {}  # chapters that keep an older Colab cell, with why (none now)


def test_the_colab_cell_is_the_same_everywhere():
    cells = {path.stem: [src for src in code_cells(path) if "google.colab" in src] for path in CHAPTERS}
    assert all(len(c) == 1 for c in cells.values()), {k: len(c) for k, c in cells.items()}
    current = {c[0] for k, c in cells.items() if k not in PREVIOUS_COLAB_CELL}
    assert len(current) == 1
    assert "assert REPO" not in next(iter(current)), "the cell must not stop a notebook that names no repository"
    for stem in PREVIOUS_COLAB_CELL:
        assert cells[stem][0] not in current, f"{stem} has the current Colab cell: drop it from PREVIOUS_COLAB_CELL"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_is_short(path):
    n = code_lines(path)
    assert n <= MAX_CODE_LINES, f"{path.name}: {n} code lines (at most {MAX_CODE_LINES}); move logic into lmdepth"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_defines_nothing(path):
    assert definitions(path) == [], f"{path.name} defines {definitions(path)}; move them into lmdepth"


@pytest.mark.parametrize("path", [p for p in CHAPTERS if p.stem[:2] in {"03", "04", "05", "06", "07"}],
                         ids=lambda p: p.stem)
def test_chapter_checks_no_parameters(path):
    names = {n.id if isinstance(n, ast.Name) else n.attr for src in code_cells(path)
             for n in ast.walk(ast.parse("\n".join(l for l in src.splitlines() if not l.lstrip().startswith(("%", "!")))))
             if isinstance(n, (ast.Name, ast.Attribute))}
    assert not names & CHECKS, f"{path.name} checks parameters itself ({names & CHECKS}); use the Params classes"


def test_the_counter_counts(tmp_path):
    src = tmp_path / "x.py"
    src.write_text("# %%\nimport os\n\n# a comment\nx = 1\n\n# %%\ndef f():\n    return lambda y: y\n"
                   "\n# %%\nif 'google.colab' in sys.modules:\n    pass\n")
    assert code_lines(src) == 4
    assert definitions(src) == ["FunctionDef f", "lambda at line 2"]


#: The executed chapters a reader reads (the summary pages 90–92 are not chapters of the paper).
EXECUTED = sorted((NOTEBOOKS.parent / "book").glob("0[1-7]_*.ipynb"))


def test_there_are_executed_chapters():
    assert len(EXECUTED) == 7


@pytest.mark.parametrize("path", EXECUTED, ids=lambda p: p.stem)
def test_a_reader_finishes_the_chapter(path):
    """The reader path (what shows without a click) of each executed chapter is at most MAX_UNFOLDED_WORDS words;
    dated notes, per-model tables, variants and long caveats fold under captions (lmdepth.book.reading)."""
    n = unfolded_words(path)
    assert n <= MAX_UNFOLDED_WORDS, (f"{path.name}: {n} unfolded words (at most {MAX_UNFOLDED_WORDS}); fold what is "
                                     "off the reader path under a captioned dropdown, then re-execute the chapter")


def _notebook(tmp_path, cells):
    path = tmp_path / "page.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_the_word_counter_counts_what_shows_and_skips_what_is_folded(tmp_path):
    markdown = {"cell_type": "markdown", "metadata": {}, "source": [
        "# Two words\n", "\n", "(a-label)=\n", "A visible paragraph of seven words here.\n", "\n",
        ":::{dropdown} Folded caption\n", "Nine hidden words that a reader never sees unopened.\n",
        "```bash\n", "hidden code too\n", "```\n", ":::\n", "\n",
        "````{admonition} Note here\n", ":class: dropdown\n", "hidden as well\n", "````\n", "\n",
        "<details><summary>Summary shows</summary>\n", "\n", "- hidden *list* item\n", "\n", "</details>\n"]}
    code = {"cell_type": "code", "metadata": {"tags": ["hide-input"]}, "execution_count": 1,
            "source": "a_long_hidden_call(with_many, arguments)", "outputs": [
                {"output_type": "display_data", "metadata": {}, "data": {
                    "text/html": "<p>Shown html</p><script>var hidden = 1;</script>"
                                 "<details><summary>Table: 3 rows</summary><table><td>hidden cell</td></table>"
                                 "</details>",
                    "text/plain": "plain fallback never shown"}},
                {"output_type": "display_data", "metadata": {}, "data": {
                    "text/markdown": "Shown **markdown** | — =\n\n<details><summary>Cap</summary>\n\nhidden\n\n</details>",
                    "text/plain": "<IPython Markdown>"}}]}
    removed = {"cell_type": "markdown", "metadata": {"tags": ["remove-cell"]}, "source": "never shown at all"}
    # 2 + 7 (the label line is not shown) + 2 (a dropdown's title) + 2 (the admonition's title) + 2 (a summary)
    assert unfolded_words(_notebook(tmp_path, [markdown])) == 15
    # html: "Shown html" + "Table: 3 rows"; markdown: "Shown **markdown**" (| — = are not words) + "Cap"
    assert unfolded_words(_notebook(tmp_path, [code])) == 2 + 3 + 2 + 1
    assert unfolded_words(_notebook(tmp_path, [removed])) == 0
    shown = dict(code, metadata={"mystnb": {"figure": {"caption": "A caption of five words"}}}, outputs=[])
    assert unfolded_words(_notebook(tmp_path, [shown])) == 2 + 5  # the visible source (2 tokens) and the caption
    opened = {"cell_type": "markdown", "metadata": {}, "source": ":::{dropdown} Open\n:open:\nthree shown words\n:::"}
    assert unfolded_words(_notebook(tmp_path, [opened])) == 1 + 3
