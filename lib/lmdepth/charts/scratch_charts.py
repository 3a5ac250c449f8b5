"""Charts of chapter 07 (MoEUT vs. Transformer trained from scratch), built from the tables of
:mod:`lmdepth.analyses.scratch`."""

from __future__ import annotations

from collections.abc import Sequence

import altair as alt
import pandas as pd

import lmdepth.charts.theme  # noqa: F401  (registers and enables the book's theme)
from lmdepth.analyses.scratch import TrainedRun
from lmdepth.charts.erasure_charts import map_chart
from lmdepth.claims.scratch_claims import FINETUNED_RUN, solved_by_all

RUN_COLORS = {"moeut-lm": "#9ecae9", "moeut-answer_only": "#3366cc", "transformer-lm": "#ffbf79",
              "transformer-answer_only": "#e45756", FINETUNED_RUN: "#54a24b"}
#: The width of the depth questions' charts: inside a phone's screen (390 px) with the axis and legend below.
NARROW = 300


def _run_scale(names: Sequence[str]):
    return alt.Scale(domain=list(names), range=[RUN_COLORS.get(n, "#888888") for n in names])


def loss_chart(runs: dict[str, TrainedRun], window: int = 25, width: int = 420, height: int = 220):
    """Training loss per step (moving average over ``window`` steps), one line per run; legend click isolates."""
    frames = []
    for name, r in runs.items():
        h = pd.DataFrame(r.summary.history, columns=["step", "loss"])
        h["loss"] = h.loss.rolling(window, min_periods=1).mean()
        frames.append(h.iloc[:: max(1, len(h) // 150)].assign(run=name))  # ~150 points per line keep the page small
    d = pd.concat(frames).round(4)
    pick = alt.selection_point(fields=["run"], bind="legend")
    return alt.Chart(d).mark_line().encode(
        x=alt.X("step:Q", title="Training step"), y=alt.Y("loss:Q", title="Training loss (nats / token)"),
        color=alt.Color("run:N", scale=_run_scale(list(runs)), legend=alt.Legend(title="Run")),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)), tooltip=["run:N", "step:Q", "loss:Q"],
    ).add_params(pick).properties(width=width, height=height)


def learning_curve_chart(runs: dict[str, TrainedRun], baseline: float | None = None, width: int = 270,
                         height: int = 200):
    """Exact match during training on the fixed learning-curve problems (``TrainConfig.n_curve`` per split), one
    panel per split, one line per run; ``baseline`` (the constant-answer rate) as a dashed rule. Runs trained
    without a curve (``eval_every`` 0) are left out; None when no run has one."""
    rows = [{"run": name, "step": p[0], "split": split, "exact match": em}
            for name, r in runs.items() for p in r.summary.curve
            for split, em in zip(("interpolate", "extrapolate"), p[1:])]
    if not rows:
        return None
    d = pd.DataFrame(rows).assign(baseline=baseline).round(4)
    pick = alt.selection_point(fields=["run"], bind="legend")
    lines = alt.Chart().mark_line(point=True).encode(
        x=alt.X("step:Q", title="Training step"),
        y=alt.Y("exact match:Q", title="Exact match", axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("run:N", scale=_run_scale(list(runs)), legend=alt.Legend(title="Run")),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
        tooltip=["run:N", "split:N", "step:Q", alt.Tooltip("exact match:Q", format=".1%")]).add_params(pick)
    layers = [lines]
    if baseline is not None:
        layers.append(alt.Chart().mark_rule(strokeDash=[4, 3], color="gray").encode(y="min(baseline):Q"))
    return alt.layer(*layers, data=d).properties(width=width, height=height).facet(
        column=alt.Column("split:N", title=None, sort=["interpolate", "extrapolate"]))


def accuracy_chart(summary: pd.DataFrame, width: int = 190, height: int = 200):
    """Exact match with Wilson 95 % intervals per run, one panel per split; a radio button switches to answer loss."""
    d = summary.round(4).copy()
    names = list(dict.fromkeys(d.run))
    x = alt.X("run:N", title=None, sort=names, axis=alt.Axis(labelAngle=-35))
    color = alt.Color("run:N", scale=_run_scale(names), legend=None)
    bars = alt.Chart(d).mark_bar().encode(
        x=x, y=alt.Y("accuracy:Q", title="Exact match", axis=alt.Axis(format="%")), color=color,
        tooltip=["run:N", "split:N", "n:Q", "correct:Q", alt.Tooltip("accuracy:Q", format=".1%"),
                 alt.Tooltip("ci_low:Q", format=".1%"), alt.Tooltip("ci_high:Q", format=".1%"),
                 alt.Tooltip("answer_nll:Q", format=".3f")])
    err = alt.Chart(d).mark_rule(strokeWidth=1.5).encode(x=x, y="ci_low:Q", y2="ci_high:Q")
    acc = alt.layer(bars, err).properties(width=width, height=height).facet(column=alt.Column("split:N", title=None))
    nll = alt.Chart(d).mark_bar().encode(
        x=x, y=alt.Y("answer_nll:Q", title="Answer loss (nats / token)"), color=color,
        tooltip=["run:N", "split:N", alt.Tooltip("answer_nll:Q", format=".3f")],
    ).properties(width=width, height=height).facet(column=alt.Column("split:N", title=None))
    return alt.vconcat(acc, nll)


def probe_chart(table: pd.DataFrame, probe: str, runs: Sequence[str], cell: int = 9):
    """Erasure maps of one probe, one row per run (layer 0 at the bottom)."""
    return alt.vconcat(*[map_chart(table, "erasure", r, prompts=[probe], cell=cell).properties(title=r)
                         for r in runs]).resolve_scale(color="independent")


def probe_charts(table: pd.DataFrame, probes: Sequence[str], runs: Sequence[str], cell: int = 9):
    """:func:`probe_chart` of several probes side by side."""
    return alt.hconcat(*[probe_chart(table, probe, runs, cell=cell) for probe in probes])


def depth_ops_chart(levels: pd.DataFrame, width: int = 420, height: int = 220):
    """Relative depth score per number of operations, one line per run, with bootstrap 95 % intervals; a radio
    button picks the effect (layer / logit)."""
    d = levels[levels.aggregation == "mean"].round(4).copy()
    names = list(dict.fromkeys(d.run))
    effect = alt.param(name="ops_effect", value="layer_effect",
                       bind=alt.binding_radio(options=["layer_effect", "logit_effect"],
                                              labels=["layer effect", "logit effect"], name="Effect: "))
    pick = alt.selection_point(fields=["run"], bind="legend")
    base = alt.Chart(d).transform_filter(alt.datum.metric == effect)
    x = alt.X("level:O", title="Operations in the problem", axis=alt.Axis(labelAngle=0))
    color = alt.Color("run:N", scale=_run_scale(names), legend=alt.Legend(title="Run"))
    line = base.mark_line(point=True).encode(
        x=x, y=alt.Y("rel_depth_score:Q", title="Depth score D / (L − 1)", scale=alt.Scale(zero=False)), color=color,
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.12)),
        tooltip=["run:N", alt.Tooltip("level:O", title="operations"), "n:Q",
                 alt.Tooltip("rel_depth_score:Q", format=".3f"), alt.Tooltip("rel_ci_low:Q", format=".3f"),
                 alt.Tooltip("rel_ci_high:Q", format=".3f")])
    band = base.mark_rule(strokeWidth=2).encode(x=x, y="rel_ci_low:Q", y2="rel_ci_high:Q", color=color,
                                                 opacity=alt.condition(pick, alt.value(0.4), alt.value(0.05)))
    return alt.layer(band, line).add_params(effect, pick).properties(width=width, height=height)


