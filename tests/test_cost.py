"""The cost tables (lmdepth.book.cost): the measured one from a hand-made book record and sidecars, and what a
prompt costs on NDIF, counted from the traces (and held here to the forward passes they make)."""

import json
import re

import pandas as pd
import pytest

from lmdepth.book.cost import COLUMNS, build_cost, chapter_minutes, cost_table
from lmdepth.runtime import REPO_ROOT


def run(root, analysis, model, key, cost, wall=None, env=None):
    d = root / analysis / model / key
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"analysis": analysis, **({"unit_compute_s": cost} if cost else {}),
                                             **({"wall_time_s": wall} if wall is not None else {}),
                                             **({"environment": env} if env else {})}))
    return f"{analysis}/{model}/{key}"


@pytest.mark.unit
def test_cost_per_chapter_and_model_from_the_recorded_runs(tmp_path):
    record = tmp_path / "book" / "default"
    runs = {"lens": [run(tmp_path, "logit_lens", "m", "a", {"total": 30.0, "units": 20, "timed": 20}, wall=120.0),
                     run(tmp_path, "tuned_lens", "m", "b", {"total": 10.0, "units": 20, "timed": 5}, wall=60.0)],
            "norms": [run(tmp_path, "residual_stream", "m", "c", {"total": 60.0, "units": 20, "timed": 20}),
                      run(tmp_path, "residual_stream", "n", "d", None)]}
    run(tmp_path, "residual_stream", "m", "unrecorded", {"total": 999.0, "units": 1, "timed": 1})  # ad hoc: not read
    for chapter, paths in runs.items():
        (record / chapter).mkdir(parents=True)
        (record / chapter / "runs.jsonl").write_text("".join(json.dumps({"path": p}) + "\n" for p in paths))
    t = cost_table(tmp_path, "default").set_index(["chapter", "model"])
    assert list(t.reset_index().columns) == COLUMNS
    lens = t.loc[("lens", "m")]
    assert (lens.runs, lens.units, lens["timed units"], lens["s / unit"]) == (2, 40, 25, 1.6)
    assert pd.isna(lens["profile total (min)"])  # 15 units untimed: no extrapolation across analyses
    assert lens["run wall time (min)"] == 3.0  # the sidecars' wall times, summed over the runs
    assert t.loc[("norms", "m"), "profile total (min)"] == 1.0 and t.loc[("norms", "m"), "s / unit"] == 3.0
    unknown = t.loc[("norms", "n")]  # no unit_compute_s at all: units, seconds and total unknown, never 0
    assert pd.isna(unknown["s / unit"]) and pd.isna(unknown.units) and pd.isna(unknown["profile total (min)"])
    assert pd.isna(t.loc[("norms", "m"), "run wall time (min)"])  # a sidecar without wall_time_s: unknown, not 0
    assert cost_table(tmp_path, "paper").empty


@pytest.mark.unit
def test_the_build_cost_counts_each_run_once_by_its_units_or_else_its_wall_time(tmp_path):
    cpu, gpu = {"cpu_threads": 2, "git_commit": None}, {"cpu_threads": 8, "cuda": "H200", "git_commit": None}
    shared = run(tmp_path, "residual_stream", "m", "s", {"total": 120.0, "units": 20, "timed": 20}, wall=600.0, env=cpu)
    resumed = run(tmp_path, "layer_skipping", "m", "r", {"total": 30.0, "units": 20, "timed": 5}, wall=300.0, env=gpu)
    record = tmp_path / "book" / "default"
    for chapter, paths in {"norms": [shared], "cosine": [shared], "skipping": [resumed]}.items():
        (record / chapter).mkdir(parents=True)
        (record / chapter / "runs.jsonl").write_text("".join(json.dumps({"path": p}) + "\n" for p in paths))
    cost = build_cost(tmp_path)
    # the units' 120 s, not the wall time; the resumed run's wall time (5 of 20 units timed); the shared run once
    assert cost.minutes == {"cosine": 2.0, "norms": 2.0, "skipping": 5.0}
    assert cost.total_min == 7.0 and cost.lower_bound == ("skipping",)
    assert cost.machines == ("a CPU (2 torch threads)", "a GPU (H200)") and cost.measured is None
    assert chapter_minutes("skipping", [tmp_path / "none", tmp_path]) == (5.0, tmp_path)
    assert chapter_minutes("lens", [tmp_path]) is None and build_cost(tmp_path, "paper").total_min == 0
    assert cost.cpu_share == 0.0 and "(wall time)" in cost.sentence()


