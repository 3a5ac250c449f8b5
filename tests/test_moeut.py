"""From-scratch models of chapter 07 (lmdepth.scratch.models): MoE routing against dense references, weight
sharing, and the residual taps the other chapters' code relies on. Integration tier: tiny random models, CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lmdepth.hooks import skip_hooks
from lmdepth.model.taps import check_additivity, hooked_residuals
from lmdepth.scratch.layers import Dispatch, SigmaMoE, SwitchHeadAttention, rope
from lmdepth.scratch.models import (
    DenseConfig,
    LayerApplication,
    MoEUTConfig,
    adapter_for,
    build_model,
    count_parameters,
)

TINY_MOEUT = dict(vocab_size=99, d_model=32, n_layers=4, n_heads=2, d_head=16, group_size=2, ff_n_experts=6,
                  ff_expert_size=8, ff_k=2, att_n_experts=3, att_k=2)
TINY_DENSE = dict(vocab_size=99, d_model=32, n_layers=4, n_heads=2, d_head=16, d_ff=64)


pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]  # see conftest.py


def tiny(arch: str, **kw):
    cfg = MoEUTConfig(**{**TINY_MOEUT, **kw}) if arch == "moeut" else DenseConfig(**{**TINY_DENSE, **kw})
    return build_model(cfg, seed=0).eval()


@pytest.fixture(params=["moeut", "transformer"])
def model(request):
    return tiny(request.param)


def ids(T: int = 14, seed: int = 0) -> torch.Tensor:
    return torch.randint(4, 99, (1, T), generator=torch.Generator().manual_seed(seed))


# ---- gather/scatter -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["loop", "bmm"])
@pytest.mark.parametrize("per_token", [False, True])
def test_dispatch_matches_per_slot_matmul(mode, per_token):
    g = torch.Generator().manual_seed(1)
    N, k, E, din, dout = 9, 3, 5, 4, 6
    experts = torch.randint(0, E, (N, k), generator=g)
    experts[0] = 4  # an uneven load, and expert 4 fully used by token 0
    x = torch.randn(N if per_token else N * k, din, generator=g, requires_grad=True)
    W = torch.randn(E, din, dout, generator=g, requires_grad=True)
    out = Dispatch(experts, E, mode).matmul(x, W, per_token=per_token)
    rows = x.repeat_interleave(k, 0) if per_token else x
    ref = torch.stack([rows[i] @ W[e] for i, e in enumerate(experts.reshape(-1).tolist())])
    torch.testing.assert_close(out, ref)
    gx, gW = torch.autograd.grad(out.square().sum(), (x, W))
    rx, rW = torch.autograd.grad(ref.square().sum(), (x, W))
    torch.testing.assert_close(gx, rx)
    torch.testing.assert_close(gW, rW)


# ---- σ-MoE routing ----------------------------------------------------------------------------------------------

def sigma_moe_reference(moe: SigmaMoE, x: torch.Tensor, k: int | None = None) -> torch.Tensor:
    """Every expert computed densely; the output mixes the top-k by their sigmoid gates (others weigh 0)."""
    k = k or moe.k
    gates = F.linear(moe.norm(x), moe.expert_sel).sigmoid()  # [N, E]
    top = gates.topk(k, -1).indices
    weight = torch.zeros_like(gates).scatter(-1, top, gates.gather(-1, top))
    h = F.relu(torch.einsum("nd,eds->nes", x, moe.keys))
    y = torch.einsum("nes,esd->ned", h, moe.values)
    return (y * weight.unsqueeze(-1)).sum(1)


@pytest.mark.parametrize("impl", ["loop", "bmm"])
def test_sigma_moe_topk_routing_matches_dense_reference(impl):
    torch.manual_seed(0)
    moe = SigmaMoE(16, n_experts=6, expert_size=8, k=2, impl=impl)
    moe.reset_parameters(1.0)
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(moe(x), sigma_moe_reference(moe, x.reshape(-1, 16)).view(2, 5, 16))
    # the k selected experts are the k largest gates, and their weights are the gate values
    logits, gates, idx = moe.select(x.reshape(-1, 16))
    assert idx.shape == (10, 2)
    s = logits.sigmoid()
    assert torch.equal(gates, s.gather(-1, idx))
    assert (gates.min(-1).values >= s.masked_fill(torch.zeros_like(s, dtype=torch.bool).scatter(-1, idx, True),
                                                  -1).max(-1).values).all()


def test_sigma_moe_with_all_experts_equals_dense_ffn():
    """k = E: the MoE is a dense ReLU FFN whose hidden units are the experts', each expert's block scaled by its gate."""
    torch.manual_seed(0)
    E, s, d = 4, 8, 16
    moe = SigmaMoE(d, n_experts=E, expert_size=s, k=E)
    moe.reset_parameters(1.0)
    x = torch.randn(7, d)
    W1 = moe.keys.permute(1, 0, 2).reshape(d, E * s)  # [d, E·s]
    W2 = moe.values.reshape(E * s, d)
    gate = F.linear(moe.norm(x), moe.expert_sel).sigmoid().repeat_interleave(s, -1)  # [N, E·s]
    dense = (F.relu(x @ W1) * gate) @ W2
    torch.testing.assert_close(moe(x), dense)


def test_moe_gradient_reaches_only_selected_experts():
    torch.manual_seed(0)
    moe = SigmaMoE(16, n_experts=6, expert_size=8, k=1)
    moe.reset_parameters(1.0)
    x = torch.randn(1, 16)
    moe(x).sum().backward()
    chosen = moe.select(x)[2].item()
    used = moe.keys.grad.flatten(1).abs().sum(-1) > 0
    assert used.tolist() == [e == chosen for e in range(6)]


# ---- SwitchHead -------------------------------------------------------------------------------------------------

def switchhead_reference(att: SwitchHeadAttention, x: torch.Tensor) -> torch.Tensor:
    """Per head: value and output projections mixed from the top-k experts by their sigmoid gates; plain loops."""

    B, T, d = x.shape
    H, E, k, dh = att.n_heads, att.n_experts, att.k, att.d_head
    xn = att.norm(x)
    pos = torch.arange(T)
    q = rope(att.q(xn).view(B, T, H, dh).transpose(1, 2), pos, att.rope_base)
    kk = rope(att.k_proj(xn).view(B, T, H, dh).transpose(1, 2), pos, att.rope_base)
    out = torch.zeros(B, T, d)
    for h in range(H):
        sv = F.linear(xn, att.sel_v[h * E : (h + 1) * E]).sigmoid()  # [B, T, E]
        so = F.linear(xn, att.sel_o[h * E : (h + 1) * E]).sigmoid()
        wv = torch.zeros_like(sv).scatter(-1, sv.topk(k, -1).indices, sv.gather(-1, sv.topk(k, -1).indices))
        wo = torch.zeros_like(so).scatter(-1, so.topk(k, -1).indices, so.gather(-1, so.topk(k, -1).indices))
        v = sum(wv[..., e : e + 1] * (x @ att.v[h * E + e]) for e in range(E))  # [B, T, dh]
        scores = (q[:, h] @ kk[:, h].transpose(-1, -2)) / dh**0.5
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        r = scores.softmax(-1) @ v
        out = out + sum(wo[..., e : e + 1] * (r @ att.o[h * E + e]) for e in range(E))
    return out


@pytest.mark.parametrize("k", [1, 2, 3])
def test_switchhead_matches_reference(k):
    torch.manual_seed(0)
    att = SwitchHeadAttention(16, n_heads=2, d_head=8, n_experts=3, k=k, rope_base=10_000.0)
    att.reset_parameters(1.0)
    x = torch.randn(2, 6, 16)
    torch.testing.assert_close(att(x), switchhead_reference(att, x), rtol=1e-4, atol=1e-5)


# ---- weight sharing ---------------------------------------------------------------------------------------------

def test_moeut_reuses_the_same_parameters_across_repeats():
    m = tiny("moeut", n_layers=6)
    layers, shared = m.model.layers, m.model.shared_layers
    assert len(layers) == 6 and len(shared) == 2
    for l, app in enumerate(layers):
        assert isinstance(app, LayerApplication)
        assert app.self_attn.target is shared[l % 2].attention and app.mlp.target is shared[l % 2].ffn
        assert not list(app.parameters())  # the applications own nothing
    # parameters do not grow with depth; state_dict stores each shared weight once
    assert count_parameters(tiny("moeut", n_layers=2)) == count_parameters(m) == count_parameters(tiny("moeut", n_layers=8))
    assert not any(key.startswith("model.layers.") for key in m.state_dict())
    # every application contributes gradient to the same tensor: zeroing repeat r's input changes the grad
    m.train()
    m(ids()).logits.sum().backward()
    g_all = m.model.shared_layers[0].ffn.keys.grad.clone()
    m.zero_grad()
    handle = layers[2].mlp.register_forward_hook(lambda mod, a, out: out.detach())  # cut one application's path
    m(ids()).logits.sum().backward()
    handle.remove()
    assert not torch.allclose(m.model.shared_layers[0].ffn.keys.grad, g_all)


def test_hooks_fire_once_per_depth_step(model):
    calls = []
    handles = [layer.self_attn.register_forward_hook(lambda mod, a, o, l=l: calls.append(l))
               for l, layer in enumerate(model.model.layers)]
    model(ids())
    for h in handles:
        h.remove()
    assert calls == list(range(model.config.n_layers))


# ---- residual taps, adapters, and the other chapters' code -----------------------------------------------------

def test_adapter_taps_are_additive_and_unembed_matches(model):
    ad = adapter_for(model)
    x = ids()
    assert ad.n_layers == model.config.n_layers and ad.d_model == model.config.d_model
    assert check_additivity(ad, x) < 1e-5
    r = hooked_residuals(ad, x)
    assert torch.equal(r["resid_pre"][0], model.model.embed_tokens(x))
    torch.testing.assert_close(ad.unembed(r["resid_post"][-1]), model(x).logits)


def test_causal_and_kv_cache_match_full_forward(model):
    x = ids(16)
    full = model(x).logits
    y = x.clone()
    y[0, 10:] = 5
    torch.testing.assert_close(model(y).logits[:, :10], full[:, :10])  # the future does not leak
    a = model(x[:, :9], use_cache=True)
    b = model(x[:, 9:], past_key_values=a.past_key_values, use_cache=True)
    torch.testing.assert_close(torch.cat([a.logits, b.logits], 1), full, rtol=1e-4, atol=1e-5)
    assert model(x, logits_to_keep=1).logits.shape[1] == 1


def test_the_skip_trace_equals_the_naive_loop_on_scratch_models(model):
    """Chapter 07 runs chapter 03's skip trace (KV-prefix reuse included, every part, local rows) on a generic
    NNsight wrapper of both architectures — MoEUT's depth steps are distinct modules over shared weights — and it
    equals the naive loop (one full forward per intervention)."""
    from lmdepth.analyses.scratch import traced
    from lmdepth.traces.skip_effects import skip_effects

    ad = adapter_for(model)
    x = ids(12)
    naive = skip_hooks.prompt_effects_naive(ad, x, cuts=[6, 9], parts=("layer", "attention", "mlp"), local=True)
    nn_model, paths = traced(model)
    traced_ = skip_effects(nn_model, paths, x, cuts=[6, 9], parts=("layer", "attention", "mlp"), config=model.config)
    assert set(traced_) == set(naive)
    for key in naive:
        torch.testing.assert_close(traced_[key][0], naive[key][0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(traced_[key][1], naive[key][1], rtol=1e-4, atol=1e-5)
    assert float(naive["future", "layer"][0].abs().sum()) > 0  # the skips change something


def test_the_erasure_trace_equals_the_hooked_map_on_scratch_models(model):
    """Chapter 07's erasure (positions 1 … T − 2, the mean residual of another text erased in) through the erasure
    trace equals the plain-hook map, position by position; a position not erased stays 0."""
    from lmdepth.analyses.scratch import traced
    from lmdepth.hooks.stack import AdapterStack, erasure_map, mean_residuals
    from lmdepth.traces.erasure_trace import boundary_sums, erasure_effects

    stack, (nn_model, paths) = AdapterStack(adapter_for(model)), traced(model)
    other, x = ids(9, seed=1), ids(12)
    mu = mean_residuals(stack, [other])
    torch.testing.assert_close(boundary_sums(nn_model, paths, other) / other.shape[1], mu, rtol=1e-5, atol=1e-6)
    ref = erasure_map(stack, x, 8, mu, batch_size=4, positions=range(1, 11))
    got = erasure_effects(nn_model, paths, x, 8, mu, batch_size=4, positions=range(1, 11))
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
    assert float(got[:, 1:11].sum()) > 0 and float(got[:, [0, 11]].abs().sum()) == 0


def test_moeut_entropy_regulariser_only_in_training():
    m = tiny("moeut")
    m(ids())
    assert float(m.aux_loss()) == 0.0
    m.train()
    m(ids())
    aux = m.aux_loss()
    assert aux.requires_grad and aux.item() < 0  # negative entropy
    dense = tiny("transformer").train()
    dense(ids())
    assert float(dense.aux_loss()) == 0.0
