"""Charts of the erasure / integrated-gradients case studies (chapters 05 and 07), built from the tidy table of
:mod:`lmdepth.analyses.erasure`."""

from __future__ import annotations

from collections.abc import Sequence

import altair as alt

import lmdepth.charts.theme  # noqa: F401  (registers and enables the book's theme)

TEXT_WIDTH = 720  # px: the book's text column


def map_chart(table, method: str, model: str, prompts: Sequence[str] | None = None, cell: int = 16):
    """Token × layer heatmaps, one per case-study prompt (layer 0 at the bottom; the last token, which feeds no
    answer prediction, is dropped as in the paper). Erasure: sequential scale from 0; integrated gradients:
    diverging scale centred at 0. Both scales are clipped at the largest |value| outside position 0 (the paper's
    choice for IG), because erasing the attention-sink token can dwarf every other cell."""
    t = table[(table.method == method) & (table.model == model)]
    charts = []
    for name in (prompts or list(dict.fromkeys(t.prompt))):
        d = t[t.prompt == name]
        d = d[d.position < d.position.max()]
        wide = d.pivot_table(index="position", columns="layer", values="value", sort=True)  # [positions, layers]
        tok = d.drop_duplicates("position").set_index("position")
        order = [tok.token[p] for p in wide.index]
        n_rows = int(d.layer.max()) + 1
        # one row per token with its column of values, flattened back to cells in the browser: the long table
        # (token label and flags repeated on every layer) made chapter 05's page 3.5 MB
        rows = [{"token": tok.token[p], "is_answer": bool(tok.is_answer[p]), "value": [round(float(v), 5) for v in col]}
                for p, col in zip(wide.index, wide.to_numpy())]
        layers = [int(l) for l in wide.columns]
        if method == "ig":
            r = float(d[d.position > 0].value.abs().max() or 1e-9)
            scale = alt.Scale(scheme="redblue", domain=[-r, r], reverse=True, clamp=True)
            title = "IG attribution"
        else:  # position 0 (BOS / attention sink) can dwarf the rest: clip there too, the tooltip keeps the value
            r = float(d[d.position > 0].value.max() or 1e-9)
            scale = alt.Scale(scheme="viridis", domain=[0, r], clamp=True)
            title = "‖P − P′‖₂"
        charts.append(alt.Chart(alt.InlineData(values=rows)).transform_calculate(layer=str(layers)).transform_flatten(
            ["value", "layer"]).mark_rect().encode(
            x=alt.X("token:N", sort=order, title=None, axis=alt.Axis(labelAngle=-60, labelLimit=90, grid=False)),
            y=alt.Y("layer:O", sort="descending", title="Layer boundary" if method == "erasure" else "Layer (output of)",
                    axis=alt.Axis(labelOverlap="greedy", grid=False)),
            color=alt.Color("value:Q", title=title, scale=scale),
            tooltip=["token:N", "layer:O", alt.Tooltip("value:Q", format=".4f"), "is_answer:N"],
        ).properties(title=name, width=cell * len(order), height=max(120, 7 * n_rows)))
    # side by side while they fit the text column (~720 px), else one per row: a page must not scroll sideways
    widths = [c.width for c in charts]
    columns = len(charts) if sum(widths) + 60 * len(charts) <= TEXT_WIDTH else 1
    return alt.concat(*charts, columns=columns).resolve_scale(color="independent")


def comparison_maps(table, models: Sequence[str], method: str = "erasure") -> alt.VConcatChart | None:
    """``method`` maps (erasure or integrated gradients) of several models, one titled row per model that has them
    in ``table``; None if none has."""
    shown = [m for m in models if ((table.model == m) & (table.method == method)).any()]
    if not shown:
        return None
    return alt.vconcat(*[map_chart(table, method, m).properties(title=m) for m in shown])


__all__ = ["map_chart", "comparison_maps"]
