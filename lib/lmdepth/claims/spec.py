"""What a claim check is (book/method.md#method-verdicts): statistic over units, decision rule, precondition, control.

A :class:`ClaimSpec` is data: the chapters and the findings page render from it and nothing else sets a threshold.
:func:`evaluate` turns a spec and the per-unit tables of a model and of its control into one verdict row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from lmdepth.errors import DataError
from lmdepth.model.random_init import control_name
from lmdepth.metrics.verdicts import MIN_UNITS, Rule, Verdict, decide, discriminates

#: Layers left out of every verdict statistic, in every chapter: layers 0–1 write a lot *relative* to the small
#: embedding they start from (and hold the attention sinks), so they dwarf the mid-depth structure the paper's claims
#: are about. Every verdict row also shows its statistic with them (``with_early``).
EARLY_LAYERS = 2

Values = Callable[[pd.DataFrame, str], np.ndarray]  # (per-unit table, model) -> [units, k] values
Reduce = Callable[[np.ndarray], float]  # [units, k] (a resample) -> the statistic


@dataclass(frozen=True)
class ClaimSpec:
    """One claim of the paper, as the book checks it.

    Attributes:
        id: stable identifier, ``<chapter>.<name>`` (saved with every verdict).
        chapter: the book chapter that owns it (``norms``, ``cosine``, …).
        figure: the paper's figure or section.
        claim: short name shown in tables.
        statement: the paper's statement, in one sentence.
        statistic: what is computed, in words (names the unit and the layers used).
        unit: what the bootstrap resamples (``problem``, ``text``, ``item``, ``position``).
        rule: the paper's side of the threshold.
        values: per-unit values of one model from its per-unit table, [units, k].
        reduce: the statistic of a (resampled) [units, k] array.
        control: which control and what it rules out.
        control_of: the name the control's rows carry in per-unit tables, from the model's name (default: its
            random-init twin, :func:`lmdepth.model.random_init.control_name`); None where the statistic already
            compares against the alternative (``control`` says how) and no separate control is run.
        with_early: the same statistic with layers 0–1 kept, shown beside the verdict (None where it does not apply).
        requires: the id of a claim that must agree for this one to mean anything (e.g. a transition's depth needs
            a transition); otherwise "not testable".
        precondition: a check-specific precondition on the per-unit table (competence over a baseline …):
            (holds, what failed and by how much).
        sample_size: the claim's own size requirement beyond ``MIN_UNITS`` units in all (e.g. 10 items on every
            level): (holds, what is short). A sample too small is the build's choice, not a finding about the
            model, so such a row — like any row on fewer than ``MIN_UNITS`` units — is not counted in the headline.
        headline: counted on the findings page (False: reported in its chapter only), if the sample is large enough.
        history: dated notes of every change made to the criterion after its numbers were seen.
    """

    id: str
    chapter: str
    figure: str
    claim: str
    statement: str
    statistic: str
    unit: str
    rule: Rule
    values: Values
    reduce: Reduce
    control: str
    control_of: Callable[[str], str] | None = control_name
    with_early: Reduce | None = None
    requires: str | None = None
    precondition: Callable[[pd.DataFrame, str], tuple[bool, str]] | None = None
    sample_size: Callable[[pd.DataFrame, str], tuple[bool, str]] | None = None
    headline: bool = True
    history: tuple[str, ...] = field(default=())


NAN = float("nan")
BUILT_IN = "built into the statistic"  # the control state of a claim without a separate control
_NEEDS = "needs '{}' to agree"  # how a verdict names the claim it depends on (see control_undecided)


def control_undecided(state: str, reason: str) -> bool:
    """A control that could not be decided for lack of data (too few units, missing values …), as opposed to one
    that is not testable because it lacks the pattern a ``requires`` claim needs — that control does discriminate."""
    return state == "not testable" and not str(reason).startswith(_NEEDS.split("{")[0])


def _verdict(spec: ClaimSpec, units: pd.DataFrame, model: str, required: Verdict | None,
             n_boot: int, seed: int) -> tuple[Verdict, np.ndarray, bool]:
    """The verdict, the per-unit values, and whether the sample meets the claim's size rules (``MIN_UNITS`` units
    in all, and ``sample_size``): only then can the row count in the headline (no headline verdict on fewer than
    10 units)."""
    try:
        values = spec.values(units, model)
    except DataError as e:  # e.g. a comparison model without an all-token run
        return Verdict("not testable", NAN, NAN, NAN, 0, str(e)), np.empty((0, 0)), False
    size = spec.sample_size(units, model) if spec.sample_size is not None and len(values) else (True, "")
    sized = len(values) >= MIN_UNITS and size[0]
    if spec.requires and (required is None or required.state != "agrees"):
        why = "it was not checked" if required is None else f"it is {required.state}"
        return (Verdict("not testable", NAN, NAN, NAN, len(values), f"{_NEEDS.format(spec.requires)} ({why})"),
                values, sized)
    pre = spec.precondition(units, model) if spec.precondition is not None else (True, "")
    if not size[0]:  # name every failed precondition: would more units alone make the check testable?
        pre = (False, "; ".join(w for w in (size[1], "" if pre[0] else pre[1]) if w))
    return decide(values, spec.rule, spec.reduce, min_units=MIN_UNITS, n_boot=n_boot, seed=seed,
                  precondition=pre), values, sized


def evaluate(spec: ClaimSpec, units: pd.DataFrame, model: str, control_units: pd.DataFrame | None,
             control_model: str | None, decided: dict[tuple[str, str], Verdict] | None = None,
             n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """One verdict row: the model's verdict, the statistic with layers 0–1, the control's verdict by the same rule,
    and whether the check discriminates (a control that is itself not testable for lack of data leaves that open:
    ``discriminates`` False; one that lacks the pattern a ``requires`` claim needs does discriminate).

    Args:
        units, control_units: per-unit tables holding ``model`` / ``control_model`` (None: no control run).
        decided: verdicts already decided in this chapter, by (claim id, model); updated in place (for ``requires``).
    """
    decided = {} if decided is None else decided
    required = decided.get((spec.requires, model)) if spec.requires else None
    real, values, sized = _verdict(spec, units, model, required, n_boot, seed)
    decided[(spec.id, model)] = real
    early = spec.with_early(values) if spec.with_early is not None and len(values) else float("nan")
    row = {"chapter": spec.chapter, "claim_id": spec.id, "figure": spec.figure, "claim": spec.claim,
           "rule": spec.rule.describe(spec.statistic.split(":")[0]), "unit": spec.unit, "model": model,
           "n": real.n, "estimate": real.estimate, "ci_low": real.ci_low, "ci_high": real.ci_high,
           "state": real.state, "reason": real.reason, "with_layers_0_1": early, "control": spec.control,
           "control_model": control_model, "headline": spec.headline and sized}
    if spec.control_of is None:
        return {**row, "control_state": BUILT_IN, "control_reason": "", "control_estimate": NAN,
                "control_ci_low": NAN, "control_ci_high": NAN, "discriminates": True}
    if control_units is None or control_model is None:
        return {**row, "control_state": "not run", "control_reason": "", "control_estimate": NAN,
                "control_ci_low": NAN, "control_ci_high": NAN, "discriminates": False}
    ctrl, _, _ = _verdict(spec, control_units, control_model,
                       decided.get((spec.requires, control_model)) if spec.requires else None, n_boot, seed)
    decided[(spec.id, control_model)] = ctrl
    return {**row, "control_state": ctrl.state, "control_reason": ctrl.reason, "control_estimate": ctrl.estimate,
            "control_ci_low": ctrl.ci_low, "control_ci_high": ctrl.ci_high,
            "discriminates": bool(discriminates(real, ctrl) and not control_undecided(ctrl.state, ctrl.reason))}
