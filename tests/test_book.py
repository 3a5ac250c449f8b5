"""The book: chapters executed with the smoke profile, rendered by jupyter-book, drawn by headless Chromium.

The executed book is the session fixture ``smoke_book`` of tests/conftest.py (tests/test_colab.py reads its runs)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest

from lmdepth.analyses.atlas import CHAPTER_KEYS
from lmdepth.book.build import repository_url
from lmdepth.book.chapters import CHAPTERS
from lmdepth.book.table_sort import SORTABLE_CLASS
from lmdepth.claims.findings_claims import ROW_COLUMNS
from lmdepth.runtime import REPO_ROOT

MAX_NOTEBOOK_BYTES = 2_000_000
CLAIM_CHAPTERS = set(CHAPTER_KEYS)  # chapters that check the paper's claims per model
MIN_CHARTS = {"90_across_models": 1, "91_explorer": 1, "92_reproducibility": 0}
NO_MATH = {"91_explorer", "92_reproducibility"}


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
@pytest.mark.unit
def test_committed_notebooks_are_publishable(stem):
    path = REPO_ROOT / "book" / f"{stem}.ipynb"
    assert path.exists(), f"{path} missing: run scripts/build_book.sh"
    assert notebook_problems(path) == []


@pytest.mark.unit
def test_re_executing_an_unchanged_page_changes_only_its_execution_record(tmp_path):
    """Random cell ids, pandas' random table ids, memory addresses and papermill's paths and times would make every
    re-execution a diff of thousands of lines; cleaned, two executions of the same page are byte-identical."""
    import pandas as pd

    from lmdepth.book.build import clean_notebook
    from lmdepth.book.notebook import styled

    def execution(i: int) -> Path:
        table = styled(pd.DataFrame({"n": [20], "verdict": ["agrees"]}))
        nb = nbformat.v4.new_notebook(metadata={"papermill": {
            "parameters": {"n_examples": 20}, "input_path": f"/tmp/tmp{i}/x.ipynb", "output_path": f"/w{i}/x.ipynb",
            "start_time": f"2026-11-2{i}T00:00", "end_time": "…", "duration": 1.5 + i}})
        md, code = nbformat.v4.new_markdown_cell("# Page"), nbformat.v4.new_code_cell("show_table(t)")
        md["id"], code["id"] = f"random{i}a", f"random{i}b"
        code.metadata["papermill"] = {"duration": 0.1 * i}
        code.outputs = [nbformat.v4.new_output("display_data", data={
            "text/html": table.to_html(), "text/plain": f"<pandas.io.formats.style.Styler at 0x7f81{i}ad0>"})]
        nb.cells = [md, code, nbformat.v4.new_code_cell("show_table(t)")]  # a repeated cell gets its own id
        path = tmp_path / f"run{i}.ipynb"
        nbformat.write(nb, path)
        assert clean_notebook(path) == []
        return path

    a, b = execution(1), execution(2)
    assert a.read_text() == b.read_text()
    old, new = (styled(pd.DataFrame({"n": [n]})).to_html().splitlines() for n in (20, 21))
    assert sum(x != y for x, y in zip(old, new)) == 1  # a changed number: one changed line
    nb = nbformat.read(a, as_version=4)
    assert nb.metadata.papermill == {"parameters": {"n_examples": 20}}  # what was run with is kept
    assert nb.cells[1].outputs[0].data["text/plain"] == "<pandas.io.formats.style.Styler>"
    assert len({c.id for c in nb.cells}) == 3 and "random" not in a.read_text()


#: One desktop load per page of the smoke book, shared by the charts, defects and console checks below (they run in
#: one pytest worker: tests/conftest.py): page → (DOM after its scripts ran, console log).
_LOADS: dict[Path, tuple[str, str]] = {}


def desktop_load(page: Path) -> tuple[str, str]:
    """``page`` loaded once in headless Chromium at a desktop window with every host name unresolvable, with the
    layout measurements of lmdepth.book.defects (and, on the findings page, :data:`SORT_PROBE`): (DOM, console)."""
    from lmdepth.book.defects import chromium_exe, loaded

    assert chromium_exe(), ("headless Chromium is needed for this test: scripts/test.sh installs Debian's chromium "
                            "where it may (root or sudo); else `apt install chromium`, or deselect with -m 'not browser'")
    if page not in _LOADS:
        _LOADS[page] = loaded(page, script=SORT_PROBE if page.stem == FINDINGS_PAGE else "")
    return _LOADS[page]


@pytest.mark.slow
@pytest.mark.parametrize("stem", list(CHAPTERS.values()))
def test_smoke_executed_chapters_are_clean(smoke_book, stem):
    path = smoke_book / "book" / f"{stem}.ipynb"
    assert notebook_problems(path) == []
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)  # e.g. no outputs field on markdown cells
    assert nb.metadata["lmdepth"]["profile"] == "smoke"
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1 and 'profile = "smoke"' in injected[0].source
    # the claim table is computed, not written: it names the model that ran
    text = json.dumps([o for c in nb.cells for o in c.get("outputs", [])])
    if stem == "07_moeut_vs_transformer":  # models trained from scratch, all four runs
        assert all(r in text for r in ("moeut-lm", "moeut-answer_only", "transformer-lm", "transformer-answer_only"))
    elif stem != "92_reproducibility":  # runs no model
        assert "smollm2-135m" in text
    if stem in CLAIM_CHAPTERS:
        assert "counted as" in text  # the verdict table (lmdepth.claims.report.display)


@pytest.mark.browser  # builds the book too (smoke_book): deselect with -m "not slow and not browser"
@pytest.mark.parametrize("stem", list(CHAPTERS.values()))
def test_charts_draw_offline_in_chromium(smoke_book, stem):
    page = smoke_book / "_build" / "html" / "book" / f"{stem}.html"
    n_charts = page.read_text().count('class="lmdepth-vega"')
    assert n_charts >= MIN_CHARTS.get(stem, 3)
    dom, _ = desktop_load(page)
    # vega-embed took every chart (a chart wider than the window also carries lmdepth.book.narrow_screens' class)
    assert len(re.findall(r'class="lmdepth-vega[^"]*\bvega-embed\b', dom)) == n_charts
    assert len(re.findall(r'class="marks"', dom)) >= n_charts  # and drew its marks
    assert ">Chart failed to render" not in dom and "Error loading script" not in dom
    if stem not in NO_MATH:
        assert "<mjx-container" in dom  # MathJax (shipped with the book) typeset the formulas


@pytest.mark.browser  # builds the book too (smoke_book): deselect with -m "not slow and not browser"
@pytest.mark.parametrize("stem", [*CHAPTERS.values(), "intro", "method"])
def test_pages_have_no_reader_visible_defects(smoke_book, stem):
    """Figures and wide tables within the text column, no raw LaTeX, no nan/None cells, every show_table table
    rendered, and the page no wider than its window on a desktop and on a 390 px phone (lmdepth.book.defects;
    `python scripts/check_pages.py` runs the same checks on the default book)."""
    from lmdepth.book.defects import expected_tables, page_defects, rendered

    findings = stem == FINDINGS_PAGE  # its table is also clicked (same page load: no extra Chromium run)
    page, source = smoke_book / "_build" / "html" / "book" / f"{stem}.html", REPO_ROOT / "notebooks" / f"{stem}.py"
    dom, _ = desktop_load(page)
    assert page_defects(dom, expected_tables(source.read_text()) if source.is_file() else 0) == []
    assert page_defects(rendered(page, phone=True), phone=True) == []
    if findings:
        assert findings_page_problems(dom) == []


FINDINGS_PAGE = "90_across_models"
# A sample of the statistic cells, with the order a numeric sort gives them (10 after 9: numbers, not text; "−" is
# U+2212; a cell without a number last, either way).
SORT_SAMPLE = ["9 [8, 10], n = 3", "—, n = 2", "10 [9, 11], n = 3", "-0.5 [-1, 0]", "1e-3", "0.02: short of it", "−2"]
SAMPLE_SORTED = ["−2", "-0.5 [-1, 0]", "1e-3", "0.02: short of it", "9 [8, 10], n = 3", "10 [9, 11], n = 3", "—, n = 2"]
# The probe (i) adds a table of SORT_SAMPLE with the sortable class while the page is parsed, so the book's sorter
# attaches to it like to any other (its data do not depend on the build), and (ii) after load clicks the headers of
# the findings table, found by its first column's title (not by the class, so a table that lost it is found and
# fails): the model three times, then the statistic twice. What it saw goes into the DOM after the measuring script
# (lmdepth.book.defects.MEASURE_JS, 3000 ms) ran.
SORT_PROBE = """
<script>
(() => {
  const t = document.createElement('table');
  t.id = 'lmdepth-sort-sample';
  t.className = CLASS;
  t.innerHTML = '<thead><tr><th>statistic</th><th>row</th></tr></thead><tbody>' +
    SAMPLE.map((c, i) => '<tr><td>' + c + '</td><td>' + i + '</td></tr>').join('') + '</tbody>';
  document.body.appendChild(t);
})();
window.addEventListener('load', () => setTimeout(() => {
  const last = t => t.tHead.rows[t.tHead.rows.length - 1];
  const rows = t => [...t.tBodies[0].rows].map(r => [...r.cells].map(c => c.textContent.trim()));
  const sample = document.getElementById('lmdepth-sort-sample');
  const out = {found: false, sample: []};
  last(sample).cells[0].click(); out.sample.push(rows(sample));
  last(sample).cells[0].click(); out.sample.push(rows(sample));
  const table = [...document.querySelectorAll('table')].find(t => t.tHead && t.tHead.rows.length &&
    last(t).cells[0].textContent.trim() === TITLE);
  if (table) {
    const heads = [...last(table).cells];
    Object.assign(out, {found: true, classes: table.className, before: rows(table), model: [], statistic: []});
    for (let i = 0; i < 3; i++) { heads[1].click(); out.model.push(rows(table)); }
    for (let i = 0; i < 2; i++) { heads[3].click(); out.statistic.push(rows(table)); }
  }
  const pre = document.createElement('pre');
  pre.id = 'lmdepth-sort-probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}, 3500));
</script>
"""
for _k, _v in {"CLASS": SORTABLE_CLASS, "SAMPLE": SORT_SAMPLE, "TITLE": ROW_COLUMNS[0]}.items():
    SORT_PROBE = SORT_PROBE.replace(_k, json.dumps(_v))
_NUMBER = re.compile(r"-?\d+\.?\d*(?:e[-+]?\d+)?")


def _groups(values: list[str]) -> list[str]:
    """The runs of equal values, in order: ["a", "a", "b", "a"] → ["a", "b", "a"]."""
    return [v for i, v in enumerate(values) if i == 0 or v != values[i - 1]]


def findings_page_problems(dom: str) -> list[str]:
    """What is wrong with the rendered findings page beyond lmdepth.book.defects: every table and figure within
    the text column (whatever its number of columns); the book's sorter orders a sample of statistic cells by their
    numbers (cells without one last); the verdict table has the sortable class and sorts by a clicked header with
    its rows intact: by the model (each model's rows together, reversed on a second click, the table's own order on
    a third), by the statistic (ascending, then descending; tested where the build has two distinct statistics:
    the smoke profile's checks are too small to have any)."""
    import html as html_lib

    from lmdepth.book.defects import measurements

    meas = measurements(dom)
    if meas is None:
        return ["no layout measurements: the page's scripts did not finish"]
    col = meas["width"]
    out = [f"{kind[:-1]} {x['i'] + 1} is {x['width']:.0f} px wide, the text column {col:.0f} px"
           for kind in ("figures", "tables") for x in meas[kind] if x["width"] > col + 1]
    m = re.search(r'<pre id="lmdepth-sort-probe"[^>]*>(.*?)</pre>', dom, re.S)
    if not m:
        return out + ["the sorting probe did not run"]
    probe = json.loads(html_lib.unescape(m[1]))
    if [[r[0] for r in rows] for rows in probe["sample"]] != [SAMPLE_SORTED, SAMPLE_SORTED[-2::-1] + ["—, n = 2"]]:
        out.append(f"the book's sorter does not order statistic cells by their numbers: {probe['sample']}")
    if not probe["found"]:
        return out + [f"no table headed {ROW_COLUMNS[0]!r}"]
    if SORTABLE_CLASS not in probe["classes"].split():
        out.append(f"the findings table lacks the class {SORTABLE_CLASS!r}")
    rows = [probe["before"], *probe["model"], *probe["statistic"]]
    if any(sorted(map(tuple, r)) != sorted(map(tuple, probe["before"])) for r in rows):
        out.append("sorting lost, duplicated or changed rows")
    up, down = ([r[1] for r in rows] for rows in probe["model"][:2])
    if len(set(up)) < 2:
        out.append(f"fewer than two models or subjects ({set(up)}): the sort is not tested")
    if len(_groups(up)) != len(set(up)) or _groups(down) != _groups(up)[::-1]:
        out.append("clicks on the model's header do not bring each model's rows together, then in reverse")
    if probe["model"][2] != probe["before"]:
        out.append("a third click on the model's header does not give back the table's own order")
    numbers = [[float(n[0]) for r in rows if (n := _NUMBER.match(r[3]))] for rows in probe["statistic"]]
    if len(set(numbers[0])) >= 2 and (
            numbers != [sorted(numbers[0]), sorted(numbers[0], reverse=True)]
            or any(_NUMBER.match(r[3]) for r in probe["statistic"][0][len(numbers[0]):])):
        out.append("clicks on the statistic's header do not sort the rows by its number (rows without one last)")
    return out


@pytest.mark.slow
def test_book_pages_link_each_other(smoke_book):
    html = smoke_book / "_build" / "html"
    intro = (html / "book" / "intro.html").read_text()
    for stem in CHAPTERS.values():
        assert f"{stem}.html" in intro
    assert (html / "_static" / "vega-bundle.js").stat().st_size > 500_000
    assert (html / "_static" / "mathjax" / "tex-chtml.js").exists()


PAGES = [*CHAPTERS.values()]


def _html_pages(root: Path) -> list[Path]:
    return [p for p in (root / "_build" / "html").rglob("*.html") if "_static" not in p.parts]


@pytest.mark.browser  # builds the book too (smoke_book): deselect with -m "not slow and not browser"
@pytest.mark.parametrize("stem", ["intro", *PAGES])
def test_pages_load_without_console_errors_or_network(smoke_book, stem):
    page = smoke_book / "_build" / "html" / "book" / f"{stem}.html"
    dom, console = desktop_load(page)
    assert "</html>" in dom or "</body>" in dom
    bad = [line for line in console.splitlines()
           if any(k in line for k in ("Uncaught", "Error", "Failed to load resource", "ERR_NAME_NOT_RESOLVED"))]
    assert bad == [], bad
    # nothing on the page is fetched from another host (links to other sites are fine; resources are not)
    html = page.read_text()
    remote = re.findall(r'<(?:script|link|img|iframe)[^>]+(?:src|href)="(https?:)?//[^"]+"', html)
    assert remote == [], remote


@pytest.mark.slow
def test_internal_links_resolve(smoke_book):
    """Every link to a file of the book reaches it, and a link into another page of the book (``page.html#anchor``,
    e.g. a findings row to its chapter's claim check) reaches an element with that id."""
    html_root = smoke_book / "_build" / "html"
    broken, ids = [], {}
    for page in _html_pages(smoke_book):
        for target, anchor in re.findall(r'(?:href|src)="([^"#?]+)[^"#]*(?:#([^"]*))?"', page.read_text()):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("//"):
                continue  # another site, mailto:, data: …
            path = (page.parent / target).resolve()
            if not path.exists():
                broken.append(f"{page.relative_to(html_root)} → {target}")
            elif anchor and path.suffix == ".html":
                if path not in ids:
                    ids[path] = set(re.findall(r"""(?<![\w-])(?:id|name)=["']([^"']+)""", path.read_text()))
                if anchor not in ids[path]:
                    broken.append(f"{page.relative_to(html_root)} → {target}#{anchor}")
    assert broken == []
    findings = (html_root / "book" / "90_across_models.html").read_text()
    assert re.search(r'href="03_layer_skipping\.html#claims-skipping"', findings)  # the rows' links were checked


@pytest.mark.slow
def test_colab_buttons_point_to_committed_notebooks(smoke_book):
    """Every launch button uses repository.url of _config.yml; while it is unset, no page has a launch or
    repository button (lmdepth.book.repository_buttons)."""
    url = repository_url()
    repo = url.removeprefix("https://github.com/")
    for stem in PAGES:
        html = (smoke_book / "_build" / "html" / "book" / f"{stem}.html").read_text()
        links = set(re.findall(r'href="https://colab\.research\.google\.com/github/([^"]+)"', html))
        if not url:
            assert not links and "colab.research.google.com" not in html, f"{stem}: a launch button with no URL set"
            assert not re.search(r'href="https://github\.com/', html), f"{stem}: a repository button with no URL set"
            continue
        assert links, f"{stem}: no Open-in-Colab button"
        for link in links:
            assert link.startswith(repo + "/blob/main/"), link
            rel = link.removeprefix(repo + "/blob/main/")
            assert (REPO_ROOT / rel).exists(), f"{stem}: Colab button points to {rel}, not a committed notebook"


@pytest.mark.parametrize("stem", PAGES)
@pytest.mark.unit
def test_committed_colab_cell_uses_the_configured_repository(stem):
    """The Colab cell clones repository.url of _config.yml (set there once, written in by lmdepth book; "" while
    unset) and installs from the clone."""
    nb = nbformat.read(REPO_ROOT / "book" / f"{stem}.ipynb", as_version=4)
    colab = [c for c in nb.cells if c.cell_type == "code" and "google.colab" in c.source]
    assert len(colab) == 1 and f'REPO = "{repository_url()}"' in colab[0].source
    installs = re.findall(r"pip install[^\n]*", colab[0].source)
    assert installs and not any("torch" in line for line in installs)  # never reinstalls torch
