"""Charts of chapter 05 (depth vs. complexity), built from the summary frames of :mod:`lmdepth.analyses.complexity`;
they never compute metrics."""

from __future__ import annotations

import altair as alt
import pandas as pd

from lmdepth.charts.theme import MODEL_PALETTE
from lmdepth.data.difficulty import SOURCE_TITLES, SOURCES
from lmdepth.metrics.depth import METRICS


def _model_scale(models: list[str]):
    return alt.Scale(domain=models, range=MODEL_PALETTE[: len(models)])


def depth_vs_level_chart(levels: pd.DataFrame, width: int = 170, height: int = 200):
    """Relative depth score D / (L − 1) per difficulty level, one panel per source, one line per model, with the
    bootstrap 95 % interval; radio buttons pick the effect (layer / logit) and the aggregation (mean / max)."""
    d = levels[["model", "source", "level", "aggregation", "metric", "rel_depth_score", "rel_ci_low", "rel_ci_high",
                "depth_score", "n", "n_layers"]].round(4).copy()
    d["source"] = d.source.map(SOURCE_TITLES)
    models = list(dict.fromkeys(d.model))
    metric = alt.param(name="effect", value="layer_effect",
                       bind=alt.binding_radio(options=list(METRICS), labels=["layer effect", "logit effect"], name="Effect: "))
    agg = alt.param(name="aggregation", value="mean",
                    bind=alt.binding_radio(options=["mean", "max"], name="Aggregation over items: "))
    pick = alt.selection_point(fields=["model"], bind="legend")
    base = alt.Chart(d).transform_filter((alt.datum.metric == metric) & (alt.datum.aggregation == agg))
    x = alt.X("level:O", title="difficulty level", axis=alt.Axis(labelAngle=0))
    color = alt.Color("model:N", scale=_model_scale(models), legend=alt.Legend(orient="top", title="Model"))
    line = base.mark_line(point=True).encode(
        x=x, y=alt.Y("rel_depth_score:Q", title="Depth score D / (L − 1)", scale=alt.Scale(domain=[0, 1])),
        color=color, opacity=alt.condition(pick, alt.value(1.0), alt.value(0.12)),
        tooltip=["model:N", "source:N", "level:O", alt.Tooltip("depth_score:Q", format=".2f", title="D (0-based layers)"),
                 alt.Tooltip("rel_depth_score:Q", format=".3f", title="D / (L−1)"),
                 alt.Tooltip("rel_ci_low:Q", format=".3f", title="95% CI low"),
                 alt.Tooltip("rel_ci_high:Q", format=".3f", title="95% CI high"), "n:Q", "n_layers:Q"])
    band = base.mark_rule(strokeWidth=2).encode(
        x=x, y="rel_ci_low:Q", y2="rel_ci_high:Q", color=color,
        opacity=alt.condition(pick, alt.value(0.45), alt.value(0.05)))
    return (alt.layer(band, line).add_params(metric, agg, pick).properties(width=width, height=height)
            .facet(facet=alt.Facet("source:N", title=None, sort=[SOURCE_TITLES[s] for s in SOURCES]), columns=3)
            .resolve_scale(x="independent"))


def accuracy_chart(acc: pd.DataFrame, width: int = 170, height: int = 180):
    """Accuracy per difficulty level with its 95 % Wilson interval, one panel per source, one line per model; the
    grey dashes are each level's constant-answer baseline. A ladder the models can climb starts well above the
    dashes and falls toward them."""
    d = acc.round(4).copy()
    d["source"] = d.source.map(SOURCE_TITLES)
    models = list(dict.fromkeys(d.model))
    x = alt.X("level:O", title="difficulty level", axis=alt.Axis(labelAngle=0))
    color = alt.Color("model:N", scale=_model_scale(models), legend=alt.Legend(orient="top", title="Model"))
    y = alt.Y("accuracy:Q", title="Accuracy", scale=alt.Scale(domain=[0, 1]), axis=alt.Axis(format="%"))
    tip = ["model:N", "source:N", "level:O", "n:Q", alt.Tooltip("accuracy:Q", format=".0%"),
           alt.Tooltip("ci_low:Q", format=".0%", title="95% CI low"), alt.Tooltip("ci_high:Q", format=".0%",
                                                                                  title="95% CI high"),
           alt.Tooltip("baseline:Q", format=".0%", title="constant answer")]
    base = alt.Chart(d)
    line = base.mark_line(point=True).encode(x=x, y=y, color=color, tooltip=tip)
    band = base.mark_rule(strokeWidth=2, opacity=0.45).encode(x=x, y="ci_low:Q", y2="ci_high:Q", color=color)
    chance = base.mark_tick(color="gray", strokeDash=[3, 2], thickness=2).encode(
        x=x, y=alt.Y("max(baseline):Q"), tooltip=[alt.Tooltip("max(baseline):Q", format=".0%", title="constant answer")])
    return (alt.layer(band, line, chance).properties(width=width, height=height)
            .facet(facet=alt.Facet("source:N", title=None, sort=[SOURCE_TITLES[s] for s in SOURCES]), columns=3)
            .resolve_scale(x="independent"))


