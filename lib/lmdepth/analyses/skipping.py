"""The layer-skipping analysis of chapter 03: runs :mod:`lmdepth.traces.skip_effects` over a data set, cached and
resumable.

Aggregation follows the paper (book/method.md#method-aggregation): per problem, the effect is the max over measured
positions and cut points; over problems, the elementwise max. The mean over problems is kept too (less sensitive to
one outlier). With ``floor`` set, every run also keeps the robust statistics the verdicts decide on
(book/method.md#method-skipping): per problem the mean over positions of the change relative to a floored
denominator, and the mean output change.

A ``nudge`` run is the output change's control (book/method.md#method-skipping): on the same model, problems and
positions, each layer's output is moved by the norm of its own contribution in a fixed random direction per layer
instead of being skipped; its variant is "nudge".
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from lmdepth.analyses.run import Job, RunSummary, SampleSummary, per_unit, resolved
from lmdepth.claims.report import control_models
from lmdepth.claims.skipping_claims import nudge_control
from lmdepth.data.datasets import Example, dataset_id, load_examples, selection_record
from lmdepth.hooks.skip_cost import time_paths, unembed_cost, work_ratios, work_units
from lmdepth.hooks.skip_hooks import NUDGE, PARTS, draw_cuts, nudge_directions, variants
from lmdepth.metrics.effects import cutoff_with_ci, later_effect
from lmdepth.metrics.verdicts import MIN_UNITS
from lmdepth.model.registry import ModelRef, load_model
from lmdepth.params import CommonParams, param
from lmdepth.results import RunResult, RunStore
from lmdepth.runtime import load_average
from lmdepth.traces.residual_metrics import TapPaths
from lmdepth.traces.skip_effects import skip_effects

ANALYSIS = "layer_skipping"
BENCHMARK = "skipping_benchmark"


#: metric names of the paper's per-problem max and of the robust per-problem mean (``floor`` runs only)
METRICS = {"E": "relative_change", "O": "output_change", "M": "relative_change_robust", "Q": "output_change_robust"}


def _tidy(model: str, per_problem: dict[tuple[str, str], dict[str, np.ndarray]]) -> pd.DataFrame:
    """per_problem[(analysis, variant)][letter of :data:`METRICS`]: [P, L, L] or [P, L] → long table with the max and
    the mean over problems."""
    rows = []
    for (analysis, variant), values in per_problem.items():
        L = values["E"].shape[1]
        for stat, over in (("max", np.max), ("mean", np.mean)):
            base = dict(model=model, analysis=analysis, variant=variant, stat=stat, n_layers=L)
            for letter, V in values.items():
                v = over(V, axis=0)
                if v.ndim == 2:
                    rows += [{**base, "metric": METRICS[letter], "skipped_layer": s, "affected_layer": j,
                              "value": v[s, j]} for s in range(L) for j in range(L)]
                else:
                    rows += [{**base, "metric": METRICS[letter], "skipped_layer": s, "affected_layer": -1,
                              "value": v[s]} for s in range(L)]
    return pd.DataFrame(rows)


def units_table(model: str, analysis: str, ids: list[str], per_problem: dict[str, dict[str, np.ndarray]]
                ) -> pd.DataFrame:
    """Per-problem table for claim verdicts: for every variant and skipped layer, the problem's later effect (the
    largest change of any later layer, :func:`later_effect`) and its output change — the paper's max
    (``later_effect``, ``output_change``) and, in ``floor`` runs, the robust means (``later_effect_robust``,
    ``output_change_robust``).

    Args:
        per_problem: variant → {letter of :data:`METRICS`: [P, L, L] or [P, L]}, problems in ``ids`` order.

    Returns:
        ``model, unit, analysis, variant, metric, layer, value`` rows.
    """
    names = {"E": "later_effect", "O": "output_change", "M": "later_effect_robust", "Q": "output_change_robust"}
    frames = []
    for v, values in per_problem.items():
        L = values["E"].shape[1]
        for i, uid in enumerate(ids):
            for letter, V in values.items():
                vals = later_effect(V[i]) if V.ndim == 3 else V[i]
                frames.append(pd.DataFrame({"model": model, "unit": uid, "analysis": analysis, "variant": v,
                                            "metric": names[letter], "layer": np.arange(L), "value": vals}))
    return pd.concat(frames, ignore_index=True)


@dataclass(frozen=True)
class SkipParams(CommonParams):
    """Parameters of the layer-skipping run (chapter 03)."""

    n_examples: int = param(10, lo=1, hi=100_000, help="problems")
    analysis: str = param("future", choices=("future", "current"),
                          help="'future': intervene before a cut point, measure after it (Fig. 3b); "
                               "'current': intervene and measure at all tokens (Fig. 3a)")
    parts: list[str] = param(list(PARTS), choices=PARTS, help="which parts to skip: layer, attention, mlp")
    local: bool = param(True, help="add the local (direct-effect) variant of the layer skip (book/method.md#method-skipping)")
    n_cuts: int = param(4, lo=1, hi=64, help="future analysis: cut points per problem")
    cut_stride: int = param(8, lo=1, hi=1024, help="future analysis: cut points drawn from every k-th token")
    threshold: float = param(0.1, lo=0.0, hi=10.0,
                             help="future-effect level below which a layer counts as not feeding later computation")
    floor: float | None = param(None, lo=0.0, hi=1.0, nullable=True,
                                help="also keep the robust statistics the verdicts decide on: the mean over positions "
                                     "of the change relative to max(‖Δ‖, floor × the layer's median ‖Δ‖); None: the "
                                     "paper's max only")
    nudge: bool = param(False, help="the output change's control instead of the skips (parts and local ignored): each "
                                    "layer's output moved by the norm of its contribution along a random unit vector "
                                    "per layer, drawn with `seed`")


@dataclass(frozen=True)
class Cutoff:
    """The future-effect cutoff of one variant (sidecar ``summary``)."""

    cutoff: int
    ci_low: float
    ci_high: float
    n_layers: int
    rel_depth: float
    threshold: float


@dataclass(frozen=True)
class SkipSummary(SampleSummary):
    """What chapter 03 and the atlas read of a skipping run (:meth:`of`).

    Attributes:
        analysis: "current" (all tokens) or "future" (future tokens).
        n_cuts: cut points per problem (future tokens; None for all tokens).
        cutoffs: variant → its future-effect cutoff with the bootstrap interval (future tokens; empty for all
            tokens).
    """

    analysis: str
    n_cuts: int | None
    cutoffs: dict[str, Cutoff]

    @classmethod
    def of(cls, result: RunResult) -> SkipSummary:
        p = result.meta["parameters"]
        return cls(**cls.fields_of(result), analysis=str(p["analysis"]), n_cuts=p.get("n_cuts"),
                   cutoffs={v: Cutoff(**c) for v, c in (result.meta.get("summary") or {}).items()})


def run(params: SkipParams | ModelRef | str | None = None, **kwargs: Any) -> RunResult:
    """Skip effects of every layer of one model over a data set (cached; resumes per problem).

    Args:
        params: a :class:`SkipParams`, or its fields as keyword arguments.

    Returns:
        Tidy table (``model, analysis, variant, stat, metric, skipped_layer, affected_layer, value``) and a
        sidecar whose ``summary`` holds the cutoff layer per variant with its bootstrap interval
        (:attr:`SkipSummary.cutoffs`).
    """
    p, ref = resolved(SkipParams, params, kwargs)
    parts = [NUDGE] if p.nudge else [x for x in PARTS if x in p.parts]
    local = p.local and not p.nudge
    examples = load_examples(p.dataset, n_examples=p.n_examples, seed=p.seed, selection=p.selection)
    # a nudge run's key differs in parts only (["nudge"]): the keys of the skip runs stay what they were
    key = dict(analysis=p.analysis, dataset=dataset_id(p.dataset), n_examples=p.n_examples, seed=p.seed,
               selection=p.selection, parts=parts, local=local, dtype=p.dtype, threshold=p.threshold, n_boot=p.n_boot,
               **({"n_cuts": p.n_cuts, "cut_stride": p.cut_stride} if p.analysis == "future" else {}),
               outputs=2,  # 2: also the per-problem table (runs finished before it recompute from their checkpoints)
               **({"nudge_draw": "per problem"} if p.nudge else {}),  # was one draw for every problem
               **({"floor": p.floor} if p.floor is not None else {}))  # absent: the keys of runs before it hold
    per_item = {k: v for k, v in key.items() if k not in ("n_examples", "threshold", "n_boot", "outputs")}
    return Job(ANALYSIS, p, key, per_item, refs=ref).execute(
        lambda store: _compute(p, ref, parts, local, key, examples, store))


def _compute(p: SkipParams, ref: ModelRef, parts: list[str], local: bool, key: dict[str, Any], examples: list[Example],
             store: RunStore) -> tuple[pd.DataFrame, dict[str, Any], pd.DataFrame]:
    lm = load_model(ref, device=p.device, dtype=p.dtype)
    encoded = [(e.id, lm.encode(e.text, label=f"Example {e.id}")) for e in examples]
    paths = TapPaths.of(lm.adapter)
    names = [v.name for v in variants(parts, local)]
    # [L, D] per problem, drawn before its trace and shipped with it (never [L, T, D])
    directions = ({uid: nudge_directions(lm.n_layers, lm.adapter.d_model, p.seed, uid) for uid, _ in encoded}
                  if p.nudge else {})
    future = p.analysis == "future"
    cuts_used = {uid: draw_cuts(ids.shape[1], p.n_cuts, p.seed, uid, p.cut_stride) if future else []
                 for uid, ids in encoded}

    def one(uid: str, ids: Any) -> dict[str, np.ndarray]:
        # one session per problem (one request on NDIF): the clean pass, then one batched trace per (layer, cut)
        res = skip_effects(lm.nn, paths, ids, cuts=cuts_used[uid], parts=parts, local=local, current=not future,
                           config=lm.model.config, remote=lm.remote_mode, floor=p.floor, directions=directions.get(uid))
        return {f"{v}_{x}": r.numpy() for v in names for x, r in zip("EOMQ", res[p.analysis, v])}

    items = per_unit(store, encoded, one, desc=f"{p.model_name}: {'nudges' if p.nudge else 'skip effects'} ({p.analysis})")
    letters = "EOMQ" if p.floor is not None else "EO"
    per_problem = {n: {x: np.stack([it[f"{n}_{x}"] for it in items]) for x in letters} for n in names}
    table = _tidy(p.model_name, {(p.analysis, n): v for n, v in per_problem.items()})
    summary = ({n: cutoff_with_ci(per_problem[n]["E"], p.threshold, p.n_boot, p.seed) for n in names}
               if future else {})
    meta = {
        "parameters": {"model_name": p.model_name, **key, "device": p.device,
                       **({"remote": p.remote} if p.remote is not False else {})},
        "model": lm.provenance(),
        "data": {**selection_record(p.dataset, p.selection, p.seed, examples), "cuts": cuts_used},
        "summary": summary,
        **({"nudge": {"directions": f"per problem, torch.randn(L, d_model) from a CPU generator seeded with "
                                    f"({p.seed}, the problem's id), rows scaled to unit norm "
                                    "(lmdepth.hooks.skip_hooks.nudge_directions)",
                      "directions_sha256": {uid: _digest(u) for uid, u in directions.items()}}} if p.nudge else {}),
    }
    units = units_table(p.model_name, p.analysis, [uid for uid, _ in encoded], per_problem)
    return table, meta, units


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()[:16]


def matrix(table: pd.DataFrame, analysis: str, variant: str, stat: str = "max", model: str | None = None) -> np.ndarray:
    """[L, L] effect matrix (skipped × affected) back from a tidy table."""
    t = table[(table.analysis == analysis) & (table.variant == variant) & (table.stat == stat)
              & (table.metric == "relative_change")]
    if model is not None:
        t = t[t.model == model]
    L = int(t.n_layers.iloc[0])
    E = np.zeros((L, L))
    E[t.skipped_layer.to_numpy(), t.affected_layer.to_numpy()] = t.value.to_numpy()
    return E


def variant_names(parts: Sequence[str], local: bool) -> list[str]:
    """The variants a run with these ``parts`` and ``local`` stores, in the chapter's order ("local" needs "layer")."""
    return [p for p in PARTS if p in parts] + (["local"] if local and "layer" in parts else [])


