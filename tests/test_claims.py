"""The claims registry: every registered claim reaches each of the four verdict states on hand-made per-unit tables,
controls decide by the same rule, and the findings page counts states (never "N of M agree")."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
import torch

from lmdepth.analyses import residual
from lmdepth.claims import REGISTRY, for_chapter, report
from lmdepth.claims import scratch_claims as sc
from lmdepth.claims.findings_claims import (
    headline,
    saved_verdicts,
    state_counts,
    verdict_matrices,
    verdict_matrix,
)
from lmdepth.claims.maps_claims import units_of as maps_units
from lmdepth.claims.scratch_claims import RUNS, SUBJECT, units_of
from lmdepth.claims.skipping_claims import nudge_control
from lmdepth.claims.spec import replicates
from lmdepth.data.difficulty import LEVELS
from lmdepth.metrics.effects import sustained_cutoff
from lmdepth.metrics.layer_curves import change_point, sign_change_margin
from lmdepth.metrics.verdicts import Rule, Side, decide
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
        "agrees": step(-0.2, 0.2, at=6), "disagrees": step(-0.2, 0.2, at=10), "inconclusive": mixed_step}.items()},
    "cosine.second_half_reinforces": {
        c: ("cosine", {k: s for k in ("attention", "mlp", "layer")}) for c, s in {
            "agrees": halves(-0.1, 0.2, early=0.5), "disagrees": halves(0.2, -0.1, early=0.5),
            "inconclusive": halves(0.0, 0.0, sd=0.3, early=0.5)}.items()
    },
}


def skip_units(model: str, curves: dict[tuple[str, str], callable], n: int = 20, seed: int = 0,
               variant: str = "layer") -> pd.DataFrame:
    """A per-problem table like :func:`lmdepth.analyses.skipping.units_table` of a ``floor`` run (one variant: the
    layer skip, or the nudge of a nudge control's rows): the paper's max (``later_effect``, ``output_change``) and the
    robust mean (``…_robust``). A curve given for a base metric serves both unless the robust one is given too;
    unlisted pairs get a flat 0.5."""
    rng = np.random.default_rng(seed)
    rows = []
    flat = lambda r: np.full(L, 0.5)  # noqa: E731
    for p in range(n):
        for analysis in ("current", "future"):
            for metric in ("later_effect", "output_change"):
                curve = curves.get((analysis, metric), flat)(rng)
                robust = curves[analysis, metric + "_robust"](rng) if (analysis, metric + "_robust") in curves else curve
                rows += [dict(model=model, unit=f"p{p}", analysis=analysis, variant=variant, metric=name,
                              layer=layer, value=float(v)) for name, c in ((metric, curve), (metric + "_robust", robust))
                         for layer, v in enumerate(c)]
    return pd.DataFrame(rows)


def feeds_until(last: int, level: float = 0.5):
    """Future later effect ``level`` on layers ≤ ``last``, 0.01 after (the last layer: 0, no later layer)."""
    return lambda rng: np.r_[[level] * (last + 1), [0.01] * (L - last - 2), 0.0][:L]


def mixed_feeding(rng):
    """Layers 6–8 feed forward at 0.18 in half the problems: the mean hovers around the 0.1 level, so the cutoff
    is either layer 6 or 9 (0.5 or 0.75 of depth) across resamples."""
    mid = 0.18 if rng.random() < 0.5 else 0.0
    return np.r_[[0.5] * 6, [mid] * 3, [0.01] * 2, 0.0]


SKIP = {
    "skipping.current_later_small": ("current", "later_effect", "below"),
    "skipping.current_output_changes": ("current", "output_change", "above"),
    "skipping.future_later_small": ("future", "later_effect", "below"),
}
for cid, (analysis, metric, side) in SKIP.items():
    low, high = halves(0.8, 0.2, early=0.9), halves(0.8, 0.8, early=0.9)
    SCENARIOS[cid] = {
        "agrees": ("skip", {(analysis, metric): low if side == "below" else high}),
        "disagrees": ("skip", {(analysis, metric): high if side == "below" else halves(0.8, 0.1, early=0.9)}),
        "inconclusive": ("skip", {(analysis, metric): halves(0.8, 0.4, sd=0.6, early=0.9)}),
    }
SCENARIOS["skipping.future_cutoff"] = {
    "agrees": ("skip", {("future", "later_effect"): feeds_until(4)}),
    "disagrees": ("skip", {("future", "later_effect"): feeds_until(9)}),  # 10: L−2 feeds, no cutoff (saturated)
    "inconclusive": ("skip", {("future", "later_effect"): mixed_feeding}),
}


def lens_units(model: str, curves: dict[tuple[str, str], callable], n: int = 20, seed: int = 0) -> pd.DataFrame:
    """A per-problem lens table like :func:`lmdepth.analyses.lens.units_table`, with the bigram baseline as a flat
    ``bigram`` lens (as :func:`lmdepth.analyses.bigram.with_baseline` adds it); unlisted curves are neutral."""
    neutral = {"kl": lambda r: np.linspace(5, 0.1, L), "kl_final_lens": lambda r: np.linspace(5, 0.1, L),
               "top5_overlap": lambda r: np.linspace(0, 1, L)}
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(n):
        for lens in ("logit_lens", "tuned_lens", "bigram"):
            for metric in ("kl", "kl_final_lens", "top5_overlap"):
                default = (lambda r: np.full(L, 0.3)) if lens == "bigram" else neutral[metric]
                c = curves.get((lens, metric), default)(rng)
                rows += [dict(model=model, unit=f"p{p}", lens=lens, metric=metric, layer=layer, value=float(v))
                         for layer, v in enumerate(c)]
    return pd.DataFrame(rows)


def rises_at(layer: int, low: float = 0.1, high: float = 0.9, sd: float = 0.0):
    def curve(rng):
        return np.r_[[low] * layer, [high] * (L - layer)] + rng.normal(0, sd)
    return curve


def alternating(early, late):
    """Every other problem ``early``, the rest ``late``: exactly half each in a sample of 20, so the mean of layers
    4–8 sits at the criterion's level and the settling layer (4 or 9: 0.33 or 0.75 of depth) moves across
    resamples, on both sides of mid-depth."""
    state = {"i": 0}

    def curve(rng):
        state["i"] += 1
        return (early if state["i"] % 2 else late)(rng)
    return curve


def mixed_rise(low: float, high: float, later: float):
    """Rise to ``high`` at layer 4 (early problems) or stay at ``later`` on layers 4–8 and rise at 9."""
    return alternating(lambda r: np.r_[[low] * 4, [high] * 8],
                       lambda r: np.r_[[low] * 4, [later] * 5, [high] * 3])


SCENARIOS["lens.logit_overlap_mid"] = {
    "agrees": ("lens", {("logit_lens", "top5_overlap"): rises_at(7)}),
    "disagrees": ("lens", {("logit_lens", "top5_overlap"): rises_at(3)}),
    "inconclusive": ("lens", {("logit_lens", "top5_overlap"): mixed_rise(0.0, 0.41, 0.0)}),
}
SCENARIOS["lens.logit_kl_mid"] = {
    "agrees": ("lens", {("logit_lens", "kl"): rises_at(7, 5.0, 0.1)}),
    "disagrees": ("lens", {("logit_lens", "kl"): rises_at(3, 5.0, 0.1)}),
    "inconclusive": ("lens", {("logit_lens", "kl"): mixed_rise(5.0, 0.0, 1.0)}),
}
SCENARIOS["lens.tuned_over_bigram_mid"] = {  # the bigram baseline sits at 0.3: the level is 0.5
    "agrees": ("lens", {("tuned_lens", "top5_overlap"): rises_at(7, 0.35, 0.9)}),
    "disagrees": ("lens", {("tuned_lens", "top5_overlap"): rises_at(3, 0.35, 0.9)}),
    "inconclusive": ("lens", {("tuned_lens", "top5_overlap"): mixed_rise(0.3, 0.71, 0.3)}),
}
SCENARIOS["lens.tuned_first_half_little"] = {
    "agrees": ("lens", {("tuned_lens", "kl_final_lens"): lambda r: np.r_[[4.0] * 6, [3.0] * 6] * (1 + r.normal(0, .05))}),
    "disagrees": ("lens", {("tuned_lens", "kl_final_lens"): lambda r: np.r_[[4.0] * 6, [0.5] * 6] * (1 + r.normal(0, .05))}),
    "inconclusive": ("lens", {("tuned_lens", "kl_final_lens"): lambda r: np.r_[[4.0] * 6, [2.0 + r.normal(0, 2)] * 6]}),
}


def item_units(model: str, source: str, peak, n: int = 20, seed: int = 0, correct: int = 1, tokens=None
               ) -> pd.DataFrame:
    """A per-item table like :func:`lmdepth.analyses.complexity.grid_frames`'s: ``n // 2`` items per level (at
    least 10 with the default n), each layer-effect vector a bump at layer ``peak(level, rng, i)``, its prompt
    ``tokens(level, i)`` long (default: 50–149 tokens drawn independently of the level); every item solved and every
    answer different (constant-answer baseline 1/items)."""
    rng = np.random.default_rng(seed)
    lengths = np.random.default_rng([seed, 1])  # its own stream: the peaks' draws stay as they were
    rows = []
    for level in LEVELS[source]:
        for i in range(max(n // 2, 1)):
            e = np.full(L, 0.01)
            e[int(np.clip(peak(level, rng, i), 0, L - 1))] = 1.0
            length = int(lengths.integers(50, 150)) if tokens is None else tokens(level, i)
            rows += [dict(model=model, source=source, item=f"{level}-{i}", level=level, correct=correct, n_layers=L,
                          answer=f"{level}-{i}", prompt_tokens=length, metric="layer_effect", layer=layer,
                          value=float(v))
                     for layer, v in enumerate(e)]
    return pd.DataFrame(rows)


for source in LEVELS:
    lo = min(LEVELS[source])
    SCENARIOS[f"complexity.{source}_depth_flat"] = {
        "agrees": (f"items:{source}", lambda level, rng, i: 6),
        "disagrees": (f"items:{source}", lambda level, rng, i, lo=lo: 3 + 2 * (level - lo)),
        # items spread over layers 3–9 on every level; the easiest level's sits one layer lower: a rise of
        # 1/12 ≈ 0.08 of depth on 10 items per level, which the interval cannot separate from 0.05
        "inconclusive": (f"items:{source}", lambda level, rng, i, lo=lo:
                         [3, 4, 5, 6, 6, 6, 6, 7, 8, 9][i % 10] - (level == lo)),
    }


def eval_units(extrapolate: dict[str, tuple[float, float]], n: int = 20, seed: int = 0,
               interpolate_acc: float = 1.0, seeds: tuple[int, ...] = (0, 1, 2),
               lr: dict[str, float] | None = None) -> pd.DataFrame:
    """A per-problem evaluation like :func:`lmdepth.analyses.scratch.evaluate_runs` of the four runs, each trained
    with ``seeds``, as :func:`lmdepth.claims.scratch_claims.units_of` labels it: on extrapolation each run solves a
    problem with probability ``extrapolate[run][0]`` and has answer loss ``extrapolate[run][1]`` ± 0.3; on
    interpolation every run solves ``interpolate_acc`` of the problems, whose answers all differ (constant-answer
    baseline 1/n); learning rate 1e-3 unless ``lr`` says otherwise per run."""
    rng = np.random.default_rng(seed)
    rows = []
    for run in RUNS:
        p_ok, nll = extrapolate.get(run, (0.5, 1.0))
        for train_seed in seeds:
            for split, acc in (("interpolate", interpolate_acc), ("extrapolate", p_ok)):
                for i in range(n):
                    rows.append(dict(run=run, split=split, answer=f"{split}{i}", correct=int(rng.random() < acc),
                                     answer_nll=float(nll + rng.normal(0, 0.3)), train_seed=train_seed,
                                     lr=(lr or {}).get(run, 1e-3)))
    return units_of(pd.DataFrame(rows))


def map_units(error, n_src: int = 12, n_tgt: int = 24, model: str = "m", seed: int = 0):
    """A main map A → B as :func:`lmdepth.analyses.maps.map_table` writes it (relative errors only), with
    ``error(m, l, rng)`` the held-out error from source boundary m to target boundary l; returns the per-boundary
    table and its absolute-index control (:func:`lmdepth.claims.maps_claims.units_of`)."""
    rng = np.random.default_rng(seed)
    rows = [dict(map=model, metric="relative_error", source_layer=m, target_layer=l, n_source_layers=n_src,
                 n_target_layers=n_tgt, value=float(error(m, l, rng)))
            for l in range(n_tgt + 1) for m in range(n_src + 1)]
    return maps_units(pd.DataFrame(rows), [model])


def relative_line(m, l, rng, n_src=12, n_tgt=24):
    return 0.1 + abs(m / n_src - l / n_tgt) + rng.normal(0, 0.01)


def index_line(m, l, rng, n_src=12):
    return 0.1 + abs(m - min(l, n_src)) / n_src + rng.normal(0, 0.01)


def alternating_offset(m, l, rng, n_src=12, n_tgt=24):
    """Best source on the relative line for even l, 0.2 of depth above it for odd l: mean offset ≈ 0.1."""
    return relative_line(m - (0.2 * n_src if l % 2 else 0), l, rng)


SCENARIOS["maps.relative_beats_absolute"] = {
    "agrees": ("maps", relative_line), "disagrees": ("maps", index_line),
    "inconclusive": ("maps", lambda m, l, rng: 0.5 + rng.normal(0, 0.05))}
SCENARIOS["maps.best_near_equal_depth"] = {
    "agrees": ("maps", relative_line), "disagrees": ("maps", index_line), "inconclusive": ("maps", alternating_offset)}


def table_for(metric: str, curves, n: int = 20, model: str = "m", seed: int = 0) -> pd.DataFrame:
    if metric == "maps":
        return map_units(curves, n_tgt=n + 4 if n >= 10 else n, model=model, seed=seed)[0]  # boundaries 2…n+4
    if metric == "runs":  # five training seeds: the fewest a seed-level test can decide with (p ≥ 1/32)
        return eval_units(curves, 5 * n if n >= 10 else n, seed, seeds=FIVE_SEEDS)  # 100 problems per seed
    if metric == "depth":
        return depth_units(curves, n, seed)
    if metric.startswith("items:"):
        return item_units(model, metric.split(":")[1], curves, n, seed)
    if metric == "lens":
        return lens_units(model, curves, n, seed)
    return skip_units(model, curves, n, seed) if metric == "skip" else units(model, metric, curves, n, seed)


MO, MA, TO, TA = "moeut-lm", "moeut-answer_only", "transformer-lm", "transformer-answer_only"
FIVE_SEEDS = (0, 1, 2, 3, 4)
#: The row each depth claim is asked of (:func:`verdict_of`).
DEPTH_MODEL = {"moeut.depth_grows": "MoEUT, question not modelled", "moeut.finetuned_flat": sc.FINETUNED,
               "moeut.chain_depth_grows": sc.CHAIN_RECIPE}


def depth_units(curves: dict[str, callable], n: int = 20, seed: int = 0, seeds=FIVE_SEEDS,
                solved: callable = lambda run, sd, ops, i: True) -> pd.DataFrame:
    """A depth table like :func:`lmdepth.claims.scratch_claims.depth_units_of`: for each run in ``curves``
    (``curves[run](ops, training seed, rng)`` gives one problem's relative depth, used for the depth score and the
    erasure depth), ``n`` problems per number of operations 2–6 (2–4 interpolate, 5–6 extrapolate), every seed
    competent on interpolation; with ``n`` < 10, ``n`` problems in all (at 2 and 3 operations). ``solved`` says
    which (run, seed, problem) is solved."""
    rng = np.random.default_rng(seed)
    ops_of = [k for k in range(2, 7) for _ in range(n)] if n >= 10 else [2 + (i >= 5) for i in range(n)]
    labels = {r: lab for lab, r in sc.RECIPES.items()} | {sc.FINETUNED_RUN: sc.FINETUNED, sc.CHAIN_RUN: sc.CHAIN_RECIPE}
    rows = []
    for run, f in curves.items():
        for sd in seeds:
            for i, ops in enumerate(ops_of):
                d = float(f(ops, sd, rng, i) if getattr(f, "per_problem", False) else f(ops, sd, rng))
                rows.append(dict(run=run, model=labels.get(run, run), train_seed=sd, unit=i, n_operations=ops,
                                 split="interpolate" if ops <= 4 else "extrapolate", question=f"q{i}",
                                 depth_layer=d, depth_answer=d, erasure_depth=d, solved=bool(solved(run, sd, ops, i)),
                                 lr=1e-3, path=f"{run}/{sd}", interpolation_em=1.0))
    return pd.DataFrame(rows)


def grows(slope, noise=0.01):
    return lambda ops, sd, rng: 0.3 + slope * ops + rng.normal(0, noise)


def seed_dependent(slopes, base=0.4, at=4):
    """Each training seed its own slope (``slopes[seed]``): the seeds disagree."""
    return lambda ops, sd, rng: base + slopes[sd] * (ops - at) + rng.normal(0, 0.005)


def level(value, noise=0.01):
    return lambda ops, sd, rng: value + rng.normal(0, noise)


SCENARIOS["moeut.depth_grows"] = {  # a flat row lies below δ: 'disagrees' (a rise of 0 is not a rise of δ)
    "agrees": ("depth", {MA: grows(3 * sc.DEPTH_DELTA)}), "disagrees": ("depth", {MA: grows(0.0)}),
    "inconclusive": ("depth", {MA: seed_dependent([sc.DEPTH_DELTA + d for d in (0.03, -0.03, 0.03, -0.03, 0)])})}
SCENARIOS["moeut.chain_depth_grows"] = {k: ("depth", {sc.CHAIN_RUN: next(iter(v[1].values()))})
                                        for k, v in SCENARIOS["moeut.depth_grows"].items()}
SCENARIOS["moeut.finetuned_flat"] = {
    "agrees": ("depth", {sc.FINETUNED_RUN: grows(0.0, 0.002)}),
    "disagrees": ("depth", {sc.FINETUNED_RUN: grows(0.05)}),
    "inconclusive": ("depth", {sc.FINETUNED_RUN: seed_dependent([sc.FT_MARGIN + d for d in (0.03, -0.03, 0.03, -0.03, 0)])})}
#: The untrained twins of the pair, alike (no gap before training): the pair rows count what training adds.
TWINS = {sc.UNTRAINED["moeut"]: level(0.5), sc.UNTRAINED["transformer"]: level(0.5)}
for _claim in ("moeut.deeper_than_transformer", "moeut.deeper_erasure"):
    SCENARIOS[_claim] = {
        "agrees": ("depth", {MA: level(0.6), TA: level(0.4), **TWINS}),
        "disagrees": ("depth", {MA: level(0.4), TA: level(0.6), **TWINS}),
        "inconclusive": ("depth", {MA: lambda ops, sd, rng: 0.5 + (0.1 if sd % 2 else -0.1) + rng.normal(0, 0.01),
                                   TA: level(0.5), **TWINS})}
def own_depth(spread, noise=0.01):
    """Each problem its own depth (the same in every seed, ``spread`` across problems), plus seed noise."""
    def f(ops, sd, rng, i):
        return 0.5 + spread * np.random.default_rng(1000 + i).normal() + rng.normal(0, noise)
    f.per_problem = True
    return f


SCENARIOS["moeut.input_dependent"] = {  # seed noise alone (level(0.5, 0.1)) is no input-dependence
    "agrees": ("depth", {MA: own_depth(0.1), TA: level(0.5, 0.1), **TWINS}),
    "disagrees": ("depth", {MA: level(0.5, 0.1), TA: own_depth(0.1), **TWINS}),
    "inconclusive": ("depth", {MA: own_depth(0.05), TA: own_depth(0.05), **TWINS})}
SCENARIOS["moeut.exact_match_gain"] = {
    "agrees": ("runs", {MO: (0.3, 1), MA: (0.7, 1)}), "disagrees": ("runs", {MO: (0.7, 1), MA: (0.3, 1)}),
    "inconclusive": ("runs", {MO: (0.5, 1), MA: (0.48, 1)})}
SCENARIOS["moeut.exact_match_gain_vs_transformer"] = {
    "agrees": ("runs", {MO: (0.2, 1), MA: (0.8, 1), TO: (0.5, 1), TA: (0.5, 1)}),
    "disagrees": ("runs", {MO: (0.5, 1), MA: (0.5, 1), TO: (0.2, 1), TA: (0.8, 1)}),
    "inconclusive": ("runs", {MO: (0.5, 1), MA: (0.5, 1), TO: (0.45, 1), TA: (0.55, 1)})}
SCENARIOS["moeut.answer_loss_gain"] = {
    "agrees": ("runs", {MO: (0.5, 1.5), MA: (0.5, 1.0)}), "disagrees": ("runs", {MO: (0.5, 1.0), MA: (0.5, 1.5)}),
    "inconclusive": ("runs", {MO: (0.5, 1.0), MA: (0.5, 1.0)})}
SCENARIOS["moeut.answer_loss_gain_vs_transformer"] = {
    "agrees": ("runs", {MO: (0.5, 1.5), MA: (0.5, 1.0)}), "disagrees": ("runs", {TO: (0.5, 1.5), TA: (0.5, 1.0)}),
    "inconclusive": ("runs", {})}


def verdict_of(claim_id: str, table: pd.DataFrame, model: str = "m") -> pd.Series:
    model = DEPTH_MODEL.get(claim_id, SUBJECT) if claim_id.startswith("moeut.") else model
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
    row = verdict_of(claim_id, table_for(metric, curves))
    assert row.state == state, (row.estimate, row.ci_low, row.ci_high, row.reason)
    assert row.n >= 20 and np.isfinite(row.ci_low) and np.isfinite(row.ci_high)


@pytest.mark.parametrize("claim_id", sorted(SCENARIOS))
def test_each_claim_is_not_testable_below_ten_problems(claim_id):
    metric, curves = SCENARIOS[claim_id]["agrees"]
    row = verdict_of(claim_id, table_for(metric, curves, n=9))
    assert row.state == "not testable" and any(w in row.reason for w in ("units, at least 10", "needs", "4 items on level"))
    assert not row.headline  # shown, but a sample this small is not counted on the findings page
    assert verdict_of(claim_id, table_for(metric, curves)).headline == REGISTRY[claim_id].headline


def test_a_transition_depth_needs_a_sign_change():
    metric, curves = SCENARIOS["cosine.sign_change"]["disagrees"]
    row = verdict_of("cosine.mid_depth", units("m", metric, curves))
    assert row.state == "not testable" and "sustained sign change" not in row.reason and "cosine.sign_change" in row.reason


def test_a_control_without_the_required_pattern_is_no_valid_control_and_nothing_is_counted_twice():
    """A twin with no sign change has no depth of it: the transition-depth row has nothing to compare the model's
    depth with, so it is shown and not counted (the sign change itself counts once, on its own row)."""
    metric, curves = SCENARIOS["cosine.mid_depth"]["agrees"]
    _, flat = SCENARIOS["cosine.sign_change"]["disagrees"]  # cosines rise but never change sign
    rows = report.check("cosine", units("m", metric, curves), ["m"],
                        units(control_name("m"), metric, flat, seed=1)).set_index("claim_id")
    sign, depth = rows.loc["cosine.sign_change"], rows.loc["cosine.mid_depth"]
    assert sign.paired_low > 0 and sign.counted_as == "agrees"  # the pattern beats its control, counted once
    assert (depth.state, depth.control_state) == ("agrees", "not testable")
    assert not depth.control_valid and depth.counted_as == "no valid control"
    assert "lacks the pattern" in depth.control_note and not np.isfinite(depth.paired_low)
    # in the chapter's table the quoted claim id wraps (it set the column's least width past the text column),
    # and reads the same once the zero-width spaces are dropped; the saved row keeps the plain id
    cell = report.display(rows.reset_index()).set_index(rows.index).loc["cosine.mid_depth", "discrimination"]
    assert "'cosine.\u200bsign_\u200bchange'" in cell and cell.replace("\u200b", "") == report.control_cell(depth)
    assert max(map(len, cell.replace("\u200b", " ").split())) < len("('cosine.sign_change'),")
    assert "\u200b" not in depth.control_note


def test_the_registry_commit_is_the_last_change_of_criteria_not_of_their_presentation(tmp_path):
    import subprocess

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    claims = tmp_path / "lib" / "lmdepth" / "claims"
    claims.mkdir(parents=True)
    git("init", "-q")
    (claims / "spec.py").write_text("THRESHOLD = 0.5\n")
    git("add", "-A"); git("commit", "-qm", "criteria")
    criteria = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tmp_path, capture_output=True,
                              text=True).stdout.strip()
    (claims / "findings_claims.py").write_text("LINKS = True\n")  # the findings page's tables: decides nothing
    git("add", "-A"); git("commit", "-qm", "presentation")
    assert report.registry_commit(tmp_path).startswith(criteria + " (")
    (claims / "spec.py").write_text("THRESHOLD = 0.6\n")
    assert report.registry_commit(tmp_path).endswith(", with uncommitted changes")
    git("add", "-A"); git("commit", "-qm", "criteria again")
    assert not report.registry_commit(tmp_path).startswith(criteria)
    latest = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tmp_path, capture_output=True,
                            text=True).stdout.strip()
    assert report.registry_commit(tmp_path).startswith(latest + " (")
    assert report.registry_commit(claims).startswith(latest + " (")  # the same from inside the checkout
    (claims / "findings_claims.py").write_text("LINKS = False\n")  # uncommitted, and only the presentation
    assert not report.registry_commit(tmp_path).endswith("uncommitted changes")


def test_a_comparison_built_into_the_statistic_shows_its_interval_as_the_paired_one():
    """relative − absolute-index error on the same target boundaries is itself a paired difference: its interval is
    the row's paired interval, and the row discriminates only when it excludes 0."""
    for scenario, counted in (("agrees", "agrees"), ("inconclusive", "not discriminating")):
        row = verdict_of("maps.relative_beats_absolute", table_for("maps", SCENARIOS["maps.relative_beats_absolute"][scenario][1]))
        assert (row.paired_diff, row.paired_low, row.paired_high) == (row.estimate, row.ci_low, row.ci_high)
        assert row.control_kind == "built into the statistic" and row.counted_as == counted, (row.state, row.counted_as)