def effect_profile_chart(table: pd.DataFrame, model: str, width: int = 250, height: int = 150):
    """Mean layer effect e[s] of each skipped layer, one line per difficulty level (darker = harder), one panel per
    source: where in depth the skip effects sit, and whether harder items move them deeper."""
    t = table[(table.model == model)]
    d = (t.groupby(["source", "level", "metric", "layer"], as_index=False)["value"].mean().round(4))
    d["source"] = d.source.map(SOURCE_TITLES)
    metric = alt.param(name="profile_effect", value="layer_effect",
                       bind=alt.binding_radio(options=list(METRICS), labels=["layer effect", "logit effect"], name="Effect: "))
    return alt.Chart(d).mark_line(point=alt.OverlayMarkDef(size=12)).encode(
        x=alt.X("layer:Q", title="Skipped layer s"),
        y=alt.Y("value:Q", title="Mean effect over items"),
        color=alt.Color("level:O", title="Level", scale=alt.Scale(scheme="viridis", reverse=True)),
        tooltip=["source:N", "level:O", "layer:Q", alt.Tooltip("value:Q", format=".3f")],
    ).add_params(metric).transform_filter(alt.datum.metric == metric).properties(width=width, height=height).facet(
        facet=alt.Facet("source:N", title=None, sort=[SOURCE_TITLES[s] for s in SOURCES]), columns=2
    ).resolve_scale(y="independent")


def solved_chart(solved: pd.DataFrame, width: int = 130, height: int = 200):
    """Relative depth score of solved vs unsolved items (mean aggregation, all levels pooled), per model and source."""
    d = solved[solved.metric == "layer_effect"][["model", "source", "group", "n", "rel_depth_score", "rel_ci_low",
                                                 "rel_ci_high"]].dropna(subset=["rel_depth_score"]).round(4).copy()
    d["source"] = d.source.map(SOURCE_TITLES)
    x = alt.X("model:N", title=None, axis=alt.Axis(labelAngle=-30))
    color = alt.Color("group:N", title=None, scale=alt.Scale(domain=["solved", "unsolved"], range=["#54A24B", "#E45756"]),
                      legend=alt.Legend(orient="top"))
    pts = alt.Chart(d).mark_point(filled=True, size=60).encode(
        x=x, xOffset=alt.XOffset("group:N"), y=alt.Y("rel_depth_score:Q", title="Depth score D / (L − 1)",
                                                   scale=alt.Scale(zero=False)), color=color,
        tooltip=["model:N", "source:N", "group:N", "n:Q", alt.Tooltip("rel_depth_score:Q", format=".3f"),
                 alt.Tooltip("rel_ci_low:Q", format=".3f"), alt.Tooltip("rel_ci_high:Q", format=".3f")])
    bars = alt.Chart(d).mark_rule(strokeWidth=2).encode(x=x, xOffset=alt.XOffset("group:N"), y="rel_ci_low:Q",
                                                       y2="rel_ci_high:Q", color=color)
    return alt.layer(bars, pts).properties(width=width, height=height).facet(
        column=alt.Column("source:N", title=None, sort=[SOURCE_TITLES[s] for s in SOURCES]))


__all__ = ["accuracy_chart", "depth_vs_level_chart", "effect_profile_chart", "solved_chart"]
