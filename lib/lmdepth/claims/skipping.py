"""Claims of paper Fig. 3 (chapter 03), checked on the layer-skipping runs' per-problem tables.

Unit: the problem (within a problem the paper's aggregation is kept: max over positions and cut points). Across
problems the statistics use means, not the paper's max (a max over problems only grows with the sample), and every
per-problem effect is clipped at 1 — as the paper's heatmaps are — so that one exploding relative change (a layer
whose clean contribution is near zero) cannot carry a verdict.

A clipped max saturates: when half or more of a half's per-problem values sit at the clip, the halves ratio
measures the clip, not the model, and the check is not testable (``saturation``; the share is shown in every row).
The output change of an untrained twin is tiny in both halves, so its ratio is a quotient of noise: a control
whose two halves both stay below 1 % of the model's first-half change is no valid control (``control_check``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from lmdepth.claims.spec import EARLY_LAYERS, ClaimSpec
from lmdepth.errors import DataError
from lmdepth.metrics.effects import sustained_cutoff
from lmdepth.metrics.verdicts import Rule, at_bound

CLIP = 1.0  # per-problem effects are clipped here (the paper's heatmaps clip relative change at 1)
CUTOFF_LEVEL = 0.1  # the registry's future-effect level for the cutoff claim (the chapter's `threshold` is display)
#: A control's output change below this fraction of the model's own (first half, both halves of the control) is
#: numerical noise: a ratio of two such values decides nothing.
NEGLIGIBLE = 0.01
CONTROL = ("a random-init model of the same architecture (weights never trained) on the same problems and cut "
           "points, run where the model has at least 10 problems: what skipping does in an untrained stack")


def per_layer(analysis: str, metric: str) -> Callable[[pd.DataFrame, str], pd.DataFrame]:
    """Per-problem values ``[problems, L]`` of the layer skip, clipped at :data:`CLIP`, indexed by problem."""

    def values(units: pd.DataFrame, model: str) -> pd.DataFrame:
        u = units[(units.model == model) & (units.analysis == analysis) & (units.variant == "layer")
                  & (units.metric == metric)]
        if u.empty:
            raise DataError(f"No per-problem {analysis}-token skip results for {model!r}: run "
                            f"lmdepth.analyses.skipping.run(model_name={model!r}, analysis={analysis!r}) first.")
        wide = u.pivot_table(index="unit", columns="layer", values="value", sort=False, dropna=False)
        return wide.clip(upper=CLIP)

    return values


def _halves(L: int, metric: str) -> tuple[slice, slice]:
    """The first half without layers 0–1 and the second half; for the later effect without the last layer: it has
    no later layer, so its effect is 0 by construction and would pull the second half down in the paper's
    direction."""
    return slice(EARLY_LAYERS, L // 2), slice((L + 1) // 2, L - 1 if metric == "later_effect" else L)


def halves_ratio(metric: str, skip: int) -> Callable[[np.ndarray], float]:
    """Per-layer values ``[problems, L]`` → mean over problems of the second-half mean / of the first-half mean
    (layers < ``skip`` out of the first half); NaN when the denominator vanishes."""

    def reduce(v: np.ndarray) -> float:
        first, second = _halves(v.shape[1], metric)
        den = float(v[:, skip : first.stop].mean())
        return float(v[:, second].mean() / den) if den != 0 else float("nan")

    return reduce


def saturation(metric: str) -> Callable[[np.ndarray], tuple[float, str]]:
    """For per-layer values ``[problems, L]``: the larger share at the clip of the two halves."""

    def share(v: np.ndarray) -> tuple[float, str]:
        first, second = _halves(v.shape[1], metric)
        return max(at_bound(v[:, first], CLIP), at_bound(v[:, second], CLIP)), f"at the clip {CLIP:g}"

    return share


def negligible_control(real: np.ndarray, control: np.ndarray) -> str:
    """Why a control's halves (per-layer output changes ``[problems, L]``) are noise beside the model's ("" if they
    are not)."""
    first, second = _halves(real.shape[1], "output_change")
    scale = float(real[:, first].mean())
    c = np.array([control[:, first].mean(), control[:, second].mean()])
    if scale > 0 and (c < NEGLIGIBLE * scale).all():
        return (f"the control's output change ({c[0]:.2g} and {c[1]:.2g} in the two halves) is below "
                f"{NEGLIGIBLE:.0%} of the model's ({scale:.2g}) in both halves: its ratio is a quotient of noise")
    return ""


def _cutoff_depth(skip: int) -> Callable[[np.ndarray], float]:
    def reduce(v: np.ndarray) -> float:
        curve = v.mean(0)
        return sustained_cutoff(curve, CUTOFF_LEVEL, skip) / len(curve)

    return reduce


_HISTORY = ("2026-11-23: per-problem effects clipped at 1, means over problems, layers 0–1 out of the first half, "
            "decided from the interval (was: max over problems, all layers, a point estimate).",)

_HISTORY_26 = ("2026-11-26: a half with ≥ 50 % of its per-problem values at the clip makes the check not testable "
               "(saturated); discrimination became a paired interval of (trained − twin) over the shared problems "
               "(was: the twin reaching another state); for the output change, a twin whose change is negligible in "
               "both halves is no valid control.",)

CLAIMS: tuple[ClaimSpec, ...] = (
    ClaimSpec(
        id="skipping.current_later_small", chapter="skipping", figure="Fig. 3a",
        claim="all tokens: 2nd half barely affects later layers",
        statement="Skipping a second-half layer barely changes the computation of the later layers.",
        statistic="ratio: mean over problems of the clipped later effect (largest relative change of any later "
                  "layer), second-half layers (without the last, which has no later layer) / first-half layers "
                  "(without layers 0–1)",
        unit="problem", rule=Rule(0.5, "below"), values=per_layer("current", "later_effect"),
        reduce=halves_ratio("later_effect", EARLY_LAYERS), with_early=halves_ratio("later_effect", 0), saturation=saturation("later_effect"), control=CONTROL,
        history=_HISTORY + _HISTORY_26),
    ClaimSpec(
        id="skipping.current_output_changes", chapter="skipping", figure="Fig. 3a",
        claim="all tokens: 2nd half still changes the output",
        statement="Second-half layers still change the output distribution: they refine the current prediction.",
        statistic="ratio: mean over problems of the output change ‖P − P′‖₂, second-half / first-half layers "
                  "(without layers 0–1)",
        unit="problem", rule=Rule(0.5, "above"), values=per_layer("current", "output_change"),
        reduce=halves_ratio("output_change", EARLY_LAYERS), with_early=halves_ratio("output_change", 0), saturation=saturation("output_change"), control_check=negligible_control,
        control=CONTROL + f"; a control whose output change stays below {NEGLIGIBLE:.0%} of the model's in both "
                          "halves is no valid control", history=_HISTORY + _HISTORY_26),
    ClaimSpec(
        id="skipping.future_later_small", chapter="skipping", figure="Fig. 3b",
        claim="future tokens: 2nd half feeds little forward",
        statement="Skipping a second-half layer barely changes the computation of future tokens.",
        statistic="ratio: as for all tokens, with the layer skipped before a cut point and effects measured after it",
        unit="problem", rule=Rule(0.5, "below"), values=per_layer("future", "later_effect"),
        reduce=halves_ratio("later_effect", EARLY_LAYERS), with_early=halves_ratio("later_effect", 0), saturation=saturation("later_effect"), control=CONTROL,
        history=_HISTORY + _HISTORY_26),
    ClaimSpec(
        id="skipping.future_cutoff", chapter="skipping", figure="Fig. 3b",
        claim="future tokens: the feeding stops by 0.6 of depth",
        statement="Layers beyond about the middle do not feed the computation of future tokens.",
        statistic=f"depth: c / L, c the first layer (≥ 2) from which the mean clipped future later effect stays "
                  f"below {CUTOFF_LEVEL:g} up to layer L−2 (c = L when layer L−2 still feeds forward; the last "
                  f"layer has no later layer and is not counted)",
        unit="problem", rule=Rule(0.6, "below"), values=per_layer("future", "later_effect"),
        reduce=_cutoff_depth(EARLY_LAYERS), with_early=_cutoff_depth(0), saturation=saturation("later_effect"),
        control=CONTROL, headline=False,
        history=("2026-11-23: replaces the cutoff of the max over problems (which could not go past L − 1, so "
                 "'≈ 0.96 of depth' meant 'no cutoff'); threshold-dependent, so not counted on the findings page.",)),
)