@pytest.mark.unit
def test_the_build_cost_prefers_the_units_cpu_time(tmp_path):
    """A run whose every unit kept its CPU seconds counts those (a loaded machine inflates the wall time); a run
    with only some units' CPU seconds falls back to its units' wall seconds."""
    both = run(tmp_path, "residual_stream", "m", "a", {"total": 600.0, "units": 4, "timed": 4, "cpu_total": 120.0,
                                                       "cpu_timed": 4})
    part = run(tmp_path, "layer_skipping", "m", "b", {"total": 180.0, "units": 4, "timed": 4, "cpu_total": 30.0,
                                                      "cpu_timed": 1})
    record = tmp_path / "book" / "default"
    for chapter, path in {"norms": both, "skipping": part}.items():
        (record / chapter).mkdir(parents=True)
        (record / chapter / "runs.jsonl").write_text(json.dumps({"path": path}) + "\n")
    cost = build_cost(tmp_path)
    assert cost.minutes == {"norms": 2.0, "skipping": 3.0} and cost.cpu_share == pytest.approx(0.4)
    assert "(40% of it CPU time, the rest wall time)" in cost.sentence()


@pytest.mark.unit
def test_a_run_without_units_counts_its_cpu_time_only_when_one_execution_computed_it_whole(tmp_path, monkeypatch):
    """The run template (analyses.run.execute, which chapter 07's depth runs go through) records a run without
    timed units in the chapter's book record with its execution's CPU seconds; build_cost counts them when that
    execution read no checkpoint, and otherwise the wall time, as a lower bound."""
    import time

    import numpy as np

    from lmdepth.analyses.run import execute
    from lmdepth.results import BOOK_RECORD_ENV, RunStore

    def busy(seconds):
        end = time.process_time() + seconds
        while time.process_time() < end:
            pass

    def compute(store, interrupt=False):
        if store.load_item("half") is None:
            busy(0.2)
            store.save_item("half", {"x": np.zeros(1)})
            if interrupt:
                raise KeyboardInterrupt
        time.sleep(0.6)  # wall time only: not counted when the CPU time is known
        busy(0.2)
        return pd.DataFrame({"x": [1]}), {"run": store.dir.parent.name}

    monkeypatch.setenv(BOOK_RECORD_ENV, str(tmp_path / "book" / "default" / "moeut"))
    whole = execute(RunStore(tmp_path, "dm_math_depth", "whole", {"k": 1}), compute, {"analysis": "dm_math_depth"})
    assert whole.meta["resumed_items"] == 0 and 0.35 <= whole.meta["cpu_time_s"] < whole.meta["wall_time_s"] - 0.3
    resumed = RunStore(tmp_path, "dm_math_depth", "resumed", {"k": 1})
    with pytest.raises(KeyboardInterrupt):
        execute(resumed, lambda st: compute(st, interrupt=True), {"analysis": "dm_math_depth"})
    resumed = execute(RunStore(tmp_path, "dm_math_depth", "resumed", {"k": 1}), compute, {"analysis": "dm_math_depth"})
    assert resumed.meta["resumed_items"] == 1
    assert whole.meta["environment"]["cpu_threads"] >= 1 and whole.meta["analysis"] == "dm_math_depth"
    cost = build_cost(tmp_path)
    expected = (whole.meta["cpu_time_s"] + resumed.meta["wall_time_s"]) / 60
    assert cost.minutes == {"moeut": pytest.approx(expected)} and cost.lower_bound == ("moeut",)
    assert 0 < cost.cpu_share < 1
    assert execute(RunStore(tmp_path, "dm_math_depth", "whole", {"k": 1}), compute, {}).from_cache  # served


