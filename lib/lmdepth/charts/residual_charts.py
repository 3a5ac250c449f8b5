"""Charts of chapters 01 (residual norms) and 02 (cosine similarity), built from the tidy table of
:mod:`lmdepth.analyses.residual`."""

from __future__ import annotations

from collections.abc import Sequence

import altair as alt
import pandas as pd

from lmdepth.charts.paper_marks import paper_marks
from lmdepth.charts.theme import COMPONENT_COLORS, COMPONENT_LABELS, MODEL_PALETTE
from lmdepth.claims.paper_values import PaperValue

_CHART_COLUMNS = ["model", "component", "label", "stat", "layer", "n_layers", "rel_depth", "value", "abs_value",
                  "ci_low", "ci_high"]


def _labelled(table: pd.DataFrame) -> pd.DataFrame:
    """Only the columns charts use, rounded: the data is embedded in every chart (and notebook) as JSON."""
    t = table.copy()
    t["label"] = [COMPONENT_LABELS.get((m, c), f"{m}/{c}") for m, c in zip(t.metric, t.component)]
    t["abs_value"] = t["value"].abs()
    return t[[c for c in _CHART_COLUMNS if c in t.columns]].round(4)


def _component_scale(table: pd.DataFrame) -> alt.Scale:
    labels = list(dict.fromkeys(table["label"]))
    comps = list(dict.fromkeys(table["component"]))
    return alt.Scale(domain=labels, range=[COMPONENT_COLORS[c] for c in comps])


def layer_bars(
    table: pd.DataFrame,
    metric: str,
    y_title: str,
    components: list[str],
    stats: tuple[str, ...] = ("mean",),
    y_max: float | None = None,
    width: int = 600,
    paper: Sequence[PaperValue] = (),
) -> alt.Chart:
    """Overlapping (not stacked) bars per layer, the paper's Fig. 2 layout, for one model.

    Each layer draws its shortest bar in front. Click legend entries to toggle components; with several
    ``stats`` a radio button switches them; rules show the bootstrap 95 % interval of the mean. Like the paper,
    ``y_max`` clips the axis when early layers would flatten the rest (the tooltip keeps the true value).
    ``paper``: the paper's values drawn over the bars (:mod:`lmdepth.charts.paper_marks`) at their relative depth:
    bar l's centre is at (l + 0.5) / L of the width, the band scale's layout with its default padding.
    """
    t = _labelled(table[(table.metric == metric) & table.component.isin(components) & table.stat.isin(stats)])
    t = t.sort_values("layer")
    pick = alt.selection_point(fields=["label"], bind="legend", name="component_pick")
    stat = alt.param(name="stat", value=stats[0], bind=alt.binding_radio(options=list(stats), name="Statistic: ")) if len(stats) > 1 else None
    color = alt.Color("label:N", title=None, scale=_component_scale(t), sort=list(dict.fromkeys(t["label"])),
                      legend=alt.Legend(orient="top", direction="horizontal", columns=3))
    x = alt.X("layer:O", title="Layer index (l)", axis=alt.Axis(labelAngle=0, labelOverlap="greedy"))
    base = alt.Chart(t).properties(width=width)
    if stat is not None:
        base = base.add_params(stat).transform_filter(alt.datum.stat == stat)
    # both layers get the clipped scale: a shared scale is the union of the layers' domains, so interval rules
    # reaching past y_max would otherwise stretch the axis beyond it
    y_scale = alt.Scale(domain=[0, y_max], clamp=True, nice=False) if y_max and t["value"].max() > y_max else alt.Undefined
    bars = base.mark_bar(opacity=0.9, clip=True).encode(
        x=x,
        y=alt.Y("value:Q", title=y_title, stack=None, scale=y_scale),
        color=color,
        order=alt.Order("abs_value:Q", sort="descending"),
        opacity=alt.condition(pick, alt.value(0.9), alt.value(0.08)),
        tooltip=[alt.Tooltip("model:N"), alt.Tooltip("layer:O"), alt.Tooltip("label:N", title="component"),
                 alt.Tooltip("stat:N"), alt.Tooltip("value:Q", format=".3f"),
                 alt.Tooltip("ci_low:Q", format=".3f", title="95% CI low"),
                 alt.Tooltip("ci_high:Q", format=".3f", title="95% CI high")],
    ).add_params(pick)
    errs = base.mark_rule(color="black", opacity=0.6, clip=True).encode(
        x=x, y=alt.Y("ci_low:Q", scale=y_scale), y2="ci_high:Q", detail="label:N",
        opacity=alt.condition(pick, alt.value(0.6), alt.value(0.0)),
    ).transform_filter("isValid(datum.ci_low)")
    # on their own [0, 1] x scale, spanning the bars' width
    marks = paper_marks([v for v in paper if v.component in (None, *components)], axis=False, y_scale=y_scale)
    if not marks:
        return alt.layer(bars, errs)
    return alt.layer(*marks.around(alt.layer(bars, errs))).resolve_scale(x="independent")


