"""Pure fp32 functions of output distributions: KL divergences, top-k overlap, the sampled-softmax KL.

Used by the logit and tuned lenses (chapter 04); ``lens_metrics`` reduces a block of lens logits to per-token
numbers with shared buffers, so a [layers × tokens × vocab] tensor never exists.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lmdepth.kernels.lens_kernels import index_overlap, lens_block

TOP_K = 5
#: Per-token metrics of one lens at one layer, in the order :func:`lens_metrics` returns them.
LENS_METRICS = ("kl", "kl_final_lens", "top5_overlap")  # KL(P_lens‖P_final), KL(P_final‖P_lens), top-5 overlap


def kl_divergence(logp: torch.Tensor, logq: torch.Tensor, p: torch.Tensor | None = None) -> torch.Tensor:
    """KL(p ‖ q) = Σ_v p(v) (log p(v) − log q(v)) over the last dimension, in fp32.

    Args:
        logp: [..., vocab] log-probabilities of p.
        logq: [..., vocab] log-probabilities of q.
        p: optional ``logp.exp()`` when the caller already has it (saves one pass over the vocabulary).

    Returns:
        [...] non-negative KL divergences (nats).
    """
    logp, logq = logp.float(), logq.float()
    p = logp.exp() if p is None else p
    # nansum: a term with p(v) = 0 is 0 even where log p(v) = -inf (0·inf is NaN in floating point).
    return (p * (logp - logq)).nansum(-1)


def topk_overlap(logits_a: torch.Tensor, logits_b: torch.Tensor, k: int = TOP_K) -> torch.Tensor:
    """|top-k(a) ∩ top-k(b)| / k per row. [..., vocab] × [..., vocab] → [...] in [0, 1]."""
    return index_overlap(logits_a.topk(k, dim=-1).indices, logits_b.topk(k, dim=-1).indices)


@dataclass
class FinalDistribution:
    """The model's output distribution at a set of positions, precomputed once and shared by every layer.

    Attributes:
        logp: [tokens, vocab] fp32 log-probabilities.
        p: [tokens, vocab] fp32 probabilities.
        top: [tokens, k] indices of the top-k tokens.
    """

    logp: torch.Tensor
    p: torch.Tensor
    top: torch.Tensor

    @classmethod
    def from_logits(cls, logits: torch.Tensor, k: int = TOP_K) -> "FinalDistribution":
        logp = torch.log_softmax(logits.float(), dim=-1)
        return cls(logp, logp.exp(), logits.topk(k, dim=-1).indices)


class Scratch:
    """Reusable [tokens, vocab] fp32 buffers for :func:`lens_metrics`, one set per block of positions.

    Why: a fresh tensor of tens of MB is a new memory mapping, and its page faults cost more than the arithmetic
    (measured: a freshly allocated ``a - b`` is 4× slower than ``torch.sub(a, b, out=buf)``).
    """

    def __init__(self, tokens: int, vocab: int, matmul_dtype: torch.dtype = torch.float32):
        self.z, self.logp, self.p, self.diff = (torch.empty(tokens, vocab) for _ in range(4))
        self.z_mm = self.z if matmul_dtype == torch.float32 else torch.empty(tokens, vocab, dtype=matmul_dtype)

    def view(self, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.logp[:n], self.p[:n], self.diff[:n]


def lens_metrics(logits: torch.Tensor, final: FinalDistribution, scratch: Scratch | None = None) -> torch.Tensor:
    """Reduce lens logits to per-token metrics (rows in :data:`LENS_METRICS` order).

    Equal to :func:`kl_divergence` in both directions and :func:`topk_overlap` (tested), computed with shared
    intermediate buffers: log p_lens − log p_final is formed once and dotted with p_lens and with p_final.

    Args:
        logits: [..., tokens, vocab] fp32 lens logits (finite); leading dims, e.g. several layers, share ``final``.
        final: the output distribution at the same tokens ([tokens, vocab]).
        scratch: reusable buffers with at least ``logits.numel() / vocab`` rows (allocated here when None).

    Returns:
        [3, ..., tokens]: KL(P_lens‖P_final), KL(P_final‖P_lens), top-k overlap.
    """
    n = logits.numel() // logits.shape[-1]
    return lens_block(logits, final.logp, final.p, final.top, *(scratch or Scratch(n, logits.shape[-1])).view(n))


def sampled_kl(z_lens: torch.Tensor, z_final: torch.Tensor, lse_final: torch.Tensor, log_w: torch.Tensor) -> torch.Tensor:
    """Importance-sampled estimate of KL(P_final ‖ P_lens) from the logits on a vocabulary subset S.

    Each candidate v ∈ S carries a weight w_v (1 for the head, |tail|/n for a uniform tail sample), so
    Σ_{v∈S} w_v f(v) estimates Σ_v f(v) over the full vocabulary. With S = the full vocabulary and w = 1 this is the
    exact KL.

    Args:
        z_lens: [tokens, layers, |S|] lens logits on S.
        z_final: [tokens, |S|] final logits on S.
        lse_final: [tokens] exact log-normaliser of the final logits over the full vocabulary.
        log_w: [|S|] log importance weights.

    Returns:
        [tokens, layers] KL estimates.
    """
    logp_f = z_final - lse_final[:, None]
    wp_f = (logp_f + log_w).exp()  # w_v · p_final(v)
    # Σ w p_f (log p_f − z + log Z): the first term does not depend on the lens, so it is formed per token only.
    neg_entropy = (wp_f * logp_f).sum(-1, keepdim=True)  # [tokens, 1]
    return neg_entropy + _LensTerms.apply(z_lens, wp_f, log_w)


class _LensTerms(torch.autograd.Function):
    """The lens' part of :func:`sampled_kl`, log Ẑ − Σ_S w p_final z ([tokens, layers]; log Ẑ = logsumexp_S(z + log w),
    the estimate of the lens' log-normaliser), with its gradient g · (softmax_S(z + log w) − w p_final) written
    by hand: autograd's version makes about twice the passes over the [tokens, layers, |S|] logits (a fifth of a
    tuned-lens step). Differentiable in the lens logits only."""

    @staticmethod
    def forward(ctx, z: torch.Tensor, wp_f: torch.Tensor, log_w: torch.Tensor) -> torch.Tensor:
        if any(ctx.needs_input_grad[1:]):
            raise ValueError("sampled_kl is differentiable in the lens logits only, not the final ones")
        cross = torch.einsum("ts,tls->tl", wp_f, z)
        e = z + log_w  # a new buffer, reused in place from here on
        m = e.amax(-1, keepdim=True)
        e.sub_(m).exp_()  # unnormalised softmax of z + log w
        total = e.sum(-1, keepdim=True)
        ctx.save_for_backward(e, total, wp_f)
        return (m + total.log() - cross[..., None]).squeeze(-1)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        e, total, wp_f = ctx.saved_tensors  # e is reused in place: a second backward through it raises
        g = g[..., None]
        return e.mul_(g / total).addcmul_(-g, wp_f[:, None, :]), None, None
