"""Results that cannot lie: a cached result is served only for the inputs it was computed from."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from lmdepth.analyses import residual
from lmdepth.model import registry
from lmdepth.testing import save_tiny_model, tiny_model


def _mean(r, layer: int = 1) -> float:
    t = r.table
    row = t[(t.metric == "relative_contribution") & (t.component == "layer") & (t.stat == "mean") & (t.layer == layer)]
    return float(row.value.iloc[0])


@pytest.mark.integration
def test_a_local_model_retrained_in_place_is_recomputed(tmp_path, jsonl, monkeypatch):
    monkeypatch.setenv("LMDEPTH_CACHE", str(tmp_path / "cache"))
    texts = jsonl([json.dumps({"text": f"{i} apples and {i + 2} pears are on the table."}) for i in range(3)])
    model_dir = save_tiny_model("llama", tmp_path / "model")
    kw = dict(dataset=str(texts), n_examples=3, results_dir=tmp_path / "results", n_boot=10)
    first = residual.run(str(model_dir), **kw)
    assert residual.run(str(model_dir), **kw).from_cache  # unchanged weights: served

    # "retrain" in place: same directory, same parameters, other weights
    m = tiny_model("llama")
    with torch.no_grad():
        m.model.layers[1].mlp.down_proj.weight.mul_(5.0)
    m.save_pretrained(model_dir)
    again = residual.run(str(model_dir), **kw)
    assert not again.from_cache and again.path != first.path  # the weights are part of the key: a new key
    assert abs(_mean(again) - _mean(first)) > 1e-3
    assert again.meta["weights"] != first.meta["weights"]
    assert residual.run(str(model_dir), **kw).from_cache  # and then served again


@pytest.mark.unit
def test_fingerprint_rehashes_only_changed_files(tmp_path, monkeypatch):
    monkeypatch.setenv("LMDEPTH_CACHE", str(tmp_path / "cache"))
    d = tmp_path / "m"
    d.mkdir()
    (d / "weights.bin").write_bytes(b"\x00" * 1000)
    (d / "config.json").write_text("{}")
    a = registry.dir_fingerprint(d)
    assert registry.dir_fingerprint(d) == a
    calls = []
    real = registry.sha256_file
    monkeypatch.setattr(registry, "sha256_file", lambda p, *x: calls.append(Path(p).name) or real(p, *x))
    assert registry.dir_fingerprint(d) == a and calls == []  # size and mtime unchanged: no hashing
    (d / "weights.bin").write_bytes(b"\x01" + b"\x00" * 999)  # same size, new content and mtime
    os.utime(d / "weights.bin", ns=(1, 1))
    b = registry.dir_fingerprint(d)
    assert b != a and calls == ["weights.bin"]


@pytest.mark.unit
def test_a_tampered_converted_copy_is_converted_again(tmp_path, monkeypatch):
    """The converted copy of a packaged model records its fingerprint; a modified copy is rebuilt, not used."""
    monkeypatch.setenv("LMDEPTH_CACHE", str(tmp_path / "cache"))
    spec = registry.PACKAGED["smollm2-135m"]
    conversions = []

    def fake_convert(spec, target):  # stands in for the GGUF conversion (a minute per model)
        conversions.append(target)
        target.mkdir(parents=True, exist_ok=True)
        (target / "model.safetensors").write_bytes(b"weights")
        (target / registry.SOURCE_FILE).write_text(json.dumps({"fingerprint": registry.dir_fingerprint(target)}))

    monkeypatch.setattr(registry, "_convert_gguf", fake_convert)
    path, source, digest = registry.resolve_model_path("smollm2-135m")
    assert source == "packaged" and digest == spec.sha256 and len(conversions) == 1
    registry.resolve_model_path("smollm2-135m")
    assert len(conversions) == 1  # verified, reused
    (Path(path) / "model.safetensors").write_bytes(b"scaled!")  # one weight changed under the same name
    registry.resolve_model_path("smollm2-135m")
    assert len(conversions) == 2
    assert (Path(path) / "model.safetensors").read_bytes() == b"weights"


class _Boom:
    """Unpickling this calls os.system: what a malicious checkpoint would do."""

    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


@pytest.mark.unit
def test_a_checkpoint_that_would_run_code_is_refused(tmp_path):
    from lmdepth.errors import DataError
    from lmdepth.scratch.training import load_trained

    bad = tmp_path / "model.pt"
    torch.save({"config": {}, "state_dict": {}, "payload": _Boom()}, bad)
    with pytest.raises(DataError, match="refused"):
        load_trained(bad)


@pytest.mark.unit
def test_no_unsafe_load_in_the_library():
    """Every torch.load goes through the weights_only loader; no pickle.load / weights_only=False anywhere."""
    lib = Path(__file__).resolve().parents[1] / "lib" / "lmdepth"
    offenders = []
    for f in lib.rglob("*.py"):
        for i, line in enumerate(f.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if "weights_only=False" in code or "pickle.load" in code or (
                    "torch.load(" in code and "weights_only=True" not in code):
                offenders.append(f"{f.relative_to(lib)}:{i}")
    assert offenders == []


@pytest.mark.integration
def test_training_resumes_from_a_weights_only_checkpoint(tmp_path, monkeypatch):
    """The resume checkpoint (model, optimiser, RNG states) loads with weights_only=True and resumes exactly."""
    from lmdepth.scratch import training as tr

    small = dict(modules=("add_or_sub",), n_train_per_module=32, n_eval_per_module=4, steps=4, batch_size=4,
                 ckpt_every=2)
    cfg = tr.run_config("smoke", "transformer", "lm", **small)
    data = tmp_path / "data"
    tr.train_run(cfg, tmp_path / "a", data, progress=False, stop_after=2)  # interrupted after 2 steps
    ckpt = next((tmp_path / "a").rglob("ckpt.pt"))
    state = torch.load(ckpt, weights_only=True)
    assert state["step"] == 2 and "numpy" in state["rng"]
    resumed = tr.load_trained(tr.train_run(cfg, tmp_path / "a", data, progress=False))[0]
    straight = tr.load_trained(tr.train_run(cfg, tmp_path / "b", data, progress=False))[0]
    for (k, v), (_, w) in zip(resumed.state_dict().items(), straight.state_dict().items()):
        assert torch.equal(v, w), k


@pytest.mark.unit
def test_a_corrupt_checkpoint_is_discarded_and_recomputed(tmp_path, capsys):
    from lmdepth.results import RunStore

    store = RunStore(tmp_path, "a", "m", {"x": 1})
    store.save_item("u1", {"v": np.arange(3)})
    assert store.load_item("u1")["v"].tolist() == [0, 1, 2]
    store._item_path("u1").write_bytes(b"")  # a 0-byte file: power lost before the data reached the disk
    assert store.load_item("u1") is None and "discarding" in capsys.readouterr().err
    assert not store._item_path("u1").exists()


def _finish(args):
    root, i = args
    from lmdepth.results import RunStore

    RunStore(root, "a", "m", {"x": 1}).finalize(pd.DataFrame({"v": [1.0, 2.0]}), {"who": i})
    return i


@pytest.mark.unit
def test_two_processes_finishing_the_same_run(tmp_path):
    from concurrent.futures import ProcessPoolExecutor

    from lmdepth.results import RunStore

    with ProcessPoolExecutor(4) as ex:
        done = list(ex.map(_finish, [(tmp_path, i) for i in range(40)]))
    assert done == list(range(40))
    store = RunStore(tmp_path, "a", "m", {"x": 1})
    assert store.complete and store.load().table.v.tolist() == [1.0, 2.0]
    assert [p.name for p in store.dir.parent.iterdir()] == [store.dir.name]  # no temporaries left behind
    assert oct(store.dir.stat().st_mode & 0o777) != oct(0o700)  # readable by others like any file


@pytest.mark.unit
def test_clean_removes_leftovers_and_keeps_results(tmp_path):
    """A marked temporary goes; the checkpoints the finished run uses and an unmarked look-alike stay, at any age."""
    import time as _time

    from lmdepth.results import RunStore, clean, temp_dir

    store = RunStore(tmp_path, "a", "m", {"x": 1}, item_params={"y": 2})
    store.save_item("u", {"v": np.zeros(1)})
    store.finalize(pd.DataFrame({"v": [1.0]}), {})
    leftover = temp_dir(store.dir.parent, "xyz-")
    lookalike = store.dir.parent / ".lmdepth-tmp-mine"
    lookalike.mkdir()
    old = _time.time() - 30 * 86400
    for p in (leftover, lookalike, store.partial):
        os.utime(p, (old, old))
    removed = clean(tmp_path, partial_days=7)
    assert removed == [leftover] and store.complete and store.load_item("u") is not None and lookalike.is_dir()


@pytest.mark.unit
def test_ad_hoc_runs_never_reach_the_findings(tmp_path, monkeypatch):
    """Only what the book build recorded for its profile is read by the findings page; a run outside the build,
    whatever its parameters, writes elsewhere."""
    import pandas as pd

    from lmdepth.claims import report
    from lmdepth.claims.findings_claims import saved_verdicts
    from lmdepth.results import BOOK_RECORD_ENV

    def verdict(estimate: float, state: str) -> pd.DataFrame:
        return pd.DataFrame([{"chapter": "norms", "claim_id": "norms.second_half_less", "claim": "second half contributes less",
                              "model": "smollm2-135m", "estimate": estimate, "state": state}])

    results = tmp_path / "results"
    record = results / "book" / "default"
    monkeypatch.setenv(BOOK_RECORD_ENV, str(record / "norms"))  # what `lmdepth book` sets while running chapter 01
    report.save(verdict(0.24, "agrees"), "norms", str(results))
    monkeypatch.delenv(BOOK_RECORD_ENV)
    # an ad-hoc run of the same chapter on a one-token file flips the verdict: it must not reach the book
    report.save(verdict(0.91, "disagrees"), "norms", str(results))
    book = saved_verdicts(results, "default")
    assert book["estimate"].tolist() == [0.24] and book["state"].tolist() == ["agrees"]
    assert saved_verdicts(results)["estimate"].tolist() == [0.91]  # kept, for the user, outside the book


@pytest.mark.unit
def test_a_summary_page_without_its_inputs_stops_with_what_to_run(tmp_path):
    from lmdepth.analyses import atlas
    from lmdepth.errors import DataError

    (tmp_path / "book" / "default" / "cosine").mkdir(parents=True)  # one chapter ran on this fresh clone
    with pytest.raises(DataError, match=r"norms, skipping, lens, complexity, maps, moeut.*lmdepth book"):
        atlas.atlas_table(tmp_path, profile="default")


@pytest.mark.unit
def test_summary_pages_outside_a_build_read_the_runs_there_and_inside_one_stop(tmp_path, monkeypatch):
    from lmdepth.analyses import atlas
    from lmdepth.errors import DataError
    from lmdepth.results import BOOK_RECORD_ENV

    (tmp_path / "book" / "default" / "cosine").mkdir(parents=True)  # one chapter's record only
    monkeypatch.delenv(BOOK_RECORD_ENV, raising=False)
    src = atlas.summary_source(tmp_path, "default")  # Colab, or a chapter run by hand: no complete record
    assert src.only is None and src.profile is None and "No complete book build" in src.note
    assert atlas.atlas_table(tmp_path, only=src.only).empty and atlas.shown_models(atlas.atlas_table(tmp_path), []) == []
    monkeypatch.setenv(BOOK_RECORD_ENV, str(tmp_path / "book" / "default" / "findings"))  # inside `lmdepth book`
    with pytest.raises(DataError, match="lmdepth book"):
        atlas.summary_source(tmp_path, "default")
    monkeypatch.delenv(BOOK_RECORD_ENV)
    for c in atlas.RECORDED_CHAPTERS:  # a complete record is the book's, wherever the page runs
        (tmp_path / "book" / "default" / c).mkdir(parents=True, exist_ok=True)
    src = atlas.summary_source(tmp_path, "default")
    assert src.only == set() and src.profile == "default" and src.note == ""


@pytest.mark.unit
def test_one_unit_gives_no_interval_and_a_warning():
    from lmdepth.metrics.effects import cutoff_with_ci
    from lmdepth.metrics.residual_stats import DatasetStats, PromptStats

    stats = DatasetStats()
    stats.add(PromptStats.from_tokens(np.random.default_rng(0).random((2, 3, 7))))
    with pytest.warns(UserWarning, match="One prompt"):
        lo, hi = stats.bootstrap_mean_ci(n_boot=50)
    assert np.isnan(lo).all() and np.isnan(hi).all()  # not a zero-width interval that looks certain
    with pytest.warns(UserWarning, match="One problem"):
        c = cutoff_with_ci(np.random.default_rng(0).random((1, 4, 4)), 0.1, n_boot=50)
    assert np.isnan(c["ci_low"]) and np.isnan(c["ci_high"])


@pytest.mark.unit
def test_token_tables_are_escaped():
    from lmdepth.book.notebook import styled

    html = styled(pd.DataFrame({"token": ["<|endoftext|>", "<b>bold</b>"]})).to_html()
    assert "&lt;|endoftext|&gt;" in html and "<b>bold</b>" not in html


def _cli_cases(tmp: Path) -> list[tuple[list[str], str]]:
    a_file = tmp / "a_file"
    a_file.write_text("x")
    readonly = tmp / "readonly"
    readonly.mkdir()
    readonly.chmod(0o555)
    not_a_model = tmp / "not_a_model"
    not_a_model.mkdir()
    (tmp / "x.jsonl").mkdir()
    profile = tmp / "mine.yaml"
    profile.write_text("common: {n_examples: 0}\n")
    # root may write anywhere, so the read-only case applies to ordinary users only (CI runs as root here)
    as_user = [(["run", "norms", "--results-dir", str(readonly / "sub")], "is not writable")] if os.geteuid() else []
    return as_user + [
        (["run", "norms", "--results-dir", str(a_file)], "is a file, not a directory"),
        (["run", "norms", "-p", "device", "cuda", "--results-dir", str(tmp)], "no CUDA GPU"),
        (["run", "norms", "--model", str(not_a_model), "--results-dir", str(tmp)], "no config.json"),
        (["run", "norms", "-p", "compare_models", "[gemma3-270m, qwen-typo]", "--results-dir", str(tmp)],
         "Unknown model 'qwen-typo'"),
        (["run", "norms", "-p", "seed", "-1", "--results-dir", str(tmp)], "'seed' must be between 0"),
        (["run", "norms", "-p", "dataset", str(tmp / "x.jsonl"), "--results-dir", str(tmp)], "is a directory"),
        (["run", "norms", "-p", "remote", "true", "--results-dir", str(tmp)], "is not one"),
        (["run", "norms", "--profile", str(profile), "--results-dir", str(tmp)], "'n_examples' must be between 1"),
    ]


@pytest.mark.unit
def test_common_mistakes_get_one_clear_message_before_any_model_loads(tmp_path, capsys, monkeypatch):
    from lmdepth.book.cli import main

    monkeypatch.chdir(tmp_path)
    loads = []
    monkeypatch.setattr(registry, "load_model", lambda *a, **k: loads.append(a))
    for argv, message in _cli_cases(tmp_path):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (argv, err)
    assert loads == [] and not list(tmp_path.rglob("*.ipynb"))


@pytest.mark.unit
def test_bad_data_files_name_the_file_and_line(tmp_path):
    from lmdepth.data.datasets import load_examples
    from lmdepth.errors import DataError

    latin = tmp_path / "latin.jsonl"
    latin.write_bytes('{"text": "ok"}\n{"text": "caf\xe9"}\n'.encode("latin-1"))
    with pytest.raises(DataError, match=r"latin.jsonl:2: not UTF-8"):
        load_examples(str(latin), n_examples=1)
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + b'{"text": "with a byte-order mark"}\n')
    assert load_examples(str(bom), n_examples=1)[0].text == "with a byte-order mark"
    num = tmp_path / "num.jsonl"
    num.write_text('{"text": 42}\n')
    with pytest.raises(DataError, match=r"num.jsonl:1: .*'text' is int"):
        load_examples(str(num), n_examples=1)


@pytest.mark.unit
def test_one_token_text_without_bos_is_a_clear_error():
    """SmolLM2 and Qwen add no BOS: a one-token text minus position 0 leaves nothing to average."""
    from lmdepth.analyses.run import require_tokens
    from lmdepth.errors import DataError

    ok = [("data.jsonl:1", torch.zeros(1, 5)), ("data.jsonl:2", torch.zeros(1, 2))]
    require_tokens(ok, 2, "include_bos=False leaves no position to average")
    with pytest.raises(DataError, match="Example data.jsonl:3 has 1 token.*include_bos=False"):
        require_tokens(ok + [("data.jsonl:3", torch.zeros(1, 1))], 2, "include_bos=False leaves no position to average")


@pytest.mark.slow  # executes a chapter
def test_ctrl_c_prints_one_line_and_the_rerun_resumes(tmp_path):
    """A real SIGINT to `lmdepth run`: exit 130, one line naming where to resume, no traceback (the kernel's own
    stderr goes to a log), nothing that looks finished; the same command then completes. On a tiny random-init model
    (the point is the interrupt, not the model), with enough problems that the interrupt lands mid-run."""
    import signal
    import subprocess
    import sys
    import time

    from lmdepth.testing import save_tiny_model

    model = save_tiny_model("llama", tmp_path / "tiny-llama", max_positions=4096)  # character tokens: long texts
    exe = Path(sys.executable).with_name("lmdepth")
    cmd = [str(exe), "run", "norms", "--profile", "smoke", "--model", str(model), "-p", "n_examples", "60",
           "-p", "compare_models", "[]", "--results-dir", str(tmp_path / "res")]
    # A shell that starts the tests in the background (`pytest ... &`) hands its children SIGINT ignored, and
    # Python keeps an ignored SIGINT ignored: the child gets the default back, as a terminal's Ctrl-C would find it.
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and not list((tmp_path / "res").rglob("*.partial/*.npz")):
        time.sleep(0.2)  # wait until the first problem is checkpointed
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "lmdepth: interrupted" in err and "run the same command again" in err
    assert "Traceback" not in err and "ZMQError" not in err and "without encryption" not in err
    assert not list((tmp_path / "res").rglob("meta.json"))  # nothing looks complete
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    tables = [t.parts[-3] for t in (tmp_path / "res" / "residual_stream").rglob("table.csv")]
    assert sorted(t.startswith("random-init") for t in tables) == [False, True], tables  # the run and its control


@pytest.mark.unit
def test_an_orphaned_dead_kernel_task_is_not_reported_and_other_task_errors_still_are(caplog, monkeypatch):
    """The race behind a flaky Ctrl-C run: a cell task that outlives its kernel fails with DeadKernelError and asyncio
    logs it, traceback and all, when the task is collected. That one report is dropped; any other is kept."""
    import asyncio
    import gc
    import logging

    from nbclient.exceptions import DeadKernelError

    from lmdepth.book.chapters import quiet_orphaned_kernel_deaths

    def reported(exc: Exception) -> bool:
        async def fail():
            raise exc

        caplog.clear()
        loop = asyncio.new_event_loop()
        task = loop.create_task(fail())
        loop.run_until_complete(asyncio.sleep(0.01))  # the task fails; nobody awaits it
        del task
        loop.close()
        gc.collect()  # asyncio reports "Task exception was never retrieved" here
        return any("never retrieved" in r.getMessage() for r in caplog.records)

    monkeypatch.setattr(logging.getLogger("asyncio"), "filters", [])  # as in a fresh process
    assert reported(DeadKernelError("Kernel died"))  # the report the CLI used to leak
    quiet_orphaned_kernel_deaths()
    quiet_orphaned_kernel_deaths()  # idempotent
    assert len(logging.getLogger("asyncio").filters) == 1
    assert not reported(DeadKernelError("Kernel died"))
    assert reported(ValueError("a real bug"))


@pytest.mark.unit
def test_an_unreachable_hub_id_fails_fast(monkeypatch):
    from lmdepth.errors import UnknownModelError

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(registry, "hub_reachable", lambda timeout=3.0: False)  # no traffic leaves the machine
    with pytest.raises(UnknownModelError, match="cannot be reached"):
        registry.load_model("someone/not-cached-anywhere")


@pytest.mark.unit
def test_cli_results_default_outside_the_book(tmp_path, monkeypatch):
    import lmdepth.book.cli as cli

    seen = []
    monkeypatch.setattr(cli, "execute_chapter", lambda chapter, params, out, **kw: seen.append(params))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", "norms"]) == 0
    assert seen[-1]["results_dir"] == str((tmp_path / "lmdepth-results").resolve())  # never the book's results/


@pytest.mark.unit
def test_two_first_conversions_at_once_both_succeed(tmp_path):
    """Two processes converting the same packaged model on a fresh cache: the second keeps the first one's copy."""
    target = tmp_path / "models" / "m"
    target.parent.mkdir()
    for who in ("first", "second"):
        src = tmp_path / f".tmp-{who}"
        src.mkdir()
        (src / "model.safetensors").write_text(who)
        (src / registry.SOURCE_FILE).write_text("{}")
        registry.install_dir(src, target)  # the second os.replace meets a non-empty directory
    assert (target / "model.safetensors").read_text() == "first"