def norms_lines(table: pd.DataFrame, width: int = 600) -> alt.Chart:
    """Absolute norms per layer on a log scale (residual, attention, MLP), mean/max switch."""
    comps = ["residual", "attention", "mlp"]
    t = _labelled(table[(table.metric == "norm") & table.component.isin(comps)])
    stat = alt.param(name="stat", value="mean", bind=alt.binding_radio(options=["mean", "max"], name="Statistic: "))
    pick = alt.selection_point(fields=["label"], bind="legend")
    return (
        alt.Chart(t).mark_line(point=True).encode(
            x=alt.X("layer:Q", title="Layer index (l)"),
            y=alt.Y("value:Q", title="L2 norm (log scale)", scale=alt.Scale(type="log")),
            color=alt.Color("label:N", title=None, scale=_component_scale(t), legend=alt.Legend(orient="top")),
            opacity=alt.condition(pick, alt.value(1.0), alt.value(0.1)),
            tooltip=["model:N", "layer:Q", alt.Tooltip("label:N", title="component"), "stat:N",
                     alt.Tooltip("value:Q", format=".2f")],
        ).add_params(stat, pick).transform_filter(alt.datum.stat == stat).properties(width=width)
    )


def across_models(
    table: pd.DataFrame,
    metric: str,
    y_title: str,
    components: list[str],
    stat: str = "mean",
    zero_line: bool = False,
    y_max: float | None = None,
    width: int = 150,
    paper: Sequence[PaperValue] = (),
) -> alt.Chart:
    """One panel per component, one line per model, on relative depth so models of different depth align.

    Relative depth of layer l in an L-layer model is (l + 0.5) / L. Click a model in the legend to highlight it.
    ``y_max`` clips the axis (early layers can be off-scale; the tooltip keeps the value). ``paper``: the paper's
    values, each on the panel of its component (on every panel when it names none), labelled on the first.
    """
    t = _labelled(table[(table.metric == metric) & table.component.isin(components) & (table.stat == stat)])
    models = list(dict.fromkeys(t["model"]))
    pick = alt.selection_point(fields=["model"], bind="legend")
    y_scale = alt.Scale(domain=[0, y_max], clamp=True) if y_max and t["value"].max() > y_max else alt.Undefined
    panels, labelled = [], False  # the paper's marks are labelled on the first panel that has them
    for comp in components:
        sub = t[t.component == comp]
        title = COMPONENT_LABELS.get((metric, comp), comp)
        line = alt.Chart(sub).mark_line(point=alt.OverlayMarkDef(size=18), clip=True).encode(
            x=alt.X("rel_depth:Q", title="Relative depth (l + 0.5) / L", scale=alt.Scale(domain=[0, 1])),
            y=alt.Y("value:Q", title=y_title, scale=y_scale),
            color=alt.Color("model:N", scale=alt.Scale(domain=models, range=MODEL_PALETTE[: len(models)]),
                            legend=alt.Legend(orient="top", title="Model")),
            opacity=alt.condition(pick, alt.value(1.0), alt.value(0.12)),
            tooltip=["model:N", "layer:Q", "n_layers:Q", alt.Tooltip("rel_depth:Q", format=".2f"),
                     alt.Tooltip("value:Q", format=".3f")],
        ).add_params(pick)
        layers = [line]
        if zero_line:
            layers.append(alt.Chart(pd.DataFrame({"y": [0.0]})).mark_rule(color="gray", strokeDash=[4, 4]).encode(y="y:Q"))
        mine = [v for v in paper if v.component in (None, comp)]
        marks = paper_marks(mine, label=not labelled, y_scale=y_scale)
        labelled = labelled or bool(mine)
        panels.append(alt.layer(*marks.around(*layers)).properties(title=title, width=width, height=220))
    return alt.hconcat(*panels).resolve_scale(y="shared")


__all__ = ["layer_bars", "norms_lines", "across_models"]
