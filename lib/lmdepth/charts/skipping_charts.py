"""Charts of chapter 03 (layer skipping), built from the tidy tables of :mod:`lmdepth.analyses.skipping`."""

from __future__ import annotations

from collections.abc import Sequence

import altair as alt
import pandas as pd

from lmdepth.analyses.skipping import SkipSummary
from lmdepth.charts.paper_marks import paper_marks
from lmdepth.charts.theme import COMPONENT_COLORS, MODEL_PALETTE
from lmdepth.claims.paper_values import PaperValue

VIRIDIS_ZERO = "#440154"  # the colour of 0 in the viridis scheme


def effect_heatmaps(table: pd.DataFrame, analysis: str, variants: list[str], title_by_variant: dict[str, str],
                    stat: str = "max", size: int = 230) -> alt.Chart:
    """One heatmap per variant: skipped layer (rows, 0 at the top) × affected layer, relative change 0..1.

    The colour scale stops at 1 (viridis, as the paper); hover a cell for its exact value; a slider highlights the
    row of one skipped layer in every panel.
    """
    t = table[(table.analysis == analysis) & (table.metric == "relative_change") & (table.stat == stat)
              & table.variant.isin(variants) & (table.affected_layer >= table.skipped_layer)]
    # Every cell is embedded in the page as JSON, so: short field names, rounding, part codes (titles go in the
    # facet headers), and no cells below the diagonal — skipping s cannot change a layer j < s, those are 0 by
    # construction and are drawn by the view's background in the colour of 0.
    d = pd.DataFrame({"s": t.skipped_layer, "j": t.affected_layer, "v": t.value.round(3), "part": t.variant})
    header = " : ".join(f"datum.value == '{v}' ? '{title_by_variant[v]}'" for v in variants) + " : datum.value"
    # a slider highlights one skipped layer's row in every panel (-1: none)
    row = alt.param(name=f"skip_row_{analysis}", value=-1, bind=alt.binding_range(
        min=-1, max=int(d["s"].max()) if len(d) else 0, step=1, name="Highlight skipped layer (−1: none) "))
    return alt.Chart(d).mark_rect().encode(
        opacity=alt.condition((row == -1) | (alt.datum.s == row), alt.value(1.0), alt.value(0.25)),
        x=alt.X("j:O", title="Effect @ layer", axis=alt.Axis(labelAngle=0, labelOverlap="greedy")),
        y=alt.Y("s:O", title="Layer skipped", axis=alt.Axis(labelOverlap="greedy")),
        color=alt.Color("v:Q", title="Relative change", scale=alt.Scale(scheme="viridis", domain=[0, 1], clamp=True)),
        tooltip=[alt.Tooltip("part:N"), alt.Tooltip("s:O", title="skipped"), alt.Tooltip("j:O", title="affected"),
                 alt.Tooltip("v:Q", format=".3f", title="relative change")],
    ).add_params(row).properties(width=size, height=size).facet(
        facet=alt.Facet("part:N", title=None, sort=list(variants), header=alt.Header(labelExpr=header)), columns=2
    ).configure_view(fill=VIRIDIS_ZERO)


def output_effect_bars(table: pd.DataFrame, analysis: str, variants: list[str], title_by_variant: dict[str, str],
                       stat: str = "max", width: int = 600) -> alt.Chart:
    """Output change ||P − P'||₂ per skipped layer, one bar per variant side by side."""
    t = table[(table.analysis == analysis) & (table.metric == "output_change") & (table.stat == stat)
              & table.variant.isin(variants)]
    d = pd.DataFrame({"s": t.skipped_layer, "v": t.value.round(4), "part": t.variant.map(title_by_variant)})
    names = [title_by_variant[v] for v in variants]
    pick = alt.selection_point(fields=["part"], bind="legend")
    return alt.Chart(d).mark_bar().encode(
        x=alt.X("s:O", title="Layer skipped", axis=alt.Axis(labelAngle=0, labelOverlap="greedy")),
        xOffset=alt.XOffset("part:N", sort=names),
        y=alt.Y("v:Q", title="Output change ‖P − P′‖₂"),
        color=alt.Color("part:N", sort=names, title=None, legend=alt.Legend(orient="top"),
                        scale=alt.Scale(domain=names, range=[COMPONENT_COLORS[c] for c in ("layer", "attention", "mlp", "io")][: len(names)])),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
        tooltip=["part:N", alt.Tooltip("s:O", title="skipped"), alt.Tooltip("v:Q", format=".4f", title="output change")],
    ).add_params(pick).properties(width=width, height=220)