@pytest.mark.unit
def test_the_atlas_reads_only_the_recorded_runs(tmp_path, monkeypatch):
    """A 5-line custom file run with n_examples 50 used to replace the GSM8K run as the model's 'best' run."""
    from lmdepth.analyses import atlas
    from lmdepth.analyses.residual import ResidualSummary
    from lmdepth.results import BOOK_RECORD_ENV, RunResult, record_run

    def run_dir(key: str, dataset: str, n: int) -> Path:
        d = tmp_path / "residual_stream" / "smollm2-135m" / key
        d.mkdir(parents=True)
        pd.DataFrame({"value": [0.0]}).to_csv(d / "table.csv", index=False)
        meta = {"analysis": "residual_stream", "cache_key": key, "wall_time_s": 1.0,
                "parameters": {"model_name": "smollm2-135m", "dataset": dataset, "n_examples": n},
                "model": {"n_layers": 30, "d_model": 576, "bos_policy": "BOS added", "additivity_error": 0.0},
                "data": {"n": n}, "n_tokens": 10 * n}
        (d / "meta.json").write_text(json.dumps(meta))
        return d

    book = run_dir("book", "gsm8k", 20)
    run_dir("adhoc", "mine.jsonl:abc", 50)
    monkeypatch.setenv(BOOK_RECORD_ENV, str(tmp_path / "book" / "default" / "norms"))
    record_run(RunResult(pd.DataFrame(), json.loads((book / "meta.json").read_text()), book))
    monkeypatch.delenv(BOOK_RECORD_ENV)
    only = atlas.recorded_runs(tmp_path / "book" / "default")
    summarised = lambda runs: [(r, ResidualSummary.of(r)) for r in runs]  # noqa: E731
    runs = atlas.best_runs(summarised(atlas.finished_runs(tmp_path, "residual_stream", only)))
    assert [(r.path.name, s.n_examples) for r, s in runs] == [("book", 20)]
    assert {r.path.name for r, _ in atlas.best_runs(summarised(atlas.finished_runs(tmp_path, "residual_stream")))} \
        == {"adhoc"}


