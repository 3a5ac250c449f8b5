"""Summaries of layer-skip effect matrices (chapter 03): the later effect of each skipped layer, the future-effect
cutoff with its bootstrap interval over problems. Pure numpy (half-network means:
:func:`lmdepth.metrics.layer_curves.half_means`)."""

from __future__ import annotations

import warnings

import numpy as np

from lmdepth.metrics.bootstrap import draws, percentile_interval


def later_effect(E: np.ndarray) -> np.ndarray:
    """[L, L] → [L]: for each skipped layer s, the largest effect on any *later* layer j > s (0 for the last)."""
    L = E.shape[0]
    return np.array([E[s, s + 1 :].max() if s + 1 < L else 0.0 for s in range(L)])


def cutoff_layer(E: np.ndarray, threshold: float) -> int:
    """The first skipped layer s from which on every later_effect stays below ``threshold`` (L if none)."""
    m = later_effect(E)
    above = np.nonzero(m >= threshold)[0]
    return int(above[-1] + 1) if len(above) else 0


def cutoff_with_ci(E_per_problem: np.ndarray, threshold: float, n_boot: int = 1000, seed: int = 0) -> dict[str, float]:
    """Cutoff of the max-over-problems effects, with a percentile bootstrap interval over problems.

    Args:
        E_per_problem: [P, L, L] per-problem effects. With one problem the interval is NaN (and a warning says so).
    """
    point = cutoff_layer(E_per_problem.max(0), threshold)
    if len(E_per_problem) < 2:
        warnings.warn("One problem: no interval for the cutoff (NaN); use at least 10 problems.", stacklevel=2)
        lo = hi = float("nan")
    else:
        boots = draws(lambda E: cutoff_layer(E.max(0), threshold), (E_per_problem,), n_boot, seed)
        lo, hi = percentile_interval(boots)
    L = E_per_problem.shape[1]
    return {"cutoff": point, "ci_low": float(lo), "ci_high": float(hi), "n_layers": L, "rel_depth": point / L,
            "threshold": threshold}


def sustained_cutoff(curve: np.ndarray, level: float, skip: int = 0) -> int:
    """The first layer c ≥ ``skip`` from which ``curve`` stays below ``level`` up to layer L−2; L when layer L−2
    is at or above it (no cutoff). The last layer is left out: it has no later layer, so its later effect is 0 by
    construction and would otherwise make L−1 the largest cutoff possible.

    Args:
        curve: [L] later effect per skipped layer.
    """
    L = len(curve)
    above = np.nonzero(np.asarray(curve[skip : L - 1]) >= level)[0]
    if not len(above):
        return skip
    last = skip + int(above[-1])
    return L if last == L - 2 else last + 1
