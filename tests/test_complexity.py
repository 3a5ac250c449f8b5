"""Depth vs complexity: depth score, statistics, difficulty data, correctness checks, erasure and integrated
gradients on tiny models, and the cached run end to end."""

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from lmdepth.analyses import complexity as C
from lmdepth.book.pages import complexity_page as cx_page
from lmdepth.data.datasets import Example
from lmdepth.data.difficulty import (
    analysis_input,
    answer_start,
    difficulty_examples,
    gsm8k_correct,
    last_boxed,
    math_correct,
)
from lmdepth.errors import DataError, ParameterError
from lmdepth.hooks.stack import (
    AdapterStack,
    boundary_residuals,
    erasure_map,
    integrated_gradients,
    mean_residuals,
)
from lmdepth.metrics.depth import (
    association,
    depth_score,
    group_statistics,
    layer_effect,
    level_statistics,
    partial_slope,
    slope,
)
from lmdepth.model.families import ModelAdapter
from lmdepth.model.taps import hooked_residuals
from lmdepth.testing import tiny_model

TEXT = "Q: a=3, b=a+2, c=b+1. What is c? A: 6"


# ---- depth score (pure) --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("L", [1, 5, 30])
@pytest.mark.unit
def test_depth_score_of_a_one_hot_vector_is_its_index(L):
    for i in range(L):
        e = np.zeros(L)
        e[i] = 0.7
        assert depth_score(e) == pytest.approx(i)
        assert depth_score(e, one_based=True) == pytest.approx(i + 1)


@pytest.mark.unit
def test_depth_score_edge_cases():
    assert depth_score(np.ones(5)) == pytest.approx(2.0)  # uniform: the middle
    assert np.isnan(depth_score(np.zeros(4)))
    batch = depth_score(np.eye(4))  # the last axis is the layer axis
    np.testing.assert_allclose(batch, [0, 1, 2, 3])


@pytest.mark.unit
def test_layer_effect_is_the_mean_over_later_layers():
    E = np.zeros((4, 4))
    E[0, 1:] = [0.3, 0.6, 0.9]
    E[2, 3] = 0.4
    E[1, 1] = E[3, 0] = 5.0  # diagonal / below: ignored (zero in the future setting anyway)
    np.testing.assert_allclose(layer_effect(E), [0.6, 0.0, 0.4, 0.0])
    np.testing.assert_allclose(layer_effect(np.stack([E, 2 * E])), [[0.6, 0, 0.4, 0], [1.2, 0, 0.8, 0]])


def _synthetic_effects(levels, depth_of_level, L=10, noise=0.05, seed=0):
    """Items whose skip effects sit at a level-dependent layer (E[s, s+1] bump) plus noise."""
    rng = np.random.default_rng(seed)
    E, O = [], []
    for lv in levels:
        e = noise * rng.random((L, L))
        o = noise * rng.random(L)
        c = depth_of_level(lv)
        e[c, c + 1:] += 1.0
        o[c] += 1.0
        E.append(np.triu(e, 1))
        O.append(o)
    return np.array(E), np.array(O)


@pytest.mark.unit
def test_level_statistics_detect_a_rising_and_a_flat_depth():
    levels = np.repeat([1, 2, 3, 4], 6)
    for depth, rising in ((lambda lv: 1 + lv, True), (lambda lv: 4, False)):
        E, O = _synthetic_effects(levels, depth)
        by_level, slopes = level_statistics(E, O, levels, n_boot=200, seed=0)
        assert set(by_level.level) == {1, 2, 3, 4} and set(by_level.aggregation) == {"max", "mean"}
        for _, r in slopes.iterrows():
            assert r.ci_low <= r.slope <= r.ci_high
            if rising:
                assert r.ci_low > 0.3, r  # 1 layer per level, diluted by the noise
            else:
                assert abs(r.slope) < 0.3, r
        mean_logit = by_level[(by_level.aggregation == "mean") & (by_level.metric == "logit_effect")]
        assert (mean_logit.ci_low <= mean_logit.depth_score + 1e-9).all()


@pytest.mark.unit
def test_group_statistics_handle_empty_groups():
    levels = np.repeat([1, 2], 4)
    E, O = _synthetic_effects(levels, lambda lv: 3)
    g = group_statistics(E, O, {"solved": levels == 1, "unsolved": np.zeros(8, bool)}, n_boot=50)
    assert g[g.group == "solved"].depth_score.notna().all()
    assert g[g.group == "unsolved"].depth_score.isna().all() and (g[g.group == "unsolved"].n == 0).all()


@pytest.mark.unit
def test_slope():
    assert slope([1, 2, 3], [2, 4, 6]) == pytest.approx(2)
    assert np.isnan(slope([1, 1], [0, 1]))
    assert slope([1, 2, 3], [1, np.nan, 3]) == pytest.approx(1)



