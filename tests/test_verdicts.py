"""The four verdict states, decided from bootstrap intervals over units on hand-made data."""

import numpy as np
import pytest

from lmdepth.metrics.verdicts import Rule, at_bound, decide, paired_interval, permutation_null, ratio_of_means

pytestmark = pytest.mark.unit
BELOW = Rule(0.5, "below")


def units(mean: float, sd: float, n: int = 20, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(mean, sd, n)


def test_agrees_when_the_whole_interval_is_on_the_papers_side():
    v = decide(units(0.2, 0.05), BELOW)
    assert v.state == "agrees" and v.ci_high < 0.5 and v.n == 20


def test_disagrees_when_the_whole_interval_is_on_the_other_side():
    v = decide(units(0.9, 0.05), BELOW)
    assert v.state == "disagrees" and v.ci_low > 0.5


def test_inconclusive_when_the_interval_straddles_the_threshold():
    v = decide(units(0.5, 0.4), BELOW)
    assert v.state == "inconclusive" and v.ci_low < 0.5 < v.ci_high


def test_not_testable_below_ten_units_or_when_a_precondition_fails():
    v = decide(units(0.2, 0.05, n=9), BELOW)
    assert v.state == "not testable" and "9 units, at least 10" in v.reason
    w = decide(units(0.2, 0.05), BELOW, precondition=(False, "accuracy 1 % is the constant-answer baseline 1 %"))
    assert w.state == "not testable" and "baseline" in w.label()


def test_a_point_estimate_on_the_right_side_is_not_enough():
    """A mean below the threshold with a wide interval is inconclusive, not 'agrees'."""
    v = decide(units(0.45, 0.5), BELOW)
    assert v.estimate < 0.5 and v.state == "inconclusive"


def test_paired_ratio_and_a_vanishing_denominator():
    rng = np.random.default_rng(1)
    first = rng.normal(1.0, 0.1, 20)
    v = decide(np.column_stack([first, 0.3 * first]), BELOW, statistic=ratio_of_means)
    assert v.state == "agrees" and abs(v.estimate - 0.3) < 1e-9
    zero = np.column_stack([np.r_[np.zeros(19), 1e-9], np.ones(20)])
    assert decide(zero, BELOW, statistic=ratio_of_means).state == "not testable"


def test_discrimination_is_a_paired_interval_not_a_match_of_states():
    """Both 'agree' (0.2 and 0.25 < 0.5), yet the paired interval tells them apart; two draws of the same
    distribution do not differ, whatever their states."""
    real, control = units(0.2, 0.05), units(0.25, 0.05, seed=3)
    assert decide(real, BELOW).state == decide(control, BELOW).state == "agrees"
    p = paired_interval(real, control, np.mean)
    assert p.excludes_zero and p.ci_high < 0 and p.n == 20
    same = paired_interval(real, units(0.2, 0.05, seed=4), np.mean)
    assert not same.excludes_zero
    # pairing matters: a shared per-unit offset cancels in the difference and narrows the interval
    offset = np.random.default_rng(5).normal(0, 1.0, 20)
    a, b = real + offset, real + offset + 0.03
    assert paired_interval(a, b, np.mean).excludes_zero
    with pytest.raises(ValueError, match="same units"):
        paired_interval(real, real[:5], np.mean)


def test_a_permutation_null_and_a_bound():
    draws = np.random.default_rng(0).normal(0, 1, 500)
    assert permutation_null(3.5, draws).excludes_real and permutation_null(3.5, draws).p_value < 0.01
    inside = permutation_null(0.1, draws)
    assert not inside.excludes_real and inside.p_value > 0.5
    assert at_bound(np.r_[1.0, 1.0, 0.5, np.nan], 1.0) == pytest.approx(2 / 3)
    assert at_bound(np.r_[0.0, 0.2], 0.0, upper=False) == 0.5


def test_above_rules_mirror_below_rules():
    above = Rule(0.5, "above")
    assert decide(units(0.9, 0.05), above).state == "agrees"
    assert decide(units(0.2, 0.05), above).state == "disagrees"
