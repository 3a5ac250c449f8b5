"""The claims registry: every registered claim reaches each of the four verdict states on hand-made per-unit tables,
controls decide by the same rule, and the findings page counts states (never "N of M agree")."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from lmdepth.analyses import residual
from lmdepth.claims import REGISTRY, for_chapter, report
from lmdepth.claims.findings import headline, saved_verdicts, state_counts, verdict_matrix
from lmdepth.metrics.layer_curves import change_point, sign_change_margin
from lmdepth.metrics.verdicts import Rule
from lmdepth.model.random_init import control_name

pytestmark = pytest.mark.unit
L = 12  # layers 0–1 early, first half 2–5, second half 6–11


def units(model: str, metric: str, curves: dict[str, callable], n: int = 20, seed: int = 0) -> pd.DataFrame:
    """A per-problem table like :func:`lmdepth.analyses.residual.units_table`: ``curves[component](rng)`` gives one
    problem's [L] values."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(n):
        tokens = int(rng.integers(50, 150))
        for comp, curve in curves.items():
            for layer, v in enumerate(curve(rng)):
                rows.append(dict(model=model, unit=f"p{p}", tokens=tokens, metric=metric, component=comp,
                                 layer=layer, value=float(v)))
    return pd.DataFrame(rows)


def halves(first: float, second: float, sd: float = 0.02, early: float = 5.0):
    """Layers 0–1 at ``early``, first half at ``first``, second half at ``second`` + per-problem noise."""
    def curve(rng):
        return np.r_[[early] * 2, [first] * 4, [second + rng.normal(0, sd)] * 6]
    return curve


def step(before: float, after: float, at: int = 6, sd: float = 0.0):
    """-ish cosines: ``before`` on layers 2…at−1, ``after`` from ``at`` on (layers 0–1 strongly positive)."""
    def curve(rng):
        e = rng.normal(0, sd)
        return np.r_[[0.5] * 2, [before + e] * (at - 2), [after + e] * (L - at)]
    return curve


def mixed_step(rng):
    """Half the problems turn positive at layer 8 (0.67 of depth), half at layer 10 (0.83): the transition's
    interval straddles 0.75."""
    at = 8 if rng.random() < 0.5 else 10
    return np.r_[[0.5] * 2, [-0.2] * (at - 2), [0.2] * (L - at)]


def rel(*args, **kw):
    c = halves(*args, **kw)
    return {"attention": c, "mlp": c, "layer": c}  # every component a chapter's claims read


SCENARIOS = {  # claim id -> state -> (metric, {component: curve})
    "norms.second_half_less": {
        "agrees": ("relative_contribution", rel(1.0, 0.3)),
        "disagrees": ("relative_contribution", rel(1.0, 1.5)),
        "inconclusive": ("relative_contribution", rel(1.0, 1.0, sd=0.5)),
    },
    "norms.sharp_drop": {
        "agrees": ("relative_contribution", rel(1.0, 0.2)),
        "disagrees": ("relative_contribution", rel(1.0, 0.9)),
        "inconclusive": ("relative_contribution", rel(1.0, 0.5, sd=0.5)),
    },
    "norms.attention_drops_most": {
        "agrees": ("relative_contribution", {"attention": halves(1.0, 0.3), "mlp": halves(1.0, 0.8),
                                                "layer": halves(1.0, 0.5)}),
        "disagrees": ("relative_contribution", {"attention": halves(1.0, 0.9), "mlp": halves(1.0, 0.3),
                                                   "layer": halves(1.0, 0.5)}),
        "inconclusive": ("relative_contribution", {"attention": halves(1.0, 0.6, sd=0.6),
                                                   "mlp": halves(1.0, 0.6), "layer": halves(1.0, 0.5)}),
    },
    "cosine.sign_change": {c: ("cosine", {k: s for k in ("attention", "mlp", "layer")}) for c, s in {
        "agrees": step(-0.2, 0.2), "disagrees": step(0.1, 0.3), "inconclusive": step(-0.01, 0.01, sd=0.2)}.items()},
    "cosine.mid_depth": {c: ("cosine", {k: s for k in ("attention", "mlp", "layer")}) for c, s in {
        "agrees": step(-0.2, 0.2, at=6), "disagrees": step(-0.2, 0.2, at=11), "inconclusive": mixed_step}.items()},
    "cosine.second_half_reinforces": {
        c: ("cosine", {k: s for k in ("attention", "mlp", "layer")}) for c, s in {
            "agrees": halves(-0.1, 0.2, early=0.5), "disagrees": halves(0.2, -0.1, early=0.5),
            "inconclusive": halves(0.0, 0.0, sd=0.3, early=0.5)}.items()
    },
}


def verdict_of(claim_id: str, table: pd.DataFrame, model: str = "m") -> pd.Series:
    return report.check(REGISTRY[claim_id].chapter, table, [model]).set_index("claim_id").loc[claim_id]