@pytest.mark.unit
def test_association_is_pearson_r_and_the_correlation_ratio():
    rng = np.random.default_rng(1)
    level = np.repeat([1.0, 2, 3, 4], 10)
    tokens = 5 * level + rng.normal(0, 3, level.size)
    r, eta = association(level, tokens)
    assert r == pytest.approx(np.corrcoef(level, tokens)[0, 1])
    means = np.array([tokens[level == v].mean() for v in level])  # η² = between-level share of the variance
    assert eta == pytest.approx(np.sqrt(((means - tokens.mean()) ** 2).sum() / ((tokens - tokens.mean()) ** 2).sum()))
    # a length fixed per level along a curve: |r| < 1 but η = 1; weights count like repeated units
    curve = np.array([10.0, 40, 20, 30])[level.astype(int) - 1]
    r_curve, eta_curve = association(level, curve)
    assert abs(r_curve) < 0.9 and eta_curve == pytest.approx(1.0)
    w = rng.integers(1, 4, level.size).astype(float)
    assert association(level, tokens, w)[0] == pytest.approx(association(np.repeat(level, w.astype(int)),
                                                                         np.repeat(tokens, w.astype(int)))[0])
    assert association(level, np.full(level.size, 9.0)) == (0.0, 0.0)  # one length: nothing to confound
    assert all(np.isnan(association(np.ones(5), np.arange(5.0))))

@pytest.mark.unit
def test_partial_slope_holds_the_covariate_fixed():
    rng = np.random.default_rng(0)
    level = np.repeat([1.0, 2, 3, 4, 5], 20)
    tokens = 20 * level + rng.uniform(0, 100, level.size)  # r ≈ 0.7 with the level
    follows_length = tokens / 25 + rng.normal(0, 0.01, level.size)
    assert slope(level, follows_length) > 0.7  # the plain slope picks up the length
    assert partial_slope(follows_length, level) == pytest.approx(slope(level, follows_length))
    assert partial_slope(follows_length, level, tokens) == pytest.approx(0.0, abs=0.01)
    assert partial_slope(level + tokens / 25, level, tokens) == pytest.approx(1.0)
    # weighted: the coefficient of a weighted least-squares fit (polyfit weighs residuals by √w)
    w = rng.uniform(0.1, 2.0, level.size)
    y = 0.3 * level + rng.normal(0, 1, level.size)
    assert partial_slope(y, level, None, w) == pytest.approx(np.polyfit(level, y, 1, w=np.sqrt(w))[0])
    design = np.column_stack([np.ones_like(level), level, tokens]) * np.sqrt(w)[:, None]
    assert partial_slope(y, level, tokens, w) == pytest.approx(np.linalg.lstsq(design, y * np.sqrt(w))[0][1])
    # dropped: NaN depth, zero weight; a constant covariate changes nothing; collinear or one level: NaN
    y[:3], w[3:6] = np.nan, 0.0
    assert partial_slope(y, level, None, w) == pytest.approx(np.polyfit(level[6:], y[6:], 1, w=np.sqrt(w[6:]))[0])
    assert partial_slope(y, level, np.full(level.size, 7.0), w) == pytest.approx(partial_slope(y, level, None, w))
    assert np.isnan(partial_slope(y, level, 27 * level + 70)) and np.isnan(partial_slope(y, np.ones(level.size)))


# ---- data with known difficulty -------------------------------------------------------------------------------------

@pytest.mark.unit
def test_math_levels_and_gsm8k_steps():
    math = difficulty_examples("math", [1, 5], 3, seed=0)
    assert [e.meta["level"] for e in math] == [1, 1, 1, 5, 5, 5]
    assert all(e.meta["subject"] == "Intermediate Algebra" and e.prompt.startswith("Problem: ")
               and e.prompt.endswith("\nAnswer:") and e.answer.startswith(" ") for e in math)
    assert math == difficulty_examples("math", [1, 5], 3, seed=0)
    assert math != difficulty_examples("math", [1, 5], 3, seed=1)
    gsm = difficulty_examples("gsm8k", None, 4, seed=0)
    for e in gsm:
        steps = e.answer.count("<<")
        assert steps == e.meta["steps"] and (steps >= 5 if e.meta["level"] == 5 else steps == e.meta["level"])
    assert [e.meta["level"] for e in gsm] == [2] * 4 + [3] * 4 + [4] * 4 + [5] * 4


@pytest.mark.unit
def test_synthetic_sources_come_from_the_generator():
    exs = difficulty_examples("facts", [2], 3)
    assert all(e.meta["level"] == 2 and e.meta["synthetic"] for e in exs)


@pytest.mark.unit
def test_bad_parameters_are_refused():
    with pytest.raises(ParameterError, match="source"):
        difficulty_examples("mquake")
    with pytest.raises(ParameterError, match="levels"):
        difficulty_examples("gsm8k", [1])
    with pytest.raises(ParameterError, match="hop_cut"):
        C.ComplexityParams(hop_cut="last")
    with pytest.raises(ParameterError, match="max_answer_tokens"):
        C.ComplexityParams(max_answer_tokens=2)


@pytest.mark.unit
def test_cut_points(tok):
    ex = difficulty_examples("vars", [2], 1)[0]
    full = tok(ex.text, return_tensors="pt").input_ids
    a = answer_start(tok, ex, full)
    assert tok.decode(full[0, a:]) == ex.answer
    ids, cuts, a2 = analysis_input(tok, ex, full, "vars", 0)
    assert a2 == a and ids.shape[1] == full.shape[1] - 1 and cuts == [a - 1]  # measure where the answer is predicted
    ids, cuts, _ = analysis_input(tok, ex, full, "vars", 0, hop_cut="answer")
    assert ids.shape[1] == full.shape[1] and cuts == [a]  # the authors' choice
    m = Example("m", "Problem: x\nAnswer:", " " + "step " * 40)
    full = tok(m.text, return_tensors="pt").input_ids
    ids, cuts, a = analysis_input(tok, m, full, "math", 0, n_cuts=4, cut_stride=4, max_answer_tokens=100)
    assert ids.shape[1] == a + 100 and len(cuts) == 4
    assert all((c - a) % 4 == 0 and a <= c < a + 96 for c in cuts)
    assert analysis_input(tok, m, full, "math", 0, n_cuts=4)[1] == analysis_input(tok, m, full, "math", 0, n_cuts=4)[1]