@dataclass(frozen=True)
class Comparison:
    """The main model's runs and the comparison models' runs of chapter 03, side by side.

    Attributes:
        table: every run's tidy table (main model: future, then current; then per comparison model future and,
            when run, current).
        futures: model → the summary of its future-token run (its sample and cutoffs).
        units: every run's per-problem table (:func:`units_table`), in the same order.
    """

    table: pd.DataFrame
    futures: dict[str, SkipSummary]
    units: pd.DataFrame


def compare(models: Sequence[str], current: RunResult, future: RunResult, n_examples: int, n_cuts: int,
            with_current: bool = True, **common: Any) -> Comparison:
    """Add the comparison models to the main model's runs.

    Args:
        models: the main model first (its runs are ``current`` and ``future``), then the comparison models.
        n_examples, n_cuts: problems and cut points per problem of each comparison model (smaller than the main
            model's: a CPU budget).
        with_current: also run the all-token analysis on the comparison models (on ``n_examples`` problems).
        common: the remaining :class:`SkipParams` fields, shared by every run.
    """
    runs, futures = [future, current], {models[0]: SkipSummary.of(future)}
    for m in models[1:]:
        f = run(m, analysis="future", n_examples=n_examples, n_cuts=n_cuts, **common)
        runs.append(f)
        futures[m] = SkipSummary.of(f)
        if with_current:
            runs.append(run(m, analysis="current", n_examples=n_examples, **common))
    return Comparison(pd.concat([r.table for r in runs], ignore_index=True), futures,
                      pd.concat([r.units for r in runs], ignore_index=True))


