"""The fault suite: what a careful user does to a results folder (corrupts it, interrupts it, cleans it, runs it
twice with other settings, mistypes a parameter) and what must hold. Each case failed on the code before it was
written, except where its docstring says it guards what already held. The Reproducibility page counts these cases
(:func:`lmdepth.book.faults.fault_summary`)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lmdepth.analyses.run import Job, per_unit
from lmdepth.errors import DataError, ParameterError
from lmdepth.params import ModelParams
from lmdepth.results import ROOT_MARKER, RUN_ID_ENV, RunStore, check_recorded, clean, damage, mark_root, slug

pytestmark = pytest.mark.unit

OLD = time.time() - 30 * 86400  # a month ago: older than every age limit of `clean`


def _files(d: Path) -> dict[str, bytes]:
    """Every file under ``d`` and its bytes (a run folder, or a partial checkpoint folder)."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _job(root: Path, use_cache: bool = True) -> Job:
    p = ModelParams(model_name="smollm2-135m", results_dir=root, use_cache=use_cache)
    return Job("toy", p, key={"n": 3})


def _compute(calls: list[str], fail_after: int | None = None, scale: float = 1.0):
    """A toy analysis: three units, each checkpointed; ``fail_after`` units then Ctrl-C."""

    def one(uid: str, x: int) -> dict[str, np.ndarray]:
        if fail_after is not None and len(calls) >= fail_after:
            raise KeyboardInterrupt
        calls.append(uid)
        return {"v": np.array([x * scale])}

    def compute(store: RunStore):
        items = per_unit(store, [(f"u{i}", i) for i in range(3)], one, desc="toy")
        table = pd.DataFrame({"unit": range(3), "value": [float(it["v"][0]) for it in items]})
        return table, {"parameters": {"n": 3}}, table.rename(columns={"value": "x"})

    return compute


# ---- clean removes only what the library wrote ------------------------------------------------------------------

PLANTED = [".venv/bin/python", ".env", ".gitignore", "sub/.env", "notes.txt", ".cache/x",
           "toy/smollm2-135m/.hidden-by-user",
           # a user's folders named exactly like the library's temporaries and checkpoints, without their markers
           "toy/smollm2-135m/0123456789abcdef.partial/mine.npz", "toy/smollm2-135m/.lmdepth-tmp-0123abcd/mine.txt",
           "toy/smollm2-135m/.0123456789abcdef-abcd_123/mine.txt", ".lmdepth-tmp-x.npz"]


def _plant(root: Path, planted: list[str] = PLANTED) -> list[Path]:
    out = []
    for rel in planted:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(rel)
        out.append(p)
    _age(root)
    return out


def _age(root: Path, when: float = OLD) -> None:
    """Every file and folder under ``root`` (itself included) last touched at ``when``."""
    for p in [root, *root.rglob("*")]:
        os.utime(p, (when, when), follow_symlinks=False)


def _leftovers(root: Path) -> tuple[RunStore, list[Path]]:
    """A finished run plus what killed processes leave: a run's temporary folder, an atomic write's temporary inside
    the checkpoints, and the marked checkpoint folder of a run that never finished (no finished run uses it)."""
    from lmdepth.results import temp_dir

    _job(root).execute(_compute([]))
    store = _job(root).store(_job(root).weights())
    orphan = RunStore(root, "toy", "smollm2-135m", {"n": 99})
    orphan.save_item("u0", {"v": np.zeros(1)})
    return store, [temp_dir(store.dir.parent, f"{store.key}-"), temp_dir(store.partial, "x-"), orphan.partial]


def test_clean_removes_only_marked_leftovers_that_no_finished_run_uses(tmp_path):
    root = tmp_path / "results"
    store, leftovers = _leftovers(root)
    planted = _plant(root)
    before = _files(root)
    assert set(clean(root, dry_run=True)) == {*leftovers}  # lists …
    assert _files(root) == before  # … and removes nothing
    assert set(clean(root)) == {*leftovers}
    assert all(p.read_text() == str(p.relative_to(root)) for p in planted)  # .venv, .env, look-alikes untouched
    assert _files(store.dir) == {k[len(f"{store.dir.relative_to(root)}/"):]: v for k, v in before.items()
                                 if k.startswith(f"{store.dir.relative_to(root)}/")}
    assert store.partial.is_dir() and store.load_item("u1") is not None  # the checkpoints the finished run uses


def test_age_alone_removes_nothing(tmp_path):
    """A checkpoint folder the finished run uses, and the look-alikes, stay at any age; a fresh temporary stays (a
    running process may be writing it)."""
    from lmdepth.results import temp_dir

    root = tmp_path / "results"
    _job(root).execute(_compute([]))
    _plant(root)
    _age(root, time.time() - 10 * 365 * 86400)
    fresh = temp_dir(root / "toy", "fresh-")
    before = _files(root)
    assert clean(root, partial_days=0) == [] and _files(root) == before and fresh.is_dir()


def test_clean_keeps_a_folder_whose_marker_names_another(tmp_path):
    """A marker copied along with a folder (or a run published with its temporary's marker) names another folder."""
    import shutil

    from lmdepth.results import temp_dir

    root = tmp_path / "results"
    mark_root(root)
    original, copy = temp_dir(root, "a-"), root / ".lmdepth-tmp-copy"
    shutil.copytree(original, copy)
    _age(root)
    assert clean(root) == [original] and copy.is_dir()


