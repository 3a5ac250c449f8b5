"""Layer skipping: exact identities, and the fast path against the naive one-pass-per-intervention loop."""

import numpy as np
import pytest
import torch

from lmdepth.analyses import skipping as skip_analysis
from lmdepth.book.pages import skipping_page as skip_page
from lmdepth.hooks.skip_hooks import (
    PARTS,
    Row,
    clean_pass,
    draw_cuts,
    intervention_hooks,
    naive_effect,
    nudge_directions,
    prompt_effects,
    prompt_effects_naive,
    run_rows,
)
from lmdepth.metrics import effects
from lmdepth.model.families import ModelAdapter
from lmdepth.model.taps import forward_hooks, layer_output
from lmdepth.testing import FAMILY_CONFIGS, tiny_model

FAMILIES = list(FAMILY_CONFIGS)
TEXT = "Natalia sold 48 clips in April, and then she sold half as many clips in May."


@pytest.fixture(scope="module")
def ids(tok):
    return tok(TEXT, return_tensors="pt").input_ids


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.integration
def test_fast_path_equals_naive_loop(family, ids):
    adapter = ModelAdapter.for_model(tiny_model(family))
    kw = dict(cuts=[9, 24, 40], parts=PARTS, local=True, current=True)
    fast, naive = prompt_effects(adapter, ids, **kw), prompt_effects_naive(adapter, ids, **kw)
    assert set(fast) == set(naive) == {(a, v) for a in ("current", "future") for v in ("layer", "attention", "mlp", "local")}
    for k in naive:
        assert (naive[k][0] > 0).any(), k  # a real effect is being compared
        torch.testing.assert_close(fast[k][0], naive[k][0], atol=1e-5, rtol=0)
        torch.testing.assert_close(fast[k][1], naive[k][1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.integration
def test_future_only_uses_the_last_cut_as_lead(family, ids):
    adapter = ModelAdapter.for_model(tiny_model(family))
    kw = dict(cuts=[16, 33], parts=("layer",), local=False, current=False)
    fast, naive = prompt_effects(adapter, ids, **kw), prompt_effects_naive(adapter, ids, **kw)
    assert set(fast) == {("future", "layer")}
    torch.testing.assert_close(fast["future", "layer"][0], naive["future", "layer"][0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("part", PARTS)
@pytest.mark.integration
def test_cut_at_one_intervenes_nowhere(part, ids):
    """t = 1: positions 1..0 are empty, so every effect is exactly zero (same batch shape as the clean pass)."""
    adapter = ModelAdapter.for_model(tiny_model("qwen2"))
    clean = clean_pass(adapter, ids, with_probs=True)
    for s in range(adapter.n_layers):
        e, o = naive_effect(adapter, ids, clean, Row(s, part, t=1))
        assert torch.count_nonzero(e) == 0 and o == 0.0
    E, O, _ = run_rows(adapter, ids, clean, [Row(2, part, t=1)])
    assert torch.count_nonzero(E) == 0 and torch.count_nonzero(O) == 0


@pytest.mark.integration
def test_skipping_a_layer_that_writes_nothing_has_no_effect(ids):
    model = tiny_model("llama")
    with torch.no_grad():  # layer 1 adds nothing to the residual: skipping it is a no-op
        model.model.layers[1].self_attn.o_proj.weight.zero_()
        model.model.layers[1].mlp.down_proj.weight.zero_()
    adapter = ModelAdapter.for_model(model)
    res = prompt_effects(adapter, ids, cuts=[20], parts=PARTS, local=False, current=True)
    for (analysis, part), (E, O) in res.items():
        assert E[1, 2:].abs().max() == 0 and O[1] == 0, (analysis, part)
        assert E[0].abs().max() > 0  # while skipping layer 0 does change things


@pytest.mark.integration
def test_all_tokens_identities(ids):
    adapter = ModelAdapter.for_model(tiny_model("olmo2"))
    E, O = prompt_effects(adapter, ids, parts=("layer",), local=True, current=True)["current", "layer"]
    L = adapter.n_layers
    torch.testing.assert_close(E.diag(), torch.ones(L))  # a skipped layer's own contribution is gone entirely
    assert all(E[s, j] == 0 for s in range(L) for j in range(s))  # earlier layers cannot change
    assert (O > 0).all() and (O <= 2 ** 0.5).all()  # ||P − P'||₂ of two distributions lies in [0, √2]


@pytest.mark.integration
def test_local_variant_pins_the_intervened_positions(ids):
    """Current + local: every later layer sees exactly its clean input at intervened positions, so only the
    skipped layer itself changes (E = identity)."""
    adapter = ModelAdapter.for_model(tiny_model("llama"))
    E, _ = prompt_effects(adapter, ids, parts=("layer",), local=True, current=True)["current", "local"]
    torch.testing.assert_close(E, torch.eye(adapter.n_layers), atol=1e-5, rtol=0)


@pytest.mark.integration
@pytest.mark.parametrize("family", FAMILIES)
def test_the_nudge_moves_the_residual_by_the_skips_norm(family, ids):
    """The residual after layer s, measured: skipping moves it by −Δ_s, the nudge by ‖Δ_s‖ · u_s — the same norm at
    every position ≥ 1, nothing at position 0, along the layer's fixed random direction."""
    adapter = ModelAdapter.for_model(tiny_model(family))
    L, T = adapter.n_layers, ids.shape[1]
    u = nudge_directions(L, adapter.d_model, 0)
    clean = clean_pass(adapter, ids)
    positions = torch.arange(T)
    for s in range(L):
        got = {}

        def grab(mod, args, out):
            got["h"] = layer_output(out).float()  # [2, T, D] after the interventions

        rows = [Row(s, "layer"), Row(s, "nudge")]
        with torch.no_grad(), forward_hooks(intervention_hooks(adapter, clean, rows, positions, u)
                                            + [(adapter.layers[s], grab)]):
            adapter.model(ids.expand(2, -1), logits_to_keep=1)
        moved = got["h"] - clean.resid_out[s].float()  # [2, T, D]
        size = clean.contrib[s].norm(dim=-1)  # [T] ‖Δ_s‖
        torch.testing.assert_close(moved[:, 1:].norm(dim=-1), size[1:].expand(2, -1), atol=1e-5, rtol=1e-5)
        assert moved[:, 0].abs().max() <= 1e-6 and size[1:].min() > 1e-3  # the sink untouched; sizes not all 0
        torch.testing.assert_close(moved[1, 1:], size[1:, None] * u[s], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="nudge directions"):
        intervention_hooks(adapter, clean, [Row(0, "nudge")], positions)


@pytest.mark.unit
def test_nudge_directions_are_seeded_unit_vectors():
    u = nudge_directions(6, 32, 0)
    assert u.shape == (6, 32) and u.dtype == torch.float32
    torch.testing.assert_close(u.norm(dim=-1), torch.ones(6))
    assert torch.equal(u, nudge_directions(6, 32, 0)) and not torch.allclose(u, nudge_directions(6, 32, 1))
    assert (u @ u.T - torch.eye(6)).abs().max() < 0.9  # one direction per layer, not one shared
    # per problem: seeded by (seed, problem id), so each problem gets its own draw, the same in every run
    a, b = nudge_directions(6, 32, 0, "p1"), nudge_directions(6, 32, 0, "p2")
    assert torch.equal(a, nudge_directions(6, 32, 0, "p1")) and not torch.allclose(a, b)
    assert not torch.allclose(a, nudge_directions(6, 32, 1, "p1")) and not torch.allclose(a, u)
    torch.testing.assert_close(b.norm(dim=-1), torch.ones(6))


@pytest.mark.unit
def test_cut_points_follow_the_paper_and_are_seeded():
    cuts = draw_cuts(200, 4, seed=0, key="gsm8k/test/1")
    assert cuts == sorted(cuts) and len(cuts) == 4
    assert all(c % 8 == 0 and 8 <= c < 196 for c in cuts)
    assert cuts == draw_cuts(200, 4, seed=0, key="gsm8k/test/1") != draw_cuts(200, 4, seed=1, key="gsm8k/test/1")
    assert draw_cuts(20, 4, 0, "x") == [8]  # short texts have fewer candidates


@pytest.mark.unit
def test_cutoff_layer_and_interval():
    E = np.zeros((6, 6))
    E[0, 1:] = 0.9
    E[2, 3] = 0.5  # layer 2 still feeds layer 3
    E[3, 4] = 0.05  # below the threshold
    assert effects.later_effect(E).tolist() == [0.9, 0.0, 0.5, 0.05, 0.0, 0.0]
    assert effects.cutoff_layer(E, threshold=0.1) == 3
    assert effects.cutoff_layer(np.zeros((4, 4)), 0.1) == 0
    per_problem = np.stack([E, E * 0.0])
    ci = effects.cutoff_with_ci(per_problem, 0.1, n_boot=200)
    assert ci["cutoff"] == 3 and 0 <= ci["ci_low"] <= 3 == ci["ci_high"] and ci["rel_depth"] == 0.5


@pytest.mark.integration
def test_run_caches_and_resumes(tiny_dirs, jsonl, tmp_path, monkeypatch):
    p = jsonl([f'{{"text": "Problem {i}: {TEXT}"}}' for i in range(3)])
    kw = dict(analysis="future", dataset=str(p), n_examples=3, selection="first", parts=["layer", "mlp"],
              local=False, n_cuts=2, results_dir=tmp_path, n_boot=20)
    calls = {"n": 0}
    real = skip_analysis.skip_effects

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(skip_analysis, "skip_effects", flaky)
    with pytest.raises(KeyboardInterrupt):
        skip_analysis.run(str(tiny_dirs["llama"]), **kw)
    r = skip_analysis.run(str(tiny_dirs["llama"]), **kw)
    assert calls["n"] == 4  # 1 before the interruption, then only the 2 missing problems
    assert set(r.table.variant) == {"layer", "mlp"} and set(r.table.stat) == {"max", "mean"}
    assert r.meta["summary"]["layer"]["n_layers"] == 4 and len(r.meta["data"]["cuts"]) == 3
    # the typed summary chapter 03 and the atlas read, from the sidecar the run wrote
    s = skip_analysis.SkipSummary.of(r)
    assert (s.analysis, s.n_layers, s.n_problems, s.n_examples, s.n_cuts) == ("future", 4, 3, 3, kw["n_cuts"])
    assert set(s.cutoffs) == {"layer", "mlp"} and s.cutoffs["layer"].n_layers == 4 and s.model == str(tiny_dirs["llama"])
    E = skip_analysis.matrix(r.table, "future", "layer")
    assert E.shape == (4, 4) and np.allclose(np.tril(E), 0)  # the future effect on layers ≤ s is zero
    assert skip_analysis.run(str(tiny_dirs["llama"]), **kw).from_cache


@pytest.mark.integration
def test_a_floor_run_keeps_the_robust_statistic_beside_the_papers(tiny_dirs, jsonl, tmp_path):
    """``floor`` adds the robust per-problem means to the tables (and to the cache key); without it the run is the
    paper's statistic alone, under the key it always had."""
    p = jsonl([f'{{"text": "Problem {i}: {TEXT}"}}' for i in range(2)])
    kw = dict(analysis="current", dataset=str(p), n_examples=2, selection="first", parts=["layer"], local=False,
              results_dir=tmp_path, n_boot=20)
    plain = skip_analysis.run(str(tiny_dirs["llama"]), **kw)
    robust = skip_analysis.run(str(tiny_dirs["llama"]), floor=0.1, **kw)
    assert robust.path != plain.path and "floor" not in plain.meta["parameters"]
    assert set(plain.units.metric) == {"later_effect", "output_change"}
    assert set(robust.units.metric) == {"later_effect", "output_change", "later_effect_robust", "output_change_robust"}
    pick = lambda r, m: r.units[r.units.metric == m].value.to_numpy()  # noqa: E731
    assert np.array_equal(pick(plain, "later_effect"), pick(robust, "later_effect"))  # the paper's numbers unchanged
    robust_later, paper_later = pick(robust, "later_effect_robust"), pick(robust, "later_effect")
    assert (robust_later > 0).any() and not np.allclose(robust_later, paper_later)
    assert (robust_later <= paper_later + 1e-6).all()  # a floored denominator and a mean: never above the max
    assert (pick(robust, "output_change_robust") <= pick(robust, "output_change") + 1e-6).all()  # a mean ≤ the max
    assert {"relative_change_robust", "output_change_robust"} <= set(robust.table.metric)


@pytest.mark.integration
def test_a_nudge_run_is_a_control_run_under_its_own_key(tiny_dirs, jsonl, tmp_path):
    """``nudge=True``: the same problems as the skip run, the nudge variant only (parts and local ignored), under its
    own key — the skip run's key and numbers are what they were; :func:`nudge_units` names its rows
    ``random-nudge:<model>`` and runs only where the model has at least 10 problems."""
    from lmdepth.claims.skipping_claims import nudge_control

    p = jsonl([f'{{"text": "Problem {i}: {TEXT}"}}' for i in range(10)])
    kw = dict(analysis="current", dataset=str(p), n_examples=10, selection="first", parts=["layer", "mlp"],
              local=True, results_dir=tmp_path, n_boot=20, floor=0.1)
    m = str(tiny_dirs["llama"])
    skip = skip_analysis.run(m, **kw)
    nudge = skip_analysis.run(m, nudge=True, **kw)
    assert nudge.path != skip.path and skip_analysis.run(m, **kw).from_cache
    assert nudge.meta["parameters"]["parts"] == ["nudge"] and not nudge.meta["parameters"]["local"]
    digests = nudge.meta["nudge"]["directions_sha256"]  # a fresh draw per problem
    assert "nudge" not in skip.meta and set(digests) == set(skip.units.unit) and len(set(digests.values())) == 10
    assert set(nudge.units.variant) == {"nudge"} and set(nudge.units.unit) == set(skip.units.unit)
    pick = lambda r, v: r.units[(r.units.variant == v) & (r.units.metric == "output_change_robust")].value.to_numpy()  # noqa: E731
    assert (pick(nudge, "nudge") > 0).all() and not np.allclose(pick(nudge, "nudge"), pick(skip, "layer"))
    common = {k: v for k, v in kw.items() if k not in ("analysis", "n_examples")}
    units = skip_analysis.nudge_units([([m], 10), ([str(tiny_dirs["qwen2"])], 9)], **common)
    assert set(units.model) == {nudge_control(m)} and len(units) == len(nudge.units)
    assert skip_analysis.nudge_units([([m], 9)], **common) is None


@pytest.mark.integration
def test_groups_of_models_keep_their_own_sample_and_parts(tiny_dirs, jsonl, tmp_path):
    """Chapter 03's controls: the main model's on its sample, each comparison model's on the comparison sample
    (:func:`units_of` groups); the cutoff table lists only the parts each model ran."""
    p = jsonl([f'{{"text": "Problem {i}: {TEXT}"}}' for i in range(3)])
    kw = dict(dataset=str(p), selection="first", local=False, results_dir=tmp_path, n_boot=20)
    a, b = str(tiny_dirs["llama"]), str(tiny_dirs["qwen2"])
    units = skip_analysis.units_of([([a], 3, 2, 2), ([b], 1, 1, 1)], parts=["layer"], **kw)
    n = units.groupby(["model", "analysis"]).unit.nunique().to_dict()
    assert n == {(a, "current"): 3, (a, "future"): 2, (b, "current"): 1, (b, "future"): 1}
    assert skip_analysis.units_of([], parts=["layer"], **kw) is None
    main = skip_analysis.run(a, analysis="future", n_examples=2, n_cuts=2, parts=["layer", "mlp"], **kw)
    other = skip_analysis.run(b, analysis="future", n_examples=1, n_cuts=1, parts=["layer"], **kw)
    futures = {a: skip_analysis.SkipSummary.of(main), b: skip_analysis.SkipSummary.of(other)}
    table = skip_page.cutoff_table(futures, [a, b], ["layer", "mlp"])
    assert list(zip(table.model, table.part)) == [(a, skip_page.VARIANT_TITLES["layer"]),
                                                  (a, skip_page.VARIANT_TITLES["mlp"]),
                                                  (b, skip_page.VARIANT_TITLES["layer"])]
    assert table["95% CI (layers)"].iloc[-1] == "—"  # one problem: no interval (the page shows no "nan")
    assert list(table.problems) == [2, 2, 1] and list(table["of layers"]) == [4, 4, 4]


@pytest.mark.integration
def test_the_benchmark_is_stored_like_a_run_and_retimed_only_on_request(tiny_dirs, jsonl, tmp_path, monkeypatch):
    p = jsonl([f'{{"text": "Problem {i}: {TEXT}"}}' for i in range(3)])
    kw = dict(dataset=str(p), selection="first", n_cuts=4, results_dir=tmp_path)
    timed = {"n": 0}
    real = skip_analysis.time_paths

    def counting(*a, **k):
        timed["n"] += 1
        return real(*a, **k)

    monkeypatch.setattr(skip_analysis, "time_paths", counting)
    assert skip_analysis.benchmark(str(tiny_dirs["llama"]), n_pool=3, compute=False, **kw) is None  # nothing stored
    assert timed["n"] == 0 and "`-p benchmark true`" in skip_page.benchmark_md(None)[0]
    first = skip_analysis.benchmark(str(tiny_dirs["llama"]), n_pool=3, **kw)
    b = first.table.iloc[0]
    assert not first.from_cache and timed["n"] == 1
    assert b.n_cuts == 2 and b.naive_passes == 2 * 4 and b.max_abs_diff <= 1e-5 and b.pool == 3
    assert b.pool_min <= b.pool_median <= b.pool_max and b.counted_ratio > 1
    assert first.meta["measured_at"] and first.meta["environment"]["platform"]
    s = skip_analysis.BenchmarkSummary.of(first)
    assert s.measured_at == first.meta["measured_at"] and s.platform and len(s.load_average) in (0, 2)
    again = skip_analysis.benchmark(str(tiny_dirs["llama"]), n_pool=3, **kw)
    assert again.from_cache and timed["n"] == 1 and again.table.equals(first.table)
    read = skip_analysis.benchmark(str(tiny_dirs["llama"]), n_pool=3, compute=False, **kw)  # the build's read
    assert read.from_cache and timed["n"] == 1 and read.table.equals(first.table)
    paragraphs = skip_page.benchmark_md(again)
    assert "stored with the book's results" in paragraphs[0] and "timed in this build" in skip_page.benchmark_md(first)[0]
    skip_analysis.benchmark(str(tiny_dirs["llama"]), n_pool=3, use_cache=False, **kw)
    assert timed["n"] == 2


@pytest.mark.unit
def test_work_units_count_the_algorithms():
    from lmdepth.hooks.skip_cost import work_units

    # L = 2, T = 10, cuts 4 and 8, no logits: naive 2 cuts × 2 skipped layers × a full pass of 2·10;
    # fast: per s the lead (cut 8) over all 10 positions for layers ≥ s, then cut 4 over positions ≥ 4
    u = work_units(2, 10, [4, 8], current=False, n_variants=1, logit_cost=0.0)
    assert u == {"naive": 80.0, "fast": 2 * 10 + 2 * 6 + 1 * 10 + 1 * 6}
    # logits: naive unembeds every position of every pass; fast only the measured ones
    v = work_units(2, 10, [4, 8], current=False, n_variants=3, logit_cost=1.0)
    assert v["naive"] == 3 * (80 + 2 * 2 * 10) and v["fast"] == 3 * (48 + 2 * (2 + 6))
    # all tokens: one pass per skipped layer, layers below s never computed
    assert work_units(4, 10, [], current=True, n_variants=1, logit_cost=0.0) == {"naive": 160.0, "fast": 100.0}


@pytest.mark.integration
def test_work_ratios_use_the_analysis_cut_points():
    from lmdepth.hooks.skip_cost import unembed_cost, work_ratios, work_units

    adapter = ModelAdapter.for_model(tiny_model("llama"))
    lengths = [("a", 60), ("b", 90)]
    got = work_ratios(adapter, lengths, n_cuts=4, seed=3, current=False, n_variants=4)
    for (key, T), r in zip(lengths, got):
        u = work_units(adapter.n_layers, T, draw_cuts(T, 4, 3, key), False, 4, unembed_cost(adapter))
        assert r == pytest.approx(u["naive"] / u["fast"]) and r > 1
    # another problem id draws other cuts, hence (here) another ratio
    assert work_ratios(adapter, [("c", 60)], 4, 3, False, 4) != got[:1]


@pytest.mark.unit
def test_the_statistics_table_sets_the_deciding_statistic_beside_the_papers():
    import pandas as pd

    nan = float("nan")
    verdicts = pd.DataFrame({"claim": ["a", "b"], "model": ["m", "m"], "estimate": [0.42, 0.7],
                             "ci_low": [0.4, nan], "ci_high": [0.45, nan], "paper_estimate": [0.97, nan],
                             "paper_at_bound": [0.93, nan]})
    t = skip_page.statistics_table(verdicts)
    assert len(t) == 1  # rows without a paper's statistic (other chapters' claims) are left out
    row = t.iloc[0]
    assert row["robust statistic (decides) [95 % CI]"] == "0.42 [0.4, 0.45]"
    assert (row["paper's statistic (clipped max)"], row["paper's maxima at the clip"]) == ("0.97", "93%")
    assert skip_page.statistics_table(verdicts.drop(columns=["paper_estimate", "paper_at_bound"])).empty