#: The depth summaries of the depth questions' chart, by column (:data:`lmdepth.analyses.scratch.DEPTH_COLUMNS`).
DEPTH_METRICS = {"depth_layer": "depth score (layer effect)", "depth_answer": "depth score (answer effect)",
                 "erasure_depth": "erasure depth"}


def depth_recipe_chart(units: pd.DataFrame, height: int = 220, split_at: float = 4.5,
                       x_title: str = "Operations in the problem"):
    """The depth questions' data: a relative depth summary per number of operations, one line per run (its mean over
    training seeds) and one small point per seed, on the problems every seed of the run solves (the problems the
    claims read); a radio button picks the summary (the claims read the layer effect's depth score and the erasure
    depth). The dashed rule at ``split_at`` separates the interpolation split (2–4 operations; operation chains: 1–6)
    from the extrapolation split (5–6; 7–8)."""
    rows = []
    for run, u in units.groupby("run", sort=False):
        s = solved_by_all(u).melt(id_vars=["train_seed", "n_operations", "unit"], value_vars=list(DEPTH_METRICS),
                                  var_name="metric", value_name="value")
        rows.append(s.groupby(["metric", "train_seed", "n_operations"]).agg(
            depth=("value", "mean"), n=("unit", "nunique")).reset_index().assign(run=run))
    if not rows:
        return None
    d = pd.concat(rows).round(4)
    d["metric"] = d.metric.map(DEPTH_METRICS)
    names = list(dict.fromkeys(d.run))
    which = alt.param(name="depth_metric", value=DEPTH_METRICS["depth_layer"],
                      bind=alt.binding_radio(options=list(DEPTH_METRICS.values()), name="Depth: "))
    pick = alt.selection_point(fields=["run"], bind="legend")
    base = alt.Chart(d).transform_filter(alt.datum.metric == which)
    x = alt.X("n_operations:Q", title=x_title, axis=alt.Axis(tickMinStep=1, format="d"),
              scale=alt.Scale(zero=False))
    color = alt.Color("run:N", scale=_run_scale(names), legend=alt.Legend(title="Run", orient="bottom", columns=2))
    y = alt.Y("depth:Q", title="Relative depth (0 = first step, 1 = last)", scale=alt.Scale(zero=False))
    seeds = base.mark_point(size=18, filled=True).encode(
        x=x, y=y, color=color, opacity=alt.condition(pick, alt.value(0.5), alt.value(0.05)),
        tooltip=["run:N", alt.Tooltip("train_seed:O", title="seed"), "n_operations:Q", "n:Q",
                 alt.Tooltip("depth:Q", format=".3f")])
    mean = base.mark_line().encode(x=x, y="mean(depth):Q", color=color, detail="run:N",
                                   opacity=alt.condition(pick, alt.value(1.0), alt.value(0.1)))
    split = alt.Chart(pd.DataFrame({"x": [split_at]})).mark_rule(strokeDash=[4, 3], color="gray").encode(x="x:Q")
    return alt.layer(split, mean, seeds).add_params(which, pick).properties(width=NARROW, height=height)


