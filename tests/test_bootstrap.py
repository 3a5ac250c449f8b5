"""The one percentile bootstrap (lmdepth.metrics.bootstrap), the one halves rule and the one relative change."""

import numpy as np
import pandas as pd
import pytest
import torch

from lmdepth.kernels.residual_kernels import relative_norm
from lmdepth.metrics.bootstrap import (
    TAILS,
    draws,
    group_means,
    group_sums,
    percentile_interval,
    replicate_means,
    resample,
    tails,
)
from lmdepth.metrics.layer_curves import half_layers, half_means

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("n", [1, 2, 7, 20, 33])
def test_one_call_draws_the_stream_of_one_call_per_resample(n):
    """Stored intervals were computed both ways; batching must not move a draw (odd n included)."""
    rng = np.random.default_rng(5)
    one_by_one = np.stack([rng.integers(0, n, n) for _ in range(40)])
    assert np.array_equal(resample(n, 40, 5), one_by_one)


def test_stratified_rows_are_the_stream_of_per_group_calls_and_stay_within_their_group():
    sizes = [3, 1, 5, 2]
    groups = np.split(np.arange(sum(sizes)), np.cumsum(sizes)[:-1])
    rng = np.random.default_rng(9)
    per_group = np.stack([np.concatenate([g[rng.integers(0, len(g), len(g))] for g in groups]) for _ in range(60)])
    idx = resample(sizes, 60, 9)
    assert np.array_equal(idx, per_group)
    label = np.repeat(np.arange(len(sizes)), sizes)
    assert (label[idx] == label).all()  # every slot keeps a unit of its own group
    assert all(set(idx[:, g].ravel()) == set(g) for g in groups)  # and draws all of it, over 60 resamples


def test_a_shared_generator_continues_across_bootstraps():
    """group_statistics resamples its groups one after another from one stream."""
    rng = np.random.default_rng(3)
    a, b = resample(4, 10, rng), resample(6, 10, rng)
    ref = np.random.default_rng(3)
    assert np.array_equal(a, ref.integers(0, 4, (10, 4))) and np.array_equal(b, ref.integers(0, 6, (10, 6)))


def test_jointly_resampled_arrays_share_their_unit_indices():
    a = np.arange(15.0)
    b = np.column_stack([10 * a, -a])
    same = draws(lambda x, y: float((y[:, 0] == 10 * x).all() and (y[:, 1] == -x).all()), (a, b), 200, 1)
    assert (same == 1).all()
    with pytest.raises(ValueError, match="same units"):
        draws(np.mean, (a, a[:3]), 10)


def test_vectorised_and_per_resample_statistics_agree():
    x = np.random.default_rng(0).normal(size=25)
    per = draws(np.mean, (x,), 300, 4)
    vec = draws(lambda v: v.mean(1), (x,), 300, 4, vectorised=True)
    assert per.shape == vec.shape == (300,) and np.allclose(per, vec, rtol=0, atol=1e-14)