# ---- correctness -----------------------------------------------------------------------------------------------

@pytest.mark.unit
def test_gsm8k_answer_checking():
    assert gsm8k_correct("so 3+4=7. The final answer is 7", "7")
    assert gsm8k_correct("The final answer is $1,200.", "1200")
    assert not gsm8k_correct("The final answer is 8. Then 7", "7")
    assert gsm8k_correct("she has 5 then 12 apples", "12")  # no cue: the last number
    assert not gsm8k_correct("no numbers", "3")


@pytest.mark.unit
def test_math_answer_checking():
    ref = "Thus the answer is $\\boxed{\\frac{3}{4}}$."
    assert last_boxed(ref) == "\\frac{3}{4}"
    assert last_boxed("\\boxed{x^{2}} and \\boxed{\\sqrt{2}}") == "\\sqrt{2}"
    assert math_correct("so $\\boxed{\\dfrac34}$", ref)
    assert math_correct("$\\boxed{ 0.75 }$", "$\\boxed{3/4}$")
    assert not math_correct("$\\boxed{4/3}$", ref)
    assert not math_correct("the answer is 3/4", ref)  # no box, no credit


# ---- residual stacks, generic skip effects, erasure, integrated gradients (tiny models) ---------------------------

@pytest.fixture(scope="module")
def ids(tok):
    return tok(TEXT, return_tensors="pt").input_ids


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.integration
def test_adapter_stack_runs_and_edits(family, ids):
    adapter = ModelAdapter.for_model(tiny_model(family))
    stack = AdapterStack(adapter)
    ref = hooked_residuals(adapter, ids)
    res = boundary_residuals(stack, ids)
    torch.testing.assert_close(res[0], ref["resid_pre"][0])
    torch.testing.assert_close(res[1:], ref["resid_post"])
    # starting at a boundary from its clean residual changes nothing
    for b in (0, 2, adapter.n_layers):
        torch.testing.assert_close(stack.run(ids, start=b, h_start=res[b]), res[-1], atol=1e-5, rtol=0)
    # an edit at boundary 2 only changes boundaries ≥ 2
    seen = {}

    def edit(b, h):
        seen[b] = h.clone()
        return h * 0.5 if b == 2 else None

    stack.run(ids, edit)
    assert sorted(seen) == list(range(adapter.n_layers + 1))
    torch.testing.assert_close(seen[1], res[1])
    assert not torch.allclose(seen[3], res[3])
    # the model is left as it was
    torch.testing.assert_close(boundary_residuals(stack, ids), res)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.integration
def test_erasure_map(family, ids, tok):
    adapter = ModelAdapter.for_model(tiny_model(family))
    stack = AdapterStack(adapter)
    L, T = adapter.n_layers, ids.shape[1]
    a = T - 1
    means = mean_residuals(stack, [tok("Some other text, 12 + 5 = 17.", return_tensors="pt").input_ids])
    assert means.shape == (L + 1, adapter.d_model)
    m = erasure_map(stack, ids, a, means, batch_size=8)
    assert m.shape == (L + 1, T) and (m >= 0).all()
    assert (m[:, -1] == 0).all()  # the last token cannot change the prediction made before it
    assert (m[L, : a - 1] == 0).all() and m[L, a - 1] > 0  # the final residual only feeds its own prediction
    assert m[0, 1:a].max() > 0
    # batching does not change the numbers: a single-position run gives the same cell
    one = erasure_map(stack, ids, a, means, batch_size=2, positions=[7])
    torch.testing.assert_close(one[:, 7], m[:, 7], atol=1e-6, rtol=0)
    # erasing with the clean value itself is a no-op: exactly zero
    clean = boundary_residuals(stack, ids)[:, 0]
    assert erasure_map(stack, ids, a, clean[:, 5], positions=[5])[:, 5].abs().max() == 0


@pytest.mark.integration
def test_integrated_gradients_completeness(ids):
    adapter = ModelAdapter.for_model(tiny_model("llama"))
    stack = AdapterStack(adapter)
    a = ids.shape[1] - 2  # two answer tokens
    res = integrated_gradients(stack, ids, a, n_steps=256, batch_size=64)
    L, T = adapter.n_layers, ids.shape[1]
    assert res.ig.shape == (L, T)
    delta = res.f_x - res.f_baseline
    assert (np.abs(delta) > 1e-4).all()  # a real difference is being attributed
    assert (res.completeness_error < 0.03).all(), res.completeness_error
    assert np.abs(res.ig[:, -1]).max() < 1e-9  # the last token feeds no answer prediction
    # the midpoint rule is more accurate than the left sum at few steps, and agrees with the fine left sum
    left16 = integrated_gradients(stack, ids, a, n_steps=16, batch_size=16, layers=[0, 2], rule="left")
    mid16 = integrated_gradients(stack, ids, a, n_steps=16, batch_size=7, layers=[0, 2], rule="midpoint")
    assert mid16.f_baseline[[0, 2]] == pytest.approx(res.f_baseline[[0, 2]], abs=1e-6)
    assert (mid16.completeness_error[[0, 2]] <= left16.completeness_error[[0, 2]] + 1e-9).all()
    assert (mid16.completeness_error[[0, 2]] < 0.03).all()
    coarse = integrated_gradients(stack, ids, a, n_steps=8, batch_size=8, layers=[1])
    assert np.isnan(coarse.f_baseline[0]) and (coarse.ig[0] == 0).all()
    assert coarse.f_baseline[1] == pytest.approx(res.f_baseline[1], abs=1e-6)