@pytest.mark.unit
def test_the_book_record_survives_moving_the_results(tmp_path, monkeypatch):
    """Stored results are cloned elsewhere: the record names runs relative to the results directory."""
    import shutil

    from lmdepth.results import BOOK_RECORD_ENV, RunResult, record_run, recorded_runs

    run = tmp_path / "a" / "residual_stream" / "m" / "key"
    run.mkdir(parents=True)
    monkeypatch.setenv(BOOK_RECORD_ENV, str(tmp_path / "a" / "book" / "default" / "norms"))
    record_run(RunResult(pd.DataFrame(), {"analysis": "residual_stream", "cache_key": "key"}, run))
    monkeypatch.delenv(BOOK_RECORD_ENV)
    assert "residual_stream/m/key" in (tmp_path / "a" / "book" / "default" / "norms" / "runs.jsonl").read_text()
    shutil.move(tmp_path / "a", tmp_path / "b")
    assert recorded_runs(tmp_path / "b" / "book" / "default") == {(tmp_path / "b" / "residual_stream" / "m" / "key").resolve()}


@pytest.mark.unit
def test_the_commit_label_is_dirty_for_code_changes_not_for_the_builds_own_outputs(tmp_path, monkeypatch):
    import subprocess

    from lmdepth import runtime

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    for d in ("book", "results", "lib", "checkpoints/run"):
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "f.txt").write_text("a")
    (tmp_path / "checkpoints/run/ckpt.pt").write_text("step 500")  # a resume checkpoint, committed
    (tmp_path / "checkpoints/run/model.pt").write_text("weights")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    monkeypatch.setattr(runtime, "REPO_ROOT", tmp_path)
    head = runtime.git_commit()
    assert len(head) == 40
    (tmp_path / "book" / "f.txt").write_text("executed")  # what a build writes while it runs
    (tmp_path / "results" / "f.txt").write_text("computed")
    assert runtime.git_commit() == head
    (tmp_path / "checkpoints/run/ckpt.pt").write_text("step 1000")  # a run training on: not the code of a page
    assert runtime.git_commit() == head
    (tmp_path / "checkpoints/run/model.pt").write_text("other weights")  # a finished run's weights: they count
    assert runtime.git_commit() == head + "-dirty"
    git("checkout", "--", "checkpoints/run/model.pt")
    (tmp_path / "lib" / "f.txt").write_text("edited")  # code that differs from HEAD
    assert runtime.git_commit() == head + "-dirty"


