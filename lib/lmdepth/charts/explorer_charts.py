"""Charts of the explorer (chapter 91), and what they draw: an :class:`Exploration`, computed by
:mod:`lmdepth.book.explorer`."""

from __future__ import annotations

from dataclasses import dataclass

import altair as alt
import pandas as pd

from lmdepth.charts.theme import COMPONENT_COLORS


@dataclass
class Exploration:
    """What the explorer shows for one (model, prompt, layer).

    Attributes:
        tokens: the prompt's tokens as strings.
        contributions: ``layer, component, value`` — relative contribution ‖a_l‖/‖h_l‖, ‖m_l‖/‖h_l+a_l‖,
            ‖a_l+m_l‖/‖h_l‖ averaged over the prompt's tokens.
        lens: ``layer, rank, token, prob`` — logit-lens top-k at ``position`` for the residual entering every layer
            (layer L = the model's output).
        skip: ``layer, relative_change`` — skipping ``skipped`` everywhere (positions ≥ 1): the largest relative
            change of every layer's contribution over the prompt's tokens.
        output_change: ‖P − P′‖₂ of the output distribution, largest over positions.
    """

    model: str
    tokens: list[str]
    position: int
    skipped: int
    contributions: pd.DataFrame
    lens: pd.DataFrame
    skip: pd.DataFrame
    output_change: float


def exploration_charts(x: Exploration, width: int = 300) -> alt.ConcatChart:
    """Three panels: relative contributions, logit-lens top-1 probability per layer, skip effect of the layer."""
    comps = list(dict.fromkeys(x.contributions.component))
    contrib = alt.Chart(x.contributions.round(4)).mark_line(point=True).encode(
        x=alt.X("layer:Q", title="Layer"), y=alt.Y("value:Q", title="Relative contribution"),
        color=alt.Color("component:N", scale=alt.Scale(domain=comps, range=[COMPONENT_COLORS[c] for c in comps]),
                        legend=alt.Legend(orient="top", title=None)),
        tooltip=["layer:Q", "component:N", alt.Tooltip("value:Q", format=".3f")],
    ).properties(title="Contributions (mean over tokens)", width=width, height=200)
    top1 = x.lens[x.lens["rank"] == 1].round(4)
    lens = alt.Chart(top1).mark_bar().encode(
        x=alt.X("layer:O", title="Residual entering layer (last = output)", axis=alt.Axis(labelOverlap="greedy")),
        y=alt.Y("prob:Q", title="Top-1 probability", scale=alt.Scale(domain=[0, 1])),
        tooltip=["layer:O", "token:N", alt.Tooltip("prob:Q", format=".3f")],
    ).properties(title=f"Logit lens at token {x.position} ({x.tokens[x.position]!r})", width=width, height=200)
    skip = alt.Chart(x.skip.round(4)).mark_bar(color=COMPONENT_COLORS["layer"]).encode(
        x=alt.X("layer:O", title="Affected layer", axis=alt.Axis(labelOverlap="greedy")),
        y=alt.Y("relative_change:Q", title="Max relative change", scale=alt.Scale(domain=[0, 1], clamp=True)),
        tooltip=["layer:O", alt.Tooltip("relative_change:Q", format=".3f")],
    ).properties(title=f"Skipping layer {x.skipped} (output change {x.output_change:.3f})", width=width, height=200)
    return alt.concat(contrib, lens, skip, columns=2).resolve_scale(color="independent")  # 3 in a row overflow


__all__ = ["Exploration", "exploration_charts"]