# ---- the cached run end to end -------------------------------------------------------------------------------------

@pytest.mark.integration
def test_run_on_a_tiny_model_is_cached_and_resumable(tiny_dirs, tmp_path):
    kw = dict(model_name=str(tiny_dirs["llama"]), source="vars", n_per_level=2, levels=[1, 3], n_boot=20,
              results_dir=tmp_path)
    r = C.run(**kw)
    assert not r.from_cache
    s = r.meta["summary"]
    assert set(r.table.metric) == {"layer_effect", "logit_effect"} and set(r.table.level) == {1, 3}
    assert len(s["items"]) == 4 and {x["level"] for x in s["levels"]} == {1, 3}
    assert all(x["correct"] in (0, 1) for x in s["items"])
    assert C.run(**kw).from_cache
    cost = r.meta["unit_compute_s"]
    assert cost["units"] == cost["timed"] == cost["cpu_timed"] == 4 and 0 < cost["cpu_total"]  # each item's own cost
    bigger = C.run(**{**kw, "n_per_level": 3})  # reuses the 4 items already computed
    assert len(bigger.meta["summary"]["items"]) == 6 and bigger.meta["unit_compute_s"]["timed"] == 6
    frame = C.summary_frame({("tiny", "vars"): bigger}, "levels")
    assert {"model", "source", "rel_depth_score"} <= set(frame.columns)
    # the typed summary chapter 05 and the atlas read, from the sidecar the run wrote
    cs = C.ComplexitySummary.of(bigger)
    assert (cs.model, cs.source, cs.n_per_level, cs.n_layers) == (kw["model_name"], "vars", 3, 4)
    assert len(cs.items) == 6 and set(cs.levels.level) == {1, 3} and {"slope", "ci_low"} <= set(cs.slopes.columns)
    assert cs.accuracy == pytest.approx((cs.items.correct == 1).mean()) and not cs.from_cache
    # each item's prompt length, recorded by the run (for a one-token answer at the predicting position the input
    # analysed is the prompt alone) ...
    assert list(cs.items.prompt_tokens) == list(cs.items.n_tokens)
    recorded = C.prompt_lengths({("tiny", "vars"): bigger})
    assert list(recorded.prompt_tokens) == list(cs.items.prompt_tokens) and set(recorded.model) == {"tiny"}
    # ... and for a run from before it was recorded, its items regenerated and encoded again: the same numbers
    for item in bigger.meta["summary"]["items"]:
        del item["prompt_tokens"]
    assert C.prompt_lengths({("tiny", "vars"): bigger}).equals(recorded)
    bigger.meta["parameters"]["items"] = "0" * 16  # the generator no longer makes the run's items
    with pytest.raises(DataError, match="can no longer be regenerated as they were"):
        C.prompt_lengths({("tiny", "vars"): bigger})


@pytest.mark.integration
def test_an_erasure_run_reads_back_as_its_typed_summary(tiny_dirs, tmp_path):
    """What chapter 05's case-study tables read of a real erasure run: every prompt, integrated gradients where
    asked for (the first prompt), none elsewhere."""
    from lmdepth.analyses import erasure as ER

    model = str(tiny_dirs["llama"])
    r = ER.run(model, n_case_studies=2, n_mean_examples=2, ig_steps=4, ig_prompts=1, ig_batch=4, results_dir=tmp_path)
    s = ER.ErasureSummary.of(r)
    assert (s.model, s.n_layers, s.ig_steps, s.ig_rule) == (model, 4, 4, "left")
    first, second = (s.prompts[name] for name, _, _ in ER.CASE_STUDIES[:2])
    assert list(s.prompts) == [name for name, _, _ in ER.CASE_STUDIES[:2]]
    assert len(first.completeness_error) == 4 and first.f_x is not None and second.completeness_error is None
    assert len(first.tokens) == first.n_tokens > first.a_start > 0
    assert len(cx_page.completeness_table(r)) == 1 and len(cx_page.case_table({model: r})) == 2


@pytest.mark.integration
def test_a_checkpoint_or_a_finished_run_never_serves_a_changed_question(tiny_dirs, tmp_path, monkeypatch):
    """Same ids, other texts (a generator that changed, or one whose item i depended on the sample size): the run
    is not served from the cache and no item reuses the checkpoint of the old text."""
    kw = dict(model_name=str(tiny_dirs["llama"]), source="vars", n_per_level=2, levels=[1], n_boot=20,
              results_dir=tmp_path)
    first = C.run(**kw)
    real = C.difficulty_examples
    changed = lambda *a: [replace(e, prompt="x=1\ny=2\n" + e.prompt) for e in real(*a)]  # noqa: E731
    monkeypatch.setattr(C, "difficulty_examples", changed)
    second = C.run(**kw)
    assert not second.from_cache and second.path != first.path
    old, new = ([x["n_tokens"] for x in r.meta["summary"]["items"]] for r in (first, second))
    assert [x["item"] for x in second.meta["summary"]["items"]] == [x["item"] for x in first.meta["summary"]["items"]]
    assert all(b > a for a, b in zip(old, new))  # every item measured on its new, longer text


