"""``remote="local"`` gives the default run's tables, chapter by chapter (issue 35).

Each model-running analysis runs twice on a tiny model with a tiny sample, each into its own temporary results
directory (``remote`` is not part of the cache key: in one directory the second run would only read the first):
once here (``remote=false``) and once through the strict offline simulation of the NDIF server
(:class:`lmdepth.traces.server.StrictServer`), and the tables must agree to 1e-5. Chapters 01, 03 and 05 also go
through the CLI command a reader types. The traces themselves are held to their plain-hook references in
``tests/test_traces.py``.
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pandas as pd
import pytest

from lmdepth.testing import save_tiny_model
from lmdepth.traces import server

pytestmark = pytest.mark.usefixtures("one_thread")
TOL = 1e-5


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Two tiny models (the maps need a pair) and four short texts."""
    root = tmp_path_factory.mktemp("remote_chapters")
    texts = root / "texts.jsonl"
    texts.write_text("".join(json.dumps({"text": f"Problem {i}: {i} apples plus {i + 2} pears make {2 * i + 2} "
                                                 "fruits on the table."}) + "\n" for i in range(4)))
    return {"llama": str(save_tiny_model("llama", root / "llama")), "qwen2": str(save_tiny_model("qwen2", root / "qwen2")),
            "texts": str(texts), "root": root}


def equal_tables(here: pd.DataFrame, sim: pd.DataFrame, columns: list[str]) -> None:
    """Same rows in the same order, the numeric ``columns`` within :data:`TOL`, every other column identical."""
    assert len(here) == len(sim) > 0
    rest = [c for c in here.columns if c not in columns]
    assert here[rest].reset_index(drop=True).equals(sim[rest].reset_index(drop=True))
    diff = (here[columns].astype(float) - sim[columns].astype(float)).abs()
    both_nan = here[columns].isna() & sim[columns].isna()
    assert not (diff.isna() & ~both_nan).any().any()  # NaN on one side only
    assert diff.fillna(0).max().max() <= TOL, diff.max()  # NaN on both sides: equal


def twice(run, tmp_path: Path, requests: int | None = None, **kw):
    """``run(**kw)`` here and under the strict server, each in its own results directory; the two results."""
    here = run(results_dir=tmp_path / "here", **kw)
    before = len(server.REQUESTS)
    sim = run(results_dir=tmp_path / "sim", remote="local", **kw)
    sent = server.REQUESTS[before:]
    assert sent and not sim.from_cache  # the simulation really ran: requests went through the strict server
    assert not [m for r in sent for m in r.modules if m.split(".")[0] == "lmdepth"]
    if requests is not None:
        assert len(sent) == requests
    return here, sim


@pytest.mark.slow
def test_norms_and_cosine_through_the_cli_as_a_reader_types_it(setup, tmp_path):
    """Chapters 01 and 02 read the same residual-metrics run: the CLI run with ``-p remote=local`` writes the table
    that the local run computes, cosine rows included."""
    from lmdepth.analyses import residual
    from lmdepth.book.cli import main

    out = tmp_path / "cli"
    command = (f"lmdepth run norms --model {setup['llama']} -p remote=local -p compare_models=[] "
               f"-p dataset={setup['texts']} -p n_examples=3 -p n_boot=20 --results-dir {out}")
    assert main(shlex.split(command)[1:]) == 0  # the notebook runs in its own kernel: its requests are not seen here
    (meta_path,) = (out / residual.ANALYSIS).glob("*/*/meta.json")
    meta = json.loads(meta_path.read_text())
    assert meta["parameters"]["remote"] == "local" and meta["model"]["remote"] == "local"  # the traces' mode
    sim = pd.read_csv(meta_path.parent / "table.csv")
    keep = {k: v for k, v in meta["parameters"].items() if k in residual.ResidualParams.__dataclass_fields__
            and k not in ("model_name", "remote", "device", "dataset")}  # the sidecar's dataset is its content id
    assert keep["n_examples"] == 3 and keep["n_boot"] == 20  # the CLI's parameters reached the run
    keep["dataset"] = setup["texts"]
    here = residual.run(setup["llama"], results_dir=tmp_path / "here", **keep).table
    assert {"norm", "cosine"} <= {m.split("_")[0] for m in here.metric}, set(here.metric)
    equal_tables(here, sim, ["value", "ci_low", "ci_high"])


