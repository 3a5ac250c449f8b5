"""Build the book: execute changed chapters with a profile, clean them, render HTML offline.

The default profile builds the published book (``book/``, ``results/``, ``_build/html``); any other profile builds
into its own folder, ``_build/profiles/<name>/`` (:func:`build_root`).

Execution is this module's job; jupyter-book only renders (``execute_notebooks: off``). A chapter is
re-executed only when its source, the library, the profile or the pinned requirements changed since the
executed copy was made (the hash is stored in the notebook's metadata), or with ``force=True``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import suppress
from pathlib import Path

import nbformat

from lmdepth.analyses.atlas import RECORDED_CHAPTERS
from lmdepth.book.chapters import (
    CHAPTERS,
    chapter_source,
    declared_parameters,
    execute_chapter,
    profile_params,
    profiles_dir,
)
from lmdepth.charts.findings_charts import headline_bar
from lmdepth.claims.answers import STATES_FILE, answers_table, landing_md, states_md
from lmdepth.claims.findings_claims import saved_verdicts
from lmdepth.errors import DataError, LmDepthError, ParameterError
from lmdepth.results import (
    BOOK_RECORD_ENV,
    RECORD_RUNS,
    atomic_write,
    atomic_write_text,
    check_recorded,
    git_tracked,
    sha256_file,
)
from lmdepth.runtime import REPO_ROOT

BOOK_FILES = ("_config.yml", "_toc.yml", "book/intro.md", "book/method.md", "book/references.md")
SUMMARY_PAGES = {"atlas", "reproducibility"}  # read the other pages' results and notebooks


def book_record_root(results_dir: str | Path, profile: str) -> Path:
    """Where the book build records, per chapter, the runs it used and the claims it checked."""
    return Path(results_dir) / "book" / Path(profile).stem


#: The file of a chapter's book record that lists its verdict files and their sha256, and the sha256 of its list of
#: runs (:data:`~lmdepth.results.RECORD_RUNS`; None where it recorded none), checked by :func:`check_verdicts`.
RECORD_MANIFEST = "manifest.json"


def _staging(record_root: Path, chapter: str) -> Path:
    """Where a chapter being executed records its runs and verdicts until it has finished: beside the profile's
    record, not inside it (readers never see a half record), at the same depth (recorded paths stay relative to the
    results root)."""
    return record_root.parent / f".executing-{record_root.name}" / chapter


def _publish_record(staging: Path, record: Path) -> None:
    """Put a finished execution's record in place of the last one, with its manifest of verdict files. A kill between
    the renames leaves no record, which makes the page stale (:func:`_execute_all` re-executes it)."""
    verdicts = sorted((staging / "verdicts").glob("*.csv"))
    runs = staging / RECORD_RUNS
    # written even where the chapter recorded nothing: a record with its manifest is a finished execution's. The list
    # of runs is sealed too: a run cut from it would no longer be checked (check_recorded reads the list)
    atomic_write_text(staging / RECORD_MANIFEST, json.dumps(
        {"verdicts": {f.name: sha256_file(f) for f in verdicts},
         "runs": sha256_file(runs) if runs.exists() else None}, indent=1) + "\n")
    aside = staging.with_name(staging.name + ".replaced")
    shutil.rmtree(aside, ignore_errors=True)
    if record.exists():
        os.rename(record, aside)
    record.parent.mkdir(parents=True, exist_ok=True)
    os.rename(staging, record)
    shutil.rmtree(aside, ignore_errors=True)
    with suppress(OSError):  # the staging folder, once empty
        staging.parent.rmdir()


def check_verdicts(record_root: str | Path, chapters: Sequence[str] | None = None) -> None:
    """Stop, in one line, when a chapter's record (for ``chapters``, default all) has no manifest or no longer matches
    the manifest its execution wrote (its verdict files, and its list of runs where the manifest seals it): the
    findings would otherwise lose rows, or show edited ones, and the pages' runs go unchecked, with no check failing.

    Raises:
        DataError: naming the first such file, its chapter and the commands that restore it.
    """
    record_root = Path(record_root)
    records = sorted(d for d in record_root.glob("*/") if d.is_dir() and not d.name.startswith("."))
    for record in records:
        chapter = record.name
        if chapters is not None and chapter not in chapters:
            continue
        problem = _record_problem(record)
        if problem:
            raise DataError(f"The book's record of chapter {chapter} is not whole: {problem}. Restore it with "
                            f"`git checkout -- {record}` if it is committed, or recompute it with "
                            f"`lmdepth book --force --chapters {chapter}`; the findings are not published without it.")


def _record_problem(record: Path) -> str | None:
    """What in one chapter's record differs from its manifest (:func:`check_verdicts`), or None."""
    manifest = record / RECORD_MANIFEST
    if not manifest.exists():  # every execution writes one: without it nothing of the record can be checked
        return f"{manifest} is missing"
    try:
        sealed = json.loads(manifest.read_text(encoding="utf-8"))
        want = sealed["verdicts"]
        have = {f.name for f in (record / "verdicts").glob("*.csv")}
    except (OSError, ValueError, KeyError, TypeError):
        return f"{manifest} cannot be read"
    problem = next((f"{record / 'verdicts' / n} is missing" for n in sorted(set(want) - have)), None)
    problem = problem or next((f"{record / 'verdicts' / n} was not written by its execution"
                               for n in sorted(have - set(want))), None)
    problem = problem or next((f"{record / 'verdicts' / n} was changed after its execution"
                               for n in sorted(want) if sha256_file(record / "verdicts" / n) != want[n]), None)
    runs = record / RECORD_RUNS
    if problem is None and "runs" in sealed:  # manifests written before the list of runs was sealed lack the key
        now = sha256_file(runs) if runs.exists() else None
        if now != sealed["runs"]:
            problem = (f"{runs} is missing" if now is None else f"{runs} was not written by its execution"
                       if sealed["runs"] is None else f"{runs} was changed after its execution")
    return problem