def test_discrimination_is_paired_not_a_match_of_states():
    """A control drawn like the model is not distinguishable; one in the same state ('agrees') but with a smaller
    drop is (the paired interval of real − control excludes 0), and the row says on which side the model lies."""
    metric, curves = SCENARIOS["norms.second_half_less"]["agrees"]  # ratio 0.3
    real = units("m", metric, curves)
    same = units(control_name("m"), metric, curves, seed=1)
    weaker = units(control_name("m"), metric, rel(1.0, 0.6), seed=1)  # also 'agrees' (0.6 < 1), drops less
    stronger = units(control_name("m"), metric, rel(1.0, 0.1), seed=1)
    a = report.check("norms", real, ["m"], same).set_index("claim_id").loc["norms.second_half_less"]
    b = report.check("norms", real, ["m"], weaker).set_index("claim_id").loc["norms.second_half_less"]
    c = report.check("norms", real, ["m"], stronger).set_index("claim_id").loc["norms.second_half_less"]
    assert (a.state, a.control_state, a.counted_as) == ("agrees", "agrees", "not discriminating")
    assert a.paired_low < 0 < a.paired_high
    assert (b.state, b.control_state, b.counted_as) == ("agrees", "agrees", "agrees")
    assert b.paired_high < 0 and b.side == Side.BEYOND
    # the twin drops more than the trained model: the pattern comes with the architecture, and training weakens it
    assert c.state == "agrees" and c.paired_low > 0 and c.side == Side.SHORT
    assert c.counted_as == "explained by its control" and c.paper_side is False