def units_of(groups: Sequence[tuple[Sequence[str], int, int, int]], **common: Any) -> pd.DataFrame | None:
    """The per-problem tables of the all-token and the future-token run of each model (e.g. the random-init controls
    of :func:`lmdepth.claims.report.control_models`), concatenated; None for no models.

    Args:
        groups: ``(models, n_examples_current, n_examples, n_cuts)`` per group of models sharing a sample size
            (chapter 03: the main model's control, then the comparison models' controls).
    """
    runs = [run(m, analysis="current", n_examples=n_cur, **common) for ms, n_cur, _, _ in groups for m in ms]
    runs += [run(m, analysis="future", n_examples=n, n_cuts=c, **common) for ms, _, n, c in groups for m in ms]
    return pd.concat([r.units for r in runs], ignore_index=True) if runs else None


def nudge_units(groups: Sequence[tuple[Sequence[str], int]], **common: Any) -> pd.DataFrame | None:
    """The per-problem tables of the all-token nudge runs (the output change's control) of each model, their rows
    named by :func:`~lmdepth.claims.skipping_claims.nudge_control`, concatenated; None for no models. A model
    gets one where its all-token sample has at least 10 problems (fewer: the check is not testable) — remote runs
    too, since the nudge runs on the model itself.

    Args:
        groups: ``(models, n_examples_current)`` per group of models sharing a sample size.
    """
    frames = []
    for ms, n in groups:
        for m in ms if n >= MIN_UNITS else ():
            u = run(m, analysis="current", n_examples=n, nudge=True, **common).units
            frames.append(u.assign(model=nudge_control(m)))
    return pd.concat(frames, ignore_index=True) if frames else None


