"""The committed book says what its verdict CSVs say: every verdict a chapter page shows is a row of the CSVs its build
recorded (claim, model, verdict and how it is counted); the introduction's findings text (its answer per question,
its headline counts) and the answers CSV are the ones the CSVs give; the states are defined in one file both the
introduction and the Method page include; and every page that counts verdicts counts the same rows. A page edited by
hand, or executed on other results than those committed, fails here. (The text itself is generated from the rows:
lmdepth.claims.answers, lmdepth.claims.findings_claims, lmdepth.claims.report.)"""

from __future__ import annotations

import html
import json
import re
from collections import Counter

import pandas as pd
import pytest

from lmdepth.book.build import ANSWERS_CSV, HEADLINE_PICTURE
from lmdepth.book.chapters import CHAPTERS
from lmdepth.claims import answers, report
from lmdepth.claims import findings_claims as findings
from lmdepth.runtime import REPO_ROOT

pytestmark = pytest.mark.unit

SHOWN = ["claim (the paper's side)", "model", "verdict", "counted as"]
_CELL = re.compile(r"<t([hd])[^>]*>(.*?)</t\1>", re.S)


def _cells(row: str) -> list[str]:
    return [html.unescape(re.sub(r"<[^>]+>", "", c)).replace("\u200b", "").strip() for _, c in _CELL.findall(row)]


def _verdict_rows(stem: str) -> list[tuple[str, ...]]:
    """(claim, model, verdict, counted as) of every verdict table the executed page shows."""
    nb = json.loads((REPO_ROOT / "book" / f"{stem}.ipynb").read_text())
    out = []
    for cell in nb["cells"]:
        for o in cell.get("outputs", []):
            page = "".join(o.get("data", {}).get("text/html", ""))
            for table in re.findall(r"<table.*?</table>", page, re.S):
                rows = re.findall(r"<tr.*?</tr>", table, re.S)
                header = _cells(rows[0]) if rows else []
                if all(c in header for c in SHOWN):
                    at = [header.index(c) for c in SHOWN]
                    out += [tuple(_cells(r)[i] for i in at) for r in rows[1:]]
    return out


def _csv_rows(chapter: str) -> list[tuple[str, ...]]:
    saved = findings.saved_verdicts(REPO_ROOT / "results", "default")
    shown = report.display(findings.normalized(saved[saved["chapter"] == chapter]))
    return [tuple(str(v).replace("\u200b", "") for v in r) for r in shown[SHOWN].itertuples(index=False)]


@pytest.mark.parametrize("chapter", [c for c in CHAPTERS if (REPO_ROOT / "results" / "book" / "default" / c /
                                                             "verdicts").is_dir()])
def test_each_chapter_page_shows_the_verdicts_its_csvs_hold(chapter):
    page, csv = _verdict_rows(CHAPTERS[chapter]), _csv_rows(chapter)
    assert csv, f"no verdict rows recorded for {chapter}"
    assert Counter(page) == Counter(csv)


def test_the_introductions_findings_are_what_the_csvs_say():
    saved = findings.saved_verdicts(REPO_ROOT / "results", "default")
    text = (REPO_ROOT / "book" / "findings.md").read_text()
    assert text.split("```\n\n", 1)[-1].strip() == answers.landing_md(saved, "default").strip()
    assert f"{{figure}} {HEADLINE_PICTURE}" in text and (REPO_ROOT / "book" / HEADLINE_PICTURE).is_file()


def saved() -> pd.DataFrame:
    return findings.saved_verdicts(REPO_ROOT / "results", "default")


def test_the_answers_csv_and_the_landing_pages_sentences_are_recomputed_from_the_verdicts():
    """One sentence per question of the paper, recomputed here from the verdict CSVs: the stored answers and the
    landing page's lines must be exactly these."""
    stored = pd.read_csv(REPO_ROOT / "results" / "book" / "default" / ANSWERS_CSV, dtype=str, keep_default_na=False)
    fresh = answers.answers_table(saved())
    assert stored.to_dict("records") == fresh.astype(str).to_dict("records")
    assert list(stored["question"]) == [q.key for q in answers.QUESTIONS]
    landing = (REPO_ROOT / "book" / "findings.md").read_text()
    for a in answers.answers(saved()):
        assert f"**{a.lead}**" + (f" — {a.details}." if a.details else ".") in landing, a.question.key
        assert a.rows, f"{a.question.key}: no counted row answers it"


def test_the_seven_states_are_defined_in_one_file_the_introduction_and_the_method_page_include():
    book = REPO_ROOT / "book"
    assert (book / answers.STATES_FILE).read_text().strip() == answers.states_md(saved()).strip()
    include = f"```{{include}} {answers.STATES_FILE}\n```"
    assert include in (book / "findings.md").read_text() and include in (book / "method.md").read_text()
    assert "```{include} findings.md\n```" in (book / "intro.md").read_text()
    text = (book / answers.STATES_FILE).read_text()
    assert all(f"*{state}*: " in text for state in report.HEADLINE_STATES)


def _outputs(stem: str) -> list[tuple[str, str]]:
    """(mime type, text) of every output of an executed page."""
    nb = json.loads((REPO_ROOT / "book" / f"{stem}.ipynb").read_text())
    return [(k, "".join(v) if isinstance(v, list) else str(v)) for cell in nb["cells"]
            for o in cell.get("outputs", []) for k, v in o.get("data", {}).items()]


def test_every_page_that_counts_verdicts_counts_the_same_rows():
    """The introduction (findings.md), the findings page's headline and its per-state table, and the findings page's
    row table: the counts of the verdict CSVs, over the same rows."""
    rows = saved()
    counted = report.counts(rows)
    total = int(counted.sum())
    intro = (REPO_ROOT / "book" / "findings.md").read_text()
    assert f"Of the {total} (claim × model) checks of the claims registry" in intro
    out = _outputs(CHAPTERS["atlas"])
    head = next(t for k, t in out if k == "text/markdown" and t.startswith("Over the registered claims"))
    assert re.search(r"— (\d+) in all", head)[1] == str(total)
    assert {s: int(n) for n, s in re.findall(r"\*\*(\d+) ([a-z ]+?)\*\*", head)} == {
        s: int(n) for s, n in counted.items()}
    table = next(t for k, t in out if k == "text/html" and "<caption>Counted verdicts per state, per model" in t)
    trs = re.findall(r"<tr.*?</tr>", table, re.S)
    header, every = _cells(trs[0]), next(_cells(r) for r in trs if "all models" in _cells(r))
    assert dict(zip(header[1:], map(int, every[1:]))) == {s: int(n) for s, n in counted.items()}
    listed = next(t for k, t in out if k == "text/html" and "<caption>Every (claim × model) verdict" in t)
    assert len(re.findall(r"<tr.*?</tr>", listed, re.S)) - 1 == len(rows)  # every row, counted or not