#: Inputs of a chapter beyond the library and its profile, as globs under the repository: chapter 07 reads every
#: finished training run (trained outside the book, so a run that finishes must re-execute it) and the snapshots of
#: the fine-tuned and positive-control runs (snapshot-*.npz, every 10 % of training: drawn over training while a run
#: trains). A resume checkpoint alone does not make it stale.
CHAPTER_INPUTS = {"moeut": ("checkpoints/dm_math/*/meta.json", "checkpoints/dm_math_ft/*/meta.json",
                            "checkpoints/dm_math_ft/*/snapshot-*.npz", "checkpoints/chains/*/meta.json",
                            "checkpoints/chains/*/snapshot-*.npz")}


#: Chapters that show another chapter's verdict rows: chapter 05 names its positive control from chapter 07's "depth
#: grows" rows. Such a chapter executes after the chapters it reads, and their recorded verdicts make it stale.
READS_VERDICTS_OF = {"complexity": ("moeut",)}


def execution_order() -> list[str]:
    """The chapters in book order, except that a chapter of :data:`READS_VERDICTS_OF` comes right after the last of
    the chapters it reads."""
    order = [c for c in CHAPTERS if c not in READS_VERDICTS_OF]
    for chapter in (c for c in CHAPTERS if c in READS_VERDICTS_OF):
        read = [order.index(r) for r in READS_VERDICTS_OF[chapter] if r in order]
        order.insert(max(read) + 1 if read else len(order), chapter)
    return order


