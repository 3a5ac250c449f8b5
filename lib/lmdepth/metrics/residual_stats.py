"""Pure metric functions (fp32) and streaming, token-weighted dataset reductions.

Formulas of paper Fig. 2 (book/method.md#method-norms, book/method.md#method-numerics): relative denominators are clamped at 1e-6, cosines use eps 1e-8,
and every activation is cast to fp32 *before* the norm, cosine or difference (the authors' code did these in
bf16; see the chapters' "Differences from the paper").
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from lmdepth.kernels.residual_kernels import COS_EPS, REL_EPS, token_metrics
from lmdepth.metrics.bootstrap import draws, percentile_interval, tails

#: Rows of :func:`residual_token_metrics`, as (metric, component) pairs of the tidy results table.
RESIDUAL_METRICS: tuple[tuple[str, str], ...] = (
    ("relative_contribution", "attention"),  # ||a_l|| / ||h_l||
    ("relative_contribution", "mlp"),  # ||m_l|| / ||h_l + a_l||
    ("relative_contribution", "layer"),  # ||a_l + m_l|| / ||h_l||
    ("cosine", "attention"),  # cos(a_l, h_l)
    ("cosine", "mlp"),  # cos(m_l, h_l + a_l)
    ("cosine", "layer"),  # cos(a_l + m_l, h_l)
    ("cosine", "io"),  # cos(h_{l+1}, h_l)
    ("norm", "residual"),  # ||h_l||
    ("norm", "attention"),  # ||a_l||
    ("norm", "mlp"),  # ||m_l||
    ("norm", "layer"),  # ||a_l + m_l||
)


def residual_token_metrics(h: torch.Tensor, a: torch.Tensor, m: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """All per-token residual metrics of one layer (rows in :data:`RESIDUAL_METRICS` order): [..., d] each →
    [11, ...] fp32 (the kernel the traces run, :func:`lmdepth.kernels.residual_kernels.token_metrics`)."""
    return token_metrics(h, a, m, o, REL_EPS, COS_EPS)


@dataclass
class PromptStats:
    """Token reductions of one prompt: what is kept instead of its activations.

    Attributes:
        sum: [metrics, layers] sum over the prompt's tokens.
        max: [metrics, layers] max over the prompt's tokens.
        count: number of tokens reduced.
    """

    sum: np.ndarray
    max: np.ndarray
    count: int

    @classmethod
    def from_tokens(cls, values: np.ndarray | torch.Tensor) -> "PromptStats":
        """values: [metrics, layers, tokens] → per-prompt sums (float64) and maxima."""
        v = np.asarray(values, dtype=np.float64)
        return cls(sum=v.sum(-1), max=v.max(-1), count=int(v.shape[-1]))


@dataclass
class DatasetStats:
    """Token-weighted mean and max over a data set, from per-prompt :class:`PromptStats` (streamed).

    The mean is Σ over all tokens of all prompts / total token count (book/method.md#method-aggregation), i.e. *not* a mean of
    per-prompt means; the authors' accumulator bug (book/method.md#method-norms) is not reproduced.
    """

    prompts: list[PromptStats] = field(default_factory=list)

    def add(self, stats: PromptStats) -> None:
        self.prompts.append(stats)

    @property
    def count(self) -> int:
        return sum(p.count for p in self.prompts)

    def mean(self) -> np.ndarray:
        """[metrics, layers] token-weighted mean."""
        return sum(p.sum for p in self.prompts) / self.count

    def max(self) -> np.ndarray:
        """[metrics, layers] max over all tokens of all prompts."""
        return np.max(np.stack([p.max for p in self.prompts]), axis=0)

    def bootstrap_mean_ci(self, n_boot: int = 1000, level: float = 0.95, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Percentile bootstrap over prompts of the token-weighted mean.

        Returns:
            (low, high), each [metrics, layers]. NaN with fewer than two prompts (one prompt says nothing about
            the spread; a zero-width interval would look certain), with a warning.
        """
        sums = np.stack([p.sum for p in self.prompts])  # [P, M, L]
        if len(sums) < 2:
            warnings.warn("One prompt: no interval (NaN); use at least 10 for an interval that means something.",
                          stacklevel=2)
            return np.full(sums.shape[1:], np.nan), np.full(sums.shape[1:], np.nan)
        counts = np.array([p.count for p in self.prompts], dtype=float)  # [P]
        boots = draws(lambda s, c: s.sum(1) / c.sum(1)[:, None, None], (sums, counts), n_boot, seed,
                      vectorised=True)  # [B, M, L]
        return percentile_interval(boots, tails(level))
