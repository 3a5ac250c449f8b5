"""What the paper reports as a number or a location, each with the figure it comes from: the one table the book's
figures read the paper's values from (:mod:`lmdepth.charts.paper_marks` draws them), so a reader compares the shape
of a curve with the paper's at a glance and no chapter types a paper value into its own code.

Only what the paper states is here. Where it gives a number (Fig. 2a's halves), the mark carries it; where it gives
a location only (the phase transition "between the two halves", the second half that barely feeds later
computation, the diagonal of Fig. 8), the mark is that location and no value; where it gives neither, there is no
entry. Depths are relative, ``l / L`` of the paper's model, so that they can be drawn over models of another depth.
The paper's main model is Llama 3.1 70B (80 layers); the linear maps are Qwen2.5 1.5B (28 layers) → 14B (48).

Not here, because the paper gives no number or location for them: the size of the second half's effects ("almost
no effect", Fig. 3b, is drawn as a location without a value), the depth score's values (Fig. 7: the paper reports
it flat across difficulty, a shape and no number), and the per-layer values of the lens curves (Fig. 4).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Mark(Enum):
    """How the paper's statement is drawn over a chart on relative depth."""

    ABOVE = "above"  # the curve lies above ``value`` over the depth range
    BELOW = "below"  # the curve lies below ``value`` over the depth range
    WHERE = "where"  # something happens at this depth (a range, or one depth when start == end); no value
    MATCH = "match"  # a layer of the shallower model corresponds to one of the deeper (two depths)


@dataclass(frozen=True)
class PaperValue:
    """One value the paper reports.

    Attributes:
        chapter: the chapter key (:data:`lmdepth.book.chapters.CHAPTERS`) whose figure shows it.
        figure: the paper's figure it comes from.
        model: the paper's model(s), as the mark's label names them.
        mark: how it is drawn.
        depth: relative depth l / L (start, end) where it holds; for :attr:`Mark.MATCH` the depths of the two
            corresponding layers (shallower model, deeper model).
        value: the value the curve stays above or below (None: a location only).
        component: the curve it is about, where a chart has several (a component of :mod:`lmdepth.analyses.residual`;
            None: every panel).
        says: the paper's statement in a few words (the mark's tooltip).
        secondary: the number is stated by a summary of the paper, not read off its figure here.
    """

    chapter: str
    figure: str
    model: str
    mark: Mark
    depth: tuple[float, float]
    value: float | None = None
    component: str | None = None
    says: str = ""
    secondary: bool = False

    @property
    def label(self) -> str:
        """The mark's label on the chart."""
        return f"paper, {self.model}"


LLAMA_70B = "Llama 3.1 70B"
#: The layers of Fig. 8's example match: Qwen2.5-1.5B's layer 14 of 28 maps best to Qwen2.5-14B's layer 24 of 48.
MAPS_EXAMPLE = ((14, 28), (24, 48))

PAPER_VALUES: tuple[PaperValue, ...] = (
    # Fig. 2a: ‖a_l + m_l‖ / ‖h_l‖ — "first half > 0.15, second half < 0.05" (the paper's results as summarised;
    # the text itself says "drops sharply around the middle")
    PaperValue("norms", "Fig. 2a", LLAMA_70B, Mark.ABOVE, (0.0, 0.5), 0.15, "layer",
               "first half: relative contribution above 0.15", secondary=True),
    PaperValue("norms", "Fig. 2a", LLAMA_70B, Mark.BELOW, (0.5, 1.0), 0.05, "layer",
               "second half: relative contribution below 0.05", secondary=True),
    # Fig. 2b: the cosines change sign in "a clear phase transition between the two halves"; no layer is given
    PaperValue("cosine", "Fig. 2b", LLAMA_70B, Mark.WHERE, (0.5, 0.5),
               says="the cosines change sign between the two halves (the phase transition)"),
    # Fig. 3b: "second-half layers have almost no effect on future computations"; no value is given for "almost no"
    PaperValue("skipping", "Fig. 3b", LLAMA_70B, Mark.WHERE, (0.5, 1.0),
               says="skipping a second-half layer has almost no effect on later layers at future tokens"),
    # Fig. 4: KL falls sharply and top-5 overlap rises sharply from the middle, at the phase transition
    PaperValue("lens", "Fig. 4", LLAMA_70B, Mark.WHERE, (0.5, 0.5),
               says="KL to the output falls and top-5 overlap rises sharply from mid-depth"),
    # Fig. 8: a diagonal at equal relative depth; the paper's example, layer 14 of 28 ↔ layer 24 of 48
    PaperValue("maps", "Fig. 8", "Qwen2.5 1.5B → 14B", Mark.MATCH,
               (MAPS_EXAMPLE[0][0] / MAPS_EXAMPLE[0][1], MAPS_EXAMPLE[1][0] / MAPS_EXAMPLE[1][1]),
               says=f"layer {MAPS_EXAMPLE[0][0]} of {MAPS_EXAMPLE[0][1]} maps best to layer {MAPS_EXAMPLE[1][0]} "
                    f"of {MAPS_EXAMPLE[1][1]}: the diagonal of equal relative depth", secondary=True),
)


def reported(chapter: str, component: str | None = None) -> tuple[PaperValue, ...]:
    """The paper's values drawn on ``chapter``'s figure; with ``component``, those about that curve (or about every
    curve)."""
    return tuple(v for v in PAPER_VALUES if v.chapter == chapter
                 and (component is None or v.component in (None, component)))


__all__ = ["Mark", "PaperValue", "LLAMA_70B", "MAPS_EXAMPLE", "PAPER_VALUES", "reported"]