@pytest.mark.integration
def test_run_checks_correctness_by_generation(tiny_dirs, tmp_path, monkeypatch):
    kw = dict(model_name=str(tiny_dirs["qwen2"]), source="gsm8k", n_per_level=2, levels=[2], n_boot=20,
              gen_tokens=6, max_answer_tokens=16, n_cuts=2)
    # the tiny random model's own greedy generations: checked, and wrong
    r = C.run(**kw, results_dir=tmp_path / "generated")
    assert [(i["correct"], i["n_tokens"] <= 1024) for i in r.meta["summary"]["items"]] == [(0, True), (0, True)]
    # scripted generations: the checker must give the right one 1 and the wrong one 0 (a checker stuck at 0 fails)
    exs = difficulty_examples("gsm8k", [2], 2, seed=0)  # what the run draws
    # hand-checked: Mico and Marco's ages sum to 20, in 10 years 20 + 10 + 10 = 40; Sally's mean 630 / 9 = 70
    assert [(e.id, e.meta["final_answer"]) for e in exs] == [("gsm8k/test/278", "40"), ("gsm8k/test/1231", "70")]
    replies = {exs[0].prompt: "20 + 10 + 10 = 40.\nThe final answer is 40",
               exs[1].prompt: "630 / 9 = 75.\nThe final answer is 75"}
    monkeypatch.setattr(C, "generate_greedy", lambda lm, prompts, max_new_tokens, **_: [replies[p] for p in prompts])
    r = C.run(**kw, results_dir=tmp_path / "scripted")
    s = r.meta["summary"]
    assert {i["item"]: i["correct"] for i in s["items"]} == {"gsm8k/test/278": 1, "gsm8k/test/1231": 0}
    assert s["accuracy"] == 0.5 and s["generated"]["gsm8k/test/278"].endswith("The final answer is 40")
    assert r.table.groupby("item").correct.unique().map(list).to_dict() == {"gsm8k/test/278": [1], "gsm8k/test/1231": [0]}


# ---- chapter 05's grid of runs, its summaries and claims (no model) -------------------------------------------------

def _fake_result(model, source, L=11, n_per_level=2, from_cache=False, path="/r/depth_complexity/m/key"):
    """A RunResult with the shape of :func:`C.run`'s, built from synthetic effects."""
    from pathlib import Path

    from lmdepth.results import RunResult

    levels = np.repeat(C.LEVELS[source], n_per_level)
    E, O = _synthetic_effects(levels, lambda lv: 4, L=L)
    by_level, slopes = level_statistics(E, O, levels, n_boot=20, seed=0)
    ok = np.arange(len(levels)) % 2
    items = [{"item": f"{source}/{i}", "level": int(lv), "correct": int(ok[i]), "n_tokens": 10 + i,
              "prompt_tokens": 8 + i, "layer_effect": 4.0, "logit_effect": 4.0} for i, lv in enumerate(levels)]
    table = pd.DataFrame([{"model": model, "source": source, "item": it["item"], "level": it["level"], "metric": m,
                           "layer": s, "value": float(s == 4)} for it in items for m in ("layer_effect", "logit_effect")
                          for s in range(L)])
    groups = group_statistics(E, O, {"solved": ok == 1, "unsolved": ok == 0}, "mean", 20, 0)
    meta = {"parameters": {"model_name": model, "source": source, "n_per_level": n_per_level}, "wall_time_s": 12.4,
            "summary": {"n_layers": L, "accuracy": float(ok.mean()), "levels": by_level.to_dict("records"),
                        "slopes": slopes.to_dict("records"), "solved": groups.to_dict("records"), "items": items}}
    return RunResult(table, meta, Path(path), from_cache=from_cache)


@pytest.mark.unit
def test_chapter_parameters_are_checked_before_any_model_loads():
    from lmdepth.analyses import erasure as ER

    ok = dict(sources=["vars"], n_per_level=2, n_synthetic=4, n_per_level_compare=1,
              n_synthetic_compare=2, max_answer_tokens=0, n_cuts=2, hop_cut="predict", gen_tokens=0, n_boot=50)
    C.check_chapter_parameters(**ok)
    C.check_chapter_parameters(**{**ok, "max_answer_tokens": 8})
    for bad, match in (({"sources": []}, "at least one"), ({"sources": ["mquake"]}, "sources"),
                       ({"sources": "vars"}, "sources"),
                       ({"n_synthetic": 0}, "n_synthetic"), ({"n_per_level_compare": 1.5}, "n_per_level_compare"),
                       ({"max_answer_tokens": 4}, "0 \\(whole solution\\) or at least 8"),
                       ({"max_answer_tokens": -1}, "max_answer_tokens"), ({"hop_cut": "last"}, "hop_cut"),
                       ({"n_boot": 1}, "n_boot")):
        with pytest.raises(ParameterError, match=match):
            C.check_chapter_parameters(**{**ok, **bad})
    eok = dict(n_case_studies=3, n_case_studies_compare=0, n_ig_prompts=0, ig_steps=0, ig_rule="left")
    assert ER.check_chapter_parameters(**eok) == dict(eok, n_ig_prompts_compare=0)  # run_case_studies' keywords
    n = len(ER.CASE_STUDIES)
    for bad, match in (({"n_case_studies": 0}, "n_case_studies"), ({"n_case_studies": n + 1}, "n_case_studies"),
                       ({"n_case_studies_compare": n + 1}, "n_case_studies_compare"), ({"n_ig_prompts": -1}, "n_ig_prompts"),
                       ({"n_ig_prompts_compare": n + 1}, "n_ig_prompts_compare"),
                       ({"ig_steps": 5000}, "ig_steps"), ({"ig_rule": "right"}, "ig_rule")):
        with pytest.raises(ParameterError, match=match):
            ER.check_chapter_parameters(**{**eok, **bad})


