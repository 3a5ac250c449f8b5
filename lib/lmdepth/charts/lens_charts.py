"""Altair charts of the logit-lens chapter (04): per-layer lens curves, models on relative depth, training curves.

Builders take the aggregated tidy tables of :mod:`lmdepth.analyses.lens` and return charts; they never compute metrics.
Interactions are Vega-Lite params (radio buttons, legend toggles, tooltips) that work in the static offline book.
"""

from __future__ import annotations

from collections.abc import Sequence

import altair as alt
import pandas as pd

from lmdepth.charts.paper_marks import paper_marks
from lmdepth.charts.theme import MODEL_PALETTE
from lmdepth.claims.paper_values import PaperValue

LENS_COLORS = {"logit_lens": "#4C78A8", "tuned_lens": "#E45756"}
LENS_LABELS = {"logit_lens": "Logit lens", "tuned_lens": "Tuned lens"}
METRIC_LABELS = {
    "kl": "KL(P_lens ‖ P_final)",
    "kl_final_lens": "KL(P_final ‖ P_lens)",
    "top5_overlap": "Top-5 overlap",
}
_COLUMNS = ["model", "metric", "lens", "stat", "layer", "n_layers", "rel_depth", "value", "ci_low", "ci_high"]


def _prepared(table: pd.DataFrame, metrics: list[str], stat: str = "mean") -> pd.DataFrame:
    """Rows of the given metrics and stat, with readable labels, only the columns charts use, rounded."""
    t = table[table.metric.isin(metrics) & (table.stat == stat)].copy()
    t["lens"] = t["component"].map(LENS_LABELS)
    t["metric"] = t["metric"].map(METRIC_LABELS)
    return t[_COLUMNS].round(4)


def _lens_color(t: pd.DataFrame) -> alt.Color:
    keys = [k for k in LENS_LABELS if LENS_LABELS[k] in set(t["lens"])]
    return alt.Color("lens:N", title=None, legend=alt.Legend(orient="top"),
                     scale=alt.Scale(domain=[LENS_LABELS[k] for k in keys], range=[LENS_COLORS[k] for k in keys]))


def _tooltip() -> list:
    return ["model:N", "lens:N", "layer:Q", alt.Tooltip("rel_depth:Q", format=".2f", title="l / L"),
            alt.Tooltip("value:Q", format=".3f"), alt.Tooltip("ci_low:Q", format=".3f", title="95% CI low"),
            alt.Tooltip("ci_high:Q", format=".3f", title="95% CI high")]


def _transition_rule(transition: int | None) -> list[alt.Chart]:
    """Dashed rule between h_t and h_(t+1): where the cosine phase-transition layer t writes."""
    if transition is None:
        return []
    df = pd.DataFrame({"x": [transition + 0.5], "label": [f"cosine transition (layer {transition})"]})
    rule = alt.Chart(df).mark_rule(color="gray", strokeDash=[5, 4]).encode(x="x:Q", tooltip=["label:N"])
    text = alt.Chart(df).mark_text(align="left", dx=4, dy=-6, color="gray", fontSize=10).encode(
        x="x:Q", y=alt.value(8), text="label:N")
    return [rule, text]


