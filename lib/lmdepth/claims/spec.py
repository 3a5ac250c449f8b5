"""What a claim check is (book/method.md#method-verdicts): statistic over units, decision rule, precondition, control.

A :class:`ClaimSpec` is data: the chapters and the findings page render from it and nothing else sets a threshold.
:func:`evaluate` turns a spec and the per-unit tables of a model and of its control into one verdict row, and
decides whether the check discriminates: by a paired interval of (real − control) over the units both share, by a
permutation null, or — for a statistic that is itself a comparison with the alternative — by construction, with a
positive control where the claim is an equivalence ("does not grow").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd

from lmdepth.errors import DataError
from lmdepth.metrics import bootstrap
from lmdepth.metrics.verdicts import (
    MIN_UNITS,
    SATURATED,
    SEED_ALPHA,
    ControlKind,
    Null,
    Paired,
    Rule,
    Side,
    State,
    Verdict,
    at_bound,
    decide,
    paired_interval,
    permutation_null,
    seed_sign_flip,
    sign_patterns,
)
from lmdepth.model.random_init import control_name

#: Layers left out of every verdict statistic, in every chapter: layers 0–1 write a lot *relative* to the small
#: embedding they start from (and hold the attention sinks), so they dwarf the mid-depth structure the paper's claims
#: are about. Every verdict row also shows its statistic with them (``with_early``).
EARLY_LAYERS = 2

#: (per-unit table, model) -> [units, k] values: a DataFrame indexed by unit id (so a control is paired with the
#: model on the units both share), or an array whose rows are units in a fixed order. A DataFrame whose columns are
#: a two-level index with the second level named :data:`REPLICATE` — (run, training seed) — holds replicates: the
#: statistic reads each run's mean over them, and the verdict's interval resamples them within each run as well.
Values = Callable[[pd.DataFrame, str], "pd.DataFrame | np.ndarray"]
REPLICATE = "replicate"  # the name of the column level that holds replicates (see Values)
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
            random-init twin, :func:`lmdepth.model.random_init.control_name`); the check discriminates when the
            paired interval of statistic(real) − statistic(control) over the shared units excludes 0. None where
            the control is a permutation null (``null``) or the statistic already compares against the alternative
            (``control`` says how).
        null: a permutation control: (the model's [units, k] values, a seeded generator) -> one permuted copy of
            them; the check discriminates when the real statistic lies outside the central 95 % of the statistic
            over ``n_null`` draws.
        positive: for an equivalence claim ("does not grow"), the alternative built from the model's own values
            ([units, k] -> [units, k]); the same rule must reach "disagrees" on it, or the check could not have
            detected the alternative and has no valid control.
        saturation: the largest share of values at a bound (a clip, a ceiling) in any compared group of the
            statistic, with what the bound is; at or above ``SATURATED`` the statistic cannot move and the row is
            not testable (for the control: no valid control).
        control_check: (real values, control values) -> why the control is degenerate ("" if it is not), e.g. a
            ratio of two changes both negligible beside the model's.
        with_early: the same statistic with layers 0–1 kept, shown beside the verdict (None where it does not apply).
        paper: where a robust statistic decides, the paper's own aggregation of the same check (e.g. a clipped max),
            shown beside the verdict and deciding nothing: (per-unit table, model) -> (its statistic, its largest
            share of values at the bound).
        requires: the id of a claim that must agree for this one to mean anything (e.g. a transition's depth needs
            a transition); otherwise "not testable".
        precondition: a check-specific precondition on the per-unit table (competence over a baseline …):
            (holds, what failed and by how much).
        sample_size: the claim's own size requirement beyond ``MIN_UNITS`` units in all (e.g. 10 items on every
            level): (holds, what is short). A sample too small is the build's choice, not a finding about the
            model, so such a row — like any row on fewer than ``MIN_UNITS`` units — is not counted in the headline.
        headline: counted on the findings page (False: reported in its chapter only), if the sample is large enough.
        control_side: for a window rule ("between"), the side of its control the paper means — ``"later"`` for a
            claim of late settling: a model that settles later than its untrained twin shows the pattern beyond what
            the architecture gives. Above/below rules take their side from the rule; a window rule without one
            (None) has no side, and its agreement is never read as explained by its control.
        seeds: a claim about a training recipe: its values hold training seeds as replicates (:data:`REPLICATE`),
            and the control is the seed-level sign-flip test (:func:`lmdepth.metrics.verdicts.seed_sign_flip`) of the
            statistic of each seed alone — the seeds are the units the claim generalises over, the problems a level
            below them. An interval on one side of the threshold decides only where the seeds do; where they cannot
            (3 seeds: p ≥ 1/8), the row is inconclusive and says how many seeds it had.
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
    null: Callable[[np.ndarray, np.random.Generator], np.ndarray] | None = None
    n_null: int = 200
    positive: Callable[[np.ndarray], np.ndarray] | None = None
    saturation: Callable[[np.ndarray], tuple[float, str]] | None = None
    control_check: Callable[[np.ndarray, np.ndarray], str] | None = None
    with_early: Reduce | None = None
    paper: Callable[[pd.DataFrame, str], tuple[float, float]] | None = None
    requires: str | None = None
    precondition: Callable[[pd.DataFrame, str], tuple[bool, str]] | None = None
    sample_size: Callable[[pd.DataFrame, str], tuple[bool, str]] | None = None
    headline: bool = True
    control_side: Literal["later", "earlier"] | None = None
    seeds: bool = False
    history: tuple[str, ...] = field(default=())


NAN = float("nan")
#: How a row's check discriminates (``control_kind``), by name.
PAIRED, PERMUTATION, BUILT_IN, SEEDS = ControlKind
_NEEDS = "needs '{}' to agree"  # how a verdict names the claim it depends on


def frame(values: "pd.DataFrame | np.ndarray") -> pd.DataFrame:
    """Per-unit values as a DataFrame indexed by unit (an array's rows get their positions as unit ids)."""
    return values if isinstance(values, pd.DataFrame) else pd.DataFrame(np.asarray(values, dtype=float))


def replicates(values: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray, list[int] | None, bool]:
    """(the per-unit values with replicate columns averaged, every column as an array, the replicate group sizes,
    whether the replicates are matched): a two-level column index whose second level is :data:`REPLICATE` is
    averaged over it, in the first level's order; its replicates are matched when every group holds the same
    labels in the same order (the same training seeds in every run). Other values are returned as they are, with
    sizes None."""
    full = values.to_numpy(dtype=float)
    if values.columns.nlevels != 2 or values.columns.names[1] != REPLICATE:
        return values, full, None, False
    first = values.columns.get_level_values(0)
    starts = [i for i in range(len(first)) if i == 0 or first[i] != first[i - 1]]
    if len(starts) != first.nunique():
        raise ValueError(f"replicate columns must be grouped by quantity: {list(values.columns)}")
    sizes = [int(n) for n in np.diff(starts + [len(first)])]
    means = pd.DataFrame(bootstrap.replicate_means(full, sizes), index=values.index, columns=list(first[starts]))
    labels = [tuple(values.columns.get_level_values(1)[a:a + n]) for a, n in zip(starts, sizes)]
    return means, full, sizes, all(lab == labels[0] for lab in labels)


def degenerate(values: pd.DataFrame) -> str:
    """Why per-unit control values cannot make a control ("" if they can): every layer curve in them (columns
    labelled by an integer layer, or ``(component, layer)``) flat in every unit — a curve that does not change over
    depth fixes any depth statistic by construction, whatever the units. (A control that is merely the same in
    every unit, e.g. an alignment whose offset is always 0, is a measurement and stays valid.)"""
    groups: dict[tuple, list] = {}
    for c in values.columns:
        key, layer = (c[:-1], c[-1]) if isinstance(c, tuple) else ((), c)
        if isinstance(layer, (int, np.integer)) and not isinstance(layer, bool):
            groups.setdefault(key, []).append(c)
    curves = [g for g in groups.values() if len(g) > 1]
    if curves and all(np.all(np.ptp(values[g].to_numpy(dtype=float), axis=1) == 0) for g in curves):
        return "the control is flat across layers in every unit, so its statistic is fixed by construction"
    return ""


def units_at_ceiling(reduce: Reduce, ceiling: float, what: str) -> Callable[[np.ndarray], tuple[float, str]]:
    """A ``saturation`` for a statistic with a censoring value (a settling depth that is 1.0 when no layer before
    the output settles): the share of units whose own statistic — ``reduce`` of their row alone, so ``reduce``
    must accept a single row — is at ``ceiling``; a row with a missing value is left out (a missing value is not a
    censored one). It is the rule for a clip applied to a censored value: with half or more of the units at
    "never", a depth of their mean says more about which units happen to settle than about where they do."""

    def saturation(values: np.ndarray) -> tuple[float, str]:
        v = np.asarray(values, dtype=float)
        own = [reduce(v[i:i + 1]) if np.isfinite(v[i]).all() else np.nan for i in range(len(v))]
        return at_bound(np.array(own, dtype=float), ceiling), what

    return saturation


def _saturated(spec: ClaimSpec, values: np.ndarray) -> tuple[float, str]:
    if spec.saturation is None or not len(values):
        return NAN, ""
    share, what = spec.saturation(values)
    return share, (f"saturated: {share:.0%} of the values in one compared group are {what} (≥ {SATURATED:.0%})"
                   if share >= SATURATED else "")


def _verdict(spec: ClaimSpec, units: pd.DataFrame, model: str, required: Verdict | None,
             n_boot: int, seed: int) -> tuple[Verdict, pd.DataFrame, bool, float]:
    """The verdict, the per-unit values, whether the sample meets the claim's size rules (``MIN_UNITS`` units in
    all, and ``sample_size``: only then can the row count in the headline), and the saturation share."""
    try:
        values = frame(spec.values(units, model))
    except DataError as e:  # e.g. a comparison model without an all-token run
        return Verdict(State.NOT_TESTABLE, NAN, NAN, NAN, 0, str(e)), pd.DataFrame(), False, NAN
    # training seeds as replicates: the interval resamples them too (one draw for all runs where the runs share
    # their seeds); everything else reads their means
    values, full, sizes, matched = replicates(values)
    v = values.to_numpy(dtype=float)
    size = spec.sample_size(units, model) if spec.sample_size is not None else (True, "")
    # the claim's own size rule, where it has one, judges the sample as drawn (its values may keep only the
    # units a precondition admits, e.g. the levels a model is competent on)
    sized = size[0] if spec.sample_size is not None else len(v) >= MIN_UNITS
    share, saturated = _saturated(spec, v)
    if spec.requires and (required is None or required.state != "agrees"):
        why = "it was not checked" if required is None else f"it is {required.state}"
        return (Verdict(State.NOT_TESTABLE, NAN, NAN, NAN, len(v), f"{_NEEDS.format(spec.requires)} ({why})"),
                values, sized, share)
    pre = spec.precondition(units, model) if spec.precondition is not None else (True, "")
    failed = [w for w in (size[1] if not size[0] else "", "" if pre[0] else pre[1], saturated) if w]
    if failed and not len(v):  # the values kept no unit because of a failed precondition: name it, not "0 units"
        return Verdict(State.NOT_TESTABLE, NAN, NAN, NAN, 0, "; ".join(failed)), values, sized, share
    verdict = decide(full, spec.rule, spec.reduce, min_units=MIN_UNITS, n_boot=n_boot, seed=seed,
                     precondition=(not failed, "; ".join(failed)), replicates=sizes, matched=matched)
    return verdict, values, sized, share


def _paired(spec: ClaimSpec, real: pd.DataFrame, control: pd.DataFrame, n_boot: int, seed: int
            ) -> tuple[Paired | None, str]:
    """The paired interval of real − control on the units both share, or why there is no valid control."""
    shared = real.index.intersection(control.index, sort=False)
    if len(shared) < MIN_UNITS:
        return None, f"the control shares {len(shared)} units with the model, at least {MIN_UNITS} needed"
    r, c = real.loc[shared].to_numpy(dtype=float), control.loc[shared].to_numpy(dtype=float)
    if r.shape[1] != c.shape[1]:
        return None, f"the control has {c.shape[1]} values per unit, the model {r.shape[1]}"
    why = spec.control_check(r, c) if spec.control_check is not None else ""
    if why:
        return None, why
    p = paired_interval(r, c, spec.reduce, n_boot=n_boot, seed=seed)
    if not (np.isfinite(p.ci_low) and np.isfinite(p.ci_high)):
        return None, "the paired difference is undefined on some resamples (a denominator of the control vanishes)"
    return p, ""


def paper_side(spec: ClaimSpec, diff: float) -> bool | None:
    """Whether model − control = ``diff`` lies on the paper's side of the control: for an above/below rule the
    rule's own side, for a window rule its ``control_side`` (None where it has none)."""
    if spec.rule.side == "between":
        return None if spec.control_side is None else (diff > 0) == (spec.control_side == "later")
    return diff < 0 if spec.rule.side == "below" else diff > 0


def _side(spec: ClaimSpec, diff: float) -> Side:
    """Where the model lies relative to its control (model − control = ``diff``), in the terms of the rule."""
    if spec.rule.side == "between":
        return Side.LATER if diff > 0 else Side.EARLIER
    return Side.BEYOND if paper_side(spec, diff) else Side.SHORT


@dataclass
class Decided:
    """What a chapter's earlier rows found, by (claim id, model), for the claims that ``require`` them: each model's
    (and control's) verdict."""

    verdicts: dict[tuple[str, str], Verdict] = field(default_factory=dict)


#: The other aggregations a decided row is read under (item: its statistic), in :func:`fragile`'s words.
WITH_EARLY, PAPER_AGGREGATION = "with layers 0–1 kept", "with the paper's aggregation"


def fragile(rule: Rule, state: str, alternatives: dict[str, float]) -> str:
    """The alternative statistics (name → value) that fall on the other side of ``rule`` from a decided state —
    an 'agrees' whose alternative misses the paper's side, a 'disagrees' whose alternative meets it — joined by
    "; " ("" when none does, and for any other state). A point on the other side, not a decision: the alternatives
    have no interval of their own."""
    if state not in ("agrees", "disagrees"):
        return ""
    return "; ".join(name for name, x in alternatives.items()
                     if x is not None and np.isfinite(x) and rule.holds(x) != (state == "agrees"))


def evaluate(spec: ClaimSpec, units: pd.DataFrame, model: str, control_units: pd.DataFrame | None,
             control_model: str | None, decided: Decided | None = None,
             n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """One verdict row: the model's verdict, the statistic with layers 0–1, whether the verdict is ``fragile`` (its
    statistic with layers 0–1 kept, or by the paper's own aggregation, on the other side of the rule: :func:`fragile`),
    the control's verdict by the same rule (shown, not deciding), and the discrimination test of the row's
    ``control_kind``:

    * ``paired`` — real − control on the shared units, resampled jointly: ``paired_diff`` [``paired_low``,
      ``paired_high``]; discriminates when the interval excludes 0; ``side`` says where the model lies relative to
      its control; where the control lacks the pattern a ``requires`` claim needs (a twin with no sign change has no
      depth of it), there is no valid control (the pattern is judged by the required claim, with its own);
    * ``permutation`` — the statistic over ``n_null`` permuted copies: ``control_estimate`` is the null's median,
      [``control_ci_low``, ``control_ci_high``] its central 95 %, ``p_value`` two-sided;
    * ``built into the statistic`` — the statistic is the comparison with the alternative on the same units (a
      paired difference decided against 0, so its own interval is the paired interval); with ``positive`` the
      alternative built from the model's own values must reach "disagrees", and the paired interval is real −
      alternative.

    A seed-level row also carries ``detectable`` (:func:`detectable`): the smallest true statistic its interval and
    seeds would call 'agrees' with 80 % power (NaN for other rows).

    ``control_valid`` False (with ``control_note``) when the control was not run, shares too few units, is flat
    across layers, is saturated, or its difference is undefined: such a row is shown and not counted.

    Args:
        units, control_units: per-unit tables holding ``model`` / ``control_model`` (None: no control run).
        decided: what this chapter's earlier rows found; updated in place (for ``requires``).
    """
    decided = Decided() if decided is None else decided
    required = decided.verdicts.get((spec.requires, model)) if spec.requires else None
    real, values, sized, share = _verdict(spec, units, model, required, n_boot, seed)
    decided.verdicts[(spec.id, model)] = real
    v = values.to_numpy(dtype=float)
    early = spec.with_early(v) if spec.with_early is not None and len(v) else NAN
    paper, paper_bound = NAN, NAN
    if spec.paper is not None and len(v):
        try:
            paper, paper_bound = spec.paper(units, model)
        except DataError:  # the paper's statistic is only shown: a run without it still decides
            pass
    row = {"chapter": spec.chapter, "claim_id": spec.id, "figure": spec.figure, "claim": spec.claim,
           "rule": spec.rule.describe(spec.statistic.split(":")[0]), "unit": spec.unit, "model": model,
           "n": real.n, "estimate": real.estimate, "ci_low": real.ci_low, "ci_high": real.ci_high,
           "state": real.state, "reason": real.reason, "with_layers_0_1": early, "at_bound": share,
           "paper_estimate": paper, "paper_at_bound": paper_bound,
           "fragile": fragile(spec.rule, real.state, {WITH_EARLY: early, PAPER_AGGREGATION: paper}),
           "control": spec.control, "control_model": control_model, "headline": spec.headline and sized,
           "control_state": "", "control_reason": "", "control_estimate": NAN, "control_ci_low": NAN,
           "control_ci_high": NAN, "paired_diff": NAN, "paired_low": NAN, "paired_high": NAN, "p_value": NAN,
           "side": Side.NONE, "paper_side": None, "control_valid": False, "control_note": "", "discriminates": False,
           "detectable": NAN}
    if real.state == "not testable":  # nothing to discriminate; the control is still shown where it ran
        row["control_note"] = "the check itself is not testable"
    if spec.seeds:
        return {**row, **_seed_level(spec, units, model, real)}
    if spec.null is not None:
        return {**row, **_permutation(spec, v, real, seed)}
    if spec.control_of is None:
        return {**row, **_built_in(spec, v, real, n_boot, seed)}
    if control_units is None or control_model is None:
        return {**row, "control_kind": PAIRED, "control_state": "not run",
                "control_note": row["control_note"] or "the control was not run"}
    ctrl, cvalues, _, _ = _verdict(spec, control_units, control_model,
                                   decided.verdicts.get((spec.requires, control_model)) if spec.requires else None,
                                   n_boot, seed)
    decided.verdicts[(spec.id, control_model)] = ctrl
    out = {**row, "control_kind": PAIRED, "control_state": ctrl.state, "control_reason": ctrl.reason,
           "control_estimate": ctrl.estimate, "control_ci_low": ctrl.ci_low, "control_ci_high": ctrl.ci_high}
    if real.state == "not testable":
        return out
    _, csat = _saturated(spec, cvalues.to_numpy(dtype=float)) if len(cvalues) else (NAN, "")
    if csat or not len(cvalues):
        return {**out, "control_note": f"the control is {csat}" if csat else (ctrl.reason or "no control values")}
    flat = degenerate(cvalues)
    if flat:
        return {**out, "control_note": flat}
    if spec.requires and ctrl.state == "not testable":
        # a twin without the pattern (no sign change) has no location of it: nothing to compare the model's with.
        # The pattern itself is judged, with its own control, by the required claim; counting its interval here
        # again would count one comparison twice.
        return {**out, "control_note": (f"the control could not be decided: {ctrl.reason}"
                                        if not ctrl.reason.startswith(_NEEDS.split("{")[0]) else
                                        f"the control lacks the pattern this claim needs ('{spec.requires}'), so it "
                                        "has no value to compare with")}
    p, why = _paired(spec, values, cvalues, n_boot, seed)
    if p is None:
        return {**out, "control_note": why}
    return {**out, "paired_diff": p.estimate, "paired_low": p.ci_low, "paired_high": p.ci_high, "control_valid": True,
            "discriminates": p.excludes_zero, "paper_side": paper_side(spec, p.estimate) if p.excludes_zero else None,
            "side": _side(spec, p.estimate) if p.excludes_zero else Side.INDISTINCT}


def per_seed_statistics(spec: ClaimSpec, units: pd.DataFrame, model: str) -> tuple[list[float], str]:
    """The statistic of each training seed alone (its column of every replicate group: the runs compared share
    their seeds), or why there is none."""
    _, full, sizes, matched = replicates(frame(spec.values(units, model)))
    if sizes is None:
        return [], "the values hold no training seeds"
    if not matched:
        return [], "the compared runs do not share their training seeds, so no seed can be compared with itself"
    starts = np.cumsum([0] + sizes[:-1])
    return [float(spec.reduce(full[:, starts + i])) for i in range(sizes[0])], ""


def _seed_power(shift_sd: np.ndarray, n: int, draws: int = 4000) -> np.ndarray:
    """Power of the one-sided sign-flip test over ``n`` seeds (:func:`~lmdepth.metrics.verdicts.seed_sign_flip`)
    when each seed's statistic lies ``shift_sd`` seed standard deviations beyond the threshold (normal seeds;
    simulated, seeded): [len(shift_sd)]."""
    z = np.random.default_rng(0).standard_normal((draws, n))
    signs = sign_patterns(n)  # [2^n, n]
    out = []
    for shift in shift_sd:
        d = z + shift  # [draws, n]
        p = ((d @ signs.T) / n >= d.mean(1, keepdims=True) - 1e-12).mean(1)  # [draws]
        out.append(float(np.mean(p <= SEED_ALPHA)))
    return np.array(out)


def detectable(rule: Rule, ci_low: float, ci_high: float, per_seed: list[float], powered: bool) -> float:
    """The smallest true value of the statistic a seed-level row would call 'agrees' with 80 % power: beyond the
    threshold by the shift at which the interval (its half-width / 1.96 as the standard error) excludes the threshold
    *and* the exact sign-flip test over the row's seeds (their standard deviation, normal seeds) rejects, with
    probability 0.8 together (the two taken as independent). With 5 seeds the test rejects only when every seed is
    beyond the threshold, which needs about 1.7 seed standard deviations, not the 1.1 a normal approximation gives.
    Infinite where the seeds cannot reach the test's level at all (fewer than 5); NaN for a window rule, or without
    an interval."""
    if rule.side == "between" or not (np.isfinite(ci_low) and np.isfinite(ci_high)):
        return NAN
    if not powered:
        return float("inf") if rule.side == "above" else float("-inf")
    se = (ci_high - ci_low) / (2 * 1.959964)
    sd = float(np.std(per_seed, ddof=1)) if len(per_seed) > 1 else 0.0
    unit = max(se, sd, 1e-12)
    distance = float("inf")
    for shift in np.linspace(0.0, 10.0, 201) * unit:  # the first shift (in steps of the larger spread / 20) that does
        interval = 0.5 * (1 + math.erf((shift / max(se, 1e-12) - 1.959964) / math.sqrt(2)))
        if interval * _seed_power(np.array([shift / max(sd, 1e-12)]), len(per_seed))[0] >= 0.8:
            distance = float(shift)
            break
    return float(rule.threshold + distance if rule.side == "above" else rule.threshold - distance)


def _seed_level(spec: ClaimSpec, units: pd.DataFrame, model: str, real: Verdict) -> dict[str, Any]:
    """The seed-level control: the sign-flip test of the per-seed statistics on the side the interval lies on. An
    interval on one side decides only where the test rejects; otherwise the row is inconclusive, naming its seeds."""
    out: dict[str, Any] = {"control_kind": SEEDS}
    if real.state == "not testable":
        return out
    per_seed, why = per_seed_statistics(spec, units, model)
    if why:
        return {**out, "control_note": why}
    other = Rule(spec.rule.threshold, "below" if spec.rule.side == "above" else "above")
    test = seed_sign_flip(per_seed, other if real.state == "disagrees" else spec.rule)
    n = test.n
    out.update(control_state=f"seed-level sign-flip test over {n} seeds", p_value=test.p_value,
               control_estimate=float(np.median(per_seed)), control_ci_low=min(per_seed),
               control_ci_high=max(per_seed), control_valid=True, discriminates=test.rejects,
               # the seeds' statistics against the threshold: their median and range (drawn like a paired difference)
               paired_diff=float(np.median(per_seed)) - spec.rule.threshold,
               paired_low=min(per_seed) - spec.rule.threshold, paired_high=max(per_seed) - spec.rule.threshold,
               side=(Side.EVERY_SEED if test.rejects else
                     Side.TOO_FEW_SEEDS if not test.powered else Side.SEEDS_INCONSISTENT),
               detectable=detectable(spec.rule, real.ci_low, real.ci_high, per_seed, test.powered))
    if real.state == "inconclusive" or test.rejects:
        return out
    power = (f"with {n} seeds the test cannot go below p = 1/{2 ** n}" if not test.powered else
             f"p = {test.p_value:.3g} over {n} seeds")
    return {**out, "state": State.INCONCLUSIVE,
            "reason": f"{n} seeds: the interval is on one side, but the seed-level sign-flip test does not reach "
                      f"p ≤ {SEED_ALPHA:g} ({power})"}


def _permutation(spec: ClaimSpec, v: np.ndarray, real: Verdict, seed: int) -> dict[str, Any]:
    out: dict[str, Any] = {"control_kind": PERMUTATION}
    if real.state == "not testable":
        return out
    rng = np.random.default_rng(seed)
    draws = [spec.reduce(spec.null(v, rng)) for _ in range(spec.n_null)]
    null: Null = permutation_null(real.estimate, np.asarray(draws))
    out.update(control_state=f"permutation null over {null.n} draws", control_estimate=float(np.median(draws)),
               control_ci_low=null.low, control_ci_high=null.high, p_value=null.p_value,
               paired_diff=real.estimate - float(np.median(draws)))
    if null.n < spec.n_null or null.low == null.high:
        return {**out, "control_note": f"the null is degenerate ({null.n} finite draws, range [{null.low:.3g}, "
                                       f"{null.high:.3g}])"}
    return {**out, "control_valid": True, "discriminates": null.excludes_real,
            "side": Side.OUTSIDE_NULL if null.excludes_real else Side.INSIDE_NULL}


def _built_in(spec: ClaimSpec, v: np.ndarray, real: Verdict, n_boot: int, seed: int) -> dict[str, Any]:
    out: dict[str, Any] = {"control_kind": BUILT_IN, "control_state": BUILT_IN}
    if real.state == "not testable":
        return out
    if spec.positive is None:
        if spec.rule.side == "between" or spec.rule.threshold != 0:
            return {**out, "control_note": "a statistic that is itself the comparison must be decided against 0"}
        excludes = Paired(real.estimate, real.ci_low, real.ci_high, real.n).excludes_zero
        return {**out, "paired_diff": real.estimate, "paired_low": real.ci_low, "paired_high": real.ci_high,
                "control_valid": True, "discriminates": excludes,
                "side": ((Side.BEYOND_ALTERNATIVE if paper_side(spec, real.estimate) else Side.SHORT_OF_ALTERNATIVE)
                         if excludes else Side.INDISTINCT_FROM_ALTERNATIVE)}
    alternative = spec.positive(v)
    alt = decide(alternative, spec.rule, spec.reduce, min_units=MIN_UNITS, n_boot=n_boot, seed=seed)
    pa = paired_interval(v, alternative, spec.reduce, n_boot=n_boot, seed=seed)
    out.update(control_state=f"positive control {alt.state}", control_estimate=alt.estimate,
               control_ci_low=alt.ci_low, control_ci_high=alt.ci_high, paired_diff=pa.estimate,
               paired_low=pa.ci_low, paired_high=pa.ci_high)
    if alt.state != "disagrees":
        return {**out, "control_note": f"the positive control (the alternative built from this model's values) is "
                                       f"{alt.state}, not 'disagrees': the check could not have detected it"}
    return {**out, "control_valid": True, "discriminates": True, "side": Side.APART_FROM_POSITIVE}