@pytest.mark.unit
def test_run_grid_sizes_samples_per_model_and_source(monkeypatch):
    calls = []
    monkeypatch.setattr(C, "run", lambda m, **kw: calls.append((m, kw)) or f"{m}|{kw['source']}")
    loaders = {"a": "load-a", "b": "load-b"}
    out = C.run_grid(["a", "b"], ["math", "vars"], 2, 4, 1, 3, max_answer_tokens=0, loaders=loaders, seed=7)
    assert list(out) == [("a", "math"), ("a", "vars"), ("b", "math"), ("b", "vars")]
    assert out["b", "vars"] == "b|vars"
    assert [(m, kw["n_per_level"], kw["lm"]) for m, kw in calls] == [("a", 2, "load-a"), ("a", 4, "load-a"),
                                                                      ("b", 1, "load-b"), ("b", 3, "load-b")]
    assert all(kw["max_answer_tokens"] is None and kw["seed"] == 7 for _, kw in calls)  # 0: the whole solution
    C.run_grid(["a"], ["gsm8k"], 2, 4, 1, 3, max_answer_tokens=32, loaders=loaders)
    assert calls[-1][1]["max_answer_tokens"] == 32


@pytest.mark.unit
def test_run_grid_loads_with_the_parameters_settings(monkeypatch):
    """Without loaders the grid makes them with the runs' own device, dtype and remote (the parameters' defaults
    where not given), and a misspelt parameter stops it in one line before any model is loaded."""
    made = []
    monkeypatch.setattr(C, "model_loaders", lambda models, *settings: made.append(settings) or dict.fromkeys(models))
    monkeypatch.setattr(C, "run", lambda m, **kw: None)
    C.run_grid(["a"], ["math"], 1, 1, 1, 1, dtype="bfloat16", remote="local")
    assert made == [(C.ComplexityParams().device, "bfloat16", "local")]
    with pytest.raises(ParameterError, match="dtyp"):
        C.run_grid(["a"], ["math"], 1, 1, 1, 1, dtyp="bfloat16")
    assert len(made) == 1


@pytest.mark.unit
def test_grid_summaries_and_notes():
    results = {("m1", "vars"): _fake_result("m1", "vars", from_cache=True),
               ("m1", "gsm8k"): _fake_result("m1", "gsm8k"), ("m2", "vars"): _fake_result("m2", "vars", L=7)}
    g = C.grid_frames(results)
    assert len(g.items) == 8 + 8 + 8 and set(g.table.model) == {"m1", "m2"} and g.table.index.is_unique
    # each item's prompt length on the items and on every row of the claims' per-item table
    assert list(g.items.prompt_tokens) == [8 + i for _ in range(3) for i in range(8)]
    assert len(g.table) == sum(len(r.table) for r in results.values())
    assert (g.table.prompt_tokens == g.table.item.str.split("/").str[1].astype(int) + 8).all()
    assert {"rel_depth_score", "n_layers"} <= set(g.levels.columns)
    results["m2", "vars"].meta["summary"]["levels"][0]["depth_score"] = 7.0  # beyond layer L − 1 = 6
    with pytest.raises(RuntimeError, match=r"outside \[0, L − 1\]"):
        C.grid_frames(results)
    results["m2", "vars"].meta["summary"]["levels"][0]["depth_score"] = 6.0
    note = cx_page.runs_note(results)
    assert note == ("Depth-score runs: 3 (model × source), 24 items in all; **m1** 11 layers, **m2** 7 layers. "
                    "Computed now: 25 s (2 runs; the rest from the cache).")
    sizes = cx_page.sizes_table(g.items.assign(correct=np.where(g.items.source == "gsm8k", -1, g.items.correct)))
    assert list(sizes.columns) == ["source", "level", "m1", "m2"] and len(sizes) == 4 + 4
    row = sizes[(sizes.source == "vars") & (sizes.level == 1)].iloc[0]
    assert row.m1 == "2 items · 10 tokens · 1 solved"  # n_tokens 10 and 11 → mean 10.5 → "10" (round half even)
    gsm = sizes[sizes.source == "gsm8k"]
    assert gsm.m1.str.endswith("– solved").all() and gsm.m2.isna().all()
    counts = cx_page.solved_counts(g.items)
    assert counts.to_dict("records") == [{"model": "m1", "source": "gsm8k", "solved": 4, "unsolved": 4},
                                         {"model": "m1", "source": "vars", "solved": 4, "unsolved": 4},
                                         {"model": "m2", "source": "vars", "solved": 4, "unsolved": 4}]
    verdicts = pd.DataFrame({"counted_as": ["agrees", "not testable", "agrees"], "headline": True})
    assert cx_page.summary_note(verdicts, results) == (
        "Verdicts (claim × model): 2 agrees, 0 disagrees, 0 inconclusive, 1 not testable, 0 no valid control, 0 not discriminating, 0 explained by its control. "
        "Results: `/r/depth_complexity`.")


