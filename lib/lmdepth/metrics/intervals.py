"""Proportions: interval estimates that are not bootstraps (the percentile bootstrap of every other statistic is
:mod:`lmdepth.metrics.bootstrap`), and the constant-answer baseline that an accuracy must beat."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from typing import NamedTuple


def wilson_interval(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a proportion k/n (sensible at 0 and n, unlike the normal approximation)."""
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def constant_answer_rate(answers: Iterable[object]) -> float:
    """Exact match of always giving the most common answer (answers compared as strings); NaN for none."""
    counts = Counter(str(a) for a in answers)
    n = sum(counts.values())
    return max(counts.values()) / n if n else float("nan")


class ExactMatch(NamedTuple):
    """Exact match of a group of items against what a constant answer would score (:func:`exact_match`)."""

    n: int
    correct: int
    accuracy: float
    ci_low: float  # Wilson 95 %
    ci_high: float
    baseline: float  # the constant-answer rate of the same items

    @property
    def above(self) -> bool:
        """The whole interval lies above the baseline: the items are solved clearly better than by a constant."""
        return bool(self.ci_low > self.baseline)


def exact_match(correct: Iterable[int | bool], answers: Iterable[object]) -> ExactMatch:
    """Accuracy of 0/1 ``correct`` flags with its Wilson 95 % interval, and the constant-answer baseline of the
    items' reference ``answers`` — the one competence check of chapters 05 and 07."""
    flags = [int(c) for c in correct]
    k, n = sum(flags), len(flags)
    lo, hi = wilson_interval(k, n)
    return ExactMatch(n, k, k / n if n else float("nan"), lo, hi, constant_answer_rate(answers))