#: Each chapter's CLI parameters for a tiny sample (chapter 03: all-token and future-token analyses, every part and the
#: local variant, and the verdicts' robust runs; chapter 05: the depth score and the residual erasure, without
#: integrated gradients, which run here only).
CLI_SAMPLES = {
    "skipping": "-p dataset={texts} -p n_examples=2 -p n_examples_current=2 -p n_cuts=2 -p benchmark=false "
                "-p n_boot=20",
    "complexity": "-p sources=[vars] -p n_synthetic=2 -p n_case_studies=1 -p n_ig_prompts=0 -p ig_steps=0 "
                  "-p n_mean_examples=1 -p n_boot=20",
}


@pytest.mark.slow
@pytest.mark.parametrize("chapter", list(CLI_SAMPLES))
def test_the_cli_with_remote_local_writes_the_default_runs_tables(setup, tmp_path, chapter):
    """``lmdepth run <chapter> -p remote=local`` as a reader types it writes the tables that the same command without
    it writes: every run (same cache keys: ``remote`` is not part of them) and the verdicts. Each command gets its
    own fresh results directory, and the simulated run's sidecars record ``remote="local"``: it computed, it did
    not read the other's cache."""
    from lmdepth.book.cli import main

    outs = {}
    for remote in (False, "local"):
        out = outs[remote] = tmp_path / ("sim" if remote else "here")
        command = (f"lmdepth run {chapter} --model {setup['llama']} {CLI_SAMPLES[chapter].format(texts=setup['texts'])}"
                   + (" -p remote=local" if remote else "") + f" --results-dir {out}")
        assert main(shlex.split(command)[1:]) == 0  # the notebook runs in its own kernel: requests not seen here
    here, sim = outs[False], outs["local"]
    runs = sorted(p.parent.relative_to(here) for p in here.glob("*/*/*/meta.json"))
    assert runs and runs == sorted(p.parent.relative_to(sim) for p in sim.glob("*/*/*/meta.json"))
    values = []
    for run in runs:
        meta = {k: json.loads((root / run / "meta.json").read_text()) for k, root in (("here", here), ("sim", sim))}
        assert meta["sim"]["parameters"]["remote"] == "local" and meta["sim"]["model"]["remote"] == "local", run
        assert meta["here"]["model"]["remote"] is False and meta["here"]["parameters"].get("remote", False) is False
        assert meta["here"]["summary"] == meta["sim"]["summary"], run
        tables = sorted(f.name for f in (here / run).glob("*.csv"))
        assert "table.csv" in tables and tables == sorted(f.name for f in (sim / run).glob("*.csv"))
        for name in tables:
            a, b = pd.read_csv(here / run / name), pd.read_csv(sim / run / name)
            equal_tables(a, b, [c for c in a.columns if a[c].dtype.kind == "f"])
            values.append(a["value"])
    assert (pd.concat(values).abs() > 1e-2).any()  # effects, not zeros: the comparison can fail
    (verdicts,) = here.glob(f"verdicts/{chapter}/*.csv")
    (sim_verdicts,) = sim.glob(f"verdicts/{chapter}/*.csv")
    a, b = pd.read_csv(verdicts), pd.read_csv(sim_verdicts)
    equal_tables(a, b, [c for c in a.columns if a[c].dtype.kind == "f"])


@pytest.mark.slow
@pytest.mark.parametrize("analysis", ["current", "future"])
def test_skipping_all_variants(setup, tmp_path, analysis):
    """Chapter 03: all-token and future-token, whole layer / attention / MLP and the local variant, with the robust
    statistics the verdicts read (floor): one request per problem."""
    from lmdepth.analyses import skipping

    kw = dict(dataset=setup["texts"], n_examples=2, analysis=analysis, n_cuts=2, floor=0.1, n_boot=20)
    here, sim = twice(skipping.run, tmp_path, requests=2, model_name=setup["llama"], **kw)
    assert set(here.table.variant) == {"layer", "attention", "mlp", "local"}
    assert sim.meta["parameters"]["remote"] == "local"
    equal_tables(here.table, sim.table, ["value"])
    equal_tables(here.units, sim.units, [c for c in here.units.columns if here.units[c].dtype.kind == "f"])
    assert here.meta["summary"] == sim.meta["summary"]


