"""Pure statistics of one per-layer curve (a value per layer, e.g. a mean relative contribution or cosine).

Halves, the book's one rule (:func:`half_layers`): the first half is layers ``[skip, L // 2)``, the second
``[(L + 1) // 2, L)`` — the middle layer of an odd L goes to neither. ``skip`` leaves the first layers out of the
first half (the book's convention for verdicts: :data:`lmdepth.claims.spec.EARLY_LAYERS`).
"""

from __future__ import annotations

import numpy as np


def half_layers(n_layers: int, skip: int = 0, stop: int | None = None) -> tuple[slice, slice]:
    """(first half, second half) of ``n_layers`` layers as slices: ``[skip, L // 2)`` and ``[(L + 1) // 2, stop)``
    (``stop`` defaults to L; a curve whose last layer is 0 by construction ends the second half before it)."""
    return slice(skip, n_layers // 2), slice((n_layers + 1) // 2, n_layers if stop is None else stop)


def half_means(curve: np.ndarray, skip: int = 0) -> tuple[float, float]:
    """(first-half mean, second-half mean) of a [L] curve."""
    curve = np.asarray(curve, dtype=float)
    first, second = half_layers(len(curve), skip)
    return float(curve[first].mean()), float(curve[second].mean())


def half_ratio(curve: np.ndarray, skip: int = 0) -> float:
    """Second-half mean / first-half mean (NaN when the first half's mean is 0)."""
    first, second = half_means(curve, skip)
    return second / first if first != 0 else float("nan")


def half_difference(curve: np.ndarray, skip: int = 0) -> float:
    """Second-half mean − first-half mean."""
    first, second = half_means(curve, skip)
    return second - first


def min_segment(n_layers: int, skip: int = 0) -> int:
    """The shortest segment :func:`change_point` allows on either side: max(2, an eighth of the layers searched),
    so that one extreme layer at either end cannot be a 'segment' of its own."""
    return max(2, (n_layers - skip) // 8)


def change_point(curve: np.ndarray, skip: int = 0) -> int:
    """The layer t at which ``curve[skip:]`` best changes from negative to non-negative: the split with the most
    layers of the claimed sign (negative before t, non-negative from t on), ties broken by the larger difference of
    the two segments' means; each segment at least :func:`min_segment` layers long. Counting signs rather than
    comparing magnitudes makes the split sustained: neither the last of several crossings of zero by noise nor one
    extreme layer at either end can move it."""
    curve = np.asarray(curve, dtype=float)
    m = min_segment(len(curve), skip)
    ts = list(range(skip + m, len(curve) - m + 1))
    if not ts:
        return skip + (len(curve) - skip) // 2  # too few layers for two segments: the middle
    scores = [(int((curve[skip:t] < 0).sum() + (curve[t:] >= 0).sum()), curve[t:].mean() - curve[skip:t].mean())
              for t in ts]
    return ts[max(range(len(ts)), key=lambda i: scores[i])]


def sign_change_margin(curve: np.ndarray, skip: int = 0) -> float:
    """min(−mean before, mean after) around :func:`change_point`: > 0 exactly when the curve is negative on average
    before its change point and positive after it."""
    curve = np.asarray(curve, dtype=float)
    t = change_point(curve, skip)
    return float(min(-curve[skip:t].mean(), curve[t:].mean()))