def lens_layers(table: pd.DataFrame, model: str, transition: int | None = None, width: int = 300,
                paper: Sequence[PaperValue] = ()) -> alt.HConcatChart:
    """Two panels for one model: KL per layer (log scale; a radio switches the direction) and top-5 overlap per
    layer, both lenses, with bootstrap 95 % bands over problems. x = l: the lens reads the residual entering layer l.
    ``paper``: the paper's values, at their relative depth times the model's number of layers, labelled on the
    right panel (the left one has the transition's label at the top).
    """
    t = _prepared(table[table.model == model], ["kl", "kl_final_lens", "top5_overlap"])
    n_layers = int(t["n_layers"].iloc[0])
    x = alt.X("layer:Q", title="Layer index l (residual entering layer l)", scale=alt.Scale(nice=False))
    color = _lens_color(t)
    direction = alt.param(name="kl_direction", value=METRIC_LABELS["kl"],
                          bind=alt.binding_radio(options=[METRIC_LABELS["kl"], METRIC_LABELS["kl_final_lens"]],
                                                 name="KL direction: "))
    kl = alt.Chart(t[t.metric != METRIC_LABELS["top5_overlap"]]).transform_filter(alt.datum.metric == direction)
    kl_y = alt.Y("value:Q", title="KL divergence (nats, log scale)", scale=alt.Scale(type="log"))
    kl_panel = alt.layer(*paper_marks(paper, n_layers=n_layers, label=False).around(
        kl.mark_area(opacity=0.2).encode(x=x, y=alt.Y("ci_low:Q", scale=alt.Scale(type="log"), title=None),
                                         y2="ci_high:Q", color=color),
        kl.mark_line(point=alt.OverlayMarkDef(size=20)).encode(x=x, y=kl_y, color=color, tooltip=_tooltip()),
        *_transition_rule(transition),
    )).add_params(direction).properties(width=width, height=240)
    ov = alt.Chart(t[t.metric == METRIC_LABELS["top5_overlap"]])
    ov_y = alt.Y("value:Q", title="Top-5 overlap with the output", scale=alt.Scale(domain=[0, 1]))
    threshold = alt.Chart(pd.DataFrame({"y": [0.2]})).mark_rule(color="black", opacity=0.4, strokeDash=[2, 2]).encode(y="y:Q")
    ov_panel = alt.layer(*paper_marks(paper, n_layers=n_layers).around(
        ov.mark_area(opacity=0.2).encode(x=x, y="ci_low:Q", y2="ci_high:Q", color=color),
        ov.mark_line(point=alt.OverlayMarkDef(size=20)).encode(x=x, y=ov_y, color=color, tooltip=_tooltip()),
        threshold, *_transition_rule(transition),
    )).properties(width=width, height=240)
    return alt.hconcat(kl_panel, ov_panel)


def lens_across_models(table: pd.DataFrame, metric: str, y_title: str, log_y: bool = False,
                       width: int = 230) -> alt.HConcatChart:
    """One panel per lens, one line per model, on relative depth l / L (0 = embeddings, 1 = output).

    Click a model in the legend to highlight it.
    """
    t = _prepared(table, [metric])
    models = list(dict.fromkeys(t["model"]))
    pick = alt.selection_point(fields=["model"], bind="legend")
    panels = []
    for lens in [LENS_LABELS[k] for k in LENS_LABELS if LENS_LABELS[k] in set(t["lens"])]:
        y_scale = alt.Scale(type="log") if log_y else alt.Scale(domain=[0, 1])
        panels.append(alt.Chart(t[t.lens == lens]).mark_line(point=alt.OverlayMarkDef(size=16)).encode(
            x=alt.X("rel_depth:Q", title="Relative depth l / L", scale=alt.Scale(domain=[0, 1])),
            y=alt.Y("value:Q", title=y_title, scale=y_scale),
            color=alt.Color("model:N", scale=alt.Scale(domain=models, range=MODEL_PALETTE[: len(models)]),
                            legend=alt.Legend(orient="top", title="Model")),
            opacity=alt.condition(pick, alt.value(1.0), alt.value(0.12)),
            tooltip=_tooltip(),
        ).add_params(pick).properties(title=lens, width=width, height=220))
    return alt.hconcat(*panels).resolve_scale(y="shared")