def test_replicate_columns_are_a_second_level_of_the_resample():
    """Columns that are replicates (a run's training seeds): identical replicates give exactly the one-level draws
    on their means (the units are drawn first); replicates that disagree widen the interval by their spread."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 2))
    same = np.repeat(x, [3, 2], axis=1)  # run 0 with 3 identical seeds, run 1 with 2
    gap = lambda v: float(v[:, 1].mean() - v[:, 0].mean())  # noqa: E731
    assert np.allclose(replicate_means(same, [3, 2]), x, rtol=0, atol=1e-15)
    assert np.allclose(draws(gap, (same,), 300, 5, columns=[3, 2]), draws(gap, (x,), 300, 5), rtol=0, atol=1e-14)
    spread = same + np.array([[-1.0, 0.0, 1.0, 0.0, 0.0]])  # run 0's seeds at −1, 0, +1 around the same values
    one = percentile_interval(draws(gap, (replicate_means(spread, [3, 2]),), 1000, 5))
    two = percentile_interval(draws(gap, (spread,), 1000, 5, columns=[3, 2]))
    assert two[1] - two[0] > 1.5 * (one[1] - one[0])
    # a resample draws each run's seeds within the run: run 1's two columns never mix with run 0's three
    marks = np.tile(np.array([0.0, 0.0, 0.0, 1.0, 1.0]), (10, 1))
    assert (draws(lambda v: float(v[:, 1].min() - v[:, 0].max()), (marks,), 200, 0, columns=[3, 2]) == 1).all()
    with pytest.raises(ValueError, match="do not tile"):
        replicate_means(same, [3, 3])
    with pytest.raises(ValueError, match="one draw at a time"):
        draws(gap, (same,), 10, 0, vectorised=True, columns=[3, 2])


def test_matched_replicates_share_one_draw_across_groups():
    """Seeds matched across runs (seed j of every run): one draw of positions for all groups, so the runs' drawn
    seeds always coincide; unmatched, they coincide only by chance."""
    labels = np.tile(np.array([0.0, 10.0, 100.0]), (6, 2))  # two runs, seeds labelled 0, 10, 100 in each
    same_seeds = lambda v: float(v[0, 0] == v[0, 1])  # noqa: E731  (each run's mean of its drawn seeds' labels)
    assert (draws(same_seeds, (labels,), 300, 2, columns=[3, 3], matched=True) == 1).all()
    assert (draws(same_seeds, (labels,), 300, 2, columns=[3, 3]) == 1).mean() < 0.5
    with pytest.raises(ValueError, match="equal size"):
        draws(same_seeds, (labels[:, :5],), 10, 0, columns=[3, 2], matched=True)


def test_known_interval_of_a_proportion():
    """The bootstrap of the mean of 30 ones and 70 zeros is Binomial(100, 0.3) / 100: its central 95 % is about
    [0.21, 0.39]."""
    x = np.r_[np.ones(30), np.zeros(70)]
    lo, hi = percentile_interval(draws(lambda v: v.mean(1), (x,), 4000, 0, vectorised=True))
    assert lo == pytest.approx(0.21, abs=0.015) and hi == pytest.approx(0.39, abs=0.015)
    assert percentile_interval(np.arange(1001.0)) == (25.0, 975.0)


def test_percentile_interval_leaves_out_undefined_draws():
    v = np.r_[np.arange(101.0), np.nan, np.inf]
    assert percentile_interval(v) == percentile_interval(np.arange(101.0))
    assert np.isnan(percentile_interval(np.full(5, np.nan))).all()
    cols = np.column_stack([np.arange(101.0), np.r_[np.arange(100.0), np.nan]])
    lo, _ = percentile_interval(cols)
    assert lo[0] == 2.5 and lo[1] == pytest.approx(np.quantile(np.arange(100.0), TAILS[0]))


def test_the_two_forms_of_a_95_percent_interval():
    low, high = tails(0.95)
    assert high == TAILS[1] and low != TAILS[0] and abs(low - TAILS[0]) < 1e-16


def test_halves_of_odd_and_even_layer_counts():
    assert half_layers(6) == (slice(0, 3), slice(3, 6))
    assert half_layers(7, skip=2) == (slice(2, 3), slice(4, 7))  # the middle layer 3 goes to neither half
    assert half_layers(7, stop=6)[1] == slice(4, 6)
    assert half_means(np.arange(7.0), skip=1) == (1.5, 5.0)


def test_the_relative_change_of_the_skip_reference_is_the_relative_norm_of_the_difference():
    new, ref = torch.tensor([[3.0, 4.0], [1.0, 1.0]]), torch.tensor([[0.0, 0.0], [1.0, 0.0]])
    assert relative_norm(new - ref, ref).tolist() == pytest.approx([5.0 / 1e-6, 1.0])


@pytest.mark.parametrize("seed", range(6))
def test_group_totals_and_means_are_pandas_groupby_transform_in_numpy(seed):
    """The statistics' per-resample group reductions give what pandas' ``groupby(keys).transform`` gives, NaN
    values (left out) and NaN keys (NaN rows) included."""
    rng = np.random.default_rng(seed)
    n = 40
    keys = rng.integers(1, 6, n).astype(float)
    x = rng.normal(size=(n, 3))
    if seed % 2:
        x[rng.random((n, 3)) < 0.25] = np.nan
        keys[rng.random(n) < 0.15] = np.nan
    x[keys == 5, 0] = np.nan  # a group with no value in one column: its mean is NaN, its total 0
    means = pd.DataFrame(x).groupby(keys).transform("mean").to_numpy()
    np.testing.assert_allclose(group_means(x, keys), means, rtol=1e-12, atol=0)
    sums = pd.Series(x[:, 0]).groupby(keys).transform("sum").to_numpy()
    np.testing.assert_allclose(group_sums(x[:, 0], keys), sums, rtol=1e-12, atol=0)
    assert group_sums(x[:, 0], keys).shape == (n,) and group_means(x, keys).shape == (n, 3)
