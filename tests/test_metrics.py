import numpy as np
import pytest
import torch

from lmdepth.kernels.residual_kernels import cosine, relative_norm
from lmdepth.metrics.residual_stats import (
    RESIDUAL_METRICS,
    DatasetStats,
    PromptStats,
    residual_token_metrics,
)

pytestmark = pytest.mark.unit


def test_relative_norm_known_values():
    x = torch.tensor([[3.0, 4.0]])
    ref = torch.tensor([[0.0, 10.0]])
    assert relative_norm(x, ref).item() == pytest.approx(0.5)
    # the denominator is clamped at 1e-6 instead of dividing by zero
    assert relative_norm(x, torch.zeros(1, 2)).item() == pytest.approx(5.0 / 1e-6)


def test_cosine_known_values():
    a = torch.tensor([1.0, 0.0])
    assert cosine(a, torch.tensor([2.0, 0.0])).item() == pytest.approx(1.0)
    assert cosine(a, torch.tensor([0.0, 3.0])).item() == pytest.approx(0.0)
    assert cosine(a, torch.tensor([-1.0, -1.0])).item() == pytest.approx(-1 / np.sqrt(2))


def test_residual_token_metrics_rows_follow_their_formulas():
    h = torch.tensor([[2.0, 0.0, 0.0]])
    a = torch.tensor([[-1.0, 0.0, 0.0]])  # erases half of h
    m = torch.tensor([[0.0, 1.0, 0.0]])  # writes an orthogonal direction
    o = h + a + m
    v = dict(zip(RESIDUAL_METRICS, residual_token_metrics(h, a, m, o)[:, 0].tolist()))
    assert v["relative_contribution", "attention"] == pytest.approx(0.5)  # ||a||/||h||
    assert v["relative_contribution", "mlp"] == pytest.approx(1.0)  # ||m||/||h+a||, not ||m||/||h||
    assert v["relative_contribution", "layer"] == pytest.approx(np.sqrt(2) / 2)
    assert v["cosine", "attention"] == pytest.approx(-1.0)
    assert v["cosine", "mlp"] == pytest.approx(0.0)
    assert v["cosine", "io"] == pytest.approx(1 / np.sqrt(2))
    assert v["norm", "residual"] == pytest.approx(2.0)


def test_metrics_are_fp32_even_for_bf16_inputs():
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    assert residual_token_metrics(x, x, x, x).dtype == torch.float32


def test_triangle_inequality_bounds_the_layer_contribution():
    g = torch.Generator().manual_seed(0)
    h, a, m = (torch.randn(100, 16, generator=g) for _ in range(3))
    v = residual_token_metrics(h, a, m, h + a + m)
    r_att, r_mlp, r_layer = v[0], v[1], v[2]
    bound = r_att + r_mlp * (h + a).norm(dim=-1) / h.norm(dim=-1)
    assert (r_layer <= bound + 1e-5).all()


def test_dataset_mean_is_token_weighted_not_a_mean_of_prompt_means():
    stats = DatasetStats()
    stats.add(PromptStats.from_tokens(np.ones((1, 1, 3))))  # three tokens of value 1
    stats.add(PromptStats.from_tokens(np.zeros((1, 1, 1))))  # one token of value 0
    assert stats.mean()[0, 0] == pytest.approx(0.75)  # a mean of means would give 0.5
    assert stats.max()[0, 0] == 1.0
    assert stats.count == 4


def test_bootstrap_interval_brackets_the_mean_and_is_absent_for_one_prompt():
    rng = np.random.default_rng(0)
    stats = DatasetStats()
    for _ in range(20):
        stats.add(PromptStats.from_tokens(rng.normal(1.0, 0.5, size=(2, 3, 40))))
    lo, hi = stats.bootstrap_mean_ci(n_boot=300)
    assert (lo <= stats.mean()).all() and (stats.mean() <= hi).all() and (hi - lo > 0).all()
    one = DatasetStats([PromptStats.from_tokens(np.full((1, 1, 5), 2.0))])
    with pytest.warns(UserWarning, match="One prompt"):
        lo1, hi1 = one.bootstrap_mean_ci(n_boot=10)
    assert np.isnan(lo1[0, 0]) and np.isnan(hi1[0, 0])  # one prompt says nothing about the spread


@pytest.mark.unit
def test_exact_match_against_the_constant_answer():
    from lmdepth.metrics.intervals import exact_match, wilson_interval

    em = exact_match([1] * 9 + [0], list("0123456789"))
    assert (em.n, em.correct, em.accuracy, em.baseline) == (10, 9, 0.9, 0.1)
    assert (em.ci_low, em.ci_high) == wilson_interval(9, 10) and em.above
    assert not exact_match([1, 0, 0, 0], ["7", "7", "7", "1"]).above  # 25 % vs a constant "7" at 75 %