@pytest.mark.unit
def test_the_atlas_places_layers_at_their_centre():
    from lmdepth.analyses.atlas import layer_depth

    assert layer_depth(0, 8) == 1 / 16 and layer_depth(7, 8) == 15 / 16 and layer_depth(3.5, 8) == 0.5
    assert layer_depth(None, 8) is None and layer_depth(float("nan"), 8) is None


@pytest.mark.integration
def test_a_cut_table_of_a_real_analysis_is_recomputed_to_the_same_bytes(tmp_path, jsonl, capsys):
    """The fault suite's toy analysis, on a real one: chapter 01's run on a tiny model, its table cut in half."""
    texts = jsonl([json.dumps({"text": f"{i} apples and {i + 2} pears are on the table."}) for i in range(3)])
    model_dir = save_tiny_model("llama", tmp_path / "model")
    kw = dict(dataset=str(texts), n_examples=3, results_dir=tmp_path / "results", n_boot=10)
    first = residual.run(str(model_dir), **kw)
    table = (first.path / "table.csv").read_bytes()
    (first.path / "table.csv").write_bytes(table[: len(table) // 2])
    again = residual.run(str(model_dir), **kw)
    assert not again.from_cache and "is damaged" in capsys.readouterr().err
    assert (again.path / "table.csv").read_bytes() == table
    assert list(first.path.parent.glob("*.damaged-*"))


@pytest.mark.unit
def test_a_second_book_build_of_the_same_root_stops_in_one_line(tmp_path, monkeypatch):
    """Two builds of one book would stage into the same folders: while one holds the lock, another stops before any
    work with one line naming the lock; once the first is done, the next build runs."""
    import fcntl

    from lmdepth.book import build
    from lmdepth.errors import LmDepthError

    monkeypatch.setattr(build, "build_root", lambda profile: tmp_path)
    ran = []
    monkeypatch.setattr(build, "_build_book", lambda *a: ran.append(a))
    lock = tmp_path / "_build" / ".lmdepth-build.lock"
    lock.parent.mkdir()
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another build (a lock is per open file, so it blocks)
        with pytest.raises(LmDepthError, match="Another `lmdepth book` is building"):
            build.build_book("default", html=False)
        assert ran == []
    build.build_book("default", html=False)
    assert len(ran) == 1


@pytest.mark.integration
@pytest.mark.parametrize("ending", ["fails", "completes"])
def test_an_executing_chapter_is_named_running_and_only_a_failed_one_is_kept_as_failed(ending, tmp_path,
                                                                                        monkeypatch):
    """While papermill runs, the page is ``<stem>.running.ipynb`` (never ``.failed`` for a run in progress); a cell
    error keeps it as ``.failed.ipynb``; a finished run lands at its name and leaves neither."""
    import papermill

    from lmdepth.book import chapters

    src = tmp_path / "probe.py"
    seen = tmp_path / "seen.txt"
    header = "# ---\n# jupyter:\n#   kernelspec:\n#     display_name: Python 3\n#     language: python\n#     name: python3\n# ---\n\n"
    src.write_text(header + '# %% tags=["parameters"]\nx: int = 1\n\n# %%\nimport pathlib\n'
                   f'pathlib.Path({str(seen)!r}).write_text(" ".join(p.name for p in pathlib.Path({str(tmp_path / "out")!r}).iterdir()))\n'
                   + ("raise ValueError('boom')\n" if ending == "fails" else ""))
    monkeypatch.setitem(chapters.CHAPTERS, "probe", "probe")
    monkeypatch.setattr(chapters, "chapter_source", lambda chapter: src)
    out = tmp_path / "out" / "probe.ipynb"
    if ending == "fails":
        with pytest.raises(papermill.PapermillExecutionError):
            chapters.execute_chapter("probe", {}, out, cwd=tmp_path)
        assert sorted(p.name for p in out.parent.iterdir()) == ["probe.failed.ipynb"]
    else:
        assert chapters.execute_chapter("probe", {}, out, cwd=tmp_path) == out
        assert sorted(p.name for p in out.parent.iterdir()) == ["probe.ipynb"]
    assert seen.read_text() == "probe.running.ipynb"  # what a reader saw while it ran
