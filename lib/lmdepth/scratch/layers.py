"""Building blocks of the from-scratch models (chapter 07): RoPE attention, the σ-MoE feed-forward block and
SwitchHead attention with their gather/scatter expert dispatch (:class:`Dispatch`), and the entropy regulariser
that keeps experts in use. Assembled into MoEUT and the dense baseline in :mod:`lmdepth.scratch.models`."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache


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


def cached_kv(k: torch.Tensor, v: torch.Tensor, cache: DynamicCache | None, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This layer's keys and values [B, H, S, dh]: the new k, v [B, H, W, dh] appended to those in ``cache``
    (which keeps them), or k, v as they are without a cache."""
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


class AuxSink:
    """Collects the regularisation losses of one forward pass (shared by all MoE modules of a model)."""

    def __init__(self) -> None:
        self.losses: list[torch.Tensor] = []


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
        self.sink: AuxSink | None = None

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
        self.sink: AuxSink | None = None

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
        kk, vv = cached_kv(kk, vv, cache, layer_idx)
        r = attend(q, kk, vv).transpose(1, 2).reshape(-1, H, dh)  # [N, H, dh]
        plan_o = Dispatch(o_idx.view(-1, k), H * self.n_experts, self.impl)  # one row per (token, head)
        o = plan_o.matmul(r.reshape(-1, dh), self.o, per_token=True).view(-1, H * k, d)
        return (o * o_gates.reshape(-1, H * k, 1).to(o.dtype)).sum(1).view(B, T, d)
