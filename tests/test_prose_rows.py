"""The committed book says what its verdict CSVs say: every verdict a chapter page shows is a row of the CSVs its build
recorded (claim, model, verdict and how it is counted), and the introduction's findings text (its headline counts,
its answer per question) is the one the CSVs give. A page edited by hand, or executed on other results than those committed,
fails here. (The text itself is generated from the rows: lmdepth.claims.findings_claims, lmdepth.claims.report.)"""

from __future__ import annotations

import html
import json
import re
from collections import Counter

import pytest

from lmdepth.book.build import HEADLINE_PICTURE
from lmdepth.book.chapters import CHAPTERS
from lmdepth.claims import findings_claims as findings
from lmdepth.claims import report
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
    assert text.split("```\n\n", 1)[-1].strip() == findings.intro_summary(saved, "default").strip()
    assert f"{{figure}} {HEADLINE_PICTURE}" in text and (REPO_ROOT / "book" / HEADLINE_PICTURE).is_file()
