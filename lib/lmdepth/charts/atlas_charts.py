"""Chart of chapter 90 (across models): every depth-valued summary of :func:`lmdepth.analyses.atlas.atlas_table`
on one relative-depth axis."""

from __future__ import annotations

import altair as alt
import pandas as pd

from lmdepth.charts.theme import MODEL_PALETTE


def atlas_chart(table: pd.DataFrame, width: int = 520) -> alt.Chart:
    """Every depth-valued summary on one relative-depth axis: one row per model (deepest last), one mark per measure.

    A drop-down picks a model (or all), clicking a legend entry toggles a measure, rules show bootstrap intervals,
    and the tooltip carries the layer, the model's depth and the sample the number comes from.
    """
    d = table.dropna(subset=["rel_depth"]).copy()
    d["row"] = d["model"] + " (" + d["n_layers"].astype(int).astype(str) + " layers)"
    rows = list(dict.fromkeys(d.sort_values("n_layers", kind="stable")["row"]))
    measures = list(dict.fromkeys(d["measure"]))
    models = list(dict.fromkeys(d["model"]))
    d = d.round(3)
    pick_model = alt.param(name="atlas_model", value="all",
                           bind=alt.binding_select(options=["all", *models], name="Model: "))
    pick_measure = alt.selection_point(fields=["measure"], bind="legend", name="atlas_measure")
    keep = (pick_model == "all") | (alt.datum.model == pick_model)
    y = alt.Y("row:N", sort=rows, title=None)
    x = alt.X("rel_depth:Q", title="Relative depth", scale=alt.Scale(domain=[0, 1]))
    color = alt.Color("measure:N", scale=alt.Scale(domain=measures, range=(MODEL_PALETTE * 3)[: len(measures)]),
                      legend=alt.Legend(orient="bottom", columns=2, title=None, labelLimit=360))
    base = alt.Chart(d).transform_filter(keep)
    ci = base.mark_rule(strokeWidth=2).encode(
        x="rel_low:Q", x2="rel_high:Q", y=y, color=color,
        opacity=alt.condition(pick_measure, alt.value(0.8), alt.value(0.05)))
    dots = base.mark_point(filled=True, size=110).encode(
        x=x, y=y, color=color, shape=alt.Shape("measure:N", legend=None),
        opacity=alt.condition(pick_measure, alt.value(0.9), alt.value(0.08)),
        tooltip=["model:N", "measure:N", alt.Tooltip("layer:Q", format=".0f"), "n_layers:Q",
                 alt.Tooltip("rel_depth:Q", format=".2f", title="relative depth"), "sample:N"]
    ).add_params(pick_model, pick_measure)
    half = alt.Chart(pd.DataFrame({"x": [0.5]})).mark_rule(color="gray", strokeDash=[4, 4]).encode(x="x:Q")
    return alt.layer(half, ci, dots).properties(
        width=width, height=max(90, 40 * len(rows)))


__all__ = ["atlas_chart"]
