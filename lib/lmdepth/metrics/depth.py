"""The depth score (paper Fig. 7; book/method.md#method-depth-score) and its per-level statistics: pure numpy functions.

With E[s, j] the effect of skipping layer s on layer j and O[s] on the output:

* layer effect ``e[s] = Σ_{j>s} E[s, j] / max(L − 1 − s, 1)`` (the mean over later layers);
* logit effect ``o[s] = O[s]``;
* ``D(e) = Σ_s s·e[s] / Σ_s e[s]`` with the **0-based** layer index s = 0..L−1, as in the authors' code. The paper
  writes Σ_{l=1}^{L} l·e_l / Σ e_l (1-based): that is D + 1. Across models we report D / (L − 1).

Per level, E and O are aggregated over items by the elementwise max (the paper) or the mean, and D is computed
from the aggregate. Intervals: percentile bootstrap over items, resampled within each level.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from lmdepth.metrics.bootstrap import draws, percentile_interval

METRICS = ("layer_effect", "logit_effect")
AGGREGATIONS = ("max", "mean")


def layer_effect(E: np.ndarray) -> np.ndarray:
    """[..., L, L] → [..., L]: mean effect of skipping s on the later layers, Σ_{j>s} E[s, j] / max(L−1−s, 1)."""
    L = E.shape[-1]
    return np.triu(E, 1).sum(-1) / np.maximum(L - 1 - np.arange(L), 1)


def depth_score(e: np.ndarray, one_based: bool = False) -> np.ndarray:
    """D = Σ_s s·e[s] / Σ_s e[s] over the last axis, s = 0..L−1 (``one_based``: s = 1..L, the paper's formula).

    NaN where every effect is 0. A one-hot e at index i gives i (or i + 1).
    """
    e = np.asarray(e, dtype=float)
    s = np.arange(e.shape[-1]) + (1 if one_based else 0)
    total = e.sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, (e * s).sum(-1) / np.where(total > 0, total, 1), np.nan)


def effect_vectors(E: np.ndarray, O: np.ndarray, how: str) -> dict[str, np.ndarray]:
    """Aggregate items ([P, L, L] and [P, L]) by ``how`` ("max" or "mean") → the layer and logit effect vectors."""
    agg = np.max if how == "max" else np.mean
    return {"layer_effect": layer_effect(agg(E, axis=0)), "logit_effect": agg(O, axis=0)}


def _scores(E: np.ndarray, O: np.ndarray, how: str) -> dict[str, float]:
    return {m: float(depth_score(v)) for m, v in effect_vectors(E, O, how).items()}


def slope(x: Sequence[float], y: Sequence[float]) -> float:
    """Least-squares slope of y on x (NaN values dropped; NaN if fewer than 2 distinct x remain)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(y)
    if len(set(x[ok])) < 2:
        return float("nan")
    return float(np.polyfit(x[ok], y[ok], 1)[0])


def partial_slope(y: Sequence[float], x: Sequence[float], covariate: Sequence[float] | None = None,
                  weights: Sequence[float] | None = None) -> float:
    """The coefficient of x in the weighted least-squares fit y ~ 1 + x + covariate: the slope of y per unit of x
    at a fixed covariate (Frisch–Waugh: x and y both residualised on [1, covariate], then regressed). Without a
    covariate, the weighted slope of y on x.

    Units whose y is NaN or whose weight is ≤ 0 are dropped. NaN when fewer than two distinct x remain, or when the
    covariate explains x to within 1e-9 of its weighted variance (x and covariate collinear: the fit cannot tell
    their slopes apart). A constant covariate only duplicates the intercept and changes nothing.

    Args:
        y, x, covariate, weights: [units] each (weights default to 1).
    """
    y, x = np.asarray(y, float), np.asarray(x, float)
    w = np.ones_like(y) if weights is None else np.asarray(weights, float)
    z = np.zeros_like(y) if covariate is None else np.asarray(covariate, float)
    ok = np.isfinite(y) & np.isfinite(x) & np.isfinite(z) & (w > 0)
    y, x, z, w = y[ok], x[ok], z[ok], w[ok]
    if len(np.unique(x)) < 2:
        return float("nan")
    design = np.column_stack([np.ones_like(x), z]) * np.sqrt(w)[:, None]

    def residual(v: np.ndarray) -> np.ndarray:  # v's part the design does not explain, in the weighted metric
        sw = v * np.sqrt(w)
        return sw - design @ np.linalg.lstsq(design, sw, rcond=None)[0]

    rx, ry = residual(x), residual(y)
    spread = float(np.sum(w * (x - np.average(x, weights=w)) ** 2))
    if float(rx @ rx) <= 1e-9 * spread:
        return float("nan")
    return float(rx @ ry / (rx @ rx))


def association(groups: Sequence[float], y: Sequence[float], weights: Sequence[float] | None = None
                ) -> tuple[float, float]:
    """How far ``groups`` (e.g. levels) fix ``y`` (e.g. prompt lengths), with weights: (r, η) — the weighted Pearson
    r of the two, and the correlation ratio η (√ of the share of y's weighted variance that the groups' weighted mean
    y explain; |r| ≤ η, and η = 1 where every group has one y, whatever its shape). (0, 0) where y is constant
    (nothing to confound); NaN with fewer than two groups. Units with weight ≤ 0 are dropped.

    Args:
        groups, y, weights: [units] each (weights default to 1).
    """
    g, y = np.asarray(groups, float), np.asarray(y, float)
    w = np.ones_like(y) if weights is None else np.asarray(weights, float)
    ok = w > 0
    g, y, w = g[ok], y[ok], w[ok]
    if len(np.unique(g)) < 2:
        return float("nan"), float("nan")
    if np.ptp(y) == 0:
        return 0.0, 0.0
    y_mean, g_mean = np.average(y, weights=w), np.average(g, weights=w)
    var_y = np.average((y - y_mean) ** 2, weights=w)
    r = np.average((g - g_mean) * (y - y_mean), weights=w) / np.sqrt(np.average((g - g_mean) ** 2, weights=w) * var_y)
    means = pd.Series(y * w).groupby(g).sum() / pd.Series(w).groupby(g).sum()
    between = np.average((means.reindex(g).to_numpy() - y_mean) ** 2, weights=w)
    return float(r), float(np.sqrt(min(between / var_y, 1.0)))


def level_statistics(E: np.ndarray, O: np.ndarray, levels: np.ndarray, n_boot: int = 1000, seed: int = 0,
                     ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Depth score per level and its slope over levels, both with percentile bootstrap 95 % intervals.

    Items are resampled within each level (stratified bootstrap); every resample recomputes the per-level
    aggregates, their depth scores and the fitted slope.

    Args:
        E: [P, L, L] per-item skip effects; O: [P, L] output effects; levels: [P] difficulty of each item.

    Returns:
        (per level: ``level, aggregation, metric, depth_score, ci_low, ci_high, n``;
         slopes: ``aggregation, metric, slope, ci_low, ci_high, n_levels``), depth scores 0-based.
    """
    uniq = np.array(sorted(set(levels.tolist())))
    idx = [np.nonzero(levels == lv)[0] for lv in uniq]
    order, bounds = np.concatenate(idx), np.cumsum([len(i) for i in idx])[:-1]

    def statistics(E: np.ndarray, O: np.ndarray) -> np.ndarray:
        """Items of every level end to end → [aggregation, metric, level + 1]: the depth scores, then the slope."""
        per_level = [[_scores(e, o, how) for e, o in zip(np.split(E, bounds), np.split(O, bounds))]
                     for how in AGGREGATIONS]
        return np.array([[[s[m] for s in sc] + [slope(uniq, [s[m] for s in sc])] for m in METRICS]
                         for sc in per_level])

    point = statistics(E[order], O[order])
    boots = draws(statistics, (E[order], O[order]), n_boot, seed, groups=[len(i) for i in idx])
    lo, hi = percentile_interval(boots)
    rows = [{"level": int(lv), "aggregation": how, "metric": m, "depth_score": point[a, b, k],
             "ci_low": float(lo[a, b, k]), "ci_high": float(hi[a, b, k]), "n": len(idx[k])}
            for a, how in enumerate(AGGREGATIONS) for b, m in enumerate(METRICS) for k, lv in enumerate(uniq)]
    slopes = [{"aggregation": how, "metric": m, "slope": point[a, b, -1], "ci_low": float(lo[a, b, -1]),
               "ci_high": float(hi[a, b, -1]), "n_levels": len(uniq)}
              for a, how in enumerate(AGGREGATIONS) for b, m in enumerate(METRICS)]
    return pd.DataFrame(rows), pd.DataFrame(slopes)


def group_statistics(E: np.ndarray, O: np.ndarray, groups: dict[str, np.ndarray], how: str = "mean",
                     n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Depth score of item groups (e.g. solved / unsolved) with bootstrap 95 % intervals.

    Args:
        groups: name → bool mask over items. Groups with no item get NaN.

    Returns:
        ``group, metric, depth_score, ci_low, ci_high, n``.
    """
    rng = np.random.default_rng(seed)  # one stream: each group continues the previous group's draws
    rows = []
    for name, mask in groups.items():
        i = np.nonzero(mask)[0]
        point = _scores(E[i], O[i], how) if len(i) else {m: np.nan for m in METRICS}
        if len(i):
            boots = draws(lambda e, o: [_scores(e, o, how)[m] for m in METRICS], (E[i], O[i]), n_boot, rng)
            lo, hi = percentile_interval(boots)
        else:
            lo = hi = np.full(len(METRICS), np.nan)
        rows += [{"group": name, "metric": m, "depth_score": point[m], "ci_low": float(lo[k]),
                  "ci_high": float(hi[k]), "n": len(i)} for k, m in enumerate(METRICS)]
    return pd.DataFrame(rows)
