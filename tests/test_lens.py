"""Logit lens and tuned lens: metric functions on known values, the lenses on tiny models of every family
(last layer = the model's logits, identity translators = the logit lens), training, caching and resuming."""

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from lmdepth.analyses import lens, tuned_lens
from lmdepth.errors import ParameterError
from lmdepth.hooks.lens_hooks import lens_stats
from lmdepth.metrics.distributions import (
    FinalDistribution,
    Scratch,
    kl_divergence,
    lens_metrics,
    sampled_kl,
    topk_overlap,
)
from lmdepth.model.registry import load_model
from lmdepth.model.taps import hooked_residuals
from lmdepth.model.translators import Translators, TunedLensRecipe, sample_candidates, train_translators
from lmdepth.model.unembed import Unembedding
from lmdepth.testing import FAMILY_CONFIGS

# ---- unit: pure functions -------------------------------------------------------------------------------------

@pytest.mark.unit
def test_kl_divergence_known_values():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.25, 0.25, 0.5]])
    q = torch.tensor([[0.25, 0.25, 0.5], [0.25, 0.25, 0.5]])
    kl = kl_divergence(p.log(), q.log())
    # Σ p log(p/q): first row 2 · 0.5 · log 2 (the zero-probability entry contributes 0), second row 0.
    torch.testing.assert_close(kl, torch.tensor([math.log(2), 0.0]))
    assert torch.isinf(kl_divergence(q.log()[:1], p.log()[:1])).all()  # q puts mass where p has none


@pytest.mark.unit
def test_kl_divergence_is_nonnegative_and_matches_torch():
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(64, 50, generator=g) * 3).log_softmax(-1), (torch.randn(64, 50, generator=g) * 3).log_softmax(-1)
    kl = kl_divergence(a, b)
    assert (kl >= 0).all()
    ref = torch.nn.functional.kl_div(b, a, log_target=True, reduction="none").sum(-1)  # KL(a ‖ b) in torch's order
    torch.testing.assert_close(kl, ref)
    torch.testing.assert_close(kl_divergence(a, a), torch.zeros(64))


@pytest.mark.unit
def test_topk_overlap_known_values():
    a = torch.tensor([[5.0, 4, 3, 2, 1, 0, 0], [5.0, 4, 3, 2, 1, 0, 0]])
    b = torch.tensor([[0.0, 0, 1, 2, 3, 4, 5], [1.0, 2, 3, 4, 5, 0, 0]])
    torch.testing.assert_close(topk_overlap(a, b, k=5), torch.tensor([0.6, 1.0]))  # {2,3,4} shared; all shared
    torch.testing.assert_close(topk_overlap(a, b, k=1), torch.tensor([0.0, 0.0]))


@pytest.mark.parametrize("with_scratch", [False, True])
@pytest.mark.unit
def test_lens_metrics_equal_the_pure_functions(with_scratch):
    g = torch.Generator().manual_seed(1)
    z, zf = torch.randn(6, 300, generator=g) * 4, torch.randn(6, 300, generator=g) * 4
    final = FinalDistribution.from_logits(zf)
    got = lens_metrics(z, final, Scratch(8, 300) if with_scratch else None)
    lp, lpf = z.log_softmax(-1), zf.log_softmax(-1)
    torch.testing.assert_close(got[0], kl_divergence(lp, lpf), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got[1], kl_divergence(lpf, lp), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got[2], topk_overlap(z, zf))
    # several readings (e.g. layers) of the same tokens share one final distribution
    many = torch.stack([z, 2 * z, zf])  # [3, tokens, vocab]
    got3 = lens_metrics(many, final, Scratch(18, 300) if with_scratch else None)
    assert got3.shape == (3, 3, 6)
    torch.testing.assert_close(got3[:, 0], got, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got3[:, 2], torch.stack([torch.zeros(6), torch.zeros(6), torch.ones(6)]), rtol=0, atol=1e-5)
    torch.testing.assert_close(got3[0, 1], kl_divergence((2 * z).log_softmax(-1), lpf), rtol=1e-4, atol=1e-5)