@pytest.mark.unit
def test_accuracy_per_level_with_its_interval_and_the_constant_answer_baseline():
    from lmdepth.metrics.intervals import wilson_interval

    items = pd.DataFrame({"model": "m", "source": "arith", "level": [1] * 10 + [2] * 10 + [3] * 2,
                          "correct": [1] * 9 + [0] + [1] * 2 + [0] * 8 + [-1, -1],
                          "answer": list("0123456789") + list("7777777123") + ["1", "2"]})
    acc = cx_page.accuracy_table(items)
    assert list(acc.level) == [1, 2]  # level 3 was not checked (correct −1): no row, not 0 %
    one, two = acc.iloc[0], acc.iloc[1]
    assert (one.n, one.accuracy, one.baseline) == (10, 0.9, 0.1) and (one.ci_low, one.ci_high) == wilson_interval(9, 10)
    assert one.above and one.ci_low > 0.5
    assert (two.accuracy, two.baseline) == (0.2, 0.7) and not two.above  # "7" seven times: a constant answer wins
    cell = cx_page.accuracy_display(acc).set_index("level").loc[1, "m"]
    assert cell.startswith("90% [") and cell.endswith("(n 10; const. 10%) ✓")
    text = cx_page.ladder_md(acc)  # level 1 above, level 2 (the hardest checked) below its 70 % baseline
    assert text.startswith("- *synthetic arithmetic chains*") and "m: 1 (level 2: 20% [" in text
    assert "constant answer 70%" in text


@pytest.mark.unit
def test_slope_table():
    slopes = pd.DataFrame({"model": ["m"] * 4, "source": ["math", "math", "vars", "vars"],
                           "aggregation": ["mean", "max", "mean", "mean"],
                           "metric": ["layer_effect", "layer_effect", "layer_effect", "logit_effect"],
                           "slope": [0.30001, 9.0, -0.1, 0.5], "rel_slope": [0.03, 0.9, -0.01, 0.05],
                           "rel_ci_low": [-0.01, 0, -0.02, 0.0], "rel_ci_high": [0.02, 1, 0.03, 0.1]})
    levels = pd.DataFrame({"model": ["m"] * 5, "source": ["math"] * 3 + ["vars"] * 2,
                           "aggregation": ["mean", "mean", "max", "mean", "mean"], "n": [4, 3, 1, 2, 5]})
    items = pd.DataFrame({"model": "m", "source": ["math"] * 5 + ["vars"] * 4, "level": [1, 2, 3, 4, 5, 1, 1, 2, 2],
                          "prompt_tokens": [97, 124, 151, 178, 205, 60, 64, 64, 60]})
    sl = cx_page.slope_table(slopes, levels, items)
    assert list(sl.columns) == ["model", "source", "metric", "slope (layers/level)",
                                "rise over all levels (rel. depth)", "95% CI", "prompt tokens per level",
                                "r (level, prompt length)"]
    # the prompt length beside each slope: 27 tokens per level in step with it (r = 1); none on average, r = 0
    assert list(sl["prompt tokens per level"]) == [27.0, 0.0, 0.0] and list(sl["r (level, prompt length)"]) == [1, 0, 0]
    assert len(sl) == 3 and (sl.metric != "max").all()
    math, vars_ = sl.iloc[0], sl.iloc[1]
    assert math["rise over all levels (rel. depth)"] == pytest.approx(0.12)  # 4 level steps × 0.03
    assert math["95% CI"] == "-0.040 … +0.080" and math["slope (layers/level)"] == 0.3
    assert vars_["rise over all levels (rel. depth)"] == pytest.approx(-0.03) and vars_["95% CI"] == "n/a (2 per level)"


