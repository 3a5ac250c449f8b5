"""Chapters narrate and call the library: few code lines, no function or class definitions, no parameter checks.

The limits are the house style of the book (chapter 01 is the model): anything longer than a call belongs in the
library, where it is typed, documented and tested.
"""

from __future__ import annotations

import ast
from pathlib import Path

import jupytext
import pytest

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