@pytest.mark.unit
def test_sampled_kl_is_exact_on_the_full_vocabulary_and_unbiased_on_a_sample():
    g = torch.Generator().manual_seed(2)
    V = 400
    zl, zf = torch.randn(3, 2, V, generator=g) * 2, torch.randn(3, V, generator=g) * 2
    lse_f = torch.logsumexp(zf, -1)
    exact = kl_divergence(zf.log_softmax(-1)[:, None, :], zl.log_softmax(-1))  # KL(P_final ‖ P_lens)
    full = sampled_kl(zl, zf, lse_f, torch.zeros(V))
    torch.testing.assert_close(full, exact, rtol=1e-4, atol=1e-5)
    # head = top 50 final tokens, tail = 100 uniform samples with weight |tail|/100: close on average
    head = zf.mean(0).topk(50).indices
    tail = torch.tensor([v for v in range(V) if v not in set(head.tolist())])
    est = []
    for _ in range(200):
        cand, log_w = sample_candidates(head, tail, 100, g)
        est.append(sampled_kl(zl[..., cand], zf[..., cand], lse_f, log_w))
    assert (torch.stack(est).mean(0) - exact).abs().max() < 0.15 * exact.abs().max()


@pytest.mark.unit
def test_sampled_kl_and_its_hand_written_gradient_equal_autograd_of_the_formula():
    """sampled_kl's lens terms have a hand-written backward (fewer passes over the logits): its values and its
    gradient in the lens logits equal autograd of the plain formula; it refuses to differentiate the final logits,
    and a second backward through the same graph raises instead of reading a reused buffer."""
    g = torch.Generator().manual_seed(3)
    zl, zf = torch.randn(4, 3, 50, generator=g) * 3, torch.randn(4, 50, generator=g) * 3
    lse_f = torch.logsumexp(zf, -1) + 0.5
    log_w = torch.cat([torch.zeros(10), torch.full((40,), 1.7)])
    up = torch.randn(4, 3, generator=g)

    def formula(z):
        logp_f = zf - lse_f[:, None]
        wp = (logp_f + log_w).exp()
        return (wp * logp_f).sum(-1, keepdim=True) - torch.einsum("ts,tls->tl", wp, z) + \
            torch.logsumexp(z + log_w, -1)

    ref_z, z = zl.clone().requires_grad_(), zl.clone().requires_grad_()
    ref = formula(ref_z)
    (ref * up).sum().backward()
    got = sampled_kl(z, zf, lse_f, log_w)
    (got * up).sum().backward(retain_graph=True)
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(z.grad, ref_z.grad, rtol=1e-5, atol=1e-7)
    with pytest.raises(RuntimeError):
        got.sum().backward()
    with pytest.raises(ValueError, match="lens logits only"):
        sampled_kl(zl, zf.clone().requires_grad_(), lse_f, log_w)