def test_the_control_is_paired_on_the_units_both_share():
    """A control run on other problems shares none of the model's units: no valid control, however it came out."""
    metric, curves = SCENARIOS["norms.second_half_less"]["agrees"]
    real = units("m", metric, curves)
    other = units(control_name("m"), metric, rel(1.0, 1.5), seed=1).assign(unit=lambda d: "q" + d.unit)
    row = report.check("norms", real, ["m"], other).set_index("claim_id").loc["norms.second_half_less"]
    assert row.counted_as == "no valid control" and "shares 0 units" in row.control_note


def _flat_control(claim_id: str) -> pd.DataFrame | None:
    """The claim's per-unit table for a control whose every curve is flat over layers (e.g. a bigram baseline
    entered as a curve), at a value that differs by problem."""
    chapter = REGISTRY[claim_id].chapter
    ctrl = REGISTRY[claim_id].control_of("m")
    if chapter in ("norms", "cosine"):
        metric = SCENARIOS[claim_id]["agrees"][0]
        return units(ctrl, metric, {k: (lambda r: np.full(L, r.uniform(0.1, 0.9))) for k in ("attention", "mlp", "layer")})
    if chapter == "lens":
        flat = lambda r: np.full(L, r.uniform(0.1, 0.9))  # noqa: E731
        return lens_units(ctrl, {(lens, m): flat for lens in ("logit_lens", "tuned_lens", "bigram")
                                 for m in ("kl", "kl_final_lens", "top5_overlap")})
    if chapter == "skipping":
        flat = lambda r: np.full(L, r.uniform(0.1, 0.9))  # noqa: E731
        return skip_units(ctrl, {(a, m): flat for a in ("current", "future") for m in ("later_effect", "output_change")},
                          variant="nudge" if ctrl == nudge_control("m") else "layer")
    return None