@pytest.mark.slow
def test_skipping_nudge_control(setup, tmp_path):
    """Chapter 03's output-change control: the nudge run, its [L, d] directions shipped with each problem's one
    request."""
    from lmdepth.analyses import skipping

    kw = dict(dataset=setup["texts"], n_examples=2, analysis="current", floor=0.1, n_boot=20, nudge=True)
    here, sim = twice(skipping.run, tmp_path, requests=2, model_name=setup["llama"], **kw)
    assert set(here.units.variant) == {"nudge"} and here.meta["nudge"] == sim.meta["nudge"]
    equal_tables(here.table, sim.table, ["value"])
    equal_tables(here.units, sim.units, [c for c in here.units.columns if here.units[c].dtype.kind == "f"])


@pytest.mark.slow
def test_lens_logit_and_tuned_applied(setup, tmp_path):
    """Chapter 04: the translators are trained here (training refuses remote), then applied inside the trace."""
    from lmdepth.analyses import lens

    kw = dict(model_name=setup["llama"], dataset=setup["texts"], n_examples=3, selection="first", n_boot=20,
              positions_per_example=0, n_train_tokens=96, train_epochs=1)
    here = lens.run(results_dir=tmp_path / "here", **kw)
    shutil.copytree(tmp_path / "here" / "tuned_lens", tmp_path / "sim" / "tuned_lens")
    before = len(server.REQUESTS)
    sim = lens.run(results_dir=tmp_path / "sim", remote="local", **kw)
    assert len(server.REQUESTS) - before == 3 and not sim.from_cache
    assert set(here.table.component) == {"logit_lens", "tuned_lens"}
    equal_tables(here.table, sim.table, ["value", "ci_low", "ci_high"])


@pytest.mark.slow
def test_complexity_depth_score_and_erasure(setup, tmp_path):
    """Chapter 05: the depth score (skip session and correctness check per item) and the residual erasure."""
    from lmdepth.analyses import complexity, erasure

    here, sim = twice(complexity.run, tmp_path, requests=2 * 2, params=setup["llama"], source="vars",
                      n_per_level=1, levels=[1, 2], n_boot=20)
    equal_tables(here.table, sim.table, ["value"])
    here, sim = twice(erasure.run, tmp_path, params=setup["llama"], n_case_studies=1, n_mean_examples=1,
                      ig_steps=0, erasure_batch=16)
    equal_tables(here.table, sim.table, ["value"])
    assert here.meta["summary"] == sim.meta["summary"]


@pytest.mark.slow
def test_maps_residual_collection(setup, tmp_path):
    """Chapter 06: the residuals are collected through the trace (both models), the maps fitted here."""
    from lmdepth.analyses import maps

    here, sim = twice(maps.run, tmp_path, model_name=setup["llama"], compare_models=[setup["qwen2"]],
                      self_map_model="", shuffle_control=False, dataset=setup["texts"], general_text="none",
                      general_fraction=0.0, n_train_tokens=60, n_val_tokens=30, n_test_tokens=30, max_doc_chars=300)
    equal_tables(here.table, sim.table, ["value"])


@pytest.mark.unit
def test_the_offline_simulation_keeps_the_random_init_controls():
    """remote='local' computes with the weights here, so the chapters' random-init controls run as in the local
    run; only a real NDIF run (remote=true) has none (a control is built and run locally)."""
    from lmdepth.claims.report import control_models

    models = ["smollm2-135m", "gemma3-270m"]
    assert control_models(models, "local", 20) == control_models(models, False, 20) != []
    with pytest.warns(UserWarning, match="No random-init controls on NDIF"):
        assert control_models(models, True, 20) == []


# ---- scripts/ndif_smoke.py: the one real NDIF check, tested offline ---------------------------------------------------

