"""Pure statistics of one per-layer curve (a value per layer, e.g. a mean relative contribution or cosine).

Halves: the first half is layers ``[skip, L // 2)``, the second ``[(L + 1) // 2, L)`` (the middle layer of an odd L
goes to neither). ``skip`` leaves the first layers out of the first half (the book's convention for verdicts:
:data:`lmdepth.claims.spec.EARLY_LAYERS`).
"""

from __future__ import annotations

import numpy as np


def half_means(curve: np.ndarray, skip: int = 0) -> tuple[float, float]:
    """(first-half mean, second-half mean) of a [L] curve."""
    curve = np.asarray(curve, dtype=float)
    n = len(curve)
    return float(curve[skip : n // 2].mean()), float(curve[(n + 1) // 2 :].mean())


def half_ratio(curve: np.ndarray, skip: int = 0) -> float:
    """Second-half mean / first-half mean (NaN when the first half's mean is 0)."""
    first, second = half_means(curve, skip)
    return second / first if first != 0 else float("nan")


def half_difference(curve: np.ndarray, skip: int = 0) -> float:
    """Second-half mean − first-half mean."""
    first, second = half_means(curve, skip)
    return second - first


def change_point(curve: np.ndarray, skip: int = 0) -> int:
    """The layer t (skip < t < L) that best splits ``curve[skip:]`` into a low segment before t and a high one from
    t on (the largest mean(after) − mean(before)). A sign change located this way is the sustained one, not the
    last of several crossings of zero by noise."""
    curve = np.asarray(curve, dtype=float)
    scores = [curve[t:].mean() - curve[skip:t].mean() for t in range(skip + 1, len(curve))]
    return skip + 1 + int(np.argmax(scores))


def sign_change_margin(curve: np.ndarray, skip: int = 0) -> float:
    """min(−mean before, mean after) around :func:`change_point`: > 0 exactly when the curve is negative on average
    before its change point and positive after it."""
    curve = np.asarray(curve, dtype=float)
    t = change_point(curve, skip)
    return float(min(-curve[skip:t].mean(), curve[t:].mean()))