@pytest.mark.parametrize("claim_id", [c for c, s in REGISTRY.items() if s.control_of is not None
                                      and s.chapter in ("norms", "cosine", "lens", "skipping")])
@pytest.mark.parametrize("state", ["agrees", "disagrees"])
def test_a_flat_control_can_never_produce_a_verdict(claim_id, state):
    """Any curve flat over depth fixes a depth statistic by construction: whatever the model does, the row has no
    valid control (the old bigram control of the lens chapter was such a curve, and always 'disagreed')."""
    metric, curves = SCENARIOS[claim_id][state]
    row = report.check(REGISTRY[claim_id].chapter, table_for(metric, curves), ["m"],
                       _flat_control(claim_id)).set_index("claim_id").loc[claim_id]
    if row.state == "not testable":  # e.g. a transition depth without a sign change
        return
    # a flat curve is caught as flat, or — by a claim with a censoring value, which it pins at "never" — as saturated
    saturated = REGISTRY[claim_id].saturation is not None and "saturated" in row.control_note
    assert row.counted_as == "no valid control" and ("flat across layers" in row.control_note
                                                     or saturated), row.control_note


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
    assert counts.loc["m", "not discriminating"] == 2  # the twin is drawn like the model: neither check tells them apart
    text = headline(saved)
    assert "not discriminating" in text and "no valid control" in text and " of " not in text.split(" — ")[0]
    matrix = verdict_matrix(saved, ["m"])
    assert matrix.shape[0] == 2 and all("n 20" in c for c in matrix["m"])
    both = pd.concat([saved, saved.assign(model="a → b"), saved.assign(model="c → d"), saved.assign(model="moeut")])
    split = verdict_matrices(both, ["m"])
    assert list(split) == ["Per model", "Per model pair (source → target)", "From-scratch models"]
    assert list(split["Per model"].columns[1:]) == ["m"] and split["From-scratch models"].shape == (2, 2)
    pairs = split["Per model pair (source → target)"]  # transposed: one row per pair, one column per claim
    assert list(pairs["model pair"]) == ["a → b", "c → d"] and pairs.shape[1] == 1 + 2
    assert pairs.iloc[0, 1] == matrix.iloc[0, 1]