@pytest.mark.unit
def test_translators_of_all_layers_equal_the_per_layer_map_and_its_gradient():
    """The all-layer translation (one batched product laid out so A's gradient needs no copy) is h + A_l h + s_l b_l
    of every layer, for any leading shape, and its gradient in A equals that of the per-layer form."""
    g = torch.Generator().manual_seed(4)
    L, d = 3, 8
    tr = Translators(L, d, scale=torch.rand(L, generator=g) + 0.5)
    with torch.no_grad():
        tr.A.copy_(torch.randn(L, d, d, generator=g))
        tr.b.copy_(torch.randn(L, d, generator=g))
    h = torch.randn(2, 5, L, d, generator=g)
    up = torch.randn(2, 5, L, d, generator=g)
    (tr(h) * up).sum().backward()
    grad, tr.A.grad = tr.A.grad.clone(), None
    per_layer = torch.stack([tr(h[..., l, :], layer=l) for l in range(L)], -2)
    (per_layer * up).sum().backward()
    torch.testing.assert_close(tr(h), per_layer, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad, tr.A.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.unit
def test_sample_positions_is_seeded_and_respects_bos():
    a = lens.sample_positions(100, 10, "0:ex")
    assert torch.equal(a, lens.sample_positions(100, 10, "0:ex")) and len(a) == 10 and torch.all(a[1:] > a[:-1])
    assert not torch.equal(a, lens.sample_positions(100, 10, "1:ex"))
    assert torch.equal(lens.sample_positions(5, 0, "k"), torch.arange(5))
    assert torch.equal(lens.sample_positions(5, 10, "k", include_bos=False), torch.arange(1, 5))


@pytest.mark.unit
def test_settling_layers_and_summary():
    rows = []
    for l, (kl, ov) in enumerate([(10.0, 0.0), (5.0, 0.1), (0.9, 0.3), (0.5, 0.5)]):
        for metric, v in (("kl", kl), ("top5_overlap", ov)):
            rows.append(dict(model="m", metric=metric, component="logit_lens", stat="mean", layer=l, n_layers=4, value=v))
            rows.append(dict(model="m", metric=metric, component="tuned_lens", stat="mean", layer=l, n_layers=4, value=v / 10))
    t = pd.DataFrame(rows)
    assert lens.settling_layers(t, "m", "logit_lens") == {"kl": 2, "overlap": 2}
    assert lens.settling_layers(t, "m", "tuned_lens") == {"kl": 2, "overlap": None}  # overlap never > 0.2
    s = lens.settling_summary(t, {"m": 1})
    assert lens.settled_depth(s, "m", "tuned_lens", lens.OVERLAP_CRITERION) == 1.0  # never: placed at the output
    assert lens.settled_depth(s, "m", "tuned_lens", lens.SHARED_KL_CRITERION) == 0.25  # 0.5 < 0.1 · 10 (strict) at layer 1
    assert lens.settled_depth(s, "m", "cosine", lens.COSINE_CRITERION) == 1 / 4  # boundary before layer t, as l / L
    wide = lens.summary_wide(s)
    assert wide.loc[0, "tuned lens: top-5 overlap > 0.2"] == "output" and wide.loc[0, "cosine: cosine transition"] == "1 (0.25)"


# ---- integration: tiny models of every family -------------------------------------------------------------------

FAMILIES = list(FAMILY_CONFIGS)
TEXT = "Problem: 3 apples plus 4 pears make 7 fruits. The final answer is 7"


def _residuals(lm, ids):
    r = hooked_residuals(lm.adapter, ids)
    return [r["resid_pre"][l, 0] for l in range(lm.n_layers)] + [r["resid_post"][-1, 0]]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.integration
def test_lens_at_the_last_layer_reproduces_the_models_logits(family, tiny_dirs):
    lm = load_model(str(tiny_dirs[family]))
    ids = lm.encode(TEXT)
    with torch.no_grad():
        logits = lm.model(ids).logits[0].float()
        hs = _residuals(lm, ids)
        un = Unembedding.of(lm, "float32", traced=False)
        torch.testing.assert_close(un(hs[-1]), logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(un(hs[3]), lm.adapter.unembed(hs[3]).float(), rtol=1e-5, atol=1e-5)
        # the lens at h_L against itself: KL 0, overlap 1 (the metric path the chapter uses)
        stats = lens_stats([hs[-1], hs[-1]], un)
    assert stats[0, 0].abs().max() < 1e-5 and stats[0, 1].abs().max() < 1e-5 and (stats[0, 2] == 1).all()
    # inside the nnsight trace, too: the self-check compares with the logits the model produced
    _, check = lens.prompt_lens(lm, ids, torch.arange(ids.shape[1]), "float32")
    assert abs(check) < 1e-5


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.integration
def test_traced_lens_equals_a_direct_computation(family, tiny_dirs):
    """The trace reads the right tensors: layer inputs h_l (h_0 = embeddings) and the final output."""
    lm = load_model(str(tiny_dirs[family]))
    ids = lm.encode(TEXT)
    pos = torch.tensor([0, 5, 17, ids.shape[1] - 1])
    vals, _ = lens.prompt_lens(lm, ids, pos, "float32")
    with torch.no_grad():
        hs = _residuals(lm, ids)
        final = lm.model(ids).logits[0, pos].float()
    for l in (0, 2, lm.n_layers - 1):
        z = lm.adapter.unembed(hs[l][pos]).float()
        torch.testing.assert_close(vals[0, 0, l], kl_divergence(z.log_softmax(-1), final.log_softmax(-1)), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(vals[0, 2, l], topk_overlap(z, final))
    assert (vals[0, 0, 1:] > 1e-4).any()  # not trivially zero: random layers change the prediction


@pytest.mark.parametrize("family", ["qwen2", "olmo2"])
@pytest.mark.integration
def test_identity_translators_equal_the_logit_lens(family, tiny_dirs):
    lm = load_model(str(tiny_dirs[family]))
    ids = lm.encode(TEXT)
    identity = Translators(lm.n_layers, lm.adapter.d_model, scale=torch.rand(lm.n_layers) + 0.5)
    vals, _ = lens.prompt_lens(lm, ids, torch.arange(ids.shape[1]), "float32", identity)
    torch.testing.assert_close(vals[1], vals[0])
    # and a non-identity translator changes the reading (so the comparison above can fail)
    with torch.no_grad():
        identity.b.add_(0.5)
    moved, _ = lens.prompt_lens(lm, ids, torch.arange(ids.shape[1]), "float32", identity)
    assert not torch.allclose(moved[1], moved[0])


@pytest.mark.integration
def test_training_reduces_the_tuned_lens_loss(tiny_dirs):
    lm = load_model(str(tiny_dirs["llama"]))
    texts = [f"Problem {i}: {i} apples and {2 * i} pears; {3 * i} fruits in all. " * 3 for i in range(8)]
    h = torch.cat([torch.stack(_residuals(lm, lm.encode(t)), 1) for t in texts])  # [tokens, L+1, d]
    cfg = TunedLensRecipe(n_tokens=len(h) - 64, epochs=6, batch_tokens=32, lr=1e-2, head_k=8, n_negatives=16)
    tr, curve, info = train_translators(lm, h[:-64], h[-64:], cfg, lens_dtype="float32", log_every=2)
    train = curve[curve.split == "train"].groupby("step")["value"].mean()
    held = curve[curve.split == "held-out"].groupby("step")["value"].mean()
    assert train.iloc[-1] < 0.7 * train.iloc[0] and held.iloc[-1] < held.iloc[0]
    assert info["head_size"] + info["n_negatives"] <= info["vocab"] + 16
    # each layer keeps the translator of its lowest held-out point (step 0 = the identity)
    best = curve[curve.split == "held-out"].loc[lambda c: c.groupby("layer")["value"].idxmin()].sort_values("layer")
    assert info["selected_step"] == best["step"].tolist()
    for l, step in enumerate(info["selected_step"]):
        assert (step == 0) == bool((tr.A[l] == 0).all() and (tr.b[l] == 0).all())
    # the full-vocabulary KL(P_final ‖ P_tuned) on the training tokens goes down at every layer
    un = Unembedding.of(lm, "float32", traced=False)
    with torch.no_grad():
        lpf = un(h[:-64, -1]).log_softmax(-1)
        for l in range(lm.n_layers):
            before = kl_divergence(lpf, un(h[:-64, l]).log_softmax(-1)).mean()
            after = kl_divergence(lpf, un(tr(h[:-64, l], l)).log_softmax(-1)).mean()
            assert after < before, l


# ---- the run: cache, translators, resume ------------------------------------------------------------------------

@pytest.fixture
def texts(jsonl):
    return jsonl([json.dumps({"text": f"Problem {i}: {i} apples plus {i + 1} pears make {2 * i + 1} fruits."}) for i in range(4)])


RUN_KW = dict(n_examples=4, selection="first", n_boot=20, positions_per_example=0, lens_dtype="float32",
              n_train_tokens=128, train_epochs=1)


@pytest.mark.integration
def test_run_writes_both_lenses_and_caches_translators(tiny_dirs, texts, tmp_path):
    r = lens.run(str(tiny_dirs["gemma3"]), dataset=str(texts), results_dir=tmp_path, **RUN_KW)
    t = r.table
    assert set(t.component) == {"logit_lens", "tuned_lens"} and set(t.metric) == set(lens.METRICS)
    assert set(t.stat) == set(lens.STATS) and sorted(t.layer.unique()) == [0, 1, 2, 3]
    assert np.allclose(t.rel_depth, t.layer / 4)
    assert (t[t.metric != "top5_overlap"].value >= -1e-6).all() and t.value.notna().all()
    meta = json.loads((r.path / "meta.json").read_text())
    assert meta["last_layer_check_kl_max"] < 1e-5 and meta["n_positions_evaluated"] == meta["n_tokens"]
    tl = meta["tuned_lens"]
    assert tl["train_tokens"] == 128 and (tmp_path / "tuned_lens").exists()
    assert (Path(tl["path"]) / "translators.npz").exists()
    curve = tuned_lens.training_curve(r)
    assert {"split", "step", "layer", "value"} <= set(curve.columns) and (curve.step == 0).any()
    # the typed summary chapter 04 and the atlas read, from the sidecar the run wrote
    s = lens.LensSummary.of(r)
    assert (s.n_layers, s.n_problems, s.n_examples, s.n_tokens) == (4, 4, 4, meta["n_tokens"])
    assert s.n_positions_evaluated == s.n_tokens and s.last_layer_check_kl_max < 1e-5 and s.eval_time_s >= 0
    assert s.tuned.train_tokens == 128 and s.tuned.epochs == 1 and not s.tuned.from_cache
    assert s.tuned.path == Path(tl["path"]) and 0 <= s.tuned.layers_kept_identity <= 4
    assert 0 < s.tuned.head_size <= s.tuned.vocab and s.tuned.train_time_s >= 0
    again = lens.run(str(tiny_dirs["gemma3"]), dataset=str(texts), results_dir=tmp_path, **RUN_KW)
    assert again.from_cache
    # a new evaluation reuses the cached translators
    other = lens.run(str(tiny_dirs["gemma3"]), dataset=str(texts), results_dir=tmp_path, **{**RUN_KW, "n_examples": 3})
    assert other.meta["tuned_lens"]["from_cache"] and other.meta["tuned_lens"]["cache_key"] == tl["cache_key"]
    # stored results omit the translators (large, regenerable): a run whose problems are all checkpointed finishes
    # without them, and does not retrain
    (Path(tl["path"]) / "translators.npz").unlink()
    shutil.rmtree(other.path)
    refinished = lens.run(str(tiny_dirs["gemma3"]), dataset=str(texts), results_dir=tmp_path, **{**RUN_KW, "n_examples": 3})
    assert not (Path(tl["path"]) / "translators.npz").exists()
    assert refinished.table.equals(other.table) and refinished.meta["tuned_lens"]["cache_key"] == tl["cache_key"]


@pytest.mark.integration
def test_logit_lens_only_run(tiny_dirs, texts, tmp_path):
    r = lens.run(str(tiny_dirs["olmo2"]), dataset=str(texts), results_dir=tmp_path, **{**RUN_KW, "tuned_lens": False})
    assert set(r.table.component) == {"logit_lens"} and r.meta["tuned_lens"] is None
    assert lens.LensSummary.of(r).tuned is None
    assert not (tmp_path / "tuned_lens").exists() and tuned_lens.training_curve(r).empty


@pytest.mark.integration
def test_interrupted_run_resumes_from_checkpoints(tiny_dirs, texts, tmp_path, monkeypatch):
    model = str(tiny_dirs["qwen2"])
    kw = dict(RUN_KW, dataset=str(texts), tuned_lens=False)
    reference = lens.run(model, results_dir=tmp_path / "ref", **kw).table
    calls = {"n": 0}
    real = lens.prompt_lens

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(lens, "prompt_lens", flaky)
    with pytest.raises(KeyboardInterrupt):
        lens.run(model, results_dir=tmp_path / "run", **kw)
    assert not list((tmp_path / "run").rglob("meta.json")) and len(list((tmp_path / "run").rglob("*.partial/*.npz"))) == 2
    calls["n"] = 100
    resumed = lens.run(model, results_dir=tmp_path / "run", **kw)
    assert calls["n"] == 102
    pd.testing.assert_frame_equal(resumed.table, reference)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(positions_per_example=-1), "'positions_per_example' must be between 0"),
        (dict(lens_dtype="int8"), "'lens_dtype' must be one of"),
        (dict(tuned_lens="yes"), "'tuned_lens' must be true/false"),
        (dict(n_train_tokens=10), "'n_train_tokens' must be between 64"),
        (dict(n_examples=0), "'n_examples' must be between 1"),
    ],
)
@pytest.mark.integration
def test_bad_parameters_are_named(kwargs, message, tiny_dirs, tmp_path):
    with pytest.raises(ParameterError, match=message):
        lens.run(str(tiny_dirs["llama"]), results_dir=tmp_path, **kwargs)


