"""The book states its own method: the Method page exists, every reference to it names an anchor it has, and no file
of the repository sends a reader to a document outside it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from lmdepth.book.build import BOOK_FILES
from lmdepth.runtime import REPO_ROOT

pytestmark = pytest.mark.unit

PAGE = REPO_ROOT / "book" / "method.md"
LABEL = re.compile(r"^\((method-[a-z0-9-]+)\)=$", re.MULTILINE)
#: The two forms of a reference: ``book/method.md#method-halves`` (docstrings, README, comments) and
#: {ref}`method-halves` (book text).
REFERENCE = re.compile(r"method\.md#(method-[a-z0-9-]+)|\{ref\}`(?:[^`<]*<)?(method-[a-z0-9-]+)>?`")
#: Documents that exist only outside the repository, and how the library used to cite them.
OUTSIDE = [r"\.\./shared", r"/work/shared", r"\bshared/[A-Z]", r"\bMETHOD\b", r"\bEVIDENCE\b", r"\bOFFLINE\.md",
           r"\bHOUSE_STYLE", r"\bNDIF\.md"]


def repository_files() -> list[Path]:
    """Tracked and not-ignored files, results/ left out (its tables are data, not prose)."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO_ROOT,
                         check=True, capture_output=True, text=True).stdout.splitlines()
    return [REPO_ROOT / p for p in out if not p.startswith("results/") and (REPO_ROOT / p).is_file()]


def text_of(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None  # binary (checkpoints, images)


def test_the_method_page_is_in_the_book():
    toc = yaml.safe_load((REPO_ROOT / "_toc.yml").read_text())
    files = [c["file"] for part in toc["parts"] for c in part["chapters"]]
    assert files[0] == "book/method", "the Method page comes first, after the introduction"
    assert "book/method.md" in BOOK_FILES  # staged with every build outside the repository
    labels = LABEL.findall(PAGE.read_text())
    assert len(labels) == len(set(labels)) >= 10


def test_no_file_refers_to_a_document_outside_the_repository():
    pattern = re.compile("|".join(OUTSIDE))
    found = []
    for path in repository_files():
        if path == Path(__file__).resolve():
            continue
        text = text_of(path)
        for i, line in enumerate((text or "").splitlines(), 1):
            if pattern.search(line):
                found.append(f"{path.relative_to(REPO_ROOT)}:{i}: {line.strip()[:120]}")
    assert found == [], "\n".join(found)


def test_every_method_reference_names_an_anchor_of_the_page():
    labels = set(LABEL.findall(PAGE.read_text()))
    refs, broken = 0, []
    for path in repository_files():
        for m in REFERENCE.finditer(text_of(path) or ""):
            refs += 1
            anchor = m.group(1) or m.group(2)
            if anchor not in labels:
                broken.append(f"{path.relative_to(REPO_ROOT)}: {anchor}")
    assert broken == [], f"anchors missing from book/method.md: {broken}"
    assert refs >= 40  # the library's docstrings and the README cite the page throughout