def depth_groups(curve: pd.DataFrame, n_groups: int = 4) -> pd.DataFrame:
    """Average a training curve over layers in ``n_groups`` equal bands of relative depth (keeps charts small).

    Args:
        curve: ``model, split, step, tokens, layer, value`` (:func:`lmdepth.analyses.tuned_lens.training_curve`).

    Returns:
        ``model, split, tokens, group, value`` with group labels such as "layers at 0–25 % depth".
    """
    c = curve.copy()
    n_layers = c.groupby("model")["layer"].transform("max") + 1
    band = (c["layer"] * n_groups // n_layers).astype(int)
    c["group"] = [f"layers at {int(100 * b / n_groups)}–{int(100 * (b + 1) / n_groups)} % depth" for b in band]
    return c.groupby(["model", "split", "tokens", "group"], as_index=False)["value"].mean().round(4)


def training_curves(curve: pd.DataFrame, width: int = 280) -> alt.ConcatChart:
    """Tuned-lens training curves per model: the sampled KL(P_final ‖ P_tuned) against training tokens seen,
    averaged over layers in depth bands; solid = training batches, dashed = held-out problems. Two panels a row
    (three side by side would overflow the book's text column)."""
    g = depth_groups(curve)
    groups = sorted(g["group"].unique(), key=lambda s: int(s.split()[2].split("–")[0]))
    panels = []
    for model in dict.fromkeys(g["model"]):
        panels.append(alt.Chart(g[g.model == model]).mark_line(point=alt.OverlayMarkDef(size=10)).encode(
            x=alt.X("tokens:Q", title="Training tokens seen (incl. repeats)"),
            y=alt.Y("value:Q", title="KL(P_final ‖ P_tuned), nats (log)", scale=alt.Scale(type="log")),
            color=alt.Color("group:N", title=None, sort=groups, scale=alt.Scale(scheme="viridis"),
                            legend=alt.Legend(orient="top", columns=2)),
            strokeDash=alt.StrokeDash("split:N", title=None, sort=["train", "held-out"]),
            detail="split:N",
            tooltip=["model:N", "split:N", "group:N", "tokens:Q", alt.Tooltip("value:Q", format=".3f")],
        ).properties(title=model, width=width, height=200))
    return alt.concat(*panels, columns=2).resolve_scale(y="shared")


def settling_chart(summary: pd.DataFrame, width: int = 520, paper: Sequence[PaperValue] = ()) -> alt.LayerChart:
    """Where each model's prediction settles, on relative depth: one row per (model, lens), one mark per
    criterion, and a gray tick at the model's cosine phase transition on each of its rows.

    Args:
        summary: :func:`lmdepth.analyses.lens.settling_summary` rows (``model, lens, criterion, layer, rel_depth``).
        paper: the paper's values drawn across the rows (:mod:`lmdepth.charts.paper_marks`).
    """
    s = summary.dropna(subset=["rel_depth"])
    points = s[s.lens.isin(LENS_LABELS)].assign(row=lambda d: d.model + " · " + d.lens.map(LENS_LABELS).str.lower())
    rows = list(dict.fromkeys(points["row"]))
    cos = s[s.lens == "cosine"].merge(points[["model", "row"]].drop_duplicates(), on="model")
    y = alt.Y("row:N", title=None, sort=rows)
    x = alt.X("rel_depth:Q", title="Relative depth (lens: l / L; cosine transition: (t + 0.5) / L)",
              scale=alt.Scale(domain=[0, 1]))
    dots = alt.Chart(points).mark_point(size=120, filled=True, opacity=0.8).encode(
        x=x, y=y,
        color=alt.Color("lens:N", legend=None, scale=alt.Scale(domain=list(LENS_COLORS), range=list(LENS_COLORS.values()))),
        shape=alt.Shape("criterion:N", title=None, legend=alt.Legend(orient="top", columns=2)),
        tooltip=["model:N", "lens:N", "criterion:N", "layer:Q", alt.Tooltip("rel_depth:Q", format=".2f")],
    )
    ticks = alt.Chart(cos).mark_tick(color="gray", thickness=3).encode(
        x=x, y=y, tooltip=["model:N", "criterion:N", "layer:Q", alt.Tooltip("rel_depth:Q", format=".2f")])
    return alt.layer(*paper_marks(paper).around(ticks, dots)).properties(width=width, height=alt.Step(26))
