"""Charts of chapter 06 (linear maps between residual streams), built from the tidy table of
:mod:`lmdepth.analyses.maps`; they compute nothing but the per-row argmin."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import altair as alt
import numpy as np
import pandas as pd

import lmdepth.charts.theme  # noqa: F401  (registers and enables the book's theme)
from lmdepth.analyses.maps import best_matches, best_sources
from lmdepth.charts.paper_marks import match_marks
from lmdepth.claims.paper_values import PaperValue
from lmdepth.metrics.ridge import error_matrix


def map_heatmap(table: pd.DataFrame, label: str, size: int = 260, max_error: float = 1.0,
                normalized: bool = False, paper: Sequence[PaperValue] = ()) -> Any:
    """Error over (source boundary ↑, target boundary →), with relative-depth axes on top and right, the
    equal-relative-depth line (dashed white), the best target of each row (red dots) and the best source of each
    column (white diamonds).

    ``normalized=False`` shows the relative error (the paper's metric); ``True`` the error relative to the
    mean-only predictor's, sqrt(fraction of variance unexplained), which removes each target boundary's own scale.
    ``paper``: the paper's matching layers, drawn at their relative depths (a white square,
    :func:`lmdepth.charts.paper_marks.match_marks`).
    """
    metric = "unexplained_variance" if normalized else "relative_error"
    t = table[(table["map"] == label) & (table.metric == metric)].copy()
    if normalized:
        t["value"] = np.sqrt(t["value"])
    n_src, n_tgt = int(t.n_source_layers.iloc[0]), int(t.n_target_layers.iloc[0])
    src, tgt = t.source.iloc[0], t.target.iloc[0]
    step_s = np.diff(sorted(t.source_layer.unique())).min() if t.source_layer.nunique() > 1 else 1
    step_t = np.diff(sorted(t.target_layer.unique())).min() if t.target_layer.nunique() > 1 else 1
    # Only (m, l, error) per cell go into the chart; cell edges and relative depths are derived in Vega (with
    # six maps and their normalized copies, storing them per cell put chapter 06 over the notebook size limit).
    d = pd.DataFrame({"m": t.source_layer, "l": t.target_layer, "e": t.value.round(4)})
    xs = alt.Scale(domain=[-step_t / 2, n_tgt + step_t / 2], nice=False, zero=False)
    ys = alt.Scale(domain=[-step_s / 2, n_src + step_s / 2], nice=False, zero=False)
    x_title, y_title = f"Target boundary l ({tgt})", f"Source boundary m ({src})"
    c_title = "Error / mean-only error" if normalized else "Relative error"
    rects = alt.Chart(d).transform_calculate(
        ms=f"datum.m - {step_s / 2}", me=f"datum.m + {step_s / 2}", ls=f"datum.l - {step_t / 2}",
        le=f"datum.l + {step_t / 2}", rm=f"datum.m / {n_src}", rl=f"datum.l / {n_tgt}",
    ).mark_rect().encode(
        x=alt.X("ls:Q", scale=xs, title=x_title, axis=alt.Axis(grid=False)), x2="le:Q",
        y=alt.Y("ms:Q", scale=ys, title=y_title, axis=alt.Axis(grid=False)), y2="me:Q",
        color=alt.Color("e:Q", title=c_title,
                        scale=alt.Scale(scheme="viridis", domain=[0, max_error], clamp=True)),
        tooltip=[alt.Tooltip("m:Q", title=f"source m ({src})"), alt.Tooltip("rm:Q", format=".3f", title="m / L_source"),
                 alt.Tooltip("l:Q", title=f"target l ({tgt})"), alt.Tooltip("rl:Q", format=".3f", title="l / L_target"),
                 alt.Tooltip("e:Q", format=".3f", title=c_title.lower())],
    )
    line = alt.Chart(pd.DataFrame({"l": [0, n_tgt], "m": [0, n_src]})).mark_line(
        color="white", strokeDash=[5, 4], strokeWidth=2).encode(x=alt.X("l:Q", scale=xs), y=alt.Y("m:Q", scale=ys))
    e = error_matrix(table, label)  # the argmins are the same for both metrics within a column, not within a row
    args = (e.to_numpy(), list(e.index), list(e.columns), n_src, n_tgt)
    rows, cols = best_matches(*args), best_sources(*args)
    b = pd.DataFrame({"m": rows.source_layer, "l": rows.best_target_layer, "kind": "best target of the row"})
    c = pd.DataFrame({"m": cols.best_source_layer, "l": cols.target_layer, "kind": "best source of the column"})
    marks = []
    for data, shape, fill in ((b, "circle", "#e45756"), (c, "diamond", "white")):
        marks.append(alt.Chart(data).mark_point(shape=shape, color=fill, filled=True, size=40, stroke="black",
                                                strokeWidth=0.6).encode(
            x=alt.X("l:Q", scale=xs), y=alt.Y("m:Q", scale=ys),
            tooltip=[alt.Tooltip("kind:N", title="best match"), alt.Tooltip("m:Q", title="source m"),
                     alt.Tooltip("l:Q", title="target l")]))
    main = alt.layer(rects, line, *marks, *match_marks(paper, n_src, n_tgt, xs, ys))
    # relative-depth axes: an invisible layer with its own scales mapping l/L and m/L onto the same pixels
    rel = alt.Chart(pd.DataFrame({"r": [0.0, 1.0]})).mark_point(opacity=0).encode(
        x=alt.X("r:Q", scale=alt.Scale(domain=[-step_t / 2 / n_tgt, 1 + step_t / 2 / n_tgt], nice=False, zero=False),
                axis=alt.Axis(orient="top", title="Target relative depth l / L", grid=False)),
        y=alt.Y("r:Q", scale=alt.Scale(domain=[-step_s / 2 / n_src, 1 + step_s / 2 / n_src], nice=False, zero=False),
                axis=alt.Axis(orient="right", title="Source relative depth m / L", grid=False)))
    return alt.layer(main, rel).resolve_scale(x="independent", y="independent").properties(
        width=size, height=size, title=label)


def map_heatmaps(table: pd.DataFrame, labels: list[str], size: int = 260, max_error: float = 1.0,
                 normalized: bool = False, paper: Sequence[PaperValue] = ()) -> Any:
    """Several :func:`map_heatmap` side by side with one colour scale (``paper`` on each)."""
    charts = [map_heatmap(table, lab, size, max_error, normalized, paper) for lab in labels]
    return alt.hconcat(*charts).resolve_scale(color="shared")


def heatmap_rows(table: pd.DataFrame, labels: list[str], size: int = 260, max_error: float = 1.0,
                 normalized: bool = False) -> list[Any]:
    """:func:`map_heatmaps` of ``labels`` two at a time (both directions of a pair side by side), one chart per pair."""
    return [map_heatmaps(table, labels[k : k + 2], size, max_error, normalized) for k in range(0, len(labels), 2)]


def heatmap_grid(table: pd.DataFrame, labels: list[str], size: int = 260, max_error: float = 1.0,
                 normalized: bool = False) -> Any:
    """The pairs of :func:`heatmap_rows` stacked into one chart, one pair per row."""
    return alt.vconcat(*heatmap_rows(table, labels, size, max_error, normalized))


def floor_lines(table: pd.DataFrame, label: str, width: int = 420) -> Any:
    """Per target boundary: error of the best source boundary, of the embeddings alone (m = 0, the floor), and of
    the mean-only predictor (no information), on target relative depth."""
    e = error_matrix(table, label)
    t = table[(table["map"] == label)]
    n_tgt = int(t.n_target_layers.iloc[0])
    base = t[t.metric == "mean_baseline_error"].set_index("target_layer")["value"]
    rows = []
    for l in e.columns:
        rows += [{"l": l, "r": l / n_tgt, "series": "best source boundary", "e": float(e[l].min()),
                  "m": int(e[l].idxmin())},
                 {"l": l, "r": l / n_tgt, "series": "source embeddings only (m = 0)", "e": float(e[l].loc[0]), "m": 0},
                 {"l": l, "r": l / n_tgt, "series": "training mean (ignores the source)", "e": float(base[l]), "m": -1}]
    d = pd.DataFrame(rows).round(4)
    names = ["best source boundary", "source embeddings only (m = 0)", "training mean (ignores the source)"]
    pick = alt.selection_point(fields=["series"], bind="legend")
    return alt.Chart(d).mark_line(point=True).encode(
        x=alt.X("r:Q", title=f"Target relative depth l / L ({t.target.iloc[0]})", scale=alt.Scale(domain=[0, 1])),
        y=alt.Y("e:Q", title="Held-out relative error", scale=alt.Scale(zero=True)),
        color=alt.Color("series:N", sort=names, title=None, legend=alt.Legend(orient="top", columns=1),
                        scale=alt.Scale(domain=names, range=["#54A24B", "#F58518", "#9d9d9d"])),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
        tooltip=["series:N", alt.Tooltip("l:Q", title="target l"), alt.Tooltip("m:Q", title="best source m"),
                 alt.Tooltip("e:Q", format=".3f", title="relative error")],
    ).add_params(pick).properties(width=width, height=240, title=label)


__all__ = ["map_heatmap", "map_heatmaps", "heatmap_rows", "heatmap_grid", "floor_lines"]
