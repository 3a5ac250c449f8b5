"""Claims of paper Fig. 9 (chapter 07): not modelling the question helps MoEUT extrapolate, more than it helps a
Transformer. Checked on the per-problem evaluation of the four runs (:func:`lmdepth.analyses.scratch.evaluate_runs`).

Unit: the problem of the extrapolation split; all four runs answer the same problems, so the runs are paired within
a problem and problems are resampled jointly. The verdict rows carry the subject ``MoEUT vs Transformer``.

Precondition (book/method.md#method-verdicts): the runs the claim compares do the task — each one's exact match on the interpolation split,
with its 95 % Wilson interval, above the constant-answer baseline (the share of the most common answer there).
Control: the same problems with each problem's two objectives swapped at random (seeded): what the gain looks like
when the objective makes no difference.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from lmdepth.claims.spec import ClaimSpec
from lmdepth.errors import DataError
from lmdepth.metrics.intervals import exact_match
from lmdepth.metrics.verdicts import Rule

SUBJECT = "MoEUT vs Transformer"
PREFIX = "shuffled-objectives:"
RUNS = ("moeut-lm", "moeut-answer_only", "transformer-lm", "transformer-answer_only")
SEED = 0


def control_name(subject: str) -> str:
    return f"{PREFIX}{subject}"


def units_of(per_example: pd.DataFrame) -> pd.DataFrame:
    """The per-problem table of the claims: :func:`~lmdepth.analyses.scratch.evaluate_runs`' rows with the subject
    as ``model`` and each problem's index within its split as ``unit`` (every run evaluates the same problems in the
    same order)."""
    out = per_example.assign(model=SUBJECT)
    out["unit"] = out.groupby(["run", "split"]).cumcount()
    return out


def shuffled_objectives(units: pd.DataFrame) -> pd.DataFrame:
    """The control: within each problem and architecture, the two objectives' results swapped with probability ½."""
    rng = np.random.default_rng(SEED)
    out = units.copy()
    for arch in ("moeut", "transformer"):
        a, b = f"{arch}-lm", f"{arch}-answer_only"
        for split, u in out[out.run.isin([a, b])].groupby("split"):
            swap = set(np.nonzero(rng.random(int(u.unit.max()) + 1) < 0.5)[0])
            rows = u.index[u.unit.isin(swap)]
            out.loc[rows, "run"] = out.loc[rows, "run"].map({a: b, b: a})
    return out.assign(model=control_name(SUBJECT))


def paired(column: str) -> Callable[[pd.DataFrame, str], np.ndarray]:
    """Per extrapolation problem: ``column`` of each run in :data:`RUNS` order, ``[problems, 4]``."""

    def values(units: pd.DataFrame, model: str) -> np.ndarray:
        u = units[(units.model == model) & (units.split == "extrapolate")]
        if u.empty:
            raise DataError(f"No extrapolation results for {model!r}: evaluate the four runs first.")
        return u.pivot(index="unit", columns="run", values=column).reindex(columns=list(RUNS)).to_numpy(float)

    return values


def competent(runs: tuple[str, ...]) -> Callable[[pd.DataFrame, str], tuple[bool, str]]:
    def check(units: pd.DataFrame, model: str) -> tuple[bool, str]:
        u = units[(units.model == model) & (units.split == "interpolate")]
        weak = []
        for run in runs:
            r = u[u.run == run]
            em = exact_match(r.correct, r["answer"])
            if not em.above:
                weak.append(f"{run} {em.accuracy:.1%} (95 % low {em.ci_low:.1%}) vs baseline {em.baseline:.1%}")
        return (False, "interpolation exact match not above the constant-answer baseline: " + "; ".join(weak)) \
            if weak else (True, "")

    return check


def _gain(arch: int, sign: float) -> Callable[[np.ndarray], float]:
    """answer-only − all-token (``sign`` −1 for a loss, so that positive = better) of architecture 0 (MoEUT) or 1."""
    return lambda v: float(sign * (v[:, 2 * arch + 1].mean() - v[:, 2 * arch].mean()))


def _gain_difference(sign: float) -> Callable[[np.ndarray], float]:
    return lambda v: _gain(0, sign)(v) - _gain(1, sign)(v)


CONTROL = ("the same problems with each problem's two objectives swapped at random: the gain when the objective "
           "makes no difference")
_HISTORY = ("2026-11-23: a competence gate (exact match above the constant-answer baseline) and a shuffled-objective "
            "control added (was: paired intervals only, on runs at the baseline).",)

CLAIMS: tuple[ClaimSpec, ...] = (
    ClaimSpec(
        id="moeut.exact_match_gain", chapter="moeut", figure="Fig. 9",
        claim="not modelling the question raises MoEUT's extrapolation accuracy",
        statement="A MoEUT trained without a loss on the question extrapolates better.",
        statistic="gain: exact match on extrapolation, answer-only − all-token MoEUT (paired over problems)",
        unit="problem", rule=Rule(0.0, "above"), values=paired("correct"), reduce=_gain(0, 1.0),
        precondition=competent(RUNS[:2]), control=CONTROL, control_of=control_name, history=_HISTORY),
    ClaimSpec(
        id="moeut.exact_match_gain_vs_transformer", chapter="moeut", figure="Fig. 9",
        claim="… more than the Transformer's", statement="The gain is larger for MoEUT than for a Transformer.",
        statistic="difference: MoEUT's exact-match gain − the Transformer's",
        unit="problem", rule=Rule(0.0, "above"), values=paired("correct"), reduce=_gain_difference(1.0),
        precondition=competent(RUNS), control=CONTROL, control_of=control_name, history=_HISTORY),
    ClaimSpec(
        id="moeut.answer_loss_gain", chapter="moeut", figure="Fig. 9 (finer measure)",
        claim="… MoEUT's answer loss improves", statement="Without the question's loss, MoEUT predicts extrapolated "
                                                           "answers better (a finer measure than exact match).",
        statistic="gain: mean answer cross-entropy, all-token − answer-only MoEUT (nats per token)",
        unit="problem", rule=Rule(0.0, "above"), values=paired("answer_nll"), reduce=_gain(0, -1.0),
        precondition=competent(RUNS[:2]), control=CONTROL, control_of=control_name, history=_HISTORY),
    ClaimSpec(
        id="moeut.answer_loss_gain_vs_transformer", chapter="moeut", figure="Fig. 9 (finer measure)",
        claim="… more than the Transformer's (answer loss)", statement="The answer-loss gain is larger for MoEUT.",
        statistic="difference: MoEUT's answer-loss gain − the Transformer's",
        unit="problem", rule=Rule(0.0, "above"), values=paired("answer_nll"), reduce=_gain_difference(-1.0),
        precondition=competent(RUNS), control=CONTROL, control_of=control_name, history=_HISTORY),
)
