"""The book: chapters executed with the smoke profile, rendered by jupyter-book, drawn by headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import nbformat
import pytest

from lmdepth.book import execute_book, render_html, stage_book
from lmdepth.chapters import CHAPTERS
from lmdepth.runtime import REPO_ROOT

MAX_NOTEBOOK_BYTES = 2_000_000


def notebook_problems(path: Path) -> list[str]:
    """What must never be published: error outputs, widget state, progress-bar noise, bloat."""
    nb = nbformat.read(path, as_version=4)
    problems = [f"error output {o.get('ename')}" for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    if "widgets" in nb.metadata:
        problems.append("widget state in metadata")
    if any("\r" in o.get("text", "") for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "stream"):
        problems.append("carriage-return progress output")
    if path.stat().st_size > MAX_NOTEBOOK_BYTES:
        problems.append(f"{path.stat().st_size} bytes")
    return problems


@pytest.mark.parametrize("stem", list(CHAPTERS.values()))
def test_committed_notebooks_are_publishable(stem):
    path = REPO_ROOT / "book" / f"{stem}.ipynb"
    assert path.exists(), f"{path} missing: run scripts/build_book.sh"
    assert notebook_problems(path) == []


def chromium_dom(html: Path) -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "headless Chromium is needed for this test: scripts/setup_env.sh installs Debian's chromium"
    with tempfile.TemporaryDirectory() as profile:
        out = subprocess.run(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--no-first-run", f"--user-data-dir={profile}",
             # no name resolves: a page that needed a CDN would fail here even on a machine with internet
             "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
             "--virtual-time-budget=8000", "--dump-dom", html.as_uri()],
            capture_output=True, text=True, timeout=120,
        )
    return out.stdout


@pytest.fixture(scope="module")
def smoke_book(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("book")
    execute_book(profile="smoke", force=True, book_dir=root / "book", results_dir=root / "results")
    stage_book(root)
    render_html(root, strict=True)
    return root


@pytest.mark.slow
@pytest.mark.parametrize("stem", list(CHAPTERS.values()))
def test_smoke_executed_chapters_are_clean(smoke_book, stem):
    path = smoke_book / "book" / f"{stem}.ipynb"
    assert notebook_problems(path) == []
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata["lmdepth"]["profile"] == "smoke"
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1 and 'profile = "smoke"' in injected[0].source
    # the claim table is computed, not written: it names the model that ran
    text = json.dumps([o for c in nb.cells for o in c.get("outputs", [])])
    assert "smollm2-135m" in text and "agrees with paper" in text


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.parametrize("stem", list(CHAPTERS.values()))
def test_charts_draw_offline_in_chromium(smoke_book, stem):
    page = smoke_book / "_build" / "html" / "book" / f"{stem}.html"
    n_charts = page.read_text().count('class="lmdepth-vega"')
    assert n_charts >= 3
    dom = chromium_dom(page)
    assert dom.count('class="lmdepth-vega vega-embed"') == n_charts  # vega-embed took every chart
    assert len(re.findall(r'class="marks"', dom)) >= n_charts  # and drew its marks
    assert ">Chart failed to render" not in dom and "Error loading script" not in dom
    assert "<mjx-container" in dom  # MathJax (shipped with the book) typeset the formulas


@pytest.mark.slow
def test_book_pages_link_each_other(smoke_book):
    html = smoke_book / "_build" / "html"
    intro = (html / "book" / "intro.html").read_text()
    for stem in CHAPTERS.values():
        assert f"{stem}.html" in intro
    assert (html / "_static" / "vega-bundle.js").stat().st_size > 500_000
    assert (html / "_static" / "mathjax" / "tex-chtml.js").exists()