def test_every_registered_claim_has_a_scenario_rule_and_control():
    assert set(SCENARIOS) == set(REGISTRY)
    for spec in REGISTRY.values():
        assert spec.control and spec.statistic and spec.unit and isinstance(spec.rule, Rule)
        assert spec.id.startswith(spec.chapter + ".")


@pytest.mark.parametrize("claim_id", sorted(SCENARIOS))
@pytest.mark.parametrize("state", ["agrees", "disagrees", "inconclusive"])
def test_each_claim_reaches_each_decided_state(claim_id, state):
    metric, curves = SCENARIOS[claim_id][state]
    row = verdict_of(claim_id, units("m", metric, curves))
    assert row.state == state, (row.estimate, row.ci_low, row.ci_high, row.reason)
    assert row.n == 20 and np.isfinite(row.ci_low) and np.isfinite(row.ci_high)


@pytest.mark.parametrize("claim_id", sorted(SCENARIOS))
def test_each_claim_is_not_testable_below_ten_problems(claim_id):
    metric, curves = SCENARIOS[claim_id]["agrees"]
    row = verdict_of(claim_id, units("m", metric, curves, n=9))
    assert row.state == "not testable" and ("9 units" in row.reason or "needs" in row.reason)


def test_a_transition_depth_needs_a_sign_change():
    metric, curves = SCENARIOS["cosine.sign_change"]["disagrees"]
    row = verdict_of("cosine.mid_depth", units("m", metric, curves))
    assert row.state == "not testable" and "sustained sign change" not in row.reason and "cosine.sign_change" in row.reason


def test_a_control_with_the_same_verdict_is_counted_as_non_discriminating():
    metric, curves = SCENARIOS["norms.second_half_less"]["agrees"]
    real = units("m", metric, curves)
    same = units(control_name("m"), metric, curves, seed=1)
    other = units(control_name("m"), metric, SCENARIOS["norms.second_half_less"]["disagrees"][1], seed=1)
    a = report.check("norms", real, ["m"], same).set_index("claim_id").loc["norms.second_half_less"]
    b = report.check("norms", real, ["m"], other).set_index("claim_id").loc["norms.second_half_less"]
    assert (a.state, a.control_state, a.counted_as) == ("agrees", "agrees", "non-discriminating")
    assert (b.state, b.control_state, b.counted_as) == ("agrees", "disagrees", "agrees")


def test_the_statistic_on_all_problems_is_the_published_token_weighted_mean():
    """The per-problem table re-weighted by tokens gives exactly the curve the chapter's main table shows."""
    metric, curves = SCENARIOS["norms.second_half_less"]["agrees"]
    t = units("m", metric, curves)
    w = t[t.component == "layer"].assign(s=lambda d: d.value * d.tokens).groupby("layer")
    curve = (w["s"].sum() / w["tokens"].sum()).to_numpy()
    expected = curve[6:].mean() / curve[2:6].mean()
    assert verdict_of("norms.second_half_less", t).estimate == pytest.approx(expected, rel=1e-12)


def test_a_late_noise_crossing_is_not_the_transition():
    """The old definition (last crossing from < 0 to ≥ 0) picked the last of several noise crossings."""
    curve = np.r_[0.5, 0.4, [-0.2] * 8, [0.15] * 10, -0.01, 0.01, 0.12, 0.1, -0.02, 0.01, 0.1, 0.1]
    assert change_point(curve, 2) == 10 and sign_change_margin(curve, 2) > 0
    table = pd.DataFrame([dict(model="m", metric="cosine", component=c, stat="mean", layer=i, value=v)
                          for c in ("attention", "mlp", "layer") for i, v in enumerate(curve)])
    assert residual.cosine_transition_layer(table, "m") == 10
    flat = table.assign(value=0.1)
    assert residual.cosine_transition_layer(flat, "m") is None  # no sign change at all


def test_findings_count_states_and_read_only_registered_claims(tmp_path):
    metric, curves = SCENARIOS["norms.second_half_less"]["agrees"]
    v = report.check("norms", units("m", metric, curves), ["m"], units(control_name("m"), metric, curves, seed=2))
    record = tmp_path / "book" / "default" / "norms" / "verdicts"
    record.mkdir(parents=True)
    v.to_csv(record / "m.csv", index=False)
    stale = v.iloc[:1].assign(claim_id="norms.retired_claim")
    stale.to_csv(record / "old.csv", index=False)
    saved = saved_verdicts(tmp_path, "default")
    assert set(saved.claim_id) == {s.id for s in for_chapter("norms")}
    counts = state_counts(saved).set_index("model")
    assert counts.loc["all models"].sum() == len(for_chapter("norms"))
    assert counts.loc["m", "non-discriminating"] == 2  # 'second half less' and 'sharp' agree for both
    text = headline(saved)
    assert "non-discriminating" in text and " of " not in text
    matrix = verdict_matrix(saved, ["m"])
    assert matrix.shape[0] == 3 and all("n = 20" in c for c in matrix["m"])