@pytest.mark.unit
def test_a_unit_keeps_its_wall_and_cpu_seconds_and_the_sidecar_sums_them():
    import time

    from lmdepth.analyses.run import UnitClock, unit_cost

    clock = UnitClock()
    t_end = time.process_time() + 0.05
    while time.process_time() < t_end:  # CPU work: counted in both clocks
        pass
    time.sleep(0.1)  # waiting: wall time only
    item = clock.stamp({}, extra=(1.0, 0.5))
    wall, cpu = float(item["_seconds"]), float(item["_cpu_seconds"])
    assert wall >= 1.15 and 0.55 <= cpu < wall - 0.05
    assert unit_cost([2.0, None, 1.0], [0.5, None, None]) == {"total": 3.0, "units": 3, "timed": 2,
                                                               "cpu_total": 0.5, "cpu_timed": 1}


@pytest.mark.unit
def test_the_readme_gives_the_cold_build_cost_the_record_gives():
    """One cost: the README's cold-build hours are build_cost's over the committed default record."""
    hours = re.search(r"takes about (\d+) h of compute", (REPO_ROOT / "README.md").read_text())
    assert hours, "the README states the cold-build cost as 'takes about N h of compute'"
    assert int(hours.group(1)) == round(build_cost(REPO_ROOT / "results").total_min / 60)


@pytest.mark.unit
def test_the_ndif_cost_of_the_paper_profile_per_chapter():
    """Llama 3.1 70B (80 layers) with the paper profile's parameters: every chapter has a row; the remote-ready
    ones their requests and forwards per prompt, from the traces' counts; the others say why they stay here."""
    from lmdepth.book.chapters import CHAPTERS
    from lmdepth.book.cost import PAPER_LAYERS, REMOTE_COLUMNS, erasure_forwards, remote_cost
    from lmdepth.traces.remote import NOT_REMOTE, REMOTE_READY
    from lmdepth.traces.skip_effects import session_forwards

    t = remote_cost("paper")
    assert list(t.columns) == REMOTE_COLUMNS and PAPER_LAYERS == 80
    assert list(dict.fromkeys(t.chapter)) == list(CHAPTERS)  # every chapter, in the book's order
    counted = t[t["requests / prompt"] != "—"]  # the support state from the code's lists
    assert set(counted.chapter) == set(REMOTE_READY) and set(t.chapter) - set(counted.chapter) <= set(NOT_REMOTE)
    skip = t[t.chapter == "skipping"].set_index("measurement")
    assert skip.loc["all tokens (every layer skipped)", "forwards / prompt"] == session_forwards(80, 0, True) == 81
    assert skip.loc["future tokens", "forwards / prompt"] == session_forwards(80, 4, False) == 321  # paper: 4 cuts
    assert (skip["requests / prompt"] == 1).all() and (skip["rows / forward"].iloc[:2] == 4).all()  # 3 parts + local
    assert skip.loc["all tokens, nudge control", "forwards / prompt"] == 81  # the output change's control: one row
    assert skip.loc["all tokens, nudge control", "rows / forward"] == 1
    rows = t.set_index(["chapter", "measurement"])
    assert rows.loc[("norms", "residual norms and contributions"), "the profile runs it"] == \
        "NDIF: meta-llama/Llama-3.1-70B"
    assert rows.loc[("maps", "residual collection"), "the profile runs it"].startswith("here")  # remote: false
    erasure = rows.loc[("complexity", "residual erasure")]
    assert f"(T = 40: {erasure_forwards(80, 40, 32)})" in erasure["forwards / prompt"] == \
        "1 + 81 x ceil(T / 31) for T tokens (T = 40: 163)"
    # the paper profile runs chapter 05 on a GPU (remote false): integrated gradients would be refused on NDIF
    assert "refuses" not in erasure.notes and erasure["the profile runs it"].startswith("here")
    assert "refuses" not in remote_cost("default").set_index("measurement").loc["residual erasure", "notes"]
    # the explorer: one session, the clean pass and the skipped one (tests/test_explorer.py counts them with a hook)
    from lmdepth.book.explorer import EXPLORE_FORWARDS, EXPLORE_REQUESTS

    explore = rows.loc[("explorer", "contributions, logit-lens tokens, one layer skipped")]
    assert (explore["requests / prompt"], explore["forwards / prompt"]) == (EXPLORE_REQUESTS, EXPLORE_FORWARDS) == (1, 2)
    small = remote_cost("paper", n_layers=32).set_index("measurement")
    assert small.loc["future tokens", "forwards / prompt"] == 1 + 32 * 4


