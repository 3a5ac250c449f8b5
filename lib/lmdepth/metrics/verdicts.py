"""Verdicts of claim checks in four states, decided from bootstrap intervals, never from point estimates
(book/method.md#method-verdicts).

A check reduces the result tables to one value per unit (problem, text, item, position — whatever the data were
drawn as) and states the paper's side of a threshold. The statistic is the mean over units (or a ratio of two
per-unit means, paired); its 95 % percentile bootstrap interval over units decides:

* **agrees** — the whole interval lies on the paper's side of the threshold;
* **disagrees** — the whole interval lies on the other side;
* **inconclusive** — the interval straddles the threshold;
* **not testable** — a precondition failed (fewer units than the minimum, a competence gate, a denominator that
  can vanish); the verdict names which one and by how much.

A control (a random-init model of the same architecture, an absolute-layer alignment, a permutation null …) is
measured on the same units. Discrimination is a paired test, never a match of states: the statistic's difference
real − control, with real and control resampled jointly over their shared units (:func:`paired_interval`), must
have a 95 % interval that excludes 0; a permutation null (:func:`permutation_null`) must leave the real statistic
outside its central 95 %. A statistic with half its values or more at a bound (a clip, a ceiling) cannot move and
decides nothing (:func:`at_bound`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

import numpy as np

from lmdepth.metrics import bootstrap
from lmdepth.metrics.bootstrap import percentile_interval, tails


class State(StrEnum):
    """A decided check (its value is the word the pages print)."""

    AGREES = "agrees"
    DISAGREES = "disagrees"
    INCONCLUSIVE = "inconclusive"
    NOT_TESTABLE = "not testable"


STATES: tuple[State, ...] = tuple(State)


class ControlKind(StrEnum):
    """How a verdict row's check discriminates (its ``control_kind``)."""

    PAIRED = "paired"  # real − control over the shared units, resampled jointly
    PERMUTATION = "permutation"  # the statistic against a permutation null
    BUILT_IN = "built into the statistic"  # the statistic is itself the comparison with the alternative
    SEEDS = "seed-level"  # a sign-flip test over training seeds


class Side(StrEnum):
    """Where a row's model lies relative to what it is compared with (its ``side``): a code; the pages render it
    (:data:`lmdepth.claims.report.SIDE_TEXT`). Counting reads these, never the rendered sentence."""

    NONE = ""  # no comparison was made
    BEYOND = "beyond"  # beyond its control, on the paper's side
    SHORT = "short"  # short of its control: the control shows the pattern more strongly
    LATER = "later"  # a window rule: later than its control
    EARLIER = "earlier"  # a window rule: earlier than its control
    INDISTINCT = "indistinct"  # the paired interval contains 0
    BEYOND_ALTERNATIVE = "beyond alternative"  # a comparison built into the statistic, on the paper's side
    SHORT_OF_ALTERNATIVE = "short of alternative"
    INDISTINCT_FROM_ALTERNATIVE = "indistinct from alternative"
    APART_FROM_POSITIVE = "apart from positive"  # an equivalence claim whose positive control disagrees
    OUTSIDE_NULL = "outside null"
    INSIDE_NULL = "inside null"
    EVERY_SEED = "every seed"  # the seed-level test rejects: every seed on the interval's side
    SEEDS_INCONSISTENT = "seeds inconsistent"
    TOO_FEW_SEEDS = "too few seeds"

MIN_UNITS = 10
MIN_BOOT = 1000  # at least 1000 resamples (book/method.md#method-intervals)
LEVEL = 0.95  # of every interval here


@dataclass(frozen=True)
class Rule:
    """The paper's side of a threshold: ``statistic < threshold`` (``side="below"``), ``> threshold``
    (``"above"``), or ``threshold ≤ statistic ≤ upper`` (``"between"``)."""

    threshold: float
    side: Literal["below", "above", "between"]
    upper: float | None = None

    def __post_init__(self) -> None:
        if (self.side == "between") != (self.upper is not None):
            raise ValueError("a 'between' rule needs an upper bound, and only it has one")

    def position(self, x: float) -> int:
        """0 on the paper's side; -1 / +1 below / above it (for ``"below"``/``"above"`` rules: ±1 is the other
        side)."""
        if self.side == "below":
            return 0 if x < self.threshold else 1
        if self.side == "above":
            return 0 if x > self.threshold else -1
        return -1 if x < self.threshold else (1 if x > self.upper else 0)

    def holds(self, x: float) -> bool:
        return self.position(x) == 0

    def describe(self, name: str = "statistic") -> str:
        if self.side == "between":
            return f"{self.threshold:g} ≤ {name} ≤ {self.upper:g}"
        return f"{name} {'<' if self.side == 'below' else '>'} {self.threshold:g}"


