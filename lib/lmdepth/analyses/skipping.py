"""The layer-skipping analysis of chapter 03: runs :mod:`lmdepth.hooks.skipping` over a data set, cached and resumable.

Aggregation follows the paper (METHOD §5): per problem, the effect is the max over measured positions and cut
points; over problems, the elementwise max. The mean over problems is kept too (less sensitive to one outlier).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lmdepth.data.datasets import dataset_id, load_examples, selection_record
from lmdepth.params import check_choice, check_common, check_range, check_type
from lmdepth.model.registry import load_model
from lmdepth.results import RunResult, RunStore
from lmdepth.runtime import environment, progress
from lmdepth.hooks.skipping import PARTS, draw_cuts, prompt_effects, variants

ANALYSIS = "layer_skipping"


def _tidy(model: str, effects: dict[tuple[str, str], np.ndarray], outputs: dict[tuple[str, str], np.ndarray]) -> pd.DataFrame:
    """effects[(analysis, variant)]: [P, L, L]; outputs: [P, L] → long table with max and mean over problems."""
    rows = []
    for (analysis, variant), E in effects.items():
        L = E.shape[1]
        O = outputs[analysis, variant]
        for stat, e, o in (("max", E.max(0), O.max(0)), ("mean", E.mean(0), O.mean(0))):
            base = dict(model=model, analysis=analysis, variant=variant, stat=stat, n_layers=L)
            rows += [{**base, "metric": "relative_change", "skipped_layer": s, "affected_layer": j, "value": e[s, j]}
                     for s in range(L) for j in range(L)]
            rows += [{**base, "metric": "output_change", "skipped_layer": s, "affected_layer": -1, "value": o[s]}
                     for s in range(L)]
    return pd.DataFrame(rows)


def later_effect(E: np.ndarray) -> np.ndarray:
    """[L, L] → [L]: for each skipped layer s, the largest effect on any *later* layer j > s (0 for the last)."""
    L = E.shape[0]
    return np.array([E[s, s + 1 :].max() if s + 1 < L else 0.0 for s in range(L)])


def cutoff_layer(E: np.ndarray, threshold: float) -> int:
    """The first skipped layer s from which on every later_effect stays below ``threshold`` (L if none)."""
    m = later_effect(E)
    above = np.nonzero(m >= threshold)[0]
    return int(above[-1] + 1) if len(above) else 0


def cutoff_with_ci(E_per_problem: np.ndarray, threshold: float, n_boot: int = 1000, seed: int = 0) -> dict[str, float]:
    """Cutoff of the max-over-problems effects, with a percentile bootstrap interval over problems.

    Args:
        E_per_problem: [P, L, L] per-problem effects.
    """
    point = cutoff_layer(E_per_problem.max(0), threshold)
    rng = np.random.default_rng(seed)
    P = len(E_per_problem)
    boots = [cutoff_layer(E_per_problem[rng.integers(0, P, P)].max(0), threshold) for _ in range(n_boot)]
    lo, hi = np.quantile(boots, [0.025, 0.975])
    L = E_per_problem.shape[1]
    return {"cutoff": point, "ci_low": float(lo), "ci_high": float(hi), "n_layers": L, "rel_depth": point / L,
            "threshold": threshold}


def run(
    model_name: str = "smollm2-135m",
    analysis: str = "future",
    dataset: str = "gsm8k",
    n_examples: int = 10,
    seed: int = 0,
    selection: str = "random",
    parts: list[str] | tuple[str, ...] = PARTS,
    local: bool = True,
    n_cuts: int = 4,
    cut_stride: int = 8,
    threshold: float = 0.1,
    device: str = "cpu",
    dtype: str = "float32",
    results_dir: str | Path = "results",
    use_cache: bool = True,
    n_boot: int = 1000,
) -> RunResult:
    """Skip effects of every layer of one model over a data set (cached; resumes per problem).

    Args:
        analysis: ``"future"`` (intervene before a cut point, measure after it; Fig. 3b) or ``"current"``
            (intervene and measure at all tokens; Fig. 3a).
        parts: any of ``"layer"``, ``"attention"``, ``"mlp"``; ``local`` adds the direct-effect variant (§5.5).
        n_cuts, cut_stride: future analysis: ``n_cuts`` cut points drawn from every ``cut_stride``-th token.
        threshold: the future-effect level below which a layer counts as not feeding later computation.

    Returns:
        Tidy table (``model, analysis, variant, stat, metric, skipped_layer, affected_layer, value``) and a
        sidecar whose ``summary`` holds the cutoff layer per variant with its bootstrap interval.
    """
    check_common(model_name=model_name, dataset=dataset, n_examples=n_examples, seed=seed, selection=selection,
                 device=device, dtype=dtype, use_cache=use_cache)
    check_choice("analysis", analysis, ["future", "current"])
    check_type("parts", list(parts), list)
    for p in parts:
        check_choice("parts", p, PARTS)
    check_type("local", local, bool)
    check_type("n_cuts", n_cuts, int)
    check_range("n_cuts", n_cuts, 1, 64)
    check_type("threshold", threshold, float)
    check_range("threshold", threshold, 0.0, 10.0)
    parts = [p for p in PARTS if p in parts]
    examples = load_examples(dataset, n_examples=n_examples, seed=seed, selection=selection)
    data_id = dataset_id(dataset)
    key = dict(analysis=analysis, dataset=data_id, n_examples=n_examples, seed=seed, selection=selection,
               parts=parts, local=local, dtype=dtype, threshold=threshold, n_boot=n_boot,
               **({"n_cuts": n_cuts, "cut_stride": cut_stride} if analysis == "future" else {}))
    per_item = {k: v for k, v in key.items() if k not in ("n_examples", "threshold", "n_boot")}
    store = RunStore(results_dir, ANALYSIS, model_name, key, item_params=per_item)
    if use_cache and store.complete:
        return store.load()
    if not use_cache:
        store.clear()

    t0 = time.time()
    lm = load_model(model_name, device=device, dtype=dtype)
    encoded = [(e, lm.encode(e.text, label=f"Example {e.id}")) for e in examples]
    names = [v.name for v in variants(parts, local)]
    per: dict[str, list[np.ndarray]] = {f"{n}_{x}": [] for n in names for x in "EO"}
    cuts_used = {}
    for ex, ids in progress(encoded, desc=f"{model_name}: skip effects ({analysis})"):
        cuts = draw_cuts(ids.shape[1], n_cuts, seed, ex.id, cut_stride) if analysis == "future" else []
        cuts_used[ex.id] = cuts
        item = store.load_item(ex.id)
        if item is None:
            res = prompt_effects(lm.adapter, ids, cuts=cuts, parts=parts, local=local, current=analysis == "current")
            item = {f"{v}_{x}": res[analysis, v][i].numpy() for v in names for i, x in enumerate("EO")}
            store.save_item(ex.id, item)
        for k in per:
            per[k].append(item[k])
    E = {(analysis, n): np.stack(per[f"{n}_E"]) for n in names}
    O = {(analysis, n): np.stack(per[f"{n}_O"]) for n in names}
    table = _tidy(model_name, E, O)
    summary = {n: cutoff_with_ci(E[analysis, n], threshold, n_boot, seed) for n in names} if analysis == "future" else {}
    meta = {
        "analysis": ANALYSIS,
        "parameters": {"model_name": model_name, **key, "device": device},
        "model": lm.provenance(),
        "data": {**selection_record(dataset, selection, seed, examples), "cuts": cuts_used},
        "summary": summary,
        "environment": environment(),
        "wall_time_s": round(time.time() - t0, 2),
    }
    return store.finalize(table, meta)


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


def run_models(models: list[str], **kwargs: Any) -> tuple[pd.DataFrame, dict[str, dict[str, Any]]]:
    results = {m: run(model_name=m, **kwargs) for m in models}
    return pd.concat([r.table for r in results.values()], ignore_index=True), {m: r.meta for m, r in results.items()}
