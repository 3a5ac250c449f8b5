"""Residual-stream statistics of paper Fig. 2: relative contributions, cosines and norms per layer.

Introduced in chapters 01 (norms) and 02 (cosine similarity); both read the same cached run, since one forward
pass per prompt yields every metric (METHOD §3–4).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lmdepth.hooks.capture import trace_layer_reductions
from lmdepth.data.datasets import dataset_id, Example, load_examples, selection_record
from lmdepth.metrics.residual import RESIDUAL_METRICS, DatasetStats, PromptStats, residual_token_metrics
from lmdepth.params import check_common, check_type
from lmdepth.model.registry import LoadedModel, load_model
from lmdepth.results import RunResult, RunStore
from lmdepth.runtime import environment, progress

ANALYSIS = "residual_stream"


def prompt_metrics(lm: LoadedModel, ids: Any) -> np.ndarray:
    """One traced forward pass → per-token metrics of every layer.

    Args:
        lm: loaded model.
        ids: [1, tokens] token ids.

    Returns:
        [metrics, layers, tokens] fp32, rows in :data:`RESIDUAL_METRICS` order.
    """
    vals = trace_layer_reductions(lm.nn, lm.adapter, ids, residual_token_metrics, remote=lm.remote)  # [L, M, 1, T]
    return vals[:, :, 0, :].permute(1, 0, 2).float().numpy()


def tidy_table(stats: DatasetStats, model: str, n_boot: int, seed: int) -> pd.DataFrame:
    """Long table: one row per (metric, component, stat, layer)."""
    mean, mx = stats.mean(), stats.max()
    lo, hi = stats.bootstrap_mean_ci(n_boot=n_boot, seed=seed)
    n_layers = mean.shape[1]
    rows = []
    for i, (metric, component) in enumerate(RESIDUAL_METRICS):
        for layer in range(n_layers):
            base = dict(model=model, metric=metric, component=component, layer=layer, n_layers=n_layers,
                        rel_depth=(layer + 0.5) / n_layers)
            rows.append({**base, "stat": "mean", "value": mean[i, layer], "ci_low": lo[i, layer], "ci_high": hi[i, layer]})
            rows.append({**base, "stat": "max", "value": mx[i, layer], "ci_low": np.nan, "ci_high": np.nan})
    return pd.DataFrame(rows)


def run(
    model_name: str = "smollm2-135m",
    dataset: str = "gsm8k",
    n_examples: int = 20,
    seed: int = 0,
    selection: str = "random",
    include_bos: bool = True,
    device: str = "cpu",
    dtype: str = "float32",
    remote: bool = False,
    results_dir: str | Path = "results",
    use_cache: bool = True,
    n_boot: int = 1000,
) -> RunResult:
    """Compute (or load from cache) the residual statistics of one model on a data set.

    Args:
        model_name: packaged short name, hub id or local directory.
        dataset: ``"gsm8k"``, ``"math"`` or a JSONL path.
        n_examples: number of examples (the paper: 10–20 GSM8K problems).
        seed, selection: see :func:`lmdepth.data.datasets.load_examples`.
        include_bos: include position 0 in the averages (faithful default; METHOD §1.3).
        device, dtype, remote: where and how the model runs.
        results_dir: root of the results cache.
        use_cache: reuse a finished run and the checkpoints of an interrupted one; False recomputes.
        n_boot: bootstrap resamples (over prompts) for the confidence intervals of the means.

    Returns:
        The tidy table (``model, metric, component, stat, layer, n_layers, rel_depth, value, ci_low, ci_high``)
        and the sidecar.
    """
    check_common(model_name=model_name, dataset=dataset, n_examples=n_examples, seed=seed, selection=selection,
                 device=device, dtype=dtype, use_cache=use_cache, remote=remote)
    check_type("include_bos", include_bos, bool)
    check_type("n_boot", n_boot, int)
    examples = load_examples(dataset, n_examples=n_examples, seed=seed, selection=selection)
    data_id = dataset_id(dataset)
    key_params = dict(dataset=data_id, n_examples=n_examples, seed=seed, selection=selection,
                      include_bos=include_bos, dtype=dtype, n_boot=n_boot)
    per_item = {k: v for k, v in key_params.items() if k not in ("n_examples", "n_boot")}
    store = RunStore(results_dir, ANALYSIS, model_name, key_params, item_params=per_item)
    if use_cache and store.complete:
        return store.load()
    if not use_cache:
        store.clear()

    t0 = time.time()
    lm = load_model(model_name, device=device, dtype=dtype, remote=remote)
    # Tokenize everything first: a prompt that does not fit fails before any compute is spent.
    encoded = [(e, lm.encode(e.text, label=f"Example {e.id}")) for e in examples]
    stats = DatasetStats()
    for ex, ids in progress(encoded, desc=f"{model_name}: residual stats"):
        cached = store.load_item(ex.id)
        if cached is None:
            vals = prompt_metrics(lm, ids)
            if not include_bos:
                vals = vals[:, :, 1:]
            ps = PromptStats.from_tokens(vals)
            store.save_item(ex.id, {"sum": ps.sum, "max": ps.max, "count": np.array(ps.count)})
        else:
            ps = PromptStats(cached["sum"], cached["max"], int(cached["count"]))
        stats.add(ps)

    table = tidy_table(stats, model_name, n_boot=n_boot, seed=seed)
    meta = {
        "analysis": ANALYSIS,
        "parameters": {"model_name": model_name, **key_params, "device": device, "remote": remote},
        "model": lm.provenance(),
        "data": selection_record(dataset, selection, seed, examples),
        "n_tokens": stats.count,
        "environment": environment(),
        "wall_time_s": round(time.time() - t0, 2),
    }
    return store.finalize(table, meta)


def run_many(model_names: list[str], **kwargs: Any) -> tuple[pd.DataFrame, dict[str, dict[str, Any]]]:
    """:func:`run` for several models; returns the concatenated table and each model's sidecar."""
    results = {m: run(model_name=m, **kwargs) for m in model_names}
    return pd.concat([r.table for r in results.values()], ignore_index=True), {m: r.meta for m, r in results.items()}