def claim_units(models: Sequence[str], main: tuple[int, int, int], others: tuple[int, int], **common: Any
                ) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """What chapter 03's claims read: every model's whole-layer runs (with ``common``'s ``floor``, the robust
    statistic) and those of their random-init controls, on the same problems and cut points — the controls only
    where the model has at least 10 problems in both analyses, and none for remote runs
    (:func:`lmdepth.claims.report.control_models`) —, and the nudge runs that are the output change's control
    (:func:`nudge_units`).

    Args:
        models: the main model first, then the comparison models.
        main: the main model's (problems all tokens, problems future tokens, cut points).
        others: each comparison model's (problems in both analyses, cut points).

    Returns:
        (the models' per-problem tables, the controls' — twins and nudges — or None).
    """
    n_cur, n_fut, cuts = main
    n_cmp, cuts_cmp = others
    remote = common.get("remote") is True
    units = units_of([([models[0]], n_cur, n_fut, cuts), (models[1:], n_cmp, n_cmp, cuts_cmp)], **common)
    twins = units_of([(control_models(models[:1], remote, min(n_cur, n_fut)), n_cur, n_fut, cuts),
                      (control_models(models[1:], remote, n_cmp), n_cmp, n_cmp, cuts_cmp)], **common)
    nudges = nudge_units([(models[:1], n_cur), (models[1:], n_cmp)], **common)
    found = [u for u in (twins, nudges) if u is not None]
    return units, pd.concat(found, ignore_index=True) if found else None


