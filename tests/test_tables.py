"""The book's tables for reading (lmdepth.book.notebook.show_table): every one captioned, a long one folded."""

import ast
import re

import pandas as pd
import pytest

from lmdepth.book import notebook
from lmdepth.runtime import REPO_ROOT

pytestmark = pytest.mark.unit


def test_every_table_of_every_chapter_has_a_caption():
    calls = [(path.name, node.lineno, node) for path in sorted((REPO_ROOT / "notebooks").glob("*.py"))
             for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call)
             and getattr(node.func, "id", None) == "show_table"]
    assert len(calls) > 40  # the walk finds the chapters' calls
    bare = [(name, line) for name, line, node in calls
            if not any(k.arg == "caption" and isinstance(k.value, ast.Constant) and k.value.value for k in node.keywords)]
    assert bare == []


def test_a_table_longer_than_a_screen_starts_folded_under_its_caption(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj))
    short = pd.DataFrame({"a": range(notebook.FOLD_ROWS)})
    notebook.show_table(short, caption="Short <one>")
    html = shown[-1].to_html()
    assert "<details" not in html and re.search(r"<caption>Short &lt;one&gt;</caption>", html)
    notebook.show_table(pd.DataFrame({"a": range(notebook.FOLD_ROWS + 1)}), caption="Long")
    folded = shown[-1].data
    assert folded.startswith(f'<details class="lmdepth-folded"><summary>Long: {notebook.FOLD_ROWS + 1} rows (click to open)</summary>')
    assert "<caption>Long</caption>" in folded and folded.count("<tr>") == notebook.FOLD_ROWS + 2  # header + rows
