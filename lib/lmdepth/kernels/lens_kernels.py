"""The lens readings of chapter 04 (the book's Method page, "Logit lens"): how far a lens' distribution at a layer
is from the model's output, in both directions, and how many of its top tokens it shares — reduced through reused
buffers, so that no [layers × tokens × vocab] tensor exists."""

from __future__ import annotations

import torch


def rowdot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Σ_v a[t, v]·b[t, v] per row, without materialising the product. [t, v] × [t, v] → [t]."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).view(-1)


def index_overlap(idx_a: torch.Tensor, idx_b: torch.Tensor) -> torch.Tensor:
    """Fraction of shared entries of two [..., k] index sets (each without repeats) → [...]."""
    return (idx_a.unsqueeze(-1) == idx_b.unsqueeze(-2)).any(-1).float().mean(-1)


def lens_block(logits: torch.Tensor, final_logp: torch.Tensor, final_p: torch.Tensor, final_top: torch.Tensor,
               logp: torch.Tensor, p: torch.Tensor, diff: torch.Tensor) -> torch.Tensor:
    """Per-token lens readings of a block of lens logits, through the given buffers.

    Args:
        logits: [..., tokens, vocab] fp32 lens logits (finite); leading dims, e.g. several layers, share the final.
        final_logp, final_p: [tokens, vocab] the output distribution's log-probabilities and probabilities.
        final_top: [tokens, k] its top-k token ids.
        logp, p, diff: [≥ n, vocab] fp32 buffers (n = ``logits.numel() / vocab``), overwritten.

    Returns:
        [3, ..., tokens]: KL(P_lens‖P_final), KL(P_final‖P_lens), top-k overlap. log p_lens − log p_final is formed
        once and dotted with p_lens and with p_final.
    """
    shape, vocab = logits.shape[:-1], logits.shape[-1]
    n = logits.numel() // vocab
    logp, p, diff = (t[:n].view(*shape, vocab) for t in (logp, p, diff))
    # the fused log-softmax into a buffer: ~5x faster than logsumexp then a subtraction (0.05 vs 0.23 ms a row of
    # SmolLM2's 49,152 logits on one CPU thread, measured 2026-12-04)
    torch.log_softmax(logits, -1, out=logp)
    torch.exp(logp, out=p)
    torch.sub(logp, final_logp, out=diff)
    kl = rowdot(p.view(n, vocab), diff.view(n, vocab)).view(shape)
    kl_final = -torch.mul(diff, final_p, out=p).sum(-1)  # p is free again: reuse it for the product
    overlap = index_overlap(logits.topk(final_top.shape[-1], dim=-1).indices, final_top)
    return torch.stack([kl, kl_final, overlap])


__all__ = ["rowdot", "index_overlap", "lens_block"]
