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

PLANTED = [".git/HEAD", ".git/objects/ab/cdef", ".venv/bin/python", ".env", ".gitignore", "sub/.env", "notes.txt",
           ".cache/x", "toy/smollm2-135m/.hidden-by-user"]


def _plant(root: Path) -> list[Path]:
    out = []
    for rel in PLANTED:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(rel)
        out.append(p)
    for p in [*out, *(q for q in root.rglob("*") if q.is_dir())]:
        os.utime(p, (OLD, OLD))
    return out


def test_clean_leaves_a_planted_repository_alone_and_removes_only_its_own_leftovers(tmp_path):
    root = tmp_path / "results"
    _job(root).execute(_compute([]))
    planted = _plant(root)
    store = _job(root).store(_job(root).weights())
    leftovers = [store.dir.parent / ".lmdepth-tmp-0123abcd", store.dir.parent / ".0123456789abcdef-abcd_123",
                 store.partial / ".lmdepth-tmp-x.npz"]
    leftovers[0].mkdir()
    leftovers[1].mkdir()
    leftovers[2].write_bytes(b"")
    for p in [*leftovers, store.partial]:
        os.utime(p, (OLD, OLD))
    before = _files(store.dir)
    assert set(clean(root, dry_run=True)) == {*leftovers[:2], store.partial}  # lists …
    assert all(p.exists() for p in leftovers)  # … and removes nothing
    removed = clean(root, partial_days=7)
    assert set(removed) == {*leftovers[:2], store.partial}  # the old partial folder, with its temporary inside
    assert all(p.read_text() == str(p.relative_to(root)) for p in planted)  # .git, .venv, .env … untouched
    assert _files(store.dir) == before


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

    monkeypatch.setenv("LMDEPTH_CACHE", str(tmp_path / "cache"))
    mark_root(tmp_path)
    left = tmp_path / "a" / ".lmdepth-tmp-x"
    left.mkdir(parents=True)
    os.utime(left, (OLD, OLD))
    assert main(["clean", "--results-dir", str(tmp_path), "--dry-run"]) == 0
    assert f"would remove {left}" in capsys.readouterr().out and left.exists()


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
    book = tmp_path / "book"
    book.mkdir()
    monkeypatch.setattr(build, "CHAPTERS", {"norms": "01_residual_norms"})
    monkeypatch.setattr(build, "build_hash", lambda chapter, profile: "h")
    import nbformat

    nb = nbformat.v4.new_notebook(metadata={"lmdepth": {"build_hash": "h", "profile": "default"}})
    nbformat.write(nb, book / "01_residual_norms.ipynb")
    monkeypatch.setattr(build, "execute_chapter", lambda *a, **k: pytest.fail("must not execute"))
    assert build._execute_all("default", False, book, root, None) == {}  # intact: up to date
    (run / "meta.json").unlink()
    with pytest.raises(DataError, match="is missing"):
        build._execute_all("default", False, book, root, None)


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
    assert cases["finished runs verify themselves"] == len(DAMAGE) + 4
    assert f"{collected} cases" in fault_summary(__file__)