def later_effect_lines(d: pd.DataFrame, threshold: float, width: int = 560,
                       paper: Sequence[PaperValue] = ()) -> alt.Chart:
    """Largest future effect of each skipped layer on any later layer, per model, on relative depth.

    Args:
        d: columns ``model, layer, n_layers, rel_depth, value``.
        paper: the paper's values drawn over the lines (:mod:`lmdepth.charts.paper_marks`).
    """
    models = list(dict.fromkeys(d["model"]))
    pick = alt.selection_point(fields=["model"], bind="legend")
    line = alt.Chart(d).mark_line(point=True, clip=True).encode(
        x=alt.X("rel_depth:Q", title="Relative depth of the skipped layer (l + 0.5) / L", scale=alt.Scale(domain=[0, 1])),
        # clipped at 1 as the heatmaps are: one exploding ratio (a near-zero clean contribution) would otherwise
        # stretch the axis to tens and flatten everything else, the threshold included; hover for the value
        y=alt.Y("value:Q", title="Max relative change of a later layer (clipped at 1)",
                scale=alt.Scale(domain=[0, 1], clamp=True)),
        color=alt.Color("model:N", scale=alt.Scale(domain=models, range=MODEL_PALETTE[: len(models)]),
                        legend=alt.Legend(orient="top", title="Model")),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.12)),
        tooltip=["model:N", "layer:Q", "n_layers:Q", alt.Tooltip("value:Q", format=".3f")],
    ).add_params(pick)
    rule = alt.Chart(pd.DataFrame({"y": [threshold]})).mark_rule(color="gray", strokeDash=[4, 4]).encode(y="y:Q")
    return alt.layer(*paper_marks(paper).around(line, rule)).properties(width=width, height=260)


def comparison_panels(table: pd.DataFrame, futures: dict[str, SkipSummary], models: Sequence[str],
                      variants: list[str], title_by_variant: dict[str, str], n_current: int
                      ) -> list[tuple[str, alt.Chart, alt.Chart]]:
    """Smaller heatmaps and output-change bars of each comparison model, all tokens then future tokens.

    Args:
        table: tidy tables of :mod:`lmdepth.analyses.skipping` (an analysis absent for a model is left out).
        futures: model → the summary of its future-token run (for its number of problems).
        n_current: problems of the comparison models' all-token runs.

    Returns:
        (Markdown heading, effect heatmaps, output-change bars) per (model, analysis).
    """
    out = []
    for m in models:
        for a, title in (("current", "all tokens"), ("future", "future tokens")):
            t = table[(table.model == m) & (table.analysis == a)]
            if len(t):
                n = futures[m].n_problems if a == "future" else n_current
                out.append((f"**{m}**, {title} ({n} problem(s)):",
                            # all tokens: the local variant pins every position, so nothing reaches a later layer
                            effect_heatmaps(t, a, [v for v in variants if a == "future" or v != "local"],
                                            title_by_variant, size=170),
                            output_effect_bars(t, a, [v for v in variants if v != "local"], title_by_variant, width=450)))
    return out


__all__ = ["VIRIDIS_ZERO", "effect_heatmaps", "output_effect_bars", "later_effect_lines", "comparison_panels"]