def test_an_undersampled_row_is_shown_marked_but_not_counted():
    flat = lambda level, rng, i: 6  # noqa: E731
    full = report.check("complexity", item_units("m", "math", flat), ["m"], None, only=["complexity.math_depth_flat"])
    few = report.check("complexity", item_units("s", "math", flat, n=8), ["s"], None,
                       only=["complexity.math_depth_flat"])
    both = pd.concat([full, few], ignore_index=True)
    counts = state_counts(both).set_index("model")
    assert "s" not in counts.index and counts.loc["all models"].sum() == 1
    matrix = verdict_matrix(both, ["m", "s"])
    assert matrix["s"].iloc[0].endswith("· not counted") and "not counted" not in matrix["m"].iloc[0]
    assert list(report.display(both)["counted as"]) == ["agrees", "not counted"]


def test_the_verdict_table_leaves_out_a_column_that_applies_to_none_of_its_rows():
    """A depth-flatness check has no bound and a positive control, not a paired one: those two columns would be "—"
    in every row, so the table leaves them out; once one row has a value the column is back, "—" in the others."""
    flat = lambda level, rng, i: 6  # noqa: E731
    rows = pd.concat([report.check("complexity", item_units(m, "math", flat), [m], None,
                                   only=["complexity.math_depth_flat"]) for m in ("m", "n")], ignore_index=True)
    shown = report.display(rows)
    assert set(report.APPLIES_TO_SOME) - set(shown.columns) == {"at the bound", "control's statistic"}
    assert "with layers 0–1" in shown.columns and "discrimination" in shown.columns
    rows.loc[0, "at_bound"] = 0.25
    assert list(report.display(rows)["at the bound"]) == ["25%", "—"]


def test_the_cutoff_can_land_anywhere_or_nowhere():
    assert sustained_cutoff(np.r_[0.5, 0.5, 0.05, 0.05, 0.0], 0.1) == 2
    assert sustained_cutoff(np.r_[0.5, 0.05, 0.5, 0.05, 0.0], 0.1) == 3  # sustained: the later excursion counts
    assert sustained_cutoff(np.r_[0.5, 0.5, 0.5, 0.5, 0.0], 0.1) == 5  # L: layer L−2 still feeds forward
    assert sustained_cutoff(np.r_[0.5, 0.5, 0.05, 0.05, 0.0], 0.1, skip=3) == 3


def test_one_exploding_effect_cannot_carry_a_skipping_verdict():
    """A relative change of 1e4 (a layer whose clean contribution is near zero) in one problem's paper max: clipped
    at 1 in the paper's statistic, and the robust statistic decides."""
    t = skip_units("m", {("current", "later_effect"): halves(0.8, 0.2, early=0.9)})
    boom = (t.unit == "p0") & (t.analysis == "current") & (t.metric == "later_effect") & (t.layer == 8)
    t.loc[boom, "value"] = 1e4
    row = verdict_of("skipping.current_later_small", t)
    assert row.state == "agrees" and row.paper_estimate < 0.5


def test_the_robust_statistic_decides_and_the_papers_saturated_max_is_shown_beside_it():
    """Paper maxima all at the clip (a ratio of exactly 1, 100 % at the bound) beside a robust mean that drops in
    the second half: the row is decided on the robust mean (agrees), not made untestable by the paper's clip; and
    the other way round, a robust mean that does not drop disagrees whatever the paper's max says."""
    at_clip = lambda r: np.full(L, 3.0)  # noqa: E731
    drops = halves(0.8, 0.2, early=0.9)
    row = verdict_of("skipping.current_later_small", skip_units("m", {("current", "later_effect"): at_clip,
                                                                       ("current", "later_effect_robust"): drops}))
    assert row.state == "agrees" and row.estimate < 0.5
    assert row.paper_estimate == pytest.approx(1.0) and row.paper_at_bound == 1.0
    flat_robust = verdict_of("skipping.current_later_small", skip_units(
        "m", {("current", "later_effect"): drops, ("current", "later_effect_robust"): halves(0.8, 0.8, early=0.9)}))
    assert flat_robust.state == "disagrees" and flat_robust.paper_estimate < 0.5


def test_a_run_without_the_robust_statistic_is_not_testable_and_says_how_to_get_it():
    t = skip_units("m", {})
    t = t[~t.metric.str.endswith("_robust")]
    row = verdict_of("skipping.current_later_small", t)
    assert row.state == "not testable" and "floor=0.1" in row.reason


def test_the_output_change_is_paired_with_the_nudge_of_the_same_model():
    """The output change's control is the nudge run of the same model (rows ``random-nudge:m``, variant "nudge"), not
    the twin: a nudge that changes the output like the skip cannot tell them apart, one whose second half changes it
    far less can (the model lies beyond it); the twin alone leaves the row without a control, and the later-effect
    rows keep the twin."""
    cid = "skipping.current_output_changes"
    real = skip_units("m", {("current", "output_change"): halves(0.8, 0.8, early=0.9)})  # ratio 1: agrees
    same = skip_units(nudge_control("m"), {("current", "output_change"): halves(0.8, 0.8, early=0.9)}, seed=1,
                      variant="nudge")
    below = skip_units(nudge_control("m"), {("current", "output_change"): halves(0.8, 0.2, early=0.9)}, seed=1,
                       variant="nudge")
    twin = skip_units(control_name("m"), {}, seed=2)
    a = report.check("skipping", real, ["m"], pd.concat([same, twin])).set_index("claim_id")
    b = report.check("skipping", real, ["m"], pd.concat([below, twin])).set_index("claim_id")
    assert a.loc[cid, "control_model"] == b.loc[cid, "control_model"] == nudge_control("m")
    assert (a.loc[cid, "state"], a.loc[cid, "counted_as"]) == ("agrees", "not discriminating")
    assert a.loc[cid, "paired_low"] <= 0 <= a.loc[cid, "paired_high"]
    assert b.loc[cid, "counted_as"] == "agrees" and b.loc[cid, "paired_low"] > 0
    assert b.loc[cid, "side"] == Side.BEYOND and b.loc[cid, "control_estimate"] < 0.5
    assert (a.loc["skipping.current_later_small", "control_model"] == control_name("m"))  # the twin, as before
    # the nudge's rows are read only as the nudge control: a twin table alone gives this row no control
    c = report.check("skipping", real, ["m"], twin).set_index("claim_id").loc[cid]
    assert c.counted_as == "no valid control" and c.control_note == "the control was not run"
    # and a nudge table without its nudge rows says how to compute them
    missing = report.check("skipping", real, ["m"], below.assign(variant="layer")).set_index("claim_id").loc[cid]
    assert missing.control_state == "not testable" and "nudge=True" in missing.control_reason
    # the page's table: each run's halves and ratio, the paired interval and how the row counts
    from lmdepth.book.pages.skipping_page import output_change_table

    verdicts = report.check("skipping", real, ["m"], pd.concat([below, twin]))
    row = output_change_table(verdicts, real, pd.concat([below, twin]), ["m"]).iloc[0]
    numbers = lambda cell: [float(x) for x in re.findall(r"\d+\.?\d*", cell)]  # noqa: E731
    assert numbers(row["layer skipped: 1st → 2nd half (ratio)"]) == pytest.approx([0.8, 0.8, 1.0, 20], abs=0.02)
    nudge_cell = row["nudge of the same size (control)"]
    assert numbers(nudge_cell.split(";")[0]) == pytest.approx([0.8, 0.2, 0.25, 20], abs=0.02)
    control = verdicts.set_index("claim_id").loc[cid]  # the ratio's interval: the spread of its per-problem draws
    assert nudge_cell.endswith(f"; ratio [{control.control_ci_low:.2f}, {control.control_ci_high:.2f}] over problems "
                               "and draws")
    assert numbers(row["random-init twin (reference)"]) == pytest.approx([0.5, 0.5, 1.0, 20])
    assert row["ratio, skip − nudge [95 % CI]"] == f"{b.loc[cid, 'paired_diff']:.3g} [{b.loc[cid, 'paired_low']:.3g}, " \
                                                   f"{b.loc[cid, 'paired_high']:.3g}]" and row["counted as"] == "agrees"
    assert output_change_table(verdicts, real, None, ["m"]).iloc[0]["nudge of the same size (control)"] == "—"