def test_clean_on_a_year_old_copy_of_the_stored_results_removes_nothing(tmp_path):
    """The issue's case: every stored run and its shared checkpoints, a year old, outside git."""
    import shutil

    from lmdepth.runtime import REPO_ROOT

    copy = tmp_path / "results"
    shutil.copytree(REPO_ROOT / "results", copy, symlinks=True)
    (copy / "toy" / "0123456789abcdef.partial").mkdir(parents=True)
    _age(copy, time.time() - 365 * 86400)
    before = _files(copy)
    assert len(before) > 1000 and any(".partial/" in k for k in before)
    assert clean(copy, partial_days=7, temp_hours=0) == [] and _files(copy) == before
    assert (copy / "toy" / "0123456789abcdef.partial").is_dir()


def _git(cwd: Path, *args: str) -> None:
    import subprocess

    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                   capture_output=True)


def test_clean_never_removes_what_git_tracks(tmp_path):
    import shutil

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    _git(tmp_path, "init", "-q")
    root = tmp_path / "results"
    store, leftovers = _leftovers(root)
    _git(tmp_path, "add", "-f", str(leftovers[0]), str(leftovers[2]))  # committed: part of the record now
    _git(tmp_path, "commit", "-q", "-m", "x")
    _age(root)
    assert clean(root) == [leftovers[1]]  # only the untracked one
    assert leftovers[0].is_dir() and leftovers[2].is_dir()


def test_clean_removes_nothing_in_a_work_tree_git_cannot_read(tmp_path, capsys):
    """A ``.git`` above the results and git unable to say what it tracks (not installed, or a broken repository):
    nothing is removed, and one line says why."""
    root = tmp_path / "results"
    _, leftovers = _leftovers(root)
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("not a repository")
    _age(root)
    assert clean(root) == [] and all(p.exists() for p in leftovers)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "git cannot be asked" in err