def build_hash(chapter: str, profile: str, record_root: Path | None = None) -> str:
    """Hash of everything that can change a chapter's executed output (with ``record_root``, the book record of the
    build: the verdict manifests of the chapters it reads, :data:`READS_VERDICTS_OF`)."""
    h = hashlib.sha256()
    files = [chapter_source(chapter), profiles_dir() / f"{profile}.yaml", REPO_ROOT / "requirements.txt"]
    files += sorted((REPO_ROOT / "lib" / "lmdepth").rglob("*.py"))
    files += sorted(f for pattern in CHAPTER_INPUTS.get(chapter, ()) for f in REPO_ROOT.glob(pattern))
    if record_root is not None:
        files += [Path(record_root) / read / RECORD_MANIFEST for read in READS_VERDICTS_OF.get(chapter, ())]
    for f in files:
        if f.exists():
            h.update(str(f.relative_to(REPO_ROOT) if f.is_relative_to(REPO_ROOT) else f.name).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def repository_url(config: Path | None = None) -> str:
    """The one place the repository URL is set: ``repository.url`` in ``_config.yml``; "" while it is unset.

    Without ``config``: the checkout's, else the working directory's (a chapter run from a clone by an installed
    package, as in Colab), else none: "" (an installed package outside a checkout names no repository)."""
    import yaml

    found = config or next((p for p in (REPO_ROOT / "_config.yml", Path.cwd() / "_config.yml") if p.is_file()), None)
    data = (yaml.safe_load(found.read_text()) or {}) if found is not None else {}
    return str((data.get("repository") or {}).get("url") or "").strip().rstrip("/")


_REPO_LINE = re.compile(r'^(\s*REPO = )"[^"]*"', re.MULTILINE)
_ADDRESS = re.compile(r"^<([\w.]+) (?:object )?at 0x[0-9a-f]+>$")  # an object's default repr: its memory address
_PAPERMILL_RUN = ("input_path", "output_path", "start_time", "end_time", "duration", "exception")


def _stable_ids(cells: list) -> None:
    """Cell ids from the cells' own text (jupytext draws them at random on every conversion), so re-executing an
    unchanged page changes no id and a diff between two builds shows only what changed."""
    seen: dict[str, int] = {}
    for cell in cells:
        base = hashlib.sha1(f"{cell.cell_type}\n{cell.source}".encode()).hexdigest()[:12]
        seen[base] = seen.get(base, 0) + 1
        cell["id"] = base if seen[base] == 1 else f"{base}-{seen[base]}"


def clean_notebook(path: Path, repo_url: str | None = None) -> list[str]:
    """Drop widget state and papermill noise (per-cell timings; the run's paths and times: the page's own
    ``lmdepth`` metadata keeps its wall time); make the cell ids and object reprs reproducible; set the Colab
    cell's repository URL to ``repo_url`` ("" while unset; None leaves it); return the error outputs found (must be none to publish)."""
    nb = nbformat.read(path, as_version=4)
    nb.metadata.pop("widgets", None)
    for key in _PAPERMILL_RUN:  # machine paths and timestamps: they differ on every execution
        nb.metadata.get("papermill", {}).pop(key, None)
    _stable_ids(nb.cells)
    errors = []
    for cell in nb.cells:
        if repo_url is not None and cell.cell_type == "code" and "google.colab" in cell.source:
            cell.source = _REPO_LINE.sub(lambda m: f'{m.group(1)}"{repo_url}"', cell.source)
        if "injected-parameters" in cell.metadata.get("tags", []) and "hide-input" not in cell.metadata["tags"]:
            cell.metadata["tags"] = cell.metadata["tags"] + ["hide-input"]  # shown folded: the profile used
        cell.metadata.pop("papermill", None)
        cell.metadata.pop("execution", None)
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                errors.append(f"{out.get('ename')}: {out.get('evalue')}")
            if "application/vnd.jupyter.widget-view+json" in out.get("data", {}):
                out["data"].pop("application/vnd.jupyter.widget-view+json")
            plain = out.get("data", {}).get("text/plain")
            if isinstance(plain, str) and _ADDRESS.match(plain):  # e.g. a Styler's repr beside its HTML
                out["data"]["text/plain"] = _ADDRESS.sub(r"<\1>", plain)
        # stderr (warnings) and progress bars (carriage returns) from model loading are not part of the chapter
        if cell.cell_type == "code":  # (markdown cells have no outputs field: adding one breaks nbformat)
            cell["outputs"] = [o for o in cell.outputs if not (
                o.get("output_type") == "stream" and (o.get("name") == "stderr" or "\r" in o.get("text", "")))]
    nbformat.write(nb, path)
    return errors


def execute_book(profile: str = "default", force: bool = False, book_dir: Path | None = None,
                 results_dir: Path | None = None, only: Sequence[str] | None = None,
                 workdir: Path | None = None) -> dict[str, float]:
    """Execute every chapter whose inputs changed into ``book_dir``. Returns wall seconds per executed chapter.

    ``only`` limits the build to these chapters (plus the summary pages, which follow any executed page); the
    other pages keep their last execution, stale or not, until a build without ``only``. ``workdir`` is the
    kernels' working directory (default: the repository); the chapters get their folders relative to it.

    Raises:
        ParameterError: ``only`` names an unknown chapter.
    """
    unknown = sorted(set(only or ()) - set(CHAPTERS))
    if unknown:
        raise ParameterError(f"Unknown chapter(s) {', '.join(unknown)}: choose from {', '.join(CHAPTERS)}.")
    book_dir = book_dir or REPO_ROOT / "book"
    results_dir = results_dir or REPO_ROOT / "results"
    env = {"LMDEPTH_PROGRESS": "0",  # inherited by the kernels: no carriage-return progress in outputs
           "LMDEPTH_BOOK_BUILD": "1"}  # the explorer shows its static example instead of a live widget
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        times = _execute_all(profile, force, book_dir, results_dir, only, workdir or REPO_ROOT)
        write_findings_summary(book_dir, results_dir, profile)
        return times
    finally:  # do not leak the build's settings into the caller (e.g. later tests in the same process)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _execute_all(profile: str, force: bool, book_dir: Path, results_dir: Path, only: Sequence[str] | None,
                 workdir: Path) -> dict[str, float]:
    times: dict[str, float] = {}
    for i, chapter in enumerate(execution_order(), 1):
        out = book_dir / f"{CHAPTERS[chapter]}.ipynb"
        record_root = book_record_root(results_dir, profile)
        if only and chapter not in only and not (chapter in SUMMARY_PAGES and times):
            check_recorded(record_root, [chapter])  # its page stays, and the summary pages read its runs
            check_verdicts(record_root, [chapter])
            print(f"[{i}/{len(CHAPTERS)}] {chapter}: not selected (kept as it is)", flush=True)
            continue
        digest = build_hash(chapter, profile, record_root)
        # pages that summarise the others are stale whenever another page was executed in this build
        stale_summary = chapter in SUMMARY_PAGES and bool(times)
        if out.exists() and not force and not stale_summary:
            meta = nbformat.read(out, as_version=4).metadata.get("lmdepth", {})
            recorded = chapter not in RECORDED_CHAPTERS or (record_root / chapter).is_dir()
            if meta.get("build_hash") == digest and meta.get("profile") == profile and recorded:
                check_recorded(record_root, [chapter])  # a page is up to date only if the runs it shows are intact
                check_verdicts(record_root, [chapter])  # … and its verdicts are the ones it wrote
                print(f"[{i}/{len(CHAPTERS)}] {chapter}: up to date", flush=True)
                clean_notebook(out, repository_url())  # a changed repository.url needs no re-execution
                continue
            if not recorded:  # an execution interrupted before its record landed: the page is not whole
                print(f"[{i}/{len(CHAPTERS)}] {chapter}: its book record is missing (an interrupted build?)",
                      flush=True)
        if chapter in SUMMARY_PAGES:  # the summary pages read every chapter's verdicts: whole, or no page
            check_verdicts(record_root)
        print(f"[{i}/{len(CHAPTERS)}] {chapter}: executing ({profile} profile) …", flush=True)
        t0 = time.time()
        # Relative to the kernel's cwd (the repository), so the published notebook names no local path.
        params = profile_params(profile, chapter)
        declared = declared_parameters(chapter)
        for name, path in (("results_dir", results_dir), ("book_dir", book_dir)):
            if name in declared:  # pages that read results or the other executed notebooks
                params[name] = os.path.relpath(path, workdir)
        # this execution's runs and claims replace the last one's only once it has finished (an interrupt leaves
        # the last page and its record as they were)
        staging = _staging(record_root, chapter)
        shutil.rmtree(staging, ignore_errors=True)  # an interrupted execution's
        os.environ[BOOK_RECORD_ENV] = str(staging.resolve())
        try:
            execute_chapter(chapter, params, out, cwd=workdir)
        finally:
            os.environ.pop(BOOK_RECORD_ENV, None)
        errors = clean_notebook(out, repository_url())
        if errors:
            out.rename(out.with_suffix(".failed.ipynb"))
            raise RuntimeError(f"{chapter}: executed notebook has error outputs: {errors}")
        # the page landed without its build hash (written below), so a kill from here on leaves it stale
        _publish_record(staging, record_root / chapter)
        nb = nbformat.read(out, as_version=4)
        # The results path is machine-specific; the book shows it relative to the repository.
        times[chapter] = time.time() - t0
        nb.metadata["lmdepth"] = {"build_hash": digest, "profile": profile, "wall_s": round(times[chapter], 1),
                                  "executed_at": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}
        nbformat.write(nb, out)
        out.with_suffix(".failed.ipynb").unlink(missing_ok=True)  # a failed attempt of an earlier build
        print(f"[{i}/{len(CHAPTERS)}] {chapter}: done in {times[chapter]:.0f} s", flush=True)
    return times