def later_effect_table(table: pd.DataFrame, models: Sequence[str]) -> pd.DataFrame:
    """Future tokens, layer skip: :func:`later_effect` of every skipped layer per model, on relative depth.

    Returns:
        ``model, layer, n_layers, rel_depth, value`` rows (the input of
        :func:`lmdepth.charts.skipping_charts.later_effect_lines`).
    """
    rows = []
    for m in models:
        E = matrix(table, "future", "layer", model=m)
        n = len(E)
        rows += [{"model": m, "layer": i, "n_layers": n, "rel_depth": (i + 0.5) / n, "value": v}
                 for i, v in enumerate(later_effect(E))]
    return pd.DataFrame(rows)


def benchmark(params: SkipParams | None = None, n_pool: int = 200, tol: float = 1e-5, compute: bool = True,
              **kwargs: Any) -> RunResult | None:
    """The fast path timed against the naive loop on the first problem (future tokens, layer skip, at most 2 cut
    points: 2 × L naive passes), the work both do on it counted (:func:`~lmdepth.hooks.skip_cost.work_units`), and
    the counted ratio with the paper's 4 cut points over ``n_pool`` problems (tokenization only).

    Cached like every run, so a rebuild from stored results does not time it again: the timing is a measurement of
    the machine and the date in the sidecar (``environment``, ``measured_at``, ``load_average``);
    ``use_cache=False`` measures again. ``compute=False`` only reads a stored timing (None without one): the book
    shows the committed one without timing the naive loop in its build (it is a measurement of a machine, not of
    the model). Only ``dataset, seed, selection, n_cuts, device, dtype`` of the parameters matter.

    Returns:
        One-row table: ``model, tokens, n_cuts, naive_passes, threads, naive_cpu_s, fast_cpu_s, naive_s, fast_s,
        max_abs_diff, counted_ratio, counted_ratio_4, pool, pool_min, pool_median, pool_max, pool_share_5x``.

    Raises:
        AssertionError: the two paths differ by more than ``tol`` (nothing is stored).
    """
    p, ref = resolved(SkipParams, params, kwargs)
    key = dict(dataset=dataset_id(p.dataset), seed=p.seed, selection=p.selection, n_cuts=min(p.n_cuts, 2),
               device=p.device, dtype=p.dtype, n_pool=n_pool, version=2)  # 2: the trace is the timed path
    if not compute:
        return Job(BENCHMARK, p, key, refs=ref, record=False).stored()
    return Job(BENCHMARK, p, key, refs=ref).execute(lambda store: _benchmark(p, ref, n_pool, tol))


