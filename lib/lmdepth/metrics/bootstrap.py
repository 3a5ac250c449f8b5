"""The percentile bootstrap: the one resampler behind every interval over units in the book
(book/method.md#method-intervals). Pure numpy.

* :func:`resample` draws the unit indices of all resamples at once — of one sample, or stratified: every group
  resampled within itself;
* :func:`draws` evaluates a statistic on each resample, the same rows of several arrays taken together (paired
  values stay paired), one resample at a time or on all at once (``vectorised``); with ``columns`` it resamples a
  second level too — columns that are replicates of one quantity (a run's training seeds) within their group, or
  one draw shared by all groups where the replicates are matched — and the statistic sees each group's mean
  (:func:`replicate_means`);
* :func:`percentile_interval` reads the interval off the draws.

Drawing all indices in one call moves no draw: numpy's bounded int64 draws take 32-bit words from the bit
generator, which keeps a spare word between calls, so ``rng.integers(0, n, (B, n))`` is the stream of ``B`` calls
``rng.integers(0, n, n)``, and stratified rows are the stream of per-group calls, row by row and group by group
(tests/test_bootstrap.py checks both).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

#: The quantiles of a 95 % interval as chapters 03, 05 and 07 compute them.
TAILS = (0.025, 0.975)


def tails(level: float) -> tuple[float, float]:
    """The quantiles ((1 − level)/2, 1 − (1 − level)/2) of a central ``level`` interval, as the verdicts and the
    residual means compute them. For 0.95 the lower one rounds to 0.025000000000000022, not to ``TAILS[0]``: both
    forms stay so that no stored interval moves (they differ by 2e-17 in probability)."""
    low = (1 - level) / 2
    return low, 1 - low


def as_generator(seed: int | np.random.Generator) -> np.random.Generator:
    """A seed → its own generator; a generator is used as is (several bootstraps sharing one stream)."""
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def resample(sizes: int | Sequence[int], n_boot: int, seed: int | np.random.Generator = 0) -> np.ndarray:
    """Unit indices of ``n_boot`` resamples with replacement: [n_boot, N].

    Args:
        sizes: n units (indices 0…n−1, N = n), or the sizes of groups laid end to end (stratified: each row
            resamples every group within itself, keeping its size and place; N = Σ sizes).
    """
    rng = as_generator(seed)
    if np.ndim(sizes) == 0:
        return rng.integers(0, int(sizes), (n_boot, int(sizes)))
    sizes = np.asarray(sizes, dtype=np.int64)
    start = np.cumsum(sizes) - sizes
    return rng.integers(0, np.repeat(sizes, sizes), (n_boot, int(sizes.sum()))) + np.repeat(start, sizes)


def replicate_means(values: np.ndarray, columns: Sequence[int]) -> np.ndarray:
    """[units, Σ columns] → [units, len(columns)]: the mean of each group of replicate columns (groups laid end to
    end, e.g. each run's training seeds)."""
    v = np.asarray(values, dtype=float)
    sizes = np.asarray(columns, dtype=np.int64)
    if v.ndim != 2 or v.shape[1] != sizes.sum() or (sizes < 1).any():
        raise ValueError(f"replicate groups {list(sizes)} do not tile the {v.shape} values' columns")
    return np.add.reduceat(v, np.cumsum(sizes) - sizes, axis=1) / sizes


def group_sums(x: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """[N] or [N, C] → the same shape: each row's group total over equal ``keys`` [N], as pandas'
    ``groupby(keys).transform("sum")`` gives it (NaN counted as 0; NaN rows for a NaN key). In numpy because
    statistics call it once per resample, where a pandas groupby costs about a millisecond."""
    return _grouped(x, keys, mean=False)


def group_means(x: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """As :func:`group_sums`, the group means of ``transform("mean")``: NaN left out, NaN where a group has none."""
    return _grouped(x, keys, mean=True)


def _grouped(x: np.ndarray, keys: np.ndarray, mean: bool) -> np.ndarray:
    x, keys = np.asarray(x, dtype=float), np.asarray(keys, dtype=float)
    flat = x.reshape(len(x), int(np.prod(x.shape[1:], dtype=int)))  # [N, C]
    ok = ~np.isnan(keys)
    out = np.full(flat.shape, np.nan)
    names, group = np.unique(keys[ok], return_inverse=True)
    v = flat[ok]
    present = ~np.isnan(v)
    n_cols = v.shape[1]
    slot = (group.reshape(-1, 1) * n_cols + np.arange(n_cols)).ravel()  # one bincount for every (group, column)
    size = len(names) * n_cols
    total = np.bincount(slot, weights=np.where(present, v, 0.0).ravel(), minlength=size)
    if mean:
        with np.errstate(invalid="ignore", divide="ignore"):
            total = total / np.bincount(slot, weights=present.ravel().astype(float), minlength=size)
    out[ok] = total[slot].reshape(v.shape)
    return out.reshape(x.shape)


def draws(statistic: Callable[..., float | np.ndarray], arrays: Sequence[np.ndarray], n_boot: int,
          seed: int | np.random.Generator = 0, groups: Sequence[int] | None = None,
          vectorised: bool = False, columns: Sequence[int] | None = None, matched: bool = False) -> np.ndarray:
    """The statistic on ``n_boot`` resamples of the units: [n_boot, ...] (float).

    Args:
        statistic: ``statistic(*resampled)`` → a number or an array; with ``vectorised`` it gets every resample at
            once ([n_boot, N, ...] arrays) and returns [n_boot, ...].
        arrays: units on the first axis, the same N units in each; row i of every array is resampled together.
        groups: group sizes for a stratified resample (the arrays hold the groups end to end, in this order);
            None resamples all units as one sample.
        columns: a second level (2-D arrays, not ``vectorised``): the sizes of groups of replicate columns laid
            end to end; each resample also draws every group's columns with replacement within it, and the
            statistic gets the group means ([N, len(columns)], :func:`replicate_means`). The units are drawn
            first, so they are the draws of the same call without ``columns``.
        matched: replicate j of every group is the same replicate (one training seed: the runs trained with it
            see the same batches): one draw of positions serves all groups (paired), which needs groups of equal
            size.
    """
    n = len(arrays[0])
    if any(len(a) != n for a in arrays):
        raise ValueError(f"jointly resampled arrays need the same units: {[len(a) for a in arrays]} rows")
    rng = as_generator(seed)
    idx = resample(n if groups is None else groups, n_boot, rng)
    if vectorised:
        if columns is not None:
            raise ValueError("replicate columns are resampled one draw at a time (vectorised=False)")
        return np.asarray(statistic(*(a[idx] for a in arrays)), dtype=float)
    if columns is None:
        return np.array([statistic(*(a[i] for a in arrays)) for i in idx], dtype=float)
    if matched:
        size = int(columns[0])
        if any(int(c) != size for c in columns):
            raise ValueError(f"matched replicates need groups of equal size, not {list(columns)}")
        pos = resample(size, n_boot, rng)  # [n_boot, size], shared by every group
        cols = np.concatenate([pos + size * g for g in range(len(columns))], axis=1)
    else:
        cols = resample(columns, n_boot, rng)
    return np.array([statistic(*(replicate_means(a[i][:, c], columns) for a in arrays))
                     for i, c in zip(idx, cols)], dtype=float)


def percentile_interval(values: np.ndarray, q: tuple[float, float] = TAILS) -> tuple[np.ndarray, np.ndarray]:
    """(low, high): the ``q`` quantiles of bootstrap draws [n_boot, ...] over the first axis, non-finite draws
    left out (NaN where none is finite). Floats for 1-D draws, else [...] arrays."""
    v = np.asarray(values, dtype=float)
    ok = np.isfinite(v)
    if ok.all():
        lo, hi = np.quantile(v, q, axis=0)
    elif v.ndim == 1:
        lo, hi = np.quantile(v[ok], q) if ok.any() else (np.nan, np.nan)
    else:
        cols = v.reshape(len(v), -1).T
        lo, hi = np.array([percentile_interval(c, q) for c in cols]).T.reshape(2, *v.shape[1:])
    return (float(lo), float(hi)) if v.ndim == 1 else (lo, hi)
