"""Per-token readings of the residual stream (paper Fig. 2; the book's Method page): relative norms and cosines in
fp32, the denominators floored."""

from __future__ import annotations

import torch
import torch.nn.functional as F

REL_EPS = 1e-6  # the floor of a relative norm's denominator
COS_EPS = 1e-8  # the cosine's eps


def relative_norm(x: torch.Tensor, ref: torch.Tensor, eps: float = REL_EPS) -> torch.Tensor:
    """||x|| / max(||ref||, eps) over the last dimension, in fp32. [..., d] → [...].

    The library's one relative change: a skip effect is ``relative_norm(new − ref, ref)`` (fp32 operands: the
    difference is taken in fp32), the additivity check ``relative_norm(residual error, h_{l+1})``."""
    return x.float().norm(dim=-1) / ref.float().norm(dim=-1).clamp_min(eps)


def cosine(x: torch.Tensor, y: torch.Tensor, eps: float = COS_EPS) -> torch.Tensor:
    """Cosine similarity over the last dimension, in fp32. [..., d] → [...]."""
    return F.cosine_similarity(x.float(), y.float(), dim=-1, eps=eps)


def contributions(h: torch.Tensor, a: torch.Tensor, m: torch.Tensor, rel_eps: float = REL_EPS) -> torch.Tensor:
    """||a_l|| / ||h_l||, ||m_l|| / ||h_l + a_l||, ||a_l + m_l|| / ||h_l||: [..., d] each → [3, ...] fp32 (the
    first three rows of :func:`token_metrics`)."""
    h, a, m = h.float(), a.float(), m.float()
    return torch.stack([relative_norm(a, h, rel_eps), relative_norm(m, h + a, rel_eps),
                        relative_norm(a + m, h, rel_eps)])


def token_metrics(h: torch.Tensor, a: torch.Tensor, m: torch.Tensor, o: torch.Tensor, rel_eps: float = REL_EPS,
                  cos_eps: float = COS_EPS) -> torch.Tensor:
    """All per-token residual metrics of one layer, in the order of
    :data:`lmdepth.metrics.residual_stats.RESIDUAL_METRICS`.

    Args:
        h: [..., d] residual entering the layer, h_l.
        a: [..., d] attention contribution a_l.
        m: [..., d] MLP contribution m_l.
        o: [..., d] residual leaving the layer, h_{l+1}.
        rel_eps, cos_eps: the denominators' floors.

    Returns:
        [11, ...] fp32.
    """
    h, a, m, o = h.float(), a.float(), m.float(), o.float()
    mid, delta = h + a, a + m
    return torch.stack([
        relative_norm(a, h, rel_eps), relative_norm(m, mid, rel_eps), relative_norm(delta, h, rel_eps),
        cosine(a, h, cos_eps), cosine(m, mid, cos_eps), cosine(delta, h, cos_eps), cosine(o, h, cos_eps),
        h.norm(dim=-1), a.norm(dim=-1), m.norm(dim=-1), delta.norm(dim=-1),
    ])


__all__ = ["REL_EPS", "COS_EPS", "relative_norm", "cosine", "contributions", "token_metrics"]
