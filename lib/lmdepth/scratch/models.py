"""Models trained from scratch in chapter 07 (paper Fig. 9, METHOD §9): MoEUT and a dense pre-LN Transformer.

Plain PyTorch, no custom kernels; CPU and GPU.

**MoEUT** (Csordás et al. 2024, "MoEUT: Mixture-of-Experts Universal Transformers"): a shared-layer Universal
Transformer. ``group_size`` (G) distinct layers form a group that is applied ``n_layers / G`` times (layers
A B A B …). Each layer has

* SwitchHead attention: per head, ``att_n_experts`` value and output projections; each token picks ``att_k`` of
  them with a sigmoid gate (selection from the normalised input) and mixes them with the gate values;
* a σ-MoE feed-forward block: ``ff_n_experts`` experts of size ``ff_expert_size``, top-``ff_k`` by a sigmoid gate,
  output ``Σ_e s_e · W2_e ReLU(W1_e x)``;
* "peri-LN": LayerNorm only where a linear map feeds a softmax/sigmoid, i.e. the attention queries/keys and the
  expert selections. Values and expert inputs read the un-normalised residual. A final LayerNorm precedes the
  unembedding;
* an entropy regulariser on the batch-averaged expert-selection distribution (``entropy_reg`` for the σ-MoE,
  ``att_entropy_reg`` for SwitchHead) that keeps experts in use.

Experts run as a gather/scatter grouped matmul (:class:`Dispatch`): the (token, choice) slots are sorted by expert,
each expert multiplies its contiguous block of gathered rows, and the results are scattered back to slot order
(``moe_impl="loop"``, the CPU default) or go through a padded [experts, capacity, d] buffer and one ``bmm``
(``"bmm"``, the CUDA default). Only the selected experts are computed.

**Dense baseline**: a pre-LN RoPE Transformer (``h += Attn(LN(h)); h += MLP(LN(h))``) with ``n_layers`` distinct
layers.

**Residual taps.** Both expose the layout of the pretrained-model adapters (``lmdepth.model.families``):
``model.model.embed_tokens``, ``model.model.layers`` (one module per depth step), ``model.model.norm``,
``model.lm_head``, and in every layer ``self_attn`` / ``mlp`` whose outputs are the contributions a_l, m_l with
``h_{l+1} = h_l + a_l + m_l``. For MoEUT ``model.model.layers[l]`` is a parameter-free :class:`LayerApplication`:
the l-th *application* of shared layer ``l % G``, so a forward hook on it fires once per depth step; the shared
weights live once in ``model.model.shared_layers``. The forward accepts ``past_key_values`` (a transformers
``DynamicCache``), ``use_cache`` and ``logits_to_keep`` like a Hugging Face causal LM, so the skipping code's KV
prefix reuse works unchanged. :func:`adapter_for` returns a :class:`lmdepth.model.families.ModelAdapter`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache, PreTrainedConfig
from transformers.modeling_outputs import CausalLMOutputWithPast

from lmdepth.model.families import FamilySpec, ModelAdapter

# ---- configs -----------------------------------------------------------------------------------------------------


class _ScratchConfig(PreTrainedConfig):
    """Shared fields. ``n_layers`` counts depth steps (layer applications for MoEUT)."""

    def __init__(self, vocab_size: int = 99, d_model: int = 128, n_layers: int = 8, n_heads: int = 4,
                 d_head: int | None = None, rope_base: float = 10_000.0, max_position_embeddings: int = 1024,
                 bos_token_id: int = 1, eos_token_id: int = 2, pad_token_id: int = 0, **kwargs: Any):
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.n_layers = n_layers
        self.n_heads = n_heads
        self.d_head = d_head or d_model // n_heads
        self.rope_base = rope_base
        self.max_position_embeddings = max_position_embeddings
        # the names the adapters and transformers' cache read
        self.hidden_size = d_model
        self.num_hidden_layers = n_layers
        self.num_attention_heads = n_heads
        self.head_dim = self.d_head
        super().__init__(bos_token_id=bos_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id, **kwargs)


class MoEUTConfig(_ScratchConfig):
    """MoEUT hyper-parameters (defaults: a tiny model; see ``lmdepth.scratch.training.PRESETS`` for the real ones)."""

    model_type = "moeut"

    def __init__(self, group_size: int = 2, ff_n_experts: int = 16, ff_expert_size: int = 32, ff_k: int = 4,
                 att_n_experts: int = 4, att_k: int = 2, entropy_reg: float = 0.01, att_entropy_reg: float = 0.001,
                 moe_impl: str = "auto", **kwargs: Any):
        self.group_size = group_size
        self.ff_n_experts = ff_n_experts
        self.ff_expert_size = ff_expert_size
        self.ff_k = ff_k
        self.att_n_experts = att_n_experts
        self.att_k = att_k
        self.entropy_reg = entropy_reg
        self.att_entropy_reg = att_entropy_reg
        self.moe_impl = moe_impl  # Dispatch kernel: "auto", "loop", "bmm" (same results)
        super().__init__(**kwargs)
        if self.n_layers % group_size:
            raise ValueError(f"n_layers ({self.n_layers}) must be a multiple of group_size ({group_size}).")


class DenseConfig(_ScratchConfig):
    """Dense pre-LN Transformer hyper-parameters."""

    model_type = "pre_ln_transformer"

    def __init__(self, d_ff: int = 512, **kwargs: Any):
        self.d_ff = d_ff
        super().__init__(**kwargs)


# ---- shared pieces -----------------------------------------------------------------------------------------------


def rope(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Rotary position embedding (rotate-half form). x: [B, H, T, dh]; positions: [T]."""
    dh = x.shape[-1]
    inv = 1.0 / (base ** (torch.arange(0, dh, 2, device=x.device, dtype=torch.float32) / dh))
    ang = positions.to(torch.float32)[:, None] * inv[None]  # [T, dh/2]
    cos, sin = torch.cat([ang, ang], -1).cos().to(x.dtype), torch.cat([ang, ang], -1).sin().to(x.dtype)
    x1, x2 = x[..., : dh // 2], x[..., dh // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Causal attention where the W queries are the last W of the S key positions. q: [B,H,W,dh]; k, v: [B,H,S,dh]."""
    W, S = q.shape[-2], k.shape[-2]
    if W == S:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    mask = torch.arange(S, device=q.device)[None, :] <= (S - W + torch.arange(W, device=q.device))[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def _cached(k: torch.Tensor, v: torch.Tensor, cache: DynamicCache | None, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
    if cache is None:
        return k, v
    return cache.update(k, v, layer_idx)


def entropy_reg_loss(logits: torch.Tensor) -> torch.Tensor:
    """Negative entropy of the selection distribution averaged over tokens (MoEUT's expert-balance term).

    Args:
        logits: [N, ..., E] selection logits; the softmax is over E, the mean over N.
    """
    logp = F.log_softmax(logits.float(), dim=-1)
    mean_logp = torch.logsumexp(logp, dim=0) - math.log(logp.shape[0])  # log of the mean distribution
    return (mean_logp.exp() * mean_logp).sum(-1).mean()


class Dispatch:
    """Gather/scatter plan for a batch of expert assignments (a plain-PyTorch ``cvmm``).

    Slot i = (token i // k, choice i % k) goes to expert ``experts.flatten()[i]``. The slots' input rows are gathered
    in expert order, multiplied with their expert's weight, and scattered back to slot order. Two kernels with
    the same result: ``"loop"`` (one matmul per expert on its contiguous block; fastest on CPU) and ``"bmm"``
    (a padded [E, capacity, d] buffer and one batched matmul; few kernel launches, for GPUs and many experts).
    Differentiable in the inputs and the weights.

    Args:
        experts: [N, k] expert index of every (token, choice).
        n_experts: E.
        mode: ``"loop"``, ``"bmm"`` or ``"auto"`` (bmm on CUDA, loop elsewhere).
    """

    def __init__(self, experts: torch.Tensor, n_experts: int, mode: str = "auto"):
        self.k = experts.shape[-1]
        flat = experts.reshape(-1)
        M = flat.numel()
        self.n_experts, self.n_slots = n_experts, M
        self.mode = ("bmm" if flat.is_cuda else "loop") if mode == "auto" else mode
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=n_experts)
        self.order = order  # slots sorted by expert
        if self.mode == "loop":
            self.counts = counts.tolist()
            self.inverse = torch.empty_like(order)
            self.inverse[order] = torch.arange(M, device=flat.device)
        else:
            offsets = counts.cumsum(0) - counts
            rank = torch.arange(M, device=flat.device) - offsets[flat[order]]
            self.capacity = int(counts.max()) if M else 0
            pos = torch.empty_like(flat)
            pos[order] = flat[order] * self.capacity + rank
            self.pos = pos  # row of every slot in the flattened padded buffer

    def matmul(self, x: torch.Tensor, weight: torch.Tensor, per_token: bool = False) -> torch.Tensor:
        """``out[i] = x[row(i)] @ weight[expert(i)]``.

        Args:
            x: [M, d_in] one row per slot, or [N, d_in] one row per token (``per_token``: slot i reads row i // k).
            weight: [E, d_in, d_out].

        Returns:
            [M, d_out] in slot order.
        """
        if self.mode == "loop":
            src = self.order // self.k if per_token else self.order
            blocks = x.index_select(0, src).split(self.counts)
            y = torch.cat([b @ weight[e] for e, b in enumerate(blocks) if b.shape[0]] or [x.new_zeros(0, weight.shape[-1])])
            return y.index_select(0, self.inverse)
        rows = x.repeat_interleave(self.k, 0) if per_token else x
        E, C = self.n_experts, self.capacity
        buf = rows.new_zeros(E * C, rows.shape[-1]).index_copy(0, self.pos, rows)
        y = torch.bmm(buf.view(E, C, -1), weight)
        return y.reshape(E * C, -1).index_select(0, self.pos)


class _AuxSink:
    """Collects the regularisation losses of one forward pass (shared by all MoE modules of a model)."""

    def __init__(self) -> None:
        self.losses: list[torch.Tensor] = []


# ---- MoEUT -------------------------------------------------------------------------------------------------------


class SigmaMoE(nn.Module):
    """σ-MoE feed-forward block; its output is the MLP contribution m_l.

    Selection from LayerNorm(x), experts on the raw x: ``y = Σ_{e ∈ topk} σ(w_e·LN(x)) · W2_e ReLU(W1_e x)``.
    """

    def __init__(self, d_model: int, n_experts: int, expert_size: int, k: int, entropy_reg: float = 0.0,
                 impl: str = "auto"):
        super().__init__()
        self.n_experts, self.expert_size, self.k, self.entropy_reg = n_experts, expert_size, k, entropy_reg
        self.impl = impl
        self.norm = nn.LayerNorm(d_model)
        self.expert_sel = nn.Parameter(torch.empty(n_experts, d_model))
        self.keys = nn.Parameter(torch.empty(n_experts, d_model, expert_size))
        self.values = nn.Parameter(torch.empty(n_experts, expert_size, d_model))
        self.sink: _AuxSink | None = None

    def reset_parameters(self, scale: float) -> None:
        d = self.keys.shape[1]
        nn.init.normal_(self.expert_sel, 0, scale / math.sqrt(d))
        nn.init.normal_(self.keys, 0, scale / math.sqrt(d))
        nn.init.normal_(self.values, 0, scale / math.sqrt(self.n_experts * self.expert_size))

    def select(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Selection logits [N, E], gate values [N, k] and expert indices [N, k] of flattened tokens x [N, d]."""
        logits = F.linear(self.norm(x), self.expert_sel)
        gates, idx = logits.sigmoid().topk(self.k, dim=-1)
        return logits, gates, idx

    def forward(self, x: torch.Tensor, **_: Any) -> torch.Tensor:
        shape = x.shape
        xf = x.reshape(-1, shape[-1])
        logits, gates, idx = self.select(xf)
        if self.sink is not None and self.training and self.entropy_reg:
            self.sink.losses.append(self.entropy_reg * entropy_reg_loss(logits))
        plan = Dispatch(idx, self.n_experts, self.impl)
        h = F.relu(plan.matmul(xf, self.keys, per_token=True))  # [N·k, s]
        y = plan.matmul(h, self.values).view(-1, self.k, shape[-1])  # [N, k, d]
        return (y * gates.unsqueeze(-1).to(y.dtype)).sum(1).view(shape)


class SwitchHeadAttention(nn.Module):
    """SwitchHead attention with RoPE; its output is the attention contribution a_l.

    Queries, keys and both expert selections read LayerNorm(x); values read the raw x. Per head h, the value is
    ``Σ_{e ∈ topk_v(h)} s_v · x W_v[h, e]`` and the output ``Σ_h Σ_{e ∈ topk_o(h)} s_o · r_h W_o[h, e]``.
    """

    def __init__(self, d_model: int, n_heads: int, d_head: int, n_experts: int, k: int, rope_base: float,
                 entropy_reg: float = 0.0, impl: str = "auto"):
        super().__init__()
        self.impl = impl
        self.n_heads, self.d_head, self.n_experts, self.k = n_heads, d_head, n_experts, k
        self.rope_base, self.entropy_reg = rope_base, entropy_reg
        self.norm = nn.LayerNorm(d_model)
        self.q = nn.Linear(d_model, n_heads * d_head, bias=False)
        self.k_proj = nn.Linear(d_model, n_heads * d_head, bias=False)
        self.v = nn.Parameter(torch.empty(n_heads * n_experts, d_model, d_head))
        self.o = nn.Parameter(torch.empty(n_heads * n_experts, d_head, d_model))
        self.sel_v = nn.Parameter(torch.empty(n_heads * n_experts, d_model))
        self.sel_o = nn.Parameter(torch.empty(n_heads * n_experts, d_model))
        self.sink: _AuxSink | None = None

    def reset_parameters(self, scale: float) -> None:
        d = self.q.in_features
        for p in (self.sel_v, self.sel_o, self.q.weight, self.k_proj.weight, self.v):
            nn.init.normal_(p, 0, scale / math.sqrt(d))
        nn.init.normal_(self.o, 0, scale / math.sqrt(self.n_heads * self.d_head))

    def select(self, xn: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-head selection of normalised tokens xn [N, d]: logits [N, H, E], gates [N, H, k], global expert ids."""
        logits = F.linear(xn, weight).view(xn.shape[0], self.n_heads, self.n_experts)
        gates, idx = logits.sigmoid().topk(self.k, dim=-1)
        offset = (torch.arange(self.n_heads, device=idx.device) * self.n_experts).view(1, -1, 1)
        return logits, gates, idx + offset

    def forward(self, x: torch.Tensor, cache: DynamicCache | None = None, layer_idx: int = 0, pos_offset: int = 0,
                **_: Any) -> torch.Tensor:
        B, T, d = x.shape
        H, dh, k = self.n_heads, self.d_head, self.k
        xf = x.reshape(-1, d)
        xn = self.norm(xf)
        v_logits, v_gates, v_idx = self.select(xn, self.sel_v)
        o_logits, o_gates, o_idx = self.select(xn, self.sel_o)
        if self.sink is not None and self.training and self.entropy_reg:
            self.sink.losses.append(self.entropy_reg * (entropy_reg_loss(v_logits) + entropy_reg_loss(o_logits)))
        plan_v = Dispatch(v_idx.view(-1, H * k), H * self.n_experts, self.impl)
        v = plan_v.matmul(xf, self.v, per_token=True).view(-1, H, k, dh)
        v = (v * v_gates.unsqueeze(-1).to(v.dtype)).sum(2)  # [N, H, dh]
        pos = torch.arange(pos_offset, pos_offset + T, device=x.device)
        q = rope(self.q(xn).view(B, T, H, dh).transpose(1, 2), pos, self.rope_base)
        kk = rope(self.k_proj(xn).view(B, T, H, dh).transpose(1, 2), pos, self.rope_base)
        vv = v.view(B, T, H, dh).transpose(1, 2)
        kk, vv = _cached(kk, vv, cache, layer_idx)
        r = attend(q, kk, vv).transpose(1, 2).reshape(-1, H, dh)  # [N, H, dh]
        plan_o = Dispatch(o_idx.view(-1, k), H * self.n_experts, self.impl)  # one row per (token, head)
        o = plan_o.matmul(r.reshape(-1, dh), self.o, per_token=True).view(-1, H * k, d)
        return (o * o_gates.reshape(-1, H * k, 1).to(o.dtype)).sum(1).view(B, T, d)


class MoEUTLayer(nn.Module):
    """One shared layer (owns the weights); applied several times through :class:`LayerApplication`."""

    def __init__(self, cfg: MoEUTConfig):
        super().__init__()
        self.attention = SwitchHeadAttention(cfg.d_model, cfg.n_heads, cfg.d_head, cfg.att_n_experts, cfg.att_k,
                                             cfg.rope_base, cfg.att_entropy_reg, cfg.moe_impl)
        self.ffn = SigmaMoE(cfg.d_model, cfg.ff_n_experts, cfg.ff_expert_size, cfg.ff_k, cfg.entropy_reg, cfg.moe_impl)


class SharedCall(nn.Module):
    """Parameter-free handle that calls a module owned elsewhere, so hooks on it fire for one application only."""

    def __init__(self, target: nn.Module):
        super().__init__()
        object.__setattr__(self, "target", target)  # not registered: the weights are counted once

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.target(*args, **kwargs)


class LayerApplication(nn.Module):
    """Depth step ``index`` of MoEUT: shared layer ``index % G`` applied to the residual.

    ``h_mid = h + self_attn(h)``; ``h_out = h_mid + mlp(h_mid)``.
    """

    def __init__(self, shared: MoEUTLayer, index: int, group_size: int):
        super().__init__()
        self.index, self.group_index, self.repeat = index, index % group_size, index // group_size
        self.self_attn = SharedCall(shared.attention)
        self.mlp = SharedCall(shared.ffn)
        object.__setattr__(self, "shared", shared)

    def forward(self, x: torch.Tensor, cache: DynamicCache | None = None, pos_offset: int = 0, **_: Any) -> torch.Tensor:
        h = x + self.self_attn(x, cache=cache, layer_idx=self.index, pos_offset=pos_offset)
        return h + self.mlp(h)

    def extra_repr(self) -> str:
        return f"index={self.index}, shared_layer={self.group_index}, repeat={self.repeat}"


# ---- dense baseline ----------------------------------------------------------------------------------------------


class DenseAttention(nn.Module):
    """Pre-LN multi-head attention with RoPE: ``Attn(LN(h))`` (the attention contribution a_l)."""

    def __init__(self, cfg: DenseConfig):
        super().__init__()
        d, H, dh = cfg.d_model, cfg.n_heads, cfg.d_head
        self.n_heads, self.d_head, self.rope_base = H, dh, cfg.rope_base
        self.norm = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * H * dh, bias=False)
        self.o_proj = nn.Linear(H * dh, d, bias=False)

    def forward(self, x: torch.Tensor, cache: DynamicCache | None = None, layer_idx: int = 0, pos_offset: int = 0,
                **_: Any) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.qkv(self.norm(x)).view(B, T, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
        pos = torch.arange(pos_offset, pos_offset + T, device=x.device)
        q, k = rope(q, pos, self.rope_base), rope(k, pos, self.rope_base)
        k, v = _cached(k, v, cache, layer_idx)
        return self.o_proj(attend(q, k, v).transpose(1, 2).reshape(B, T, -1))


class DenseMLP(nn.Module):
    """Pre-LN feed-forward block ``W2 ReLU(W1 LN(h))`` (the MLP contribution m_l)."""

    def __init__(self, cfg: DenseConfig):
        super().__init__()
        self.norm = nn.LayerNorm(cfg.d_model)
        self.up = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, **_: Any) -> torch.Tensor:
        return self.down(F.relu(self.up(self.norm(x))))


class DenseLayer(nn.Module):
    """``h_mid = h + self_attn(h)``; ``h_out = h_mid + mlp(h_mid)``."""

    def __init__(self, cfg: DenseConfig, index: int):
        super().__init__()
        self.index = index
        self.self_attn = DenseAttention(cfg)
        self.mlp = DenseMLP(cfg)

    def forward(self, x: torch.Tensor, cache: DynamicCache | None = None, pos_offset: int = 0, **_: Any) -> torch.Tensor:
        h = x + self.self_attn(x, cache=cache, layer_idx=self.index, pos_offset=pos_offset)
        return h + self.mlp(h)


# ---- the language models ---------------------------------------------------------------------------------------


class ScratchBody(nn.Module):
    """embed_tokens → layers → norm (the names the adapters use)."""

    def __init__(self, cfg: _ScratchConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        if isinstance(cfg, MoEUTConfig):
            self.shared_layers = nn.ModuleList([MoEUTLayer(cfg) for _ in range(cfg.group_size)])
            self.layers = nn.ModuleList(
                [LayerApplication(self.shared_layers[i % cfg.group_size], i, cfg.group_size) for i in range(cfg.n_layers)]
            )
        else:
            self.layers = nn.ModuleList([DenseLayer(cfg, i) for i in range(cfg.n_layers)])
        self.norm = nn.LayerNorm(cfg.d_model)


class ScratchLM(nn.Module):
    """A causal LM with a Hugging Face-like interface: ``model(input_ids).logits``.

    Attributes:
        config: :class:`MoEUTConfig` or :class:`DenseConfig`.
        model: the body (``embed_tokens``, ``layers``, ``norm``).
        lm_head: the unembedding.
    """

    def __init__(self, config: _ScratchConfig):
        super().__init__()
        self.config = config
        self.model = ScratchBody(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self._sink = _AuxSink()
        for m in self.modules():
            if isinstance(m, (SigmaMoE, SwitchHeadAttention)):
                m.sink = self._sink
        self.reset_parameters()

    @property
    def arch(self) -> str:
        return "moeut" if isinstance(self.config, MoEUTConfig) else "transformer"

    @torch.no_grad()
    def reset_parameters(self) -> None:
        cfg = self.config
        scale = math.sqrt(2 / cfg.n_layers)  # as MoEUT: std shrinks with the number of depth steps
        d = cfg.d_model
        nn.init.normal_(self.model.embed_tokens.weight, 0, 1 / math.sqrt(d))
        nn.init.normal_(self.lm_head.weight, 0, 1 / math.sqrt(d))
        for m in self.modules():
            if isinstance(m, (SigmaMoE, SwitchHeadAttention)):
                m.reset_parameters(scale)
            elif isinstance(m, nn.LayerNorm):
                m.reset_parameters()
            elif isinstance(m, DenseAttention):
                nn.init.normal_(m.qkv.weight, 0, scale / math.sqrt(d))
                nn.init.normal_(m.o_proj.weight, 0, scale / math.sqrt(m.o_proj.in_features))
            elif isinstance(m, DenseMLP):
                nn.init.normal_(m.up.weight, 0, scale / math.sqrt(d))
                nn.init.normal_(m.down.weight, 0, scale / math.sqrt(m.down.in_features))

    def aux_loss(self) -> torch.Tensor:
        """Sum of the expert-balance regularisers of the last forward pass (0 for the dense model / in eval)."""
        losses = self._sink.losses
        return torch.stack(losses).sum() if losses else torch.zeros(())

    def forward(self, input_ids: torch.Tensor, past_key_values: DynamicCache | None = None, use_cache: bool = False,
                logits_to_keep: int = 0, **_: Any) -> CausalLMOutputWithPast:
        """Args:
            input_ids: [B, T] token ids (positions continue after any cached prefix).
            past_key_values: a ``DynamicCache`` holding a prefix, or None.
            use_cache: return the keys/values (a new ``DynamicCache`` if none was given).
            logits_to_keep: 0 → logits of every position; n → of the last n.

        Returns:
            ``CausalLMOutputWithPast`` with ``logits`` [B, T or n, V] and ``past_key_values``.
        """
        self._sink.losses = []
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache(config=self.config)
        pos_offset = past_key_values.get_seq_length() if past_key_values is not None else 0
        h = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            h = layer(h, cache=past_key_values, pos_offset=pos_offset)
        if logits_to_keep:
            h = h[:, -logits_to_keep:]
        logits = self.lm_head(self.model.norm(h))
        return CausalLMOutputWithPast(logits=logits, past_key_values=past_key_values if use_cache else None)


def build_model(config: _ScratchConfig, seed: int = 0) -> ScratchLM:
    """A freshly initialised model (seeded)."""
    torch.manual_seed(seed)
    return ScratchLM(config)


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (shared MoEUT weights counted once)."""
    return sum(p.numel() for p in model.parameters())


def active_parameters(config: _ScratchConfig) -> int:
    """Parameters touched per token per depth step, summed over depth (a FLOP proxy; embeddings excluded)."""
    d, H, dh = config.d_model, config.n_heads, config.d_head
    if isinstance(config, MoEUTConfig):
        per = 2 * d * H * dh + 2 * H * config.att_k * d * dh + 2 * config.ff_k * config.ff_expert_size * d
    else:
        per = 4 * d * H * dh + 2 * d * config.d_ff
    return per * config.n_layers


# ---- adapters ----------------------------------------------------------------------------------------------------

MOEUT_FAMILY = FamilySpec("moeut", ("moeut",), attn_contrib=("self_attn", None), mlp_contrib=("mlp", None))
DENSE_FAMILY = FamilySpec("pre_ln_transformer", ("pre_ln_transformer",), attn_contrib=("self_attn", None),
                          mlp_contrib=("mlp", None))


def adapter_for(model: ScratchLM) -> ModelAdapter:
    """A :class:`~lmdepth.model.families.ModelAdapter` for a from-scratch model (layers = depth steps)."""
    return ModelAdapter(model=model, family=MOEUT_FAMILY if isinstance(model.config, MoEUTConfig) else DENSE_FAMILY)


def config_from_dict(d: dict[str, Any]) -> _ScratchConfig:
    """Rebuild a config from ``config.to_dict()`` (as stored in checkpoints)."""
    d = dict(d)
    cls = MoEUTConfig if d.get("model_type") == "moeut" else DenseConfig
    keep = {k: v for k, v in d.items() if k not in ("model_type", "transformers_version", "hidden_size",
                                                     "num_hidden_layers", "num_attention_heads", "head_dim")}
    return cls(**keep)


__all__ = ["MoEUTConfig", "DenseConfig", "ScratchLM", "SigmaMoE", "SwitchHeadAttention", "Dispatch",
           "LayerApplication", "build_model", "adapter_for", "count_parameters", "active_parameters",
           "config_from_dict", "MOEUT_FAMILY", "DENSE_FAMILY"]