def test_a_lens_that_never_settles_is_not_a_late_settler_but_saturated():
    """A depth pinned at 1.0 because the problems' own curves never settle cannot move: not testable, whatever
    the rule; with fewer than half of them never settling the depth of the mean decides."""
    row = verdict_of("lens.logit_overlap_mid", lens_units("m", {("logit_lens", "top5_overlap"): rises_at(12)}))
    assert row.state == "not testable" and "saturated: 100%" in row.reason
    assert "saturated: 50%" in verdict_of("lens.logit_kl_mid", lens_units("m", {("logit_lens", "kl"): alternating(
        lambda r: np.full(L, 5.0), rises_at(7, 5.0, 0.1))})).reason
    few = lens_units("m", {("logit_lens", "top5_overlap"): lambda r: (rises_at(12) if r.random() < 0.2 else
                                                                      rises_at(7))(r)})
    decided = verdict_of("lens.logit_overlap_mid", few)
    assert decided.state == "agrees" and 0 < decided.at_bound < 0.5


@pytest.mark.parametrize("claim_id, metric, never", [
    ("lens.logit_overlap_mid", "lens", {("logit_lens", "top5_overlap"): rises_at(12)}),
    ("lens.logit_kl_mid", "lens", {("logit_lens", "kl"): lambda r: np.full(L, 5.0) + r.normal(0, 0.01, L)}),
    ("lens.tuned_over_bigram_mid", "lens", {("tuned_lens", "top5_overlap"): rises_at(12, 0.35, 0.9)}),
    ("skipping.future_cutoff", "skip", {("future", "later_effect"): feeds_until(10)}),
])
def test_a_depth_pinned_at_never_decides_nothing_as_model_or_as_control(claim_id, metric, never):
    """Every claim with a censoring value: a model whose units never settle (no cutoff) is not testable
    (saturated), and a control like that is no valid control for a model that does settle."""
    tab = lens_units if metric == "lens" else skip_units
    chapter = REGISTRY[claim_id].chapter
    row = report.check(chapter, tab("m", never), ["m"], None).set_index("claim_id").loc[claim_id]
    assert row.state == "not testable" and "saturated: 100%" in row.reason, row.reason
    agrees = SCENARIOS[claim_id]["agrees"][1]
    row = report.check(chapter, tab("m", agrees), ["m"], tab(control_name("m"), never, seed=1)
                       ).set_index("claim_id").loc[claim_id]
    assert (row.state, row.counted_as) == ("agrees", "no valid control") and "saturated" in row.control_note


def test_the_lens_control_is_the_twin_read_by_the_same_lens():
    """A trained model that settles at mid-depth against a twin whose lens settles later: paired over problems,
    the model settles earlier than its control — for a claim of late settling, the twin shows the pattern more
    strongly, so the agreement is explained by its control; against a twin that settles earlier, the model settles
    later: counted. A twin that settles like the model does not discriminate, and a twin whose lens never settles
    (its depth pinned at 1.0) is no valid control."""
    real = lens_units("m", {("logit_lens", "top5_overlap"): rises_at(7)})
    late = lens_units(control_name("m"), {("logit_lens", "top5_overlap"): rises_at(10, sd=0.02)}, seed=1)
    like = lens_units(control_name("m"), {("logit_lens", "top5_overlap"): rises_at(7, sd=0.02)}, seed=1)
    never = lens_units(control_name("m"), {("logit_lens", "top5_overlap"):
                                           lambda r: np.linspace(0, 0.15, L) + r.normal(0, 0.01, L)})
    a, b, c = (report.check("lens", real, ["m"], ctrl).set_index("claim_id").loc["lens.logit_overlap_mid"]
               for ctrl in (late, like, never))
    assert (a.state, a.control_state, a.counted_as) == ("agrees", "agrees", "explained by its control")
    assert a.paired_diff < 0 and a.side == Side.EARLIER
    early = lens_units(control_name("m"), {("logit_lens", "top5_overlap"): rises_at(4, sd=0.02)}, seed=1)
    d = report.check("lens", real, ["m"], early).set_index("claim_id").loc["lens.logit_overlap_mid"]
    assert (d.counted_as, d.side) == ("agrees", Side.LATER) and d.paper_side is True
    assert (b.state, b.counted_as) == ("agrees", "not discriminating")
    assert c.counted_as == "no valid control" and "saturated" in c.control_note
    # a twin whose own curve has settled before the search starts: pinned at the first layer searched, it cannot move
    pinned = lens_units(control_name("m"), {("logit_lens", "top5_overlap"): lambda r: 0.5 + r.normal(0, 0.01, L)})
    e = report.check("lens", real, ["m"], pinned).set_index("claim_id").loc["lens.logit_overlap_mid"]
    assert e.counted_as == "no valid control" and "first layer searched" in e.control_note


def test_the_kl_level_ignores_the_layers_the_search_skips():
    """A huge KL at layers 0–1 must not set the level: against the largest KL of layers 2…L−1 the curve settles
    at layer 7, not at layer 2."""
    kl = lambda r: np.r_[[500.0] * 2, [5.0] * 5, [0.1] * 5]  # noqa: E731
    row = verdict_of("lens.logit_kl_mid", lens_units("m", {("logit_lens", "kl"): kl}))
    assert row.estimate == pytest.approx(7 / L)


def test_bigram_counts_back_off_to_the_unigram():
    from lmdepth.analyses.bigram import BigramCounts

    c = BigramCounts([[1, 2, 1, 2, 1, 3]], vocab=5)
    lp = c.logprobs(torch.tensor([1, 4]))
    assert lp.shape == (2, 5) and torch.allclose(lp.exp().sum(-1), torch.ones(2), atol=1e-5)
    assert lp[0].argmax() == 2 and lp[0, 2] > lp[0, 3] > lp[0, 0]  # seen pairs first (2 twice, 3 once)
    assert torch.allclose(lp[1].exp(), torch.as_tensor(c.unigram, dtype=torch.float32))  # unseen context: unigram


def test_depth_vs_difficulty_needs_competence_and_ten_items_per_level():
    flat = lambda level, rng, i: 6  # noqa: E731
    assert verdict_of("complexity.math_depth_flat", item_units("m", "math", flat)).state == "agrees"
    unsolved = verdict_of("complexity.math_depth_flat", item_units("m", "math", flat, correct=0))
    assert unsolved.state == "not testable" and "constant-answer baseline" in unsolved.reason
    assert unsolved.headline  # a model that does not do the task is a finding: counted as "not testable"
    few = verdict_of("complexity.math_depth_flat", item_units("m", "math", flat, n=8))
    assert few.state == "not testable" and "4 items on level" in few.reason and not few.headline
    # 4 items on each of 5 levels: 20 units in all, but short of the per-level rule; not counted either
    assert few.n == 20
    # both failures named, so a reader sees that more items alone would not do
    both = verdict_of("complexity.math_depth_flat", item_units("m", "math", flat, n=8, correct=0))
    assert "4 items on level" in both.reason and "constant-answer baseline" in both.reason and not both.headline
    tiny = verdict_of("complexity.math_depth_flat", item_units("m", "math", flat, n=2, correct=0))
    # no level is solved, so no item enters the fit: n counts the units the statistic rests on
    assert tiny.n == 0 and "1 items on level" in tiny.reason and "constant-answer baseline" in tiny.reason
    # a null claim, decided as a one-sided equivalence test with a positive control: the same items' profiles
    # shifted one layer per level must reach 'disagrees'
    t = item_units("m", "math", flat)
    row = report.check("complexity", t, ["m"], None, only=["complexity.math_depth_flat"]).iloc[0]
    assert (row.state, row.control_state, row.counted_as) == ("agrees", "positive control disagrees", "agrees")
    assert row.control_estimate == pytest.approx(1.0, abs=0.05)  # one layer per level, as built