#: The introduction's picture, written beside ``findings.md`` (which shows it first). A PNG at twice the pixels: an
#: SVG's labels are laid out with vl-convert's font metrics and drawn with the browser's fonts, and the model-pair
#: labels then ran out of the picture on the left.
HEADLINE_PICTURE = "headline.png"


#: The answers per question (:func:`lmdepth.claims.answers.answers_table`), beside the chapters' verdict records.
ANSWERS_CSV = "answers.csv"


def write_findings_summary(book_dir: Path, results_dir: Path, profile: str) -> Path:
    """``<book_dir>/findings.md``: what this build found, included by the introduction — the headline as a picture
    (:data:`HEADLINE_PICTURE`, the findings page's bar), the answer per question, the states and the counts folded,
    then the paragraph with the counts — from the verdicts the chapters recorded for ``profile``; stops
    (:func:`check_verdicts`) where they are not whole. Beside it, the states in plain words
    (:data:`~lmdepth.claims.answers.STATES_FILE`, which the Method page includes too), and beside the verdicts the
    answers as a CSV (:data:`ANSWERS_CSV`)."""
    record_root = book_record_root(results_dir, profile)
    check_verdicts(record_root)
    verdicts = saved_verdicts(results_dir, profile)
    text = landing_md(verdicts, Path(profile).stem)
    atomic_write_text(book_dir / STATES_FILE, states_md(verdicts) + "\n")
    if len(verdicts):
        record_root.mkdir(parents=True, exist_ok=True)
        atomic_write_text(record_root / ANSWERS_CSV, answers_table(verdicts).to_csv(index=False))
    else:  # no answers of an earlier build beside no verdicts
        (record_root / ANSWERS_CSV).unlink(missing_ok=True)
    chart = headline_bar(verdicts) if len(verdicts) else None
    picture = book_dir / HEADLINE_PICTURE
    if chart is None:
        # no counted rows: no picture of an earlier build beside this text, unless git tracks it (the published one)
        tracked = git_tracked(book_dir)
        if tracked is not None and picture.name not in tracked:
            picture.unlink(missing_ok=True)
    else:
        import vl_convert as vlc  # the book extra's (the build renders with it); imported only where drawn

        png = vlc.vegalite_to_png(chart.to_json(), scale=2)
        atomic_write(picture, lambda tmp: tmp.write_bytes(png))
        text = (f"```{{figure}} {HEADLINE_PICTURE}\n:alt: The counted (claim × model) verdicts per state, one bar per "
                f"model or model pair\n:width: 100%\n\nThe headline: counted verdicts per state, per model (the "
                f"[findings page](90_across_models.ipynb) has each row).\n```\n\n{text}")
    out = book_dir / "findings.md"
    atomic_write_text(out, text + "\n")
    return out


