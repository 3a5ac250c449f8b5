"""The paper's reported values drawn over a chart (:data:`lmdepth.claims.paper_values.PAPER_VALUES`), so a reader
compares a curve's shape with the paper's at a glance: a dashed bound with the side the paper's curve lies on
shaded, a dashed rule at a depth the paper names, a shaded range of depth, or the point where two models' layers
match — each labelled with the paper's model, its figure and words in the tooltip.

:func:`paper_marks` draws on an x axis of relative depth on [0, 1] (or, with ``n_layers``, of layer index: the
paper's depth times the chart model's number of layers); :func:`match_marks` on a source × target layer grid. The
marks' colour is fixed and encodes no field, so they join no legend and no selection; the shading goes under the
chart's data and the rules and labels over it (:class:`PaperLayers`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import altair as alt
import pandas as pd

from lmdepth.claims.paper_values import Mark, PaperValue

PAPER_COLOR = "#3b3b3b"


@dataclass(frozen=True)
class PaperLayers:
    """The layers of the paper's marks: ``behind`` the chart's data (shading) and in ``front`` of it (rules, points,
    labels)."""

    behind: list[Any] = field(default_factory=list)
    front: list[Any] = field(default_factory=list)

    def around(self, *data: Any) -> list[Any]:
        """``data``'s layers with the marks under and over them, in drawing order."""
        return [*self.behind, *data, *self.front]

    def __bool__(self) -> bool:
        return bool(self.behind or self.front)


def _rows(values: Sequence[PaperValue], scale: float) -> pd.DataFrame:
    return pd.DataFrame([{
        "x": v.depth[0] * scale, "x2": v.depth[1] * scale, "y": v.value, "mark": v.mark.value,
        "label": v.label, "figure": v.figure,
        "says": v.says + (" (as a summary of the paper states it)" if v.secondary else ""),
    } for v in values])


def _tooltip() -> list[alt.Tooltip]:
    return [alt.Tooltip("label:N", title="reference"), alt.Tooltip("figure:N", title="the paper's figure"),
            alt.Tooltip("says:N", title="the paper reports")]


def _labels(d: pd.DataFrame, x: Any, y: Any, **text: Any) -> list[Any]:
    """Each label once, broken after its comma, dark on a white halo (legible over bars and heatmap cells)."""
    first = d.drop_duplicates("label")
    kw = {"align": "left", "dx": 4, "fontSize": 9, "fontWeight": "bold", "lineBreak": ", ", **text}
    base = alt.Chart(first)
    return [base.mark_text(color="white", stroke="white", strokeWidth=3, strokeJoin="round", **kw).encode(x=x, y=y, text="label:N"),
            base.mark_text(color=PAPER_COLOR, **kw).encode(x=x, y=y, text="label:N",
                                                                               tooltip=_tooltip())]


def paper_marks(values: Sequence[PaperValue], n_layers: int | None = None, axis: bool = True,
                label: bool = True, y_scale: Any = alt.Undefined) -> PaperLayers:
    """The layers drawing ``values``' bounds and locations (:attr:`Mark.MATCH` is :func:`match_marks`'s).

    Args:
        values: the paper's values for this chart (:func:`lmdepth.claims.paper_values.reported`).
        n_layers: x in layer units (depth × ``n_layers``, on the chart's own x scale) instead of relative depth on
            [0, 1].
        axis: False where the chart's own x axis is another scale (an ordinal layer axis): the marks then need
            ``resolve_scale(x="independent")`` and draw no axis of their own.
        label: write the labels (False in small multiples after the first panel).
        y_scale: the chart's own y scale (a clipped domain), which the bounds then share unchanged.
    """
    values = [v for v in values if v.mark is not Mark.MATCH]
    if not values:
        return PaperLayers()
    d = _rows(values, float(n_layers or 1))
    # relative depth spans [0, 1], as the charts' own axes; in layer units the chart's own data sets the domain
    scale = alt.Scale(domain=[0, 1]) if n_layers is None else alt.Undefined
    # no title of their own: an implicit title gives way to the chart's when their axes merge (an explicit one,
    # even None, would replace or join it)
    x = alt.X("x:Q", scale=scale) if axis else alt.X("x:Q", scale=scale, axis=None)
    behind, front = [], []
    for kind, edge in ((Mark.ABOVE, 0), (Mark.BELOW, "height")):  # shaded from the bound to the plot's edge
        band = d[d["mark"] == kind.value]
        if len(band):
            behind.append(alt.Chart(band).mark_rect(color=PAPER_COLOR, opacity=0.10).encode(
                x=x, x2="x2:Q", y=alt.Y("y:Q", scale=y_scale), y2=alt.value(edge), tooltip=_tooltip()))
            front.append(alt.Chart(band).mark_rule(color=PAPER_COLOR, strokeDash=[6, 3], strokeWidth=1.5).encode(
                x=x, x2="x2:Q", y=alt.Y("y:Q", scale=y_scale), tooltip=_tooltip()))
    where = d[d["mark"] == Mark.WHERE.value]
    ranges, points = where[where["x"] < where["x2"]], where[where["x"] == where["x2"]]
    if len(ranges):
        behind.append(alt.Chart(ranges).mark_rect(color=PAPER_COLOR, opacity=0.08).encode(
            x=x, x2="x2:Q", y=alt.value(0), y2=alt.value("height"), tooltip=_tooltip()))
    if len(points):
        front.append(alt.Chart(points).mark_rule(color=PAPER_COLOR, strokeDash=[6, 3], strokeWidth=1.5).encode(
            x=x, tooltip=_tooltip()))
    if label:
        front += _labels(d, x, alt.value(4), baseline="top")
    return PaperLayers(behind, front)


def match_marks(values: Sequence[PaperValue], n_source: int, n_target: int, x_scale: alt.Scale,
                y_scale: alt.Scale) -> list[Any]:
    """The paper's matching layers (:attr:`Mark.MATCH`) as a point on a source (y) × target (x) boundary grid.

    The paper maps the shallower model onto the deeper; on a map the other way round its point is mirrored, so the
    shallower model's depth is read on whichever axis holds the shallower model."""
    rows = []
    for v in (v for v in values if v.mark is Mark.MATCH):
        shallow, deep = v.depth
        src, tgt = (shallow, deep) if n_source <= n_target else (deep, shallow)
        rows.append({"m": src * n_source, "l": tgt * n_target, "label": v.label, "figure": v.figure,
                     "says": v.says + (" (as a summary of the paper states it)" if v.secondary else "")})
    if not rows:
        return []
    d = pd.DataFrame(rows)
    x, y = alt.X("l:Q", scale=x_scale), alt.Y("m:Q", scale=y_scale)
    point = alt.Chart(d).mark_point(shape="square", size=90, filled=False, color="white", strokeWidth=2.5).encode(
        x=x, y=y, tooltip=_tooltip())
    return [point, *_labels(d, x, y, baseline="middle", dx=9)]


__all__ = ["PAPER_COLOR", "PaperLayers", "paper_marks", "match_marks"]