def test_the_depth_fit_uses_only_levels_the_model_solves():
    """Levels 4–5 unsolved: the fit runs over levels 1–3 (the rise there is flat); with only two solved levels the
    check is not testable."""
    def rising_late(level, rng, i):
        return 6 if level <= 3 else 10  # a jump on the unsolved levels only

    t = item_units("m", "math", rising_late)
    t.loc[t.level >= 4, "correct"] = 0
    row = verdict_of("complexity.math_depth_flat", t)
    assert row.state == "agrees" and row.estimate == pytest.approx(0.0, abs=1e-9)
    t.loc[t.level == 3, "correct"] = 0
    two = verdict_of("complexity.math_depth_flat", t)
    assert two.state == "not testable" and "competent on 2 levels (1, 2)" in two.reason


def test_depth_vs_difficulty_is_not_testable_where_prompt_length_follows_the_level():
    """The arithmetic ladder's prompts grow 27 tokens per rung and vary by none within one: a fit on level and
    length cannot tell their slopes apart, so the row names r and asks for length-matched levels."""
    flat = lambda level, rng, i: 6  # noqa: E731
    ladder = verdict_of("complexity.math_depth_flat", item_units("m", "math", flat, tokens=lambda lv, i: 70 + 27 * lv))
    assert ladder.state == "not testable" and ladder.headline
    assert "prompt length grows with the level (over the fit's items of levels 1, 2, 3, 4, 5: r = 1.00, η = 1.00" \
        in ladder.reason
    assert "length-matched levels needed" in ladder.reason
    falling = verdict_of("complexity.math_depth_flat", item_units("m", "math", flat, tokens=lambda lv, i: 300 - lv))
    assert falling.state == "not testable" and "falls with the level" in falling.reason and "r = -1.00" in falling.reason
    # r ≈ 0.96 from a little within-level spread: still past the bound (the fit's standard error × 3.6)
    near = verdict_of("complexity.math_depth_flat",
                      item_units("m", "math", flat, tokens=lambda lv, i: 70 + 27 * lv + 4 * (i % 10)))
    assert near.state == "not testable" and "r = 0.96" in near.reason
    # one length per level along a zigzag: r is small, yet the level fixes the length (η = 1), so a linear fit could
    # only separate the two through the zigzag's shape
    zigzag = {1: 100, 2: 220, 3: 120, 4: 240, 5: 140}
    curve = verdict_of("complexity.math_depth_flat", item_units("m", "math", flat, tokens=lambda lv, i: zigzag[lv]))
    assert curve.state == "not testable" and "η = 1.00" in curve.reason, curve.reason
    # the same levels with prompts of one length: nothing to confound (r taken as 0), decided
    same = verdict_of("complexity.math_depth_flat", item_units("m", "math", flat, tokens=lambda lv, i: 100))
    assert same.state == "agrees"
    # r over the levels the fit uses only: length grows on the unsolved levels 4–5 alone, r = 0 on levels 1–3
    t = item_units("m", "math", flat, tokens=lambda lv, i: 100 + 50 * max(lv - 3, 0) + (i % 10))
    t.loc[t.level >= 4, "correct"] = 0
    assert verdict_of("complexity.math_depth_flat", t).state == "agrees"
    # no prompt length in the per-item table: not decided on an uncontrolled slope
    bare = verdict_of("complexity.math_depth_flat", item_units("m", "math", flat).drop(columns="prompt_tokens"))
    assert bare.state == "not testable" and "prompt_tokens" in bare.reason


