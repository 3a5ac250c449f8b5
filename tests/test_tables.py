"""The book's tables for reading (lmdepth.book.notebook.show_table): every one captioned, a long one folded."""

import ast
import re

import pandas as pd
import pytest

from lmdepth.book import notebook
from lmdepth.book.reading import markdown_words
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


def test_a_table_off_the_reader_path_folds_whatever_its_length(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj))
    notebook.show_table(pd.DataFrame({"a": [1, 2]}), caption="Per seed", fold=True)
    assert shown[-1].data.startswith('<details class="lmdepth-folded"><summary>Per seed: 2 rows (click to open)')
    notebook.show_table(pd.DataFrame({"a": range(notebook.FOLD_ROWS + 1)}), caption="Answer", fold=False)
    assert "<details" not in shown[-1].to_html()


def test_folded_prose_keeps_its_markdown_under_a_caption():
    text = notebook.folded("Dated <notes>", "- one\n- two *em*\n")
    assert text.startswith('<details class="lmdepth-folded"><summary>Dated &lt;notes&gt;</summary>\n\n- one')
    assert text.endswith("- two *em*\n\n</details>")  # blank lines: CommonMark renders the body as Markdown
    assert markdown_words(text) == 2  # only the caption shows


@pytest.mark.parametrize("chapter", ["norms", "skipping", "complexity", "moeut"])
def test_the_claims_section_folds_its_rules_and_history_and_drops_nothing(chapter):
    from lmdepth.claims import report

    described, shown = report.describe(chapter), notebook.claims_md(chapter)
    heading = "Changes to the criteria after their numbers were seen:"
    assert all(line in shown for line in described.replace(heading, "").splitlines() if line.strip())
    assert markdown_words(shown) < markdown_words(described) / 2
    specs = report.for_chapter(chapter)
    visible = markdown_words(shown) > sum(markdown_words(s.statement) for s in specs)
    assert visible == (len(specs) <= notebook.FOLD_CLAIMS)  # a long list of claims folds too