# ---- packaged: the real SmolLM2 -------------------------------------------------------------------------------

@pytest.mark.packaged
def test_packaged_smollm2_lens_matches_its_logits():
    """bf16 unembedding (the chapter's default) against the model's fp32 output, and the fp32 lens exactly."""
    lm = load_model("smollm2-135m")
    ids = lm.encode("The capital of France is Paris. The capital of Germany is")
    pos = torch.arange(ids.shape[1])
    vals, check_bf16 = lens.prompt_lens(lm, ids, pos, "bfloat16")
    _, check_fp32 = lens.prompt_lens(lm, ids, pos, "float32")
    assert check_fp32 < 1e-5 and check_bf16 < 1e-2
    kl, overlap = vals[0, 0].mean(-1), vals[0, 2].mean(-1)
    assert kl[-1] < kl[: lm.n_layers // 2].min()  # the prediction is closer to the output entering the last layer
    assert overlap[-1] > 0.4 and overlap[0] < 0.3


@pytest.mark.unit
def test_tuned_convergence_counts_layers_that_beat_the_logit_lens_and_layers_still_improving():
    import pandas as pd

    from lmdepth.analyses.lens import tuned_convergence

    # layer 0: better, flat at the end; layer 1: never beats the identity; layer 2: still falling fast at the end
    held = {0: [1.0, 0.5, 0.5], 1: [1.0, 1.2, 1.1], 2: [1.0, 0.8, 0.6]}
    rows = [{"model": "m", "split": "held-out", "step": step, "layer": layer, "value": v}
            for layer, vals in held.items() for step, v in zip((0, 10, 20), vals)]
    rows.append({"model": "m", "split": "train", "step": 20, "layer": 0, "value": 0.01})  # training points: ignored
    t = tuned_convergence(pd.DataFrame(rows))
    assert t.to_dict("records") == [{"model": "m", "layers": 3, "beat logit lens": 2, "still improving": 1}]


@pytest.mark.unit
def test_the_training_curve_is_found_in_a_results_folder_read_from_elsewhere(tmp_path, monkeypatch):
    """A lens run's sidecar names its tuned lens by a path relative to where it was computed; a copied results
    folder, read from another working directory, still finds the curve beside the lens run."""
    import pandas as pd

    from lmdepth.analyses.tuned_lens import training_curve
    from lmdepth.results import RunResult

    root = tmp_path / "copied" / "results"
    tuned = root / "tuned_lens" / "m" / "k1"
    tuned.mkdir(parents=True)
    pd.DataFrame({"step": [1, 2], "loss": [2.0, 1.0]}).to_csv(tuned / "table.csv", index=False)
    run = RunResult(pd.DataFrame(), {"tuned_lens": {"path": "results/tuned_lens/m/k1", "cache_key": "k1"}},
                    root / "logit_lens" / "m" / "k2")
    monkeypatch.chdir(tmp_path)  # "results/tuned_lens/m/k1" does not exist from here
    assert list(training_curve(run).loss) == [2.0, 1.0]


# ---- the tuned lens as its own job; the model name resolved once per run ------------------------------------------

def _count_resolutions(monkeypatch) -> list[str]:
    """Every resolution of a model name (:meth:`ModelRef.of`, the one resolver) from here on, by name."""
    from lmdepth.model.registry import ModelRef

    calls: list[str] = []
    real = ModelRef.of.__func__

    def counted(cls, name, remote=False):
        calls.append(name)
        return real(cls, name, remote)

    monkeypatch.setattr(ModelRef, "of", classmethod(counted))
    return calls


@pytest.mark.integration
def test_a_lens_run_resolves_its_model_name_once(tiny_dirs, texts, tmp_path, monkeypatch):
    """Once per run, computing (the tuned lens trained as its own job, the model loaded, the translators trained again
    where the stored entry keeps none) or served from the cache; run_many once per model."""
    calls = _count_resolutions(monkeypatch)
    model, other = str(tiny_dirs["llama"]), str(tiny_dirs["qwen2"])
    kw = dict(RUN_KW, dataset=str(texts), results_dir=tmp_path)
    computed = lens.run(model, **kw)
    assert not computed.from_cache and not computed.meta["tuned_lens"]["from_cache"]
    assert calls == [model]
    calls.clear()
    assert lens.run(model, **kw).from_cache and calls == [model]
    # computing again from nothing but the tuned lens's curve: its translators are trained again, same resolution
    (Path(computed.meta["tuned_lens"]["path"]) / tuned_lens.TRANSLATORS).unlink()
    for d in (tmp_path / "logit_lens").glob("*/*"):
        shutil.rmtree(d)
    calls.clear()
    again = lens.run(model, **kw)
    assert not again.from_cache and not again.meta["tuned_lens"]["from_cache"] and calls == [model]
    assert (Path(again.meta["tuned_lens"]["path"]) / tuned_lens.TRANSLATORS).exists()
    calls.clear()
    _, runs, curves = lens.run_many([model, other], **kw)
    assert calls == [model, other] and runs[model].from_cache and not runs[other].from_cache
    assert set(curves.model) == {model, other}


@pytest.mark.integration
def test_the_tuned_lens_is_its_own_cached_job_with_its_old_keys(tiny_dirs, tmp_path):
    """Its entry keeps the key it had before it ran through the run template (stored entries load), the translators
    land in the same atomic finish with their digest, and translators that no longer match it are not used."""
    from dataclasses import asdict

    from lmdepth.model.registry import current_weights_id
    from lmdepth.results import RunStore

    model = str(tiny_dirs["olmo2"])
    p = tuned_lens.TunedLensParams(model_name=model, n_train_tokens=128, train_epochs=1, lens_dtype="float32",
                                   results_dir=tmp_path)
    r = tuned_lens.run(p)
    legacy = RunStore(tmp_path, "tuned_lens", model, {**asdict(p.recipe), "train_data": "gsm8k/train",
                                                      "dtype": "float32", "lens_dtype": "float32",
                                                      "weights": current_weights_id(model)})
    assert r.path == legacy.dir and r.meta["cache_key"] == legacy.key
    assert set(r.meta["files"]) == {"table.csv"} and set(r.meta["artifacts"]) == {tuned_lens.TRANSLATORS}
    assert not list(tmp_path.rglob("*.partial")) and not list(tmp_path.rglob(".lmdepth-tmp-*"))
    t = tuned_lens.translators_of(r)
    assert t is not None and t.A.shape[0] == 4 and (t.A != 0).any()
    served = tuned_lens.run(p)
    assert served.from_cache and served.table.equals(r.table)
    assert torch.equal(tuned_lens.translators_of(served).A, t.A)
    # a changed translators file is not used (a digest mismatch), and the entry itself still serves its curve
    npz = r.path / tuned_lens.TRANSLATORS
    npz.write_bytes(npz.read_bytes()[:-8] + b"\0" * 8)
    assert tuned_lens.translators_of(tuned_lens.run(p)) is None and tuned_lens.run(p).from_cache
    # an entry written before artifacts were recorded reads its translators as they are
    meta = json.loads((r.path / "meta.json").read_text())
    del meta["artifacts"]
    (r.path / "meta.json").write_text(json.dumps(meta))
    npz.write_bytes(t.to_npz())
    assert torch.equal(tuned_lens.translators_of(tuned_lens.run(p)).A, t.A)


@pytest.mark.integration
def test_a_remote_lens_run_that_would_train_the_tuned_lens_is_refused_before_the_model_loads(
        tiny_dirs, texts, tmp_path, monkeypatch):
    def no_load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(lens, "load_model", no_load)
    kw = dict(RUN_KW, dataset=str(texts), results_dir=tmp_path, remote="local")
    with pytest.raises(ParameterError, match="trained here, not on NDIF"):  # no entry: its job would train
        lens.run(str(tiny_dirs["llama"]), **kw)
    # an entry that keeps only its curve (as stored results do): the translators would be trained again
    model = str(tiny_dirs["llama"])
    r = tuned_lens.run(lens.LensParams(model_name=model, **dict(kw, remote=False)).tuned())
    (r.path / tuned_lens.TRANSLATORS).unlink()
    with pytest.raises(ParameterError, match="trained here, not on NDIF"):
        lens.run(model, **kw)


@pytest.mark.unit
def test_the_bigram_baseline_left_out_on_ndif_says_so_in_one_line():
    """The bigram baseline needs the weights here: on NDIF the lens table comes back unchanged, with one line that
    says why (nothing is loaded first)."""
    from lmdepth.analyses import bigram

    table = pd.DataFrame({"model": ["m"], "layer": [0], "lens": ["logit"]})
    with pytest.warns(UserWarning, match="No bigram baseline on NDIF") as caught:
        assert bigram.with_baseline(table, ["no-such-model"], remote=True) is table
    assert len(caught) == 1 and "\n" not in str(caught[0].message)