# ---- summaries used by the chapters' claim checks ---------------------------------------------------------

def select(table: pd.DataFrame, metric: str, component: str, stat: str = "mean", model: str | None = None) -> pd.Series:
    """Values indexed by layer for one (model, metric, component, stat)."""
    t = table[(table.metric == metric) & (table.component == component) & (table.stat == stat)]
    if model is not None:
        t = t[t.model == model]
    return t.set_index("layer")["value"].sort_index()


def half_means(values: pd.Series, skip_first: int = 0) -> tuple[float, float]:
    """Mean over the first and over the second half of the layers (the middle layer of an odd L goes to neither).

    ``skip_first`` leaves the first layers out of the first half: their large *relative* writes reflect the small
    embedding norm they start from, not the mid-depth drop the paper describes.
    """
    n = len(values)
    return float(values.iloc[skip_first : n // 2].mean()), float(values.iloc[(n + 1) // 2 :].mean())


def half_ratio(values: pd.Series, skip_first: int = 0) -> float:
    """Second-half mean / first-half mean (see :func:`half_means`)."""
    first, second = half_means(values, skip_first)
    return second / first


def cosine_transition_layer(table: pd.DataFrame, model: str | None = None) -> int | None:
    """Effective depth from cosines (arXiv 2512.14064): the last layer where the mean of the attention, MLP and
    layer cosines goes from < 0 to ≥ 0. None if it never does."""
    avg = sum(select(table, "cosine", c, model=model) for c in ("attention", "mlp", "layer")) / 3
    ups = [l for l in avg.index[1:] if avg[l - 1] < 0 <= avg[l]]
    return int(ups[-1]) if ups else None


__all__ = ["ANALYSIS", "run", "run_many", "select", "half_means", "cosine_transition_layer", "Example"]