def test_clean_refuses_a_directory_that_is_not_a_results_root(tmp_path, capsys):
    from lmdepth.book.cli import main

    planted = _plant(tmp_path)
    with pytest.raises(ParameterError, match="not an lmdepth results root"):
        clean(tmp_path)
    assert main(["clean", "--results-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not an lmdepth results root" in err
    assert all(p.exists() for p in planted)


def test_the_cli_dry_run_lists_and_removes_nothing(tmp_path, capsys, monkeypatch):
    from lmdepth.book.cli import main
    from lmdepth.results import temp_dir

    monkeypatch.setenv("LMDEPTH_CACHE", str(tmp_path / "cache"))
    mark_root(tmp_path)
    left = temp_dir(tmp_path / "a", "x-")
    os.utime(left, (OLD, OLD))
    assert main(["clean", "--results-dir", str(tmp_path), "--dry-run"]) == 0
    assert f"would remove {left}" in capsys.readouterr().out and left.exists()
    assert main(["clean", "--results-dir", str(tmp_path)]) == 0
    assert f"removed {left}" in capsys.readouterr().out and not left.exists()


# ---- finished runs verify themselves ----------------------------------------------------------------------------

def _cut(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2])


def _drop_last_row(p: Path) -> None:  # still a valid CSV: only the recorded digest can tell
    p.write_text("".join(p.read_text().splitlines(keepends=True)[:-1]))


DAMAGE = {
    "table cut in half": ("table.csv", _cut),
    "table zero bytes": ("table.csv", lambda p: p.write_bytes(b"")),
    "table one row short": ("table.csv", _drop_last_row),
    "table missing": ("table.csv", Path.unlink),
    "units cut in half": ("units.csv", _cut),
    "meta cut in half": ("meta.json", _cut),
    "meta zero bytes": ("meta.json", lambda p: p.write_bytes(b"")),
    "meta not an object": ("meta.json", lambda p: p.write_text("[1, 2]")),
    # a valid sidecar with one number edited (a sample size that would flow into a page's text)
    "meta one value edited": ("meta.json", lambda p: p.write_text(p.read_text().replace('"n": 3', '"n": 4', 1))),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_finished_run_is_moved_aside_and_recomputed_to_the_same_bytes(case, tmp_path, capsys):
    name, hurt = DAMAGE[case]
    root = tmp_path / "results"
    first = _job(root).execute(_compute([]))
    tables = {n: (first.path / n).read_bytes() for n in ("table.csv", "units.csv")}
    hurt(first.path / name)
    calls: list[str] = []
    again = _job(root).execute(_compute(calls))
    err = capsys.readouterr().err
    assert not again.from_cache and "is damaged" in err and err.count("is damaged") == 1
    assert calls == []  # the units' checkpoints were intact: recomputing the run read them
    assert {n: (again.path / n).read_bytes() for n in tables} == tables
    aside = list(first.path.parent.glob(f"{first.path.name}.damaged-*"))
    assert len(aside) == 1  # kept for inspection, under a name `clean` leaves alone
    assert aside[0] not in clean(root, temp_hours=0, partial_days=0)
    assert _job(root).execute(_compute([])).from_cache  # and served from then on


def test_the_stored_book_results_are_sealed_and_intact():
    """Every finished run committed in results/ records its files' digests, and they match."""
    from lmdepth.runtime import REPO_ROOT

    runs = [m.parent for m in (REPO_ROOT / "results").rglob("meta.json") if (m.parent / "table.csv").exists()]
    assert runs and (REPO_ROOT / "results" / ROOT_MARKER).is_file()
    for run in runs:
        assert "files" in json.loads((run / "meta.json").read_text()), run
        assert damage(run) is None, run


def _book_record(tmp_path: Path) -> tuple[Path, Path]:
    from lmdepth.results import BOOK_RECORD_ENV

    root = tmp_path / "results"
    os.environ[BOOK_RECORD_ENV] = str(root / "book" / "default" / "norms")
    try:
        run = _job(root).execute(_compute([])).path
    finally:
        os.environ.pop(BOOK_RECORD_ENV)
    return root, run


@pytest.mark.parametrize("case", ["missing", "damaged"])
def test_the_book_refuses_a_missing_or_damaged_recorded_run_in_one_line(case, tmp_path, capsys):
    import shutil

    from lmdepth.analyses import atlas

    root, run = _book_record(tmp_path)
    check_recorded(root / "book" / "default")  # intact: passes
    shutil.rmtree(run) if case == "missing" else _cut(run / "table.csv")
    with pytest.raises(DataError, match=rf"toy/smollm2-135m/{run.name} \(chapter norms\) is {case}.*"
                                        r"git checkout -- .*lmdepth book --force --chapters norms"):
        check_recorded(root / "book" / "default")
    for c in atlas.RECORDED_CHAPTERS:  # a complete record otherwise: the summary pages stop too
        (root / "book" / "default" / c).mkdir(parents=True, exist_ok=True)
    with pytest.raises(DataError, match="chapter norms"):
        atlas.book_runs(root, "default")


def test_the_book_build_checks_the_pages_it_keeps(tmp_path, monkeypatch):
    """An up-to-date page whose recorded run was deleted is not 'up to date': the build stops naming the run."""
    from lmdepth.book import build

    root, run = _book_record(tmp_path)
    record, staging = root / "book" / "default" / "norms", tmp_path / "staging" / "norms"
    staging.parent.mkdir()
    os.rename(record, staging)
    build._publish_record(staging, record)  # with its manifest, as a finished execution leaves it
    book = tmp_path / "book"
    book.mkdir()
    monkeypatch.setattr(build, "CHAPTERS", {"norms": "01_residual_norms"})
    monkeypatch.setattr(build, "build_hash", lambda chapter, profile, record_root=None: "h")
    import nbformat

    nb = nbformat.v4.new_notebook(metadata={"lmdepth": {"build_hash": "h", "profile": "default"}})
    nbformat.write(nb, book / "01_residual_norms.ipynb")
    monkeypatch.setattr(build, "execute_chapter", lambda *a, **k: pytest.fail("must not execute"))
    assert build._execute_all("default", False, book, root, None, build.REPO_ROOT) == {}  # intact: up to date
    (run / "meta.json").unlink()
    with pytest.raises(DataError, match="is missing"):
        build._execute_all("default", False, book, root, None, build.REPO_ROOT)


def test_the_sidecar_records_its_own_digest(tmp_path):
    from lmdepth.results import META_DIGEST, meta_digest

    run = _job(tmp_path / "results").execute(_compute([])).path
    meta = json.loads((run / "meta.json").read_text())
    assert meta[META_DIGEST] == meta_digest(meta) and '"n": 3' in (run / "meta.json").read_text()
    (run / "meta.json").write_text(json.dumps({**meta, "parameters": {"n": 4}}, indent=2))
    assert "meta.json was changed" in damage(run)


# ---- publishing a run is one swap ----------------------------------------------------------------------------------

_STEPS = ("rename", "replace", "unlink", "rmdir")


def _killed_at(step: int, publish) -> int:
    """Run ``publish()`` in a child process that dies (``os._exit``, no handler runs) at its ``step``-th filesystem
    rename or removal; returns the child's exit status (0: it finished before that step)."""
    pid = os.fork()
    if pid == 0:  # the child: count the steps, die at the chosen one
        calls = [0]

        def dying(real):
            def step(*a, **k):
                calls[0] += 1
                if calls[0] == step_no:
                    os._exit(9)
                return real(*a, **k)
            return step

        step_no = step
        for name in _STEPS:
            setattr(os, name, dying(getattr(os, name)))
        try:
            publish()
        finally:
            os._exit(0)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _table(v: float) -> pd.DataFrame:
    return pd.DataFrame({"v": [v, v]})


def test_a_kill_at_any_step_of_replacing_a_run_leaves_the_old_or_the_new_run_whole(tmp_path):
    """``use_cache=False``'s replace of a finished run: killed at each step in turn, then opened again, the run's
    name holds the old or the new run, whole, and nothing is left beside it that `clean` does not recognise (but an
    empty folder, from a kill between removing a temporary's marker and the temporary)."""
    import shutil

    old_root = tmp_path / "old"
    RunStore(old_root, "a", "m", {"x": 1}).finalize(_table(1.0), {"p": 1})
    seen, step = set(), 1
    while True:
        root = tmp_path / f"r{step}"
        shutil.copytree(old_root, root)
        code = _killed_at(step, lambda: RunStore(root, "a", "m", {"x": 1}).finalize(_table(2.0), {"p": 2},
                                                                                    replace=True))
        store = RunStore(root, "a", "m", {"x": 1})  # the next start: completes an interrupted swap
        result = store.load_verified()
        assert result is not None and damage(store.dir) is None, step
        seen.add(result.table.v.iloc[0])
        clean(root, temp_hours=0)  # a temporary of a kill before the swap began is marked: `clean` knows it
        rest = [p for p in store.dir.parent.iterdir() if p != store.dir]
        assert all(p.is_dir() and not any(p.iterdir()) for p in rest), (step, rest)  # at most an empty folder
        if code == 0:
            break
        assert code == 9
        step += 1
    assert step > 4 and seen == {1.0, 2.0}  # several steps were cut, and both outcomes occurred
    assert result.table.v.iloc[0] == 2.0  # the last (not killed) publication landed


@pytest.mark.parametrize("step", [1, 2, 3, 4, 5])
def test_an_interrupt_inside_the_swap_still_lands_the_new_run(step, tmp_path, monkeypatch):
    """Ctrl-C (an exception, so handlers run) at a step of the swap: the run's name holds a whole run when the
    exception arrives, without waiting for a next start."""
    store = RunStore(tmp_path, "a", "m", {"x": 1})
    store.finalize(_table(1.0), {"p": 1})
    calls = [0]
    real = os.rename

    def interrupted(*a, **k):
        calls[0] += 1
        if calls[0] == step:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(os, "rename", interrupted)
    try:
        store.finalize(_table(2.0), {"p": 2}, replace=True)
    except KeyboardInterrupt:
        pass
    monkeypatch.setattr(os, "rename", real)
    assert damage(store.dir) is None and store.load().table.v.iloc[0] in (1.0, 2.0)


# ---- the findings are whole or not published ------------------------------------------------------------------------

def _page(book: Path, stem: str = "01_residual_norms") -> Path:
    import nbformat

    nb = nbformat.v4.new_notebook(metadata={"lmdepth": {"build_hash": "h", "profile": "default"}})
    nbformat.write(nb, book / f"{stem}.ipynb")
    return book / f"{stem}.ipynb"


def _one_chapter_build(tmp_path: Path, monkeypatch, execute) -> tuple[object, Path, Path]:
    """``build`` reduced to chapter norms (hash "h"), with ``execute`` standing in for papermill."""
    from lmdepth.book import build

    book, root = tmp_path / "book", tmp_path / "results"
    book.mkdir()
    monkeypatch.setattr(build, "CHAPTERS", {"norms": "01_residual_norms"})
    monkeypatch.setattr(build, "build_hash", lambda chapter, profile, record_root=None: "h")
    monkeypatch.setattr(build, "clean_notebook", lambda out, url=None: [])
    monkeypatch.setattr(build, "repository_url", lambda: "")
    monkeypatch.setattr(build, "execute_chapter", execute)
    return build, book, root


def _chapter_writes(verdict: str, interrupt: bool = False):
    """A chapter execution: its verdicts into the record it is given, then its page (or Ctrl-C before the page)."""
    from lmdepth.results import BOOK_RECORD_ENV

    def execute(chapter, params, out, **k):
        record = Path(os.environ[BOOK_RECORD_ENV])
        (record / "verdicts").mkdir(parents=True)
        (record / "verdicts" / "smollm2-135m.csv").write_text(verdict)
        if interrupt:
            raise KeyboardInterrupt
        _page(out.parent)

    return execute


def test_an_interrupted_chapter_leaves_its_last_page_and_record_in_place(tmp_path, monkeypatch):
    build, book, root = _one_chapter_build(tmp_path, monkeypatch, _chapter_writes("claim,state\nnorms.a,supported\n"))
    build._execute_all("default", True, book, root, None, build.REPO_ROOT)
    record = root / "book" / "default" / "norms"
    before, page = _files(record), (book / "01_residual_norms.ipynb").read_bytes()
    assert "manifest.json" in before and "verdicts/smollm2-135m.csv" in before
    monkeypatch.setattr(build, "execute_chapter", _chapter_writes("claim,state\n", interrupt=True))
    with pytest.raises(KeyboardInterrupt):
        build._execute_all("default", True, book, root, None, build.REPO_ROOT)
    assert _files(record) == before and (book / "01_residual_norms.ipynb").read_bytes() == page
    assert [p.name for p in (root / "book" / "default").iterdir()] == ["norms"]  # the half record is not among them
    assert build._execute_all("default", False, book, root, None, build.REPO_ROOT) == {}  # and the page is whole: up to date


def test_a_page_whose_record_is_missing_is_executed_again(tmp_path, monkeypatch):
    """The record of an execution interrupted under the old build (deleted first, never written) made every page
    report "up to date" while the findings lost the chapter."""
    executed = []

    def execute(chapter, params, out, **k):
        executed.append(chapter)
        _chapter_writes("claim,state\n")(chapter, params, out)

    build, book, root = _one_chapter_build(tmp_path, monkeypatch, execute)
    _page(book)
    build._execute_all("default", False, book, root, None, build.REPO_ROOT)
    assert executed == ["norms"] and (root / "book" / "default" / "norms" / "manifest.json").is_file()


@pytest.mark.parametrize("hurt", ["deleted", "edited", "added"])
def test_the_findings_stop_in_one_line_when_a_verdict_file_is_not_whole(hurt, tmp_path, monkeypatch):
    build, book, root = _one_chapter_build(tmp_path, monkeypatch, _chapter_writes("claim,state\nnorms.a,supported\n"))
    build._execute_all("default", True, book, root, None, build.REPO_ROOT)
    verdicts = root / "book" / "default" / "norms" / "verdicts"
    {"deleted": lambda: (verdicts / "smollm2-135m.csv").unlink(),
     "edited": lambda: (verdicts / "smollm2-135m.csv").write_text("claim,state\nnorms.a,refuted\n"),
     "added": lambda: (verdicts / "gemma3-270m.csv").write_text("claim,state\n")}[hurt]()
    with pytest.raises(DataError, match=r"record of chapter norms is not whole: .*(missing|changed|not written)"
                                        r".*lmdepth book --force --chapters norms") as e:
        build.write_findings_summary(book, root, "default")
    assert "\n" not in str(e.value) and not (book / "findings.md").exists()
    with pytest.raises(DataError, match="chapter norms"):  # the page that shows them is not "up to date" either
        build._execute_all("default", False, book, root, None, build.REPO_ROOT)


def test_a_chapter_without_its_manifest_stops_the_build_in_one_line(tmp_path, monkeypatch):
    """The manifest deleted together with one of the verdict files it lists: the chapter was left unchecked, the build
    exited 0 and the findings lost that file's rows."""
    build, book, root = _one_chapter_build(tmp_path, monkeypatch, _chapter_writes("claim,state\nnorms.a,supported\n"))
    build._execute_all("default", True, book, root, None, build.REPO_ROOT)
    record = root / "book" / "default" / "norms"
    (record / "manifest.json").unlink()
    (record / "verdicts" / "smollm2-135m.csv").unlink()
    match = r"record of chapter norms is not whole: .*norms/manifest.json is missing.*lmdepth book --force --chapters norms"
    with pytest.raises(DataError, match=match) as e:
        build.write_findings_summary(book, root, "default")
    assert "\n" not in str(e.value) and not (book / "findings.md").exists()
    with pytest.raises(DataError, match=match):  # nor is its page "up to date"
        build._execute_all("default", False, book, root, None, build.REPO_ROOT)


def test_a_run_cut_from_a_chapters_record_is_still_checked(tmp_path, monkeypatch):
    """A page's run deleted together with its line of the record (runs.jsonl): the record check read that list only,
    so the page stayed "up to date" with a run it shows gone."""
    import shutil

    from lmdepth.results import RECORD_RUNS

    used = []

    def execute(chapter, params, out, **k):  # a chapter that reads one run (recorded as a chapter's kernel does)
        used.append(_job(root).execute(_compute([])).path)
        _page(out.parent)

    build, book, root = _one_chapter_build(tmp_path, monkeypatch, execute)
    build._execute_all("default", True, book, root, None, build.REPO_ROOT)
    runs = root / "book" / "default" / "norms" / RECORD_RUNS
    assert used and runs.read_text() and build._execute_all("default", False, book, root, None, build.REPO_ROOT) == {}
    shutil.rmtree(used[0])
    runs.write_text("")
    with pytest.raises(DataError, match=r"record of chapter norms is not whole: .*runs.jsonl was changed after"):
        build._execute_all("default", False, book, root, None, build.REPO_ROOT)


def test_the_atlas_leaves_out_a_run_whose_sidecar_was_edited(tmp_path, capsys):
    """An edited sample size in a run's sidecar (the atlas shows the sample beside every number): it was shown as the
    run's, e.g. "200 gsm8k problems" for a 2-problem run."""
    from lmdepth.analyses import atlas

    root = tmp_path / "results"
    run = _job(root).execute(_compute([])).path
    assert [r.path for r in atlas.finished_runs(root, "toy")] == [run]
    meta = json.loads((run / "meta.json").read_text())
    (run / "meta.json").write_text(json.dumps({**meta, "parameters": {"n": 300}}))
    capsys.readouterr()
    assert atlas.finished_runs(root, "toy") == []
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and f"the atlas leaves out {run}" in err[0] and "digest does not match" in err[0], err


# ---- recompute never destroys before it replaces ------------------------------------------------------------------

def test_an_interrupted_use_cache_false_run_leaves_the_previous_run_byte_identical(tmp_path):
    root = tmp_path / "results"
    first = _job(root).execute(_compute([]))
    store = _job(root).store(_job(root).weights())
    run_before, ckpt_before = _files(first.path), _files(store.partial)
    calls: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        _job(root, use_cache=False).execute(_compute(calls, fail_after=2, scale=2.0))
    assert calls == ["u0", "u1"]  # it did recompute (no checkpoint was read) …
    assert _files(first.path) == run_before and _files(store.partial) == ckpt_before  # … and changed nothing
    assert sorted(p.name for p in first.path.parent.iterdir()) == sorted([first.path.name, store.partial.name])
    assert _job(root).execute(_compute([])).from_cache


def test_a_finished_use_cache_false_run_replaces_the_run_and_its_checkpoints(tmp_path):
    """Guards what already held (now through the computed-aside path): the new run and checkpoints replace the old."""
    root = tmp_path / "results"
    first = _job(root).execute(_compute([]))
    calls: list[str] = []
    again = _job(root, use_cache=False).execute(_compute(calls, scale=2.0))
    assert calls == ["u0", "u1", "u2"] and again.path == first.path
    assert again.table.value.tolist() == [0.0, 2.0, 4.0]
    served = _job(root).execute(_compute([]))
    assert served.from_cache and served.table.value.tolist() == [0.0, 2.0, 4.0]
    store = _job(root).store(_job(root).weights())
    assert [float(store.load_item(f"u{i}")["v"][0]) for i in range(3)] == [0.0, 2.0, 4.0]
    assert sorted(p.name for p in first.path.parent.iterdir()) == sorted([first.path.name, store.partial.name])


def test_the_interrupt_message_says_what_is_true_for_use_cache_false(tmp_path, capsys, monkeypatch):
    from lmdepth.book import cli

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "execute_chapter", interrupted)
    assert cli.main(["run", "norms", "-p", "use_cache", "false", "--results-dir", str(tmp_path)]) == 130
    err = capsys.readouterr().err
    assert "previous finished run and its checkpoints are as they were" in err and "to resume" not in err


# ---- every run keeps its own record ------------------------------------------------------------------------------

def test_runs_with_other_settings_keep_their_own_notebook_and_verdicts(tmp_path, monkeypatch):
    from lmdepth.book import cli
    from lmdepth.claims import report

    written = []

    def fake(chapter, params, out, **k):  # what the chapter's last cell does, without a kernel
        written.append(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(params))
        rows = pd.DataFrame([{"model": "smollm2-135m", "claim_id": "norms.second_half_less",
                              "estimate": params["n_examples"]}])
        report.save(rows, chapter, params["results_dir"])

    monkeypatch.setattr(cli, "execute_chapter", fake)
    for n in (5, 7, 5):
        assert cli.main(["run", "norms", "-p", "n_examples", str(n), "--results-dir", str(tmp_path)]) == 0
    assert written[0] == written[2] != written[1]  # the same settings: the same record; others: their own
    notebooks = sorted((tmp_path / "notebooks").glob("norms-smollm2-135m-*.ipynb"))
    verdicts = sorted((tmp_path / "verdicts" / "norms").glob("smollm2-135m-*.csv"))
    assert len(notebooks) == 2 and len(verdicts) == 2
    assert sorted(pd.read_csv(v).estimate.item() for v in verdicts) == [5, 7]
    assert sorted(json.loads(p.read_text())["n_examples"] for p in notebooks) == [5, 7]
    assert RUN_ID_ENV not in os.environ


# ---- the small edges ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [-1, 2**32])
def test_seed_out_of_range_is_one_line_before_any_kernel(seed, tmp_path):
    from lmdepth.book.chapters import check_parameters

    with pytest.raises(ParameterError, match="'seed' must be between 0 and 4294967295"):
        ModelParams(seed=seed)
    with pytest.raises(ParameterError, match="'seed'"):
        check_parameters("norms", {"seed": seed})


@pytest.mark.parametrize("profile, message", [
    ("common: {n_exmaples: 5}\n", "no chapter has the parameter"),
    ("chapters: {normz: {n_examples: 5}}\n", "unknown chapter"),
    ("chapters: {norms: {n_exmaples: 5}}\n", "chapter 'norms' has no parameter"),
    ("common: [n_examples]\n", "must be mappings"),
])
def test_every_key_of_a_profile_means_something(profile, message, tmp_path):
    from lmdepth.book.chapters import profile_params

    path = tmp_path / "mine.yaml"
    path.write_text(profile)
    with pytest.raises(ParameterError, match=message):
        profile_params(str(path), "cosine")


def test_the_shipped_profiles_pass_the_profile_check():
    """Guards what already held: every key of the four profiles is a parameter of some chapter."""
    from lmdepth.book.chapters import CHAPTERS, PROFILES, profile_params

    for profile in PROFILES:
        for chapter in CHAPTERS:
            profile_params(profile, chapter)


def test_a_directory_named_like_a_data_file_is_one_line(tmp_path):
    from lmdepth.data.datasets import dataset_id, load_examples

    (tmp_path / "x.jsonl").mkdir()
    for call in (lambda: load_examples(str(tmp_path / "x.jsonl"), 1), lambda: dataset_id(str(tmp_path / "x.jsonl"))):
        with pytest.raises(DataError, match="is a directory, not a file"):
            call()


@pytest.mark.parametrize("value", ["/data/runs #3/mine.jsonl", "a: b.jsonl", "'quoted #1'"])
def test_string_parameters_are_taken_as_typed(value, tmp_path, monkeypatch):
    """A ``#`` or ``: `` in a path failed before; a quoted value (the old advice) guards what already held."""
    from lmdepth.book import cli

    seen = {}
    monkeypatch.setattr(cli, "check_parameters", lambda chapter, params: params)  # the files need not exist here
    monkeypatch.setattr(cli, "execute_chapter", lambda chapter, params, out, **k: seen.update(params))
    assert cli.main(["run", "norms", "-p", "dataset", value, "--results-dir", str(tmp_path)]) == 0
    assert seen["dataset"] == (value[1:-1] if value.startswith("'") else value)


@pytest.mark.parametrize("name", ["..", ".", "../..", ".hidden", "/", "a/../.."])
def test_a_model_name_is_filed_under_its_analysis(name, tmp_path):
    """``..``, ``.``, ``../..`` and ``.hidden`` failed before; ``/`` and ``a/../..`` guard what already held."""
    store = RunStore(tmp_path, "toy", name, {})
    assert store.dir.resolve().parent.parent == (tmp_path / "toy").resolve()
    assert not slug(name).startswith(".")


def test_a_same_size_edit_with_the_mtime_restored_is_seen(tmp_path, monkeypatch):
    from lmdepth.model.registry import dir_fingerprint

    monkeypatch.setenv("LMDEPTH_CACHE", str(tmp_path / "cache"))
    d = tmp_path / "model"
    d.mkdir()
    w = d / "model.safetensors"
    w.write_bytes(b"\x00" * 64)
    before = dir_fingerprint(d)
    st = w.stat()
    time.sleep(0.01)
    w.write_bytes(b"\x01" + b"\x00" * 63)  # same size …
    os.utime(w, ns=(st.st_atime_ns, st.st_mtime_ns))  # … and the old modification time
    assert w.stat().st_size == st.st_size and w.stat().st_mtime_ns == st.st_mtime_ns
    assert dir_fingerprint(d) != before


def test_a_training_run_that_finishes_outside_the_book_re_executes_chapter_07_only(tmp_path, monkeypatch):
    """Chapter 07's comparison runs are trained by a script, not the book: a finished one must make the stored page
    stale (else the book keeps serving verdicts without it); a checkpoint of an unfinished one must not."""
    from lmdepth.book import build

    monkeypatch.setattr(build, "REPO_ROOT", tmp_path)
    from lmdepth.book.chapters import CHAPTERS

    keys = list(CHAPTERS)
    before = {c: build.build_hash(c, "default") for c in keys}
    run = tmp_path / "checkpoints" / "dm_math" / "moeut-lm-0123456789ab"
    run.mkdir(parents=True)
    (run / "ckpt.pt").write_bytes(b"step 500")
    assert build.build_hash("moeut", "default") == before["moeut"]
    (run / "model.pt").write_bytes(b"weights")
    (run / "meta.json").write_text('{"steps": 16000}')
    after = {c: build.build_hash(c, "default") for c in keys}
    assert [c for c in keys if after[c] != before[c]] == ["moeut"]
    # a fine-tuning run's snapshot (its depth over training, drawn by the chapter) does the same; its checkpoint not
    ft = tmp_path / "checkpoints" / "dm_math_ft" / "smollm2-135m-ft-0123456789ab"
    ft.mkdir(parents=True)
    (ft / "ckpt.pt").write_bytes(b"step 100")
    assert build.build_hash("moeut", "default") == after["moeut"]
    (ft / "snapshot-00100.npz").write_bytes(b"snapshot")
    assert [c for c in keys if build.build_hash(c, "default") != after[c]] == ["moeut"]


# ---- one line, then nothing lost -----------------------------------------------------------------------------------

def _run_refused(tmp_path, monkeypatch, capsys, *argv: str, results: Path | None = None) -> str:
    """``lmdepth run norms ARGV`` must stop with exit 2 and one line before a kernel starts and before anything is
    written to its results folder; returns that line."""
    from lmdepth.book import chapters, cli

    monkeypatch.setattr(chapters, "require_kernel", lambda: pytest.fail("a kernel was about to start"))
    results = results or tmp_path / "res"
    args = ["run", "norms", *argv]
    if "--results-dir" not in argv:
        args += ["--results-dir", str(results)]
    capsys.readouterr()
    assert cli.main(args) == 2
    lines = capsys.readouterr().err.splitlines()
    errors = [line for line in lines if line.startswith("lmdepth: error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0] and not any("Traceback" in x for x in lines), lines
    assert not any(x.startswith("lmdepth: running") for x in lines)
    err = errors[0] + "\n"
    assert not results.exists()
    return err


def test_a_lone_surrogate_in_a_prompt_is_one_line_naming_file_and_line(tmp_path, monkeypatch, capsys):
    data = tmp_path / "mine.jsonl"
    data.write_text('{"text": "fine"}\n{"text": "half a pair: \\ud83d here"}\n')
    err = _run_refused(tmp_path, monkeypatch, capsys, "-p", "dataset", str(data))
    assert f"{data}:2" in err and "\\ud83d" in err and "fix or delete" in err


def test_a_lone_surrogate_never_reaches_the_tokenizer():
    from types import SimpleNamespace

    from lmdepth.model.registry import LoadedModel

    lm = SimpleNamespace(tokenizer=lambda *a, **k: pytest.fail("tokenized"))
    with pytest.raises(DataError, match=r"problem gsm8k/3 holds \\udc80, half of a UTF-16"):
        LoadedModel.encode(lm, "ok \udc80", label="problem gsm8k/3")


def test_a_lone_surrogate_in_a_prompt_parameter_is_one_line_before_any_kernel(tmp_path, monkeypatch, capsys):
    """``-p prompt`` with half of a UTF-16 pair (or bytes that are not UTF-8, as a shell passes them): the notebook's
    write failed with a UnicodeEncodeError traceback, in `lmdepth run explorer` and in `lmdepth explore` (whose
    temporary folder is removed all the same)."""
    import socket
    import tempfile

    from lmdepth.book import chapters, cli, explore_app, explore_server
    from lmdepth.results import TMP_PREFIX

    monkeypatch.setattr(chapters, "require_kernel", lambda: pytest.fail("a kernel was about to start"))
    monkeypatch.setattr(explore_app, "require_voila", lambda: None)
    monkeypatch.setenv("LMDEPTH_CACHE", str(tmp_path / "cache"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    made = lambda: set(Path(tempfile.gettempdir()).glob(f"{TMP_PREFIX}{explore_server.FOLDER_LABEL}*"))  # noqa: E731
    before = made()
    for argv in (["run", "explorer", "--results-dir", str(tmp_path / "res")], ["explore", "--port", str(port)]):
        capsys.readouterr()
        assert cli.main([*argv, "-p", "prompt", "two plus \udced\udca0 is"]) == 2, argv
        errors = [x for x in capsys.readouterr().err.splitlines() if x.startswith("lmdepth: error: ")]
        assert len(errors) == 1 and "Parameter 'prompt' of chapter 'explorer' holds \\udced at character 9" in \
            errors[0], errors
    assert made() == before and not (tmp_path / "res").exists()


def test_a_pipe_as_data_file_is_one_line(tmp_path, monkeypatch, capsys):
    """``-p dataset <(cat f.jsonl)``: the shell passes /dev/fd/N, a pipe (it said "is a directory" before)."""
    r, w = os.pipe()
    try:
        err = _run_refused(tmp_path, monkeypatch, capsys, "-p", "dataset", f"/dev/fd/{r}")
    finally:
        os.close(r)
        os.close(w)
    assert f"/dev/fd/{r} is a pipe" in err and "Write it to a file first" in err and "directory" not in err


def test_an_unwritable_model_cache_names_lmdepth_cache(tmp_path, monkeypatch, capsys):
    """A read-only home on a first run (simulated by a home under a file: the tests may run as root, whom a
    read-only mode does not stop)."""
    (tmp_path / "home").write_text("a file")
    monkeypatch.delenv("LMDEPTH_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home" / "me"))
    err = _run_refused(tmp_path, monkeypatch, capsys)
    assert f"{tmp_path / 'home' / 'me' / '.cache' / 'lmdepth'} cannot be written" in err and "LMDEPTH_CACHE" in err


def test_a_read_only_model_cache_that_holds_the_converted_model_is_used(tmp_path, monkeypatch, capsys):
    """A shared or read-only cache with SmolLM2 converted in it: `lmdepth run` refused it as unwritable (it worked
    before), and a copy converted by an older version (no fingerprint in its record) failed on the record's update.
    Read-only is simulated (the tests may run as root, whom a mode does not stop): no write there succeeds."""
    from lmdepth.book import cli
    from lmdepth.model import registry

    cache = tmp_path / "cache"
    monkeypatch.setenv("LMDEPTH_CACHE", str(cache))
    spec = registry.PACKAGED["smollm2-135m"]
    target = registry.converted_dir(spec)
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    (target / registry.SOURCE_FILE).write_text(json.dumps({"name": spec.name}))  # converted before fingerprints
    before = _files(cache)
    real_access, real_write = os.access, registry.atomic_write_text

    def refused(path, *a, **k):
        if Path(path).is_relative_to(cache):
            raise PermissionError(13, "Permission denied", str(path))
        return real_write(path, *a, **k)

    monkeypatch.setattr(os, "access", lambda p, mode, **k: not Path(p).is_relative_to(cache) and real_access(p, mode))
    monkeypatch.setattr(registry, "atomic_write_text", refused)
    assert registry._packaged_dir(spec) == target
    seen = []
    monkeypatch.setattr(cli, "execute_chapter", lambda chapter, params, out, **kw: seen.append(params["model_name"]))
    assert cli.main(["run", "norms", "--model", "smollm2-135m", "--results-dir", str(tmp_path / "res")]) == 0
    assert seen == ["smollm2-135m"] and _files(cache) == before  # used, and nothing written there
    err = _run_refused(tmp_path, monkeypatch, capsys, "--model", "gemma3-270m")  # one it would have to convert
    assert f"{cache} cannot be written" in err and "LMDEPTH_CACHE" in err


def test_a_cut_weights_file_is_named(tmp_path, monkeypatch, capsys):
    from lmdepth.model.registry import load_model
    from lmdepth.testing import save_tiny_model

    monkeypatch.setenv("LMDEPTH_CACHE", str(tmp_path / "cache"))
    model = save_tiny_model("llama", tmp_path / "model")
    weights = model / "model.safetensors"
    _cut(weights)
    err = _run_refused(tmp_path, monkeypatch, capsys, "--model", str(model))
    assert f"{weights} cannot be read" in err and "Copy it again" in err
    with pytest.raises(DataError, match="model.safetensors cannot be read"):
        load_model(str(model))


def test_a_cut_source_record_in_the_model_cache_is_converted_again(tmp_path, monkeypatch, capsys):
    """``lmdepth_source.json`` cut in the converted copy of a packaged model (a JSONDecodeError on every run before,
    until the folder was deleted by hand): one line naming it, and the copy is made again."""
    from lmdepth.model import registry

    monkeypatch.setenv("LMDEPTH_CACHE", str(tmp_path / "cache"))
    spec = registry.PACKAGED["smollm2-135m"]
    target = tmp_path / "cache" / "models" / f"{spec.name}-{spec.sha256[:12]}"
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    (target / registry.SOURCE_FILE).write_text('{"name": "smollm2-135m", "gguf_sha')  # cut

    def convert(spec, target):  # what a conversion leaves: the files and their record
        target.mkdir()
        (target / "config.json").write_text("{}")
        (target / registry.SOURCE_FILE).write_text(json.dumps({"fingerprint": registry.dir_fingerprint(target)}))

    monkeypatch.setattr(registry, "_convert_gguf", convert)
    assert registry._packaged_dir(spec) == target
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{target / registry.SOURCE_FILE} cannot be read" in err
    assert json.loads((target / registry.SOURCE_FILE).read_text())["fingerprint"]
    assert registry._packaged_dir(spec) == target and capsys.readouterr().err == ""  # verified from then on


@pytest.mark.parametrize("where", ["/", "home", "repository", "link to /"])
def test_a_results_folder_that_is_root_home_or_the_repository_is_refused(where, tmp_path, monkeypatch, capsys):
    from lmdepth.runtime import REPO_ROOT

    monkeypatch.setenv("LMDEPTH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "me"))
    (tmp_path / "me").mkdir()
    path = {"/": Path("/"), "home": tmp_path / "me", "repository": REPO_ROOT, "link to /": tmp_path / "link"}[where]
    if where == "link to /":
        path.symlink_to("/")
    before = sorted(p.name for p in path.iterdir())
    err = _run_refused(tmp_path, monkeypatch, capsys, "--results-dir", str(path), results=tmp_path / "none")
    assert "Parameter 'results_dir'" in err and "a folder of their own" in err
    assert sorted(p.name for p in path.iterdir()) == before  # nothing written there


def test_a_disk_filling_while_the_notebook_is_written_is_one_line_and_keeps_no_cut_notebook(tmp_path, monkeypatch,
                                                                                             capsys):
    import errno

    import papermill

    from lmdepth.book import cli

    def fill(src, out, **kw):  # papermill writes the notebook as it executes: the disk fills half way
        Path(out).write_text('{"cells": [')
        raise OSError(errno.ENOSPC, "No space left on device", out)

    monkeypatch.setattr(papermill, "execute_notebook", fill)
    capsys.readouterr()
    assert cli.main(["run", "norms", "-p", "n_examples", "1", "--results-dir", str(tmp_path / "res")]) == 2
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("lmdepth: error: ")]
    assert len(lines) == 1 and "The disk filled while the executed notebook" in lines[0] and "free space" in lines[0]
    assert not list((tmp_path / "res").rglob("*.ipynb"))  # neither a cut notebook nor a finished-looking one


# ---- the count on the Reproducibility page ------------------------------------------------------------------------

def test_the_page_counts_the_cases_pytest_collects():
    """The page's static count equals pytest's own collection of this file."""
    import subprocess
    import sys

    from lmdepth.book.faults import fault_cases, fault_summary

    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", __file__],
                         capture_output=True, text=True, timeout=120).stdout
    collected = sum(1 for line in out.splitlines() if "::" in line)
    cases = fault_cases(__file__)
    assert collected > 30 and sum(cases.values()) == collected
    assert cases["finished runs verify themselves"] == len(DAMAGE) + 5
    assert f"{collected} cases" in fault_summary(__file__)