@dataclass(frozen=True)
class Verdict:
    """One decided check.

    Attributes:
        state: one of :data:`STATES`.
        estimate: the statistic on all units (NaN when not testable for lack of units).
        ci_low, ci_high: its 95 % percentile bootstrap interval over units.
        n: units the statistic rests on.
        reason: for "not testable", the failed precondition and by how much; else empty.
    """

    state: State
    estimate: float
    ci_low: float
    ci_high: float
    n: int
    reason: str = ""

    def label(self) -> str:
        """E.g. ``agrees: 0.31 [0.27, 0.35], n = 20`` (the interval and n always shown)."""
        if self.state == "not testable":
            return f"not testable: {self.reason}"
        return f"{self.state}: {self.estimate:.3g} [{self.ci_low:.3g}, {self.ci_high:.3g}], n = {self.n}"


def decide(values: np.ndarray, rule: Rule, statistic: Callable[[np.ndarray], float] | None = None,
           min_units: int = MIN_UNITS, n_boot: int = 1000, seed: int = 0,
           precondition: tuple[bool, str] = (True, ""), replicates: Sequence[int] | None = None,
           matched: bool = False) -> Verdict:
    """The verdict of one check.

    Args:
        values: [units] or [units, k] per-unit values (k columns for paired statistics such as a ratio of means).
        rule: the paper's side of the threshold.
        statistic: reduces a (resampled) array of units to one number (default: the mean of a 1-D array).
        min_units: the precondition on the sample size (at least 10: book/method.md#method-verdicts).
        precondition: (holds, why not) of a check-specific precondition (competence over a baseline, …).
        replicates: ``values`` [units, Σ replicates] holds groups of replicate columns end to end (each run's
            training seeds): the statistic reads each group's mean, and the interval resamples the replicates
            within each group as well as the units (:func:`lmdepth.metrics.bootstrap.draws`), so it includes the
            spread between them.
        matched: the replicates are matched across groups (the same training seeds in every run): one draw of
            them serves every group (paired resampling).
    """
    values = np.asarray(values, dtype=float)
    statistic = statistic or (lambda v: float(np.mean(v)))
    n = len(values)
    ok, why = precondition
    if n < min_units:  # the precondition's failure too, so a reader sees whether more units alone would do
        return Verdict(State.NOT_TESTABLE, float("nan"), float("nan"), float("nan"), n,
                       f"{n} unit{'' if n == 1 else 's'}, at least {min_units} needed" + ("" if ok else f"; {why}"))
    if not ok:
        return Verdict(State.NOT_TESTABLE, float("nan"), float("nan"), float("nan"), n, why)
    missing = int((~np.isfinite(values)).reshape(n, -1).any(1).sum())
    if missing:
        return Verdict(State.NOT_TESTABLE, float("nan"), float("nan"), float("nan"), n,
                       f"{missing} of {n} units have missing values")
    if n_boot < MIN_BOOT:
        return Verdict(State.NOT_TESTABLE, float("nan"), float("nan"), float("nan"), n,
                       f"{n_boot} bootstrap resamples, at least {MIN_BOOT} needed")
    boots = bootstrap.draws(statistic, (values,), n_boot, seed, columns=replicates, matched=matched)
    bad = int((~np.isfinite(boots)).sum())  # the interval leaves these out; the verdict does not trust it then
    est = float(statistic(values if replicates is None else bootstrap.replicate_means(values, replicates)))
    lo, hi = percentile_interval(boots, tails(LEVEL))
    if bad or not np.isfinite(est):
        return Verdict(State.NOT_TESTABLE, est, lo, hi, n, f"the statistic is undefined on {bad} of {n_boot} "
                                                             "resamples (a denominator that can vanish, or an empty "
                                                             "range of layers or levels)")
    low_side, high_side = rule.position(lo), rule.position(hi)
    if low_side == high_side == 0:
        state = State.AGREES
    elif low_side == high_side:  # the whole interval on one side outside the paper's
        state = State.DISAGREES
    else:
        state = State.INCONCLUSIVE
    return Verdict(state, est, lo, hi, n)


def ratio_of_means(values: np.ndarray) -> float:
    """mean(column 1) / mean(column 0) of paired per-unit values (e.g. second-half / first-half contribution);
    NaN when the denominator vanishes."""
    den = float(np.mean(values[:, 0]))
    return float(np.mean(values[:, 1]) / den) if den != 0 else float("nan")


@dataclass(frozen=True)
class Paired:
    """real − control on shared units: the difference of the statistic, its 95 % interval from a joint resample of
    the units, and how many units were shared. ``excludes_zero`` is the discrimination test."""

    estimate: float
    ci_low: float
    ci_high: float
    n: int

    @property
    def excludes_zero(self) -> bool:
        return bool(np.isfinite(self.ci_low) and np.isfinite(self.ci_high) and (self.ci_low > 0 or self.ci_high < 0))


