"""Altair chart builders: one theme, one colour per component, interaction that works without a kernel.

Builders take an aggregated tidy table and return a chart; they never compute metrics. Interactions are
Vega-Lite params (legend toggles, radio buttons, tooltips), which keep working in the static offline book.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

COMPONENT_COLORS = {
    "attention": "#4C78A8",
    "mlp": "#F58518",
    "layer": "#54A24B",
    "io": "#B279A2",
    "residual": "#72B7B2",
}
COMPONENT_LABELS = {
    ("relative_contribution", "attention"): "Attention: ‖a_l‖/‖h_l‖",
    ("relative_contribution", "mlp"): "MLP: ‖m_l‖/‖h_l+a_l‖",
    ("relative_contribution", "layer"): "Attention + MLP: ‖a_l+m_l‖/‖h_l‖",
    ("cosine", "attention"): "cos(a_l, h_l)",
    ("cosine", "mlp"): "cos(m_l, h_l+a_l)",
    ("cosine", "layer"): "cos(a_l+m_l, h_l)",
    ("cosine", "io"): "cos(h_(l+1), h_l)",
    ("norm", "residual"): "Residual ‖h_l‖",
    ("norm", "attention"): "Attention ‖a_l‖",
    ("norm", "mlp"): "MLP ‖m_l‖",
    ("norm", "layer"): "Layer ‖a_l+m_l‖",
}
MODEL_PALETTE = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02"]


@alt.theme.register("lmdepth", enable=True)
def _theme() -> alt.theme.ThemeConfig:
    return {
        "config": {
            "view": {"continuousWidth": 560, "continuousHeight": 260, "stroke": None},
            "axis": {"labelFontSize": 11, "titleFontSize": 12, "grid": True, "gridOpacity": 0.4},
            "legend": {"labelFontSize": 11, "titleFontSize": 12, "labelLimit": 260},
            "font": "system-ui, -apple-system, 'Segoe UI', sans-serif",
        }
    }


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
) -> alt.Chart:
    """Overlapping (not stacked) bars per layer, the paper's Fig. 2 layout, for one model.

    Each layer draws its shortest bar in front. Click legend entries to toggle components; with several
    ``stats`` a radio button switches them; rules show the bootstrap 95 % interval of the mean. Like the paper,
    ``y_max`` clips the axis when early layers would flatten the rest (the tooltip keeps the true value).
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
    bars = base.mark_bar(opacity=0.9, clip=True).encode(
        x=x,
        y=alt.Y("value:Q", title=y_title, stack=None,
                scale=alt.Scale(domain=[0, y_max], clamp=True) if y_max and t["value"].max() > y_max else alt.Undefined),
        color=color,
        order=alt.Order("abs_value:Q", sort="descending"),
        opacity=alt.condition(pick, alt.value(0.9), alt.value(0.08)),
        tooltip=[alt.Tooltip("model:N"), alt.Tooltip("layer:O"), alt.Tooltip("label:N", title="component"),
                 alt.Tooltip("stat:N"), alt.Tooltip("value:Q", format=".3f"),
                 alt.Tooltip("ci_low:Q", format=".3f", title="95% CI low"),
                 alt.Tooltip("ci_high:Q", format=".3f", title="95% CI high")],
    ).add_params(pick)
    errs = base.mark_rule(color="black", opacity=0.6, clip=True).encode(
        x=x, y="ci_low:Q", y2="ci_high:Q", detail="label:N",
        opacity=alt.condition(pick, alt.value(0.6), alt.value(0.0)),
    ).transform_filter("isValid(datum.ci_low)")
    return alt.layer(bars, errs)


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
) -> alt.Chart:
    """One panel per component, one line per model, on relative depth so models of different depth align.

    Relative depth of layer l in an L-layer model is (l + 0.5) / L. Click a model in the legend to highlight it.
    ``y_max`` clips the axis (early layers can be off-scale; the tooltip keeps the value).
    """
    t = _labelled(table[(table.metric == metric) & table.component.isin(components) & (table.stat == stat)])
    models = list(dict.fromkeys(t["model"]))
    pick = alt.selection_point(fields=["model"], bind="legend")
    panels = []
    for comp in components:
        sub = t[t.component == comp]
        title = COMPONENT_LABELS.get((metric, comp), comp)
        line = alt.Chart(sub).mark_line(point=alt.OverlayMarkDef(size=18), clip=True).encode(
            x=alt.X("rel_depth:Q", title="Relative depth (l + 0.5) / L", scale=alt.Scale(domain=[0, 1])),
            y=alt.Y("value:Q", title=y_title,
                    scale=alt.Scale(domain=[0, y_max], clamp=True) if y_max and t["value"].max() > y_max else alt.Undefined),
            color=alt.Color("model:N", scale=alt.Scale(domain=models, range=MODEL_PALETTE[: len(models)]),
                            legend=alt.Legend(orient="top", title="Model")),
            opacity=alt.condition(pick, alt.value(1.0), alt.value(0.12)),
            tooltip=["model:N", "layer:Q", "n_layers:Q", alt.Tooltip("rel_depth:Q", format=".2f"),
                     alt.Tooltip("value:Q", format=".3f")],
        ).add_params(pick)
        layers = [line]
        if zero_line:
            layers.append(alt.Chart(pd.DataFrame({"y": [0.0]})).mark_rule(color="gray", strokeDash=[4, 4]).encode(y="y:Q"))
        panels.append(alt.layer(*layers).properties(title=title, width=width, height=220))
    return alt.hconcat(*panels).resolve_scale(y="shared")


# ---- layer skipping (chapter 03) ---------------------------------------------------------------------------------

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


def later_effect_lines(d: pd.DataFrame, threshold: float, width: int = 560) -> alt.Chart:
    """Largest future effect of each skipped layer on any later layer, per model, on relative depth.

    Args:
        d: columns ``model, layer, n_layers, rel_depth, value``.
    """
    models = list(dict.fromkeys(d["model"]))
    pick = alt.selection_point(fields=["model"], bind="legend")
    line = alt.Chart(d).mark_line(point=True).encode(
        x=alt.X("rel_depth:Q", title="Relative depth of the skipped layer (l + 0.5) / L", scale=alt.Scale(domain=[0, 1])),
        y=alt.Y("value:Q", title="Max relative change of a later layer"),
        color=alt.Color("model:N", scale=alt.Scale(domain=models, range=MODEL_PALETTE[: len(models)]),
                        legend=alt.Legend(orient="top", title="Model")),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.12)),
        tooltip=["model:N", "layer:Q", "n_layers:Q", alt.Tooltip("value:Q", format=".3f")],
    ).add_params(pick)
    rule = alt.Chart(pd.DataFrame({"y": [threshold]})).mark_rule(color="gray", strokeDash=[4, 4]).encode(y="y:Q")
    return alt.layer(line, rule).properties(width=width, height=260)
