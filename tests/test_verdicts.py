"""The four verdict states, decided from bootstrap intervals over units on hand-made data."""

import numpy as np
import pytest

from lmdepth.metrics.verdicts import Rule, decide, discriminates, ratio_of_means

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


def test_a_control_with_the_same_verdict_does_not_discriminate():
    real, control = decide(units(0.2, 0.05), BELOW), decide(units(0.25, 0.05, seed=3), BELOW)
    assert not discriminates(real, control)
    assert discriminates(real, decide(units(0.9, 0.05), BELOW))


def test_above_rules_mirror_below_rules():
    above = Rule(0.5, "above")
    assert decide(units(0.9, 0.05), above).state == "agrees"
    assert decide(units(0.2, 0.05), above).state == "disagrees"