def paired_interval(real: np.ndarray, control: np.ndarray, statistic: Callable[[np.ndarray], float],
                    n_boot: int = 1000, seed: int = 0, level: float = LEVEL) -> Paired:
    """The 95 % percentile interval of statistic(real) − statistic(control), the same resample of unit rows applied
    to both (row i of ``real`` and of ``control`` is the same unit, e.g. the same problem).

    Args:
        real, control: [units, k] per-unit values of the model and of its control, rows aligned.
    """
    real, control = np.asarray(real, dtype=float), np.asarray(control, dtype=float)
    if len(real) != len(control):
        raise ValueError(f"paired values need the same units: {len(real)} real rows, {len(control)} control rows")
    b = bootstrap.draws(lambda r, c: statistic(r) - statistic(c), (real, control), n_boot, seed)
    lo, hi = percentile_interval(b, tails(level)) if np.isfinite(b).all() else (np.nan, np.nan)
    return Paired(float(statistic(real) - statistic(control)), float(lo), float(hi), len(real))


@dataclass(frozen=True)
class Null:
    """A permutation null: the real statistic, the central 95 % of the statistic over ``n`` permuted draws, and the
    two-sided p-value (share of draws at least as far from the null's median as the real value, counting the real
    one). ``excludes_real`` is the discrimination test."""

    estimate: float
    low: float
    high: float
    p_value: float
    n: int

    @property
    def excludes_real(self) -> bool:
        return bool(np.isfinite(self.estimate) and (self.estimate < self.low or self.estimate > self.high))


def permutation_null(real: float, draws: np.ndarray, level: float = LEVEL) -> Null:
    """Summarise ``draws`` (the statistic on each permuted copy of the data) against the ``real`` statistic."""
    d = np.asarray(draws, dtype=float)
    d = d[np.isfinite(d)]
    if not len(d):
        return Null(real, float("nan"), float("nan"), float("nan"), 0)
    lo, hi = percentile_interval(d, tails(level))
    centre = float(np.median(d))
    p = (1 + int((np.abs(d - centre) >= abs(real - centre)).sum())) / (len(d) + 1)
    return Null(float(real), float(lo), float(hi), float(p), len(d))


#: The level of the seed-level test (one-sided): a claim about training is decided only where its seeds reach it.
SEED_ALPHA = 0.05


@dataclass(frozen=True)
class SeedTest:
    """An exact one-sided sign-flip test over training seeds: are the per-seed statistics consistently on the paper's
    side of the threshold? Under the null each seed's deviation from the threshold is as likely negative as
    positive, so every one of the 2^n sign patterns is equally likely; ``p_value`` is the share of patterns whose
    mean deviation is at least the observed one (the observed one included). ``floor`` = 2^−n is the smallest
    p-value n seeds can give: with 3 seeds 1/8, so no 3-seed test can reach :data:`SEED_ALPHA` (5 seeds: 1/32).

    Attributes:
        per_seed: the statistic of each seed alone; p_value, floor: as above; n: seeds.
    """

    per_seed: tuple[float, ...]
    p_value: float
    floor: float
    n: int

    @property
    def powered(self) -> bool:
        """Whether this many seeds could reach :data:`SEED_ALPHA` at all."""
        return self.floor <= SEED_ALPHA

    @property
    def rejects(self) -> bool:
        return bool(np.isfinite(self.p_value) and self.p_value <= SEED_ALPHA)


def sign_patterns(n: int) -> np.ndarray:
    """[2^n, n] every pattern of ±1 over n seeds (the sign-flip test's null distribution)."""
    return 1 - 2 * ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1)


def seed_sign_flip(per_seed: Sequence[float], rule: Rule) -> SeedTest:
    """:class:`SeedTest` of the per-seed statistics against ``rule``'s threshold, on the paper's side (a 'between'
    rule has no side: NaN)."""
    x = np.asarray(per_seed, dtype=float)
    n = len(x)
    floor = 2.0 ** -n if n else float("nan")
    if rule.side == "between" or not n or not np.isfinite(x).all():
        return SeedTest(tuple(map(float, x)), float("nan"), floor, n)
    d = (x - rule.threshold) * (1.0 if rule.side == "above" else -1.0)  # positive = the paper's side
    signs = sign_patterns(n)
    p = float(np.mean((signs * d).mean(1) >= d.mean() - 1e-12))
    return SeedTest(tuple(map(float, x)), p, floor, n)


SATURATED = 0.5  # a group with at least this share of its values at a bound cannot move: not testable


def at_bound(values: np.ndarray, bound: float, upper: bool = True) -> float:
    """Share of ``values`` at (or beyond) ``bound`` — above it with ``upper``, below it otherwise; NaN values are
    left out."""
    v = np.asarray(values, dtype=float).ravel()
    v = v[np.isfinite(v)]
    if not len(v):
        return float("nan")
    return float(np.mean(v >= bound if upper else v <= bound))