def _benchmark(p: SkipParams, ref: ModelRef, n_pool: int, tol: float) -> tuple[pd.DataFrame, dict[str, Any]]:
    load_before = load_average()
    lm = load_model(ref.here(), device=p.device, dtype=p.dtype)  # timed here, whatever the remote mode
    ex = load_examples(p.dataset, n_examples=1, seed=p.seed, selection=p.selection)[0]
    ids = lm.encode(ex.text)
    # two cut points keep the naive loop to 2 × L passes; scripts/bench_skipping.py runs the full setting
    cuts = draw_cuts(ids.shape[1], min(p.n_cuts, 2), p.seed, ex.id)
    paths = TapPaths.of(lm.adapter)
    t = time_paths(lm.adapter, ids, fast=lambda adapter, x, **kw: skip_effects(lm.nn, paths, x, config=lm.model.config,
                                                                               **kw),
                   cuts=cuts, parts=("layer",), local=False, current=False)
    if t.max_abs_diff > tol:
        raise AssertionError(f"fast and naive paths disagree: {t.max_abs_diff:.3g} > {tol}")
    u = work_units(lm.n_layers, ids.shape[1], cuts, False, 1, unembed_cost(lm.adapter))
    r4 = work_ratios(lm.adapter, [(ex.id, ids.shape[1])], 4, p.seed, False, 1)[0]  # the paper's 4 cuts
    pool = load_examples(p.dataset, n_examples=n_pool, seed=p.seed, selection=p.selection)
    ratios = np.array(work_ratios(lm.adapter, [(e.id, lm.encode(e.text).shape[1]) for e in pool], 4, p.seed, False, 1))
    row = dict(model=p.model_name, tokens=ids.shape[1], n_cuts=len(cuts), naive_passes=len(cuts) * lm.n_layers,
               threads=torch.get_num_threads(), naive_cpu_s=t.naive_cpu_s, fast_cpu_s=t.fast_cpu_s,
               naive_s=t.naive_s, fast_s=t.fast_s, max_abs_diff=t.max_abs_diff,
               counted_ratio=u["naive"] / u["fast"], counted_ratio_4=r4, pool=len(pool), pool_min=ratios.min(),
               pool_median=float(np.median(ratios)), pool_max=ratios.max(), pool_share_5x=float((ratios >= 5).mean()))
    meta = {"parameters": {"model_name": p.model_name, "example": ex.id, "cuts": [int(c) for c in cuts]},
            "model": lm.provenance(), "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load_average": [load_before, load_average()]}
    return pd.DataFrame([row]), meta


@dataclass(frozen=True)
class BenchmarkSummary(RunSummary):
    """When and where :func:`benchmark` timed the two paths (:meth:`of`); None where the sidecar does not say.

    Attributes:
        measured_at: the UTC date and time of the measurement.
        platform: the machine's platform string; ``cuda``: its GPU, if any.
        load_average: the machine's 1-minute load average before and after (the values it could read).
    """

    measured_at: str | None
    platform: str | None
    cuda: str | None
    load_average: tuple[float, ...]

    @classmethod
    def of(cls, result: RunResult) -> BenchmarkSummary:
        m = result.meta
        env = m.get("environment") or {}
        return cls(**cls.fields_of(result), measured_at=m.get("measured_at"), platform=env.get("platform"),
                   cuda=env.get("cuda") or None,
                   load_average=tuple(float(x) for x in m.get("load_average") or () if x is not None))