def render_html(root: Path = REPO_ROOT, strict: bool = True) -> Path:
    """Run jupyter-book (1.x) on ``root``; the vega bundle ships through the lmdepth.charts.vega_offline extension."""
    cmd = [str(Path(sys.executable).with_name("jupyter-book")), "build", str(root), "--path-output", str(root)]
    if strict:
        cmd += ["-W", "-n", "--keep-going"]
    t0 = time.time()
    subprocess.run(cmd, check=True)
    print(f"HTML rendered in {time.time() - t0:.0f} s: {root / '_build' / 'html' / 'index.html'}", flush=True)
    return root / "_build" / "html" / "index.html"


def stage_book(target: Path) -> Path:
    """Copy the book's configuration and front matter to ``target`` (for builds outside the repository)."""
    for rel in BOOK_FILES:
        src = REPO_ROOT / rel
        if src.exists():
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target / rel)
    return target


def build_root(profile: str) -> Path:
    """Where a build with ``profile`` writes its pages (``book/``), results (``results/``) and HTML (``_build/html``):
    the repository itself for the default profile (the published book), else ``_build/profiles/<name>/``, so a
    build with any other profile never overwrites the published ``book/*.ipynb`` or ``results/``."""
    name = Path(profile).stem
    return REPO_ROOT if name == "default" else REPO_ROOT / "_build" / "profiles" / name


@contextlib.contextmanager
def one_build(root: Path) -> Iterator[None]:
    """Hold the build lock of ``root`` (``root/_build/.lmdepth-build.lock``; released when the process ends, however
    it ends): two builds of one book would stage into the same folders, so a second one stops in one line."""
    lock_path = root / "_build" / ".lmdepth-build.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LmDepthError(f"Another `lmdepth book` is building {root} now; wait for it to finish (its lock: "
                               f"{lock_path}).") from None
        yield


def build_book(profile: str = "default", force: bool = False, html: bool = True,
               only: Sequence[str] | None = None) -> None:
    """Execute the changed chapters of ``profile`` into :func:`build_root` and render its HTML there (one build of a
    root at a time: :func:`one_build`)."""
    with one_build(build_root(profile)):
        _build_book(profile, force, html, only)


def _build_book(profile: str, force: bool, html: bool, only: Sequence[str] | None) -> None:
    t0 = time.time()
    root = build_root(profile)
    if root != REPO_ROOT:
        stage_book(root)
        print(f"lmdepth: the {Path(profile).stem} profile builds into {root} (the published book/ is not touched)",
              flush=True)
    times = execute_book(profile=profile, force=force, only=only, book_dir=root / "book", results_dir=root / "results")
    if html:
        render_html(root)
    print(json.dumps({"executed_s": {k: round(v) for k, v in times.items()}, "total_s": round(time.time() - t0)}))
