"""Claims of paper Fig. 3 (chapter 03), checked on the layer-skipping runs' per-problem tables.

Unit: the problem (within a problem the paper's aggregation is kept: max over positions and cut points). Across
problems the statistics use means, not the paper's max (a max over problems only grows with the sample), and every
per-problem effect is clipped at 1 — as the paper's heatmaps are — so that one exploding relative change (a layer
whose clean contribution is near zero) cannot carry a verdict.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from lmdepth.claims.spec import EARLY_LAYERS, ClaimSpec
from lmdepth.errors import DataError
from lmdepth.metrics.effects import sustained_cutoff
from lmdepth.metrics.verdicts import Rule, ratio_of_means

CLIP = 1.0  # per-problem effects are clipped here (the paper's heatmaps clip relative change at 1)
CUTOFF_LEVEL = 0.1  # the registry's future-effect level for the cutoff claim (the chapter's `threshold` is display)
CONTROL = ("a random-init model of the same architecture (weights never trained) on the same problems and cut "
           "points, run where the model has at least 10 problems: what skipping does in an untrained stack")


def per_layer(analysis: str, metric: str) -> Callable[[pd.DataFrame, str], np.ndarray]:
    """Per-problem values ``[problems, L]`` of the layer skip, clipped at :data:`CLIP`."""

    def values(units: pd.DataFrame, model: str) -> np.ndarray:
        u = units[(units.model == model) & (units.analysis == analysis) & (units.variant == "layer")
                  & (units.metric == metric)]
        if u.empty:
            raise DataError(f"No per-problem {analysis}-token skip results for {model!r}: run "
                            f"lmdepth.analyses.skipping.run(model_name={model!r}, analysis={analysis!r}) first.")
        wide = u.pivot_table(index="unit", columns="layer", values="value", sort=False, dropna=False)
        return np.minimum(wide.to_numpy(dtype=float), CLIP)

    return values


def halves_by_problem(analysis: str, metric: str) -> Callable[[pd.DataFrame, str], np.ndarray]:
    """Per problem: [first-half mean without layers 0–1, second-half mean, first-half mean with layers 0–1]. For
    the later effect the last layer is left out of the second half: it has no later layer, so its effect is 0 by
    construction and would pull the second half down in the paper's direction."""
    layers = per_layer(analysis, metric)

    def values(units: pd.DataFrame, model: str) -> np.ndarray:
        v = layers(units, model)
        L = v.shape[1]
        end = L - 1 if metric == "later_effect" else L
        return np.column_stack([v[:, EARLY_LAYERS : L // 2].mean(1), v[:, (L + 1) // 2 : end].mean(1),
                                v[:, : L // 2].mean(1)])

    return values


def _with_early(v: np.ndarray) -> float:
    return float(v[:, 1].mean() / v[:, 2].mean()) if v[:, 2].mean() != 0 else float("nan")


def _cutoff_depth(skip: int) -> Callable[[np.ndarray], float]:
    def reduce(v: np.ndarray) -> float:
        curve = v.mean(0)
        return sustained_cutoff(curve, CUTOFF_LEVEL, skip) / len(curve)

    return reduce


_HISTORY = ("2026-11-23: per-problem effects clipped at 1, means over problems, layers 0–1 out of the first half, "
            "decided from the interval (was: max over problems, all layers, a point estimate).",)

CLAIMS: tuple[ClaimSpec, ...] = (
    ClaimSpec(
        id="skipping.current_later_small", chapter="skipping", figure="Fig. 3a",
        claim="all tokens: 2nd half barely affects later layers",
        statement="Skipping a second-half layer barely changes the computation of the later layers.",
        statistic="ratio: mean over problems of the clipped later effect (largest relative change of any later "
                  "layer), second-half layers (without the last, which has no later layer) / first-half layers "
                  "(without layers 0–1)",
        unit="problem", rule=Rule(0.5, "below"), values=halves_by_problem("current", "later_effect"),
        reduce=ratio_of_means, with_early=_with_early, control=CONTROL, history=_HISTORY),
    ClaimSpec(
        id="skipping.current_output_changes", chapter="skipping", figure="Fig. 3a",
        claim="all tokens: 2nd half still changes the output",
        statement="Second-half layers still change the output distribution: they refine the current prediction.",
        statistic="ratio: mean over problems of the output change ‖P − P′‖₂, second-half / first-half layers "
                  "(without layers 0–1)",
        unit="problem", rule=Rule(0.5, "above"), values=halves_by_problem("current", "output_change"),
        reduce=ratio_of_means, with_early=_with_early, control=CONTROL, history=_HISTORY),
    ClaimSpec(
        id="skipping.future_later_small", chapter="skipping", figure="Fig. 3b",
        claim="future tokens: 2nd half feeds little forward",
        statement="Skipping a second-half layer barely changes the computation of future tokens.",
        statistic="ratio: as for all tokens, with the layer skipped before a cut point and effects measured after it",
        unit="problem", rule=Rule(0.5, "below"), values=halves_by_problem("future", "later_effect"),
        reduce=ratio_of_means, with_early=_with_early, control=CONTROL, history=_HISTORY),
    ClaimSpec(
        id="skipping.future_cutoff", chapter="skipping", figure="Fig. 3b",
        claim="future tokens: the feeding stops by 0.6 of depth",
        statement="Layers beyond about the middle do not feed the computation of future tokens.",
        statistic=f"depth: c / L, c the first layer (≥ 2) from which the mean clipped future later effect stays "
                  f"below {CUTOFF_LEVEL:g} up to layer L−2 (c = L when layer L−2 still feeds forward; the last "
                  f"layer has no later layer and is not counted)",
        unit="problem", rule=Rule(0.6, "below"), values=per_layer("future", "later_effect"),
        reduce=_cutoff_depth(EARLY_LAYERS), with_early=_cutoff_depth(0), control=CONTROL, headline=False,
        history=("2026-11-23: replaces the cutoff of the max over problems (which could not go past L − 1, so "
                 "'≈ 0.96 of depth' meant 'no cutoff'); threshold-dependent, so not counted on the findings page.",)),
)