def smoke_script():
    import importlib.util

    from lmdepth.runtime import REPO_ROOT

    spec = importlib.util.spec_from_file_location("ndif_smoke", REPO_ROOT / "scripts" / "ndif_smoke.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.unit
@pytest.mark.parametrize("case, message", [("no key", "needs an NDIF API key"),
                                           ("no network", "cannot be reached from this machine")])
def test_the_smoke_command_refuses_in_one_line_before_loading_anything(case, message, monkeypatch, capsys):
    from nnsight.schema.config import CONFIG

    from lmdepth.analyses import residual, skipping
    from lmdepth.model import ndif, registry

    monkeypatch.setattr(CONFIG.API, "APIKEY", None)
    if case == "no key":
        monkeypatch.delenv("NDIF_API_KEY", raising=False)
        monkeypatch.setattr(ndif, "_reachable", lambda url, timeout: True)
    else:
        monkeypatch.setenv("NDIF_API_KEY", "a-key")
        monkeypatch.setattr(ndif, "_reachable", lambda url, timeout: False)
    for module, name in ((registry, "load_model"), (residual, "run"), (skipping, "run"), (residual, "load_examples")):
        monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail("loaded something before the preflight"))
    assert smoke_script().main([]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    # one line per missing piece: the key alone, or the hub and NDIF both unreachable
    assert len(lines) == (1 if case == "no key" else 2)
    assert all(message in line and line.startswith("ndif_smoke: ") for line in lines)


@pytest.mark.integration
def test_the_smoke_command_runs_its_pipeline_under_the_strict_simulation(setup, tmp_path, capsys):
    """``--remote local``: norms and the all-token layer skip of one problem, two requests through the strict server,
    the per-layer numbers printed and the sidecar written (no server versions: not NDIF)."""
    out = tmp_path / "smoke"
    assert smoke_script().main(["--model", setup["llama"], "--remote", "local", "--dataset", setup["texts"],
                                "--results-dir", str(out)]) == 0
    sidecar = json.loads((out / "ndif_smoke.json").read_text())
    assert sidecar["remote"] == "local" and sidecar["server_versions"] is None
    assert sidecar["requests_simulated"] == 2  # one per analysis: a trace (norms), a session (skipping)
    assert sidecar["forwards_per_problem"] == {"norms": 1, "skipping": 1 + 4}  # the clean pass + one per layer
    for run in sidecar["runs"].values():
        assert json.loads((Path(run) / "meta.json").read_text())["model"]["remote"] == "local"
    rows = [l.split() for l in capsys.readouterr().out.splitlines() if l.split() and l.split()[0].isdigit()]
    assert [int(r[0]) for r in rows] == [0, 1, 2, 3] and all(float(r[2]) > 0 for r in rows)


@pytest.mark.unit
@pytest.mark.parametrize("remote", [True, "local"])
def test_chapter_05_refuses_remote_integrated_gradients_before_any_model_loads(remote):
    """The chapter's first cell checks its erasure parameters: a remote run that asks for integrated gradients stops
    there in one line (it used to stop at the erasure cell, after every ladder had run)."""
    from lmdepth.analyses.erasure import check_chapter_parameters
    from lmdepth.errors import ParameterError

    kw = dict(n_case_studies=6, n_case_studies_compare=6, n_ig_prompts=5, ig_steps=128, ig_rule="left",
              n_ig_prompts_compare=5)
    with pytest.raises(ParameterError, match="integrated gradients run here only") as e:
        check_chapter_parameters(**kw, remote=remote)
    assert "\n" not in str(e.value)
    with pytest.raises(ParameterError):  # the comparison models' integrated gradients too
        check_chapter_parameters(**{**kw, "n_ig_prompts": 0}, remote=remote)
    assert check_chapter_parameters(**kw)["ig_steps"] == 128  # here: allowed
    for ok in ({"ig_steps": 0}, {"n_ig_prompts": 0, "n_ig_prompts_compare": 0},
               {"n_ig_prompts": 0, "n_case_studies_compare": 0}):
        assert check_chapter_parameters(**{**kw, **ok}, remote=remote)


@pytest.mark.unit
def test_the_support_list_is_what_the_chapters_take():
    """The Reproducibility page's per-chapter list (lmdepth.traces.remote) matches the chapters: each remote-ready
    chapter takes a ``remote`` parameter, no other chapter does, and every chapter is in exactly one list."""
    from lmdepth.book.chapters import CHAPTERS, declared_parameters
    from lmdepth.traces.remote import NOT_REMOTE, REMOTE_READY

    assert not set(REMOTE_READY) & set(NOT_REMOTE) and set(REMOTE_READY) | set(NOT_REMOTE) == set(CHAPTERS)
    assert {c for c in CHAPTERS if "remote" in declared_parameters(c)} == set(REMOTE_READY)
