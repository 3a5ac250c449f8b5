"""Depth vs complexity: depth score, statistics, difficulty data, correctness checks, erasure and integrated
gradients on tiny models, and the cached run end to end."""

import numpy as np
import pytest
import torch

from lmdepth.data.difficulty import analysis_input, answer_start, difficulty_examples, gsm8k_correct, last_boxed, math_correct
from lmdepth.metrics.depth import depth_score, group_statistics, layer_effect, level_statistics, slope
from lmdepth.analyses import complexity as C
from lmdepth.model.families import ModelAdapter
from lmdepth.hooks.capture import hooked_residuals
from lmdepth.data.datasets import Example
from lmdepth.hooks.stack import AdapterStack, as_stack, boundary_residuals, erasure_map, integrated_gradients, mean_residuals
from lmdepth.errors import ParameterError
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
    stack = as_stack(adapter)
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
    bigger = C.run(**{**kw, "n_per_level": 3})  # reuses the 4 items already computed
    assert len(bigger.meta["summary"]["items"]) == 6
    frame = C.summary_frame({("tiny", "vars"): bigger}, "levels")
    assert {"model", "source", "rel_depth_score"} <= set(frame.columns)


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