def test_a_depth_that_follows_prompt_length_is_regressed_out():
    """Each item's depth follows its prompt length (one layer per 25 tokens), not its level; the prompts grow 20
    tokens per level with a within-level spread of 0–90 (r ≈ 0.7). The slope of the levels' D alone rises about 0.8
    layer per level (it would disagree); at a fixed length it is flat, and the positive control — one layer per
    level on top — is still seen."""
    from lmdepth.claims.complexity_claims import rise
    from lmdepth.claims.spec import EARLY_LAYERS
    from lmdepth.metrics.depth import depth_score, partial_slope

    def tokens(level, i):
        return 20 * level + 10 * (i % 10)

    t = item_units("m", "math", lambda level, rng, i: 2 + tokens(level, i) // 25, tokens=tokens)
    spec = REGISTRY["complexity.math_depth_flat"]
    v = spec.values(t, "m").to_numpy(dtype=float)
    e = v[:, :-2].copy()
    e[:, :EARLY_LAYERS] = 0
    plain = partial_slope(depth_score(e), v[:, -2], None, weights=e.sum(1))  # the fit without the length
    assert plain > 0.7
    assert abs(rise(EARLY_LAYERS)(v)) < 0.1 and abs(np.corrcoef(v[:, -2], v[:, -1])[0, 1]) < 0.9
    row = report.check("complexity", t, ["m"], None, only=["complexity.math_depth_flat"]).iloc[0]
    assert row.state == "agrees" and row.ci_high < 0.5, (row.estimate, row.ci_low, row.ci_high, row.reason)
    assert row.control_state == "positive control disagrees" and row.control_estimate == pytest.approx(1.0, abs=0.1)


def test_a_positive_control_that_cannot_be_detected_leaves_no_valid_control():
    """Profiles all at the last layer: shifting them deeper moves nothing (they fall off the end), so the pipeline
    could not have seen the alternative."""
    t = item_units("m", "math", lambda level, rng, i: L - 1)
    t.loc[t.layer < L - 1, "value"] = 0.0
    row = report.check("complexity", t, ["m"], None, only=["complexity.math_depth_flat"]).iloc[0]
    assert row.state == "agrees" and row.counted_as == "no valid control" and "positive control" in row.control_note


def test_runs_that_are_not_comparable_are_not_testable():
    one_seed = eval_units({MO: (0.3, 1), MA: (0.7, 1)}, n=100, seeds=(0,))
    row = verdict_of("moeut.exact_match_gain", one_seed)
    assert row.state == "not testable" and "1 training seed" in row.reason and "runs not comparable" in row.reason
    learning = eval_units({MO: (0.3, 1), MA: (0.7, 1)}, n=100, interpolate_acc=0.6)
    assert "below 95%" in verdict_of("moeut.exact_match_gain", learning).reason
    other_lr = eval_units({MO: (0.2, 1), MA: (0.8, 1)}, n=100, lr={TA: 2e-3}, seeds=FIVE_SEEDS)
    assert "learning rates differ" in verdict_of("moeut.exact_match_gain_vs_transformer", other_lr).reason
    assert verdict_of("moeut.exact_match_gain", other_lr).state == "agrees"  # MoEUT's two runs share one rate
    # MoEUT's comparison runs all finished, no Transformer run yet: the MoEUT-only rows are decided, the others not
    moeut_only = eval_units({MO: (0.2, 1), MA: (0.8, 1)}, n=100, seeds=FIVE_SEEDS)
    moeut_only = moeut_only[moeut_only.run.isin([MO, MA])]
    assert verdict_of("moeut.exact_match_gain", moeut_only).state == "agrees"
    assert verdict_of("moeut.answer_loss_gain", moeut_only).state in ("inconclusive", "agrees", "disagrees")
    row = verdict_of("moeut.exact_match_gain_vs_transformer", moeut_only)
    assert row.state == "not testable" and "transformer-lm: 0 training seeds" in row.reason


def test_the_interval_of_a_comparison_of_runs_includes_the_spread_between_training_seeds():
    """A gain that one training seed of three carries: on each problem's mean over seeds it looks decided, but seeds
    are replicates as well as problems, and resampling them leaves the gain undecided."""
    t = pd.concat([eval_units({MO: (0.5, 1), MA: (0.95 if sd == 0 else 0.5, 1)}, n=150, seed=sd, seeds=(sd,))
                   for sd in (0, 1, 2)], ignore_index=True)
    spec = REGISTRY["moeut.exact_match_gain"]
    v = spec.values(t, SUBJECT)
    assert list(v.columns) == [(MO, 0), (MO, 1), (MO, 2), (MA, 0), (MA, 1), (MA, 2)] and len(v) == 150
    on_means = decide(v.T.groupby(level=0, sort=False).mean().T.to_numpy(), spec.rule, spec.reduce)
    assert on_means.state == "agrees", on_means
    row = verdict_of("moeut.exact_match_gain", t)
    assert row.estimate == pytest.approx(on_means.estimate, abs=1e-12)  # the same statistic ...
    assert row.state == "inconclusive" and row.ci_low < 0 < row.ci_high  # ... with the seeds' spread in its interval
    assert row.ci_high - row.ci_low > 2 * (on_means.ci_high - on_means.ci_low)
    # the statistic of all four runs is the one on each run's mean over its seeds, straight from the raw table
    four = REGISTRY["moeut.exact_match_gain_vs_transformer"]
    ext = t[t.split == "extrapolate"].pivot_table(index="unit", columns="run", values="correct", aggfunc="mean")
    row4 = verdict_of(four.id, t)
    assert row4.estimate == pytest.approx(four.reduce(ext[list(RUNS)].to_numpy()), abs=1e-12)


def test_seeds_are_paired_across_runs_only_where_the_runs_share_them():
    t = eval_units({MO: (0.3, 1), MA: (0.7, 1)}, n=60)
    values, full, sizes, matched = replicates(REGISTRY["moeut.exact_match_gain"].values(t, SUBJECT))
    assert sizes == [3, 3] and matched and list(values.columns) == [MO, MA] and full.shape == (60, 6)
    uneven = t[~((t.run == MA) & (t.train_seed == 2))]  # MoEUT answer-only lacks seed 2: its twin waits for it
    values, _, sizes, matched = replicates(REGISTRY["moeut.exact_match_gain"].values(uneven, SUBJECT))
    assert sizes == [2, 2] and matched and list(values.columns) == [MO, MA]
    assert "2 training seeds" in verdict_of("moeut.exact_match_gain", uneven).reason
    # a seed that did not answer one problem leaves that problem without a mean of all seeds: not testable
    gap = t.drop(t[(t.run == MO) & (t.train_seed == 1) & (t.split == "extrapolate") & (t.unit == 7)].index)
    row = verdict_of("moeut.exact_match_gain", gap)
    assert row.state == "not testable" and "1 of 60 units have missing values" in row.reason


def test_a_comparison_of_training_recipes_is_decided_at_the_level_of_seeds():
    """The control of a claim about training is the seeds themselves: each seed's own gain, sign-flipped. A clear
    gain in all of three seeds puts the interval on the paper's side and still reads 'inconclusive (3 seeds)' —
    three seeds cannot reach p ≤ 0.05 — and is counted as inconclusive; five seeds decide it."""
    three = eval_units({MO: (0.2, 1), MA: (0.8, 1)}, n=100)
    row = report.check("moeut", three, [SUBJECT], None).set_index("claim_id").loc["moeut.exact_match_gain"]
    assert row.ci_low > 0 and row.control_kind == "seed-level" and row.p_value == pytest.approx(1 / 8)
    assert (row.state, row.counted_as) == ("inconclusive", "inconclusive") and "3 seeds" in row.reason
    assert "cannot go below p = 1/8" in row.reason and row.control_ci_low > 0.4  # every seed's own gain ≈ 0.6
    five = eval_units({MO: (0.2, 1), MA: (0.8, 1)}, n=100, seeds=FIVE_SEEDS)
    row = report.check("moeut", five, [SUBJECT], None).set_index("claim_id").loc["moeut.exact_match_gain"]
    assert (row.state, row.counted_as) == ("agrees", "agrees") and row.p_value == pytest.approx(1 / 32)
    assert row.side == Side.EVERY_SEED
    # the seeds disagree: one seed's gain the other way makes the test fail even where the mean gain is positive
    mixed = pd.concat([eval_units({MO: (0.2, 1), MA: (0.8, 1)}, n=100, seeds=(0, 1, 2, 3)),
                       eval_units({MO: (0.9, 1), MA: (0.1, 1)}, n=100, seeds=(4,), seed=3)])
    row = report.check("moeut", units_of(mixed.drop(columns=["model", "unit"])), [SUBJECT],
                       None).set_index("claim_id").loc["moeut.exact_match_gain"]
    assert row.p_value > 0.05 and row.counted_as == "inconclusive"


def test_maps_of_models_with_similar_depth_are_told_apart_by_the_paired_offsets():
    """Maps on the relative-depth line between a 22- and a 24-layer model: both alignments lie within 0.1 (both
    'agree'), yet boundary by boundary the relative offset is the smaller one, and the paired interval says so; maps
    on the index line are told apart the other way."""
    units, controls = map_units(lambda m, l, rng: relative_line(m, l, rng, 22, 24), n_src=22, n_tgt=24)
    row = report.check("maps", units, ["m"], controls).set_index("claim_id").loc["maps.best_near_equal_depth"]
    assert (row.state, row.control_state, row.counted_as) == ("agrees", "agrees", "agrees")
    assert row.paired_high < 0 and row.side == Side.BEYOND
    units, controls = map_units(lambda m, l, rng: index_line(m, l, rng, 22), n_src=22, n_tgt=24)
    row = report.check("maps", units, ["m"], controls).set_index("claim_id").loc["maps.best_near_equal_depth"]
    assert row.state == "agrees" and row.paired_low > 0 and row.side == Side.SHORT


def test_maps_between_models_of_equal_depth_are_not_testable():
    units, controls = map_units(relative_line, n_src=24, n_tgt=24)
    row = report.check("maps", units, ["m"], controls).iloc[0]
    assert row.state == "not testable" and "same depth" in row.reason


def test_a_control_without_enough_data_is_no_valid_control():
    """A control on 5 problems: not enough shared units to pair; the row is shown, and not counted either way."""
    metric, curves = SCENARIOS["norms.second_half_less"]["agrees"]
    real = units("m", metric, curves)
    thin = units(control_name("m"), metric, curves, n=5)
    row = report.check("norms", real, ["m"], thin).set_index("claim_id").loc["norms.second_half_less"]
    assert (row.state, row.control_state, row.counted_as) == ("agrees", "not testable", "no valid control")


def test_missing_values_and_too_few_resamples_are_named():
    metric, curves = SCENARIOS["norms.second_half_less"]["agrees"]
    t = units("m", metric, curves)
    t.loc[(t.unit == "p3") & (t.layer == 7), "value"] = np.nan
    assert "1 of 20 units have missing values" in verdict_of("norms.second_half_less", t).reason
    few = report.check("norms", units("m", metric, curves), ["m"], n_boot=200).iloc[0]
    assert few.state == "not testable" and "200 bootstrap resamples" in few.reason


def test_a_change_point_needs_segments_of_some_length():
    """One extreme last layer is not a 'segment' of its own (the transition would land at the output)."""
    curve = np.r_[0.5, 0.5, [-0.1] * 6, [0.05] * 7, 0.6]
    assert change_point(curve, 2) == 8


@pytest.mark.unit
def test_controls_left_out_on_ndif_say_so_in_one_line():
    """On NDIF no random-init control runs (it is built here): the chapter says so once, in one line, and a local or
    simulated run is unchanged and silent."""
    import warnings

    with pytest.warns(UserWarning, match="No random-init controls on NDIF") as caught:
        assert report.control_models(["smollm2-135m"], True, 20) == []
    assert len(caught) == 1 and "\n" not in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert report.control_models(["smollm2-135m"], "local", 20) == report.control_models(["smollm2-135m"], False, 20) != []