def over_training_chart(curve: pd.DataFrame, height: int = 160, step: str = "Fine-tuning step",
                        per: str = "operation"):
    """Runs over training (:func:`lmdepth.analyses.scratch.snapshot_curve`): the within-split rise of the depth
    score per ``per`` on the snapshots' depth sample (top) and exact match on the learning-curve problems (bottom),
    one line per seed (``seed``: a number or a label); step 0 is the weights training starts from. None when no
    snapshot is stored."""
    if curve.empty:
        return None
    d = curve.assign(seed=curve.seed.astype(str)).round(5)
    x = alt.X("step:Q", title=step)
    color = alt.Color("seed:N", title="Seed", legend=alt.Legend(orient="bottom"))
    rise = alt.Chart(d).mark_line(point=True).encode(
        x=x, y=alt.Y("rise:Q", title=f"Rise per {per}"), color=color,
        tooltip=["seed:N", "step:Q", alt.Tooltip("rise:Q", format=".4f"), alt.Tooltip("depth:Q", format=".3f")])
    zero = alt.Chart(pd.DataFrame({"y": [0.0]})).mark_rule(color="gray").encode(y="y:Q")
    em = alt.Chart(d).transform_fold(["interpolate", "extrapolate"], as_=["split", "exact match"]).mark_line(
        point=True).encode(x=x, y=alt.Y("exact match:Q", title="Exact match", axis=alt.Axis(format="%"),
                                              scale=alt.Scale(domain=[0, 1])),
                           color=color, strokeDash=alt.StrokeDash("split:N", title="Split",
                                                                  legend=alt.Legend(orient="bottom")),
                           tooltip=["seed:N", "step:Q", "split:N", alt.Tooltip("exact match:Q", format=".1%")])
    return alt.vconcat((zero + rise).properties(width=NARROW, height=height),
                       em.properties(width=NARROW, height=height))


__all__ = ["RUN_COLORS", "depth_recipe_chart", "over_training_chart", "loss_chart", "accuracy_chart", "probe_chart", "probe_charts", "depth_ops_chart"]