@pytest.mark.integration
@pytest.mark.parametrize("n_tokens, batch", [(13, 4), (12, 4), (13, 32)])
def test_the_erasure_sessions_forward_count_is_what_the_cost_table_says(n_tokens, batch):
    """Forward passes of the model in one prompt's erasure session, counted by a hook, = erasure_forwards."""
    import torch
    from nnsight.modeling.transformers import TransformersModel

    from lmdepth.book.cost import erasure_forwards
    from lmdepth.model.families import ModelAdapter
    from lmdepth.testing import tiny_model, tiny_tokenizer
    from lmdepth.traces.erasure_trace import erasure_effects
    from lmdepth.traces.residual_metrics import TapPaths

    model = tiny_model("llama")
    adapter = ModelAdapter.for_model(model)
    ids = tiny_tokenizer()("x" * (n_tokens - 1), return_tensors="pt").input_ids
    assert ids.shape[1] == n_tokens
    calls = []
    model.model.register_forward_pre_hook(lambda mod, args: calls.append(1))
    erasure_effects(TransformersModel(model, tokenizer=tiny_tokenizer()), TapPaths.of(adapter), ids, n_tokens - 3,
                    torch.zeros(adapter.n_layers + 1, adapter.d_model), batch_size=batch)
    assert len(calls) == erasure_forwards(adapter.n_layers, n_tokens, batch)


@pytest.mark.integration
def test_the_cost_tables_request_sizes_are_what_the_strict_server_records():
    """The sizes the NDIF cost table states per request (formulas in L and d) against the requests the strict server
    serves on a tiny model: the residual metrics and a skip session bring back what the table says, and nothing
    else; for Llama 3.1 70B the maps' collection stays under the server's result bound and the tuned lens is
    refused."""
    from nnsight.modeling.transformers import TransformersModel

    from lmdepth.book.cost import remote_cost, size
    from lmdepth.model.families import ModelAdapter
    from lmdepth.testing import tiny_model, tiny_tokenizer
    from lmdepth.traces import server
    from lmdepth.traces.residual_metrics import TapPaths, residual_metrics
    from lmdepth.traces.skip_effects import skip_effects

    model = tiny_model("llama")
    nn_model, paths = TransformersModel(model, tokenizer=tiny_tokenizer()), TapPaths.of(ModelAdapter.for_model(model))
    ids = tiny_tokenizer()("12 + 7 = 19, and 3 + 4 = 7.", return_tensors="pt").input_ids
    L, T, B = paths.n_layers, ids.shape[1], 4
    before = len(server.REQUESTS)
    residual_metrics(nn_model, paths, ids, remote="local")
    skip_effects(nn_model, paths, ids, config=model.config, remote="local")  # 3 parts + local, no robust means
    norms_req, skip_req = server.REQUESTS[before:]
    overhead = 2_000  # torch.save's framing, per saved tensor
    assert 4 * L * 11 * T <= norms_req.result_bytes <= 4 * L * 11 * T + overhead
    assert 4 * B * L * (L + 1) <= skip_req.result_bytes <= 4 * B * L * (L + 1) + 2 * overhead
    t = remote_cost("paper").set_index("measurement")
    assert t.loc["residual norms and contributions", "returns / request"] == f"L x 11 x T floats: {size(80 * 11)} per token"
    assert "<= 47.7 MB" in t.loc["residual collection", "returns / request"]  # 50 MB: the strict server's bound
    tuned = remote_cost("default", n_layers=80, d_model=8192).set_index("measurement")
    assert "refused" in tuned.loc["logit lens and tuned lens", "ships / request"]  # 21 GB of translators
    assert "refused" not in remote_cost("default", n_layers=30, d_model=576).set_index("measurement").loc[
        "logit lens and tuned lens", "ships / request"]  # SmolLM2-135M's 40 MB travel