@pytest.mark.unit
def test_erasure_summaries(monkeypatch):
    from pathlib import Path

    from lmdepth.analyses import erasure as ER
    from lmdepth.results import RunResult

    # the highest boundary that still matters, per token, ignoring position 0 and the last token
    L, T = 4, 6
    reach = np.zeros((L + 1, T))
    reach[:, 0] = 100.0  # the attention sink: ignored
    reach[:2, 1] = 1.0  # token 1 matters up to boundary 1
    reach[:4, 3] = 0.5  # token 3 up to boundary 3
    reach[4, 4] = 0.05  # below 10 % of the max: ignored
    reach[:, 5] = 9.0  # the last token: ignored
    table = pd.DataFrame([{"model": "m", "prompt": "p", "method": meth, "layer": l, "position": t,
                           "value": reach[l, t]} for meth in ("erasure", "ig") for l in range(L + 1) for t in range(T)])
    got = ER.last_layer_that_matters(table)
    assert got.to_dict("records") == [{"model": "m", "prompt": "p", "first token": 1, "last prompt token": 3,
                                       "tokens": 2, "of layers": 4}]
    # completeness table and its note
    prompts = {"a": {"a_start": 7, "n_tokens": 9, "tokens": [f"{t}: x" for t in range(9)], "correct": 1,
                     "f_x": 0.123456, "f_baseline": [0.0] * 3, "ig_sum": [0.1] * 3,
                     "completeness_error": [0.01, 0.2, 0.03]},
               "b": {"a_start": 4, "n_tokens": 5, "tokens": [f"{t}: y" for t in range(5)], "correct": 0}}

    def erasure_run(ig_steps: int, prompts: dict) -> RunResult:  # the sidecar as erasure.run writes it
        return RunResult(pd.DataFrame(), {"parameters": {"model_name": "m", "ig_steps": ig_steps, "ig_rule": "midpoint"},
                                          "summary": {"n_layers": 3, "prompts": prompts}, "wall_time_s": 1.0}, Path("."))

    res = erasure_run(16, prompts)
    comp = cx_page.completeness_table(res)
    assert comp.to_dict("records") == [{"prompt": "a", "f(X)": 0.1235, "median |error|": 0.03, "max |error|": 0.2,
                                        "layers with error > 5 %": 1, "of layers": 3}]
    assert cx_page.completeness_note(res).startswith("Integrated gradients with 16 steps, midpoint rule")
    no_ig = erasure_run(0, {"b": prompts["b"]})
    assert cx_page.completeness_table(no_ig).empty and list(cx_page.completeness_table(no_ig).columns) == cx_page.COMPLETENESS_COLUMNS
    assert "skipped" in cx_page.completeness_note(no_ig)
    by_model = cx_page.completeness_by_model({"m": res, "n": no_ig, "o": res})
    assert list(by_model.columns) == ["model", *cx_page.COMPLETENESS_COLUMNS]
    assert list(by_model.model) == ["m", "o"] and by_model.drop(columns="model").iloc[1].to_dict() == comp.iloc[0].to_dict()
    assert cx_page.completeness_by_model({"n": no_ig}).empty
    assert cx_page.case_table({"m": res}).to_dict("records") == [
        {"model": "m", "prompt": "a", "tokens": 9, "answer tokens": 2, "greedy answer right": "yes"},
        {"model": "m", "prompt": "b", "tokens": 5, "answer tokens": 1, "greedy answer right": "no"}]
    # the main model gets integrated gradients, the comparison models erasure when n_case_studies_compare > 0 and
    # integrated gradients only when ig_prompts_compare > 0
    calls = []
    monkeypatch.setattr(ER, "run", lambda m, **kw: calls.append((m, kw)) or m)
    assert ER.run_case_studies(["a", "b"], 3, 0, 8, 1, "left", {"a": "la"}, n_mean_examples=2) == {"a": "a"}
    assert calls == [("a", dict(n_case_studies=3, ig_steps=8, ig_prompts=1, ig_rule="left", lm="la",
                                n_mean_examples=2))]
    assert list(ER.run_case_studies(["a", "b", "c"], 3, 1, 8, 1, "left", n_mean_examples=2)) == ["a", "b", "c"]
    assert calls[-1] == ("c", dict(n_case_studies=1, ig_steps=0, ig_prompts=0, ig_rule="left", lm=None,
                                   n_mean_examples=2))
    ER.run_case_studies(["a", "b"], 3, 2, 8, 1, "midpoint", n_ig_prompts_compare=2, n_mean_examples=2)
    assert calls[-1] == ("b", dict(n_case_studies=2, ig_steps=8, ig_prompts=2, ig_rule="midpoint", lm=None,
                                   n_mean_examples=2))


@pytest.mark.unit
def test_map_chart_draws_every_cell_of_the_table():
    """The map ships one row per token (values as a column, flattened in the browser): drawn by Vega, its cells are
    exactly the table's (token, layer, value, is_answer), the last token left out."""
    import re

    import vl_convert as vlc

    from lmdepth.charts.erasure_charts import map_chart

    table = pd.DataFrame([{"model": "m", "prompt": "p", "method": "erasure", "layer": l, "position": t,
                           "token": f"{t}: x{t}", "is_answer": t == 2, "value": round(0.1 * l + 0.01 * t + 0.003, 4)}
                          for l in range(3) for t in range(4)])
    svg = vlc.vegalite_to_svg(map_chart(table, "erasure", "m").to_dict())
    cells = {(m[0], int(m[1]), float(m[2]), m[3] == "true") for m in
             re.findall(r'aria-label="token: ([^;]*);[^"]*; layer: (\d+); value: ([\d.]+); is_answer: (\w+)"', svg)}
    want = {(r.token, r.layer, r.value, r.is_answer) for r in table[table.position < 3].itertuples()}
    assert cells == want and len(want) == 9


@pytest.mark.unit
def test_comparison_maps():
    from lmdepth.charts.erasure_charts import comparison_maps

    table = pd.DataFrame([{"model": m, "prompt": "p", "method": "erasure", "layer": l, "position": t,
                           "token": f"{t}: x", "is_answer": t == 2, "value": float(l + t)}
                          for m in ("a", "b") for l in range(3) for t in range(3)])
    assert comparison_maps(table, []) is None and comparison_maps(table, ["zz"]) is None
    chart = comparison_maps(table, ["b", "zz"])
    assert len(chart.vconcat) == 1 and chart.vconcat[0].title == "b"
    # integrated gradients: only the models that have them, each drawn on the diverging scale
    table = pd.concat([table, table[table.model == "a"].assign(method="ig", value=lambda d: d.value - 2)])
    assert comparison_maps(table, ["b"], method="ig") is None
    chart = comparison_maps(table, ["a", "b"], method="ig")
    assert [c.title for c in chart.vconcat] == ["a"]
    assert chart.to_dict()["vconcat"][0]["concat"][0]["encoding"]["color"]["scale"]["scheme"] == "redblue"
