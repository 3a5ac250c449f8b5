"""Residual-stream statistics of paper Fig. 2: relative contributions, cosines and norms per layer.

Introduced in chapters 01 (norms) and 02 (cosine similarity); both read the same cached run, since one forward
pass per prompt yields every metric (METHOD §3–4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from lmdepth.hooks.capture import trace_layer_reductions
from lmdepth.data.datasets import dataset_id, Example, load_examples, selection_record
from lmdepth.metrics.residual import RESIDUAL_METRICS, DatasetStats, PromptStats, residual_token_metrics
from lmdepth.analyses.run import Job, require_tokens, concat_tables, per_unit, run_many as many
from lmdepth.model.registry import LoadedModel, load_model
from lmdepth.params import CommonParams, param
from lmdepth.results import RunResult, RunStore

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


@dataclass(frozen=True)
class ResidualParams(CommonParams):
    """Parameters of the residual-stream run (chapters 01 and 02)."""

    include_bos: bool = param(True, help="include position 0 in the averages (faithful default; METHOD §1.3)")


def run(params: ResidualParams | None = None, **kwargs: Any) -> RunResult:
    """Compute (or load from cache) the residual statistics of one model on a data set.

    Args:
        params: a :class:`ResidualParams`, or its fields as keyword arguments (``model_name``, ``dataset``,
            ``n_examples``, ``include_bos``, ``n_boot`` (bootstrap resamples over prompts) …).

    Returns:
        The tidy table (``model, metric, component, stat, layer, n_layers, rel_depth, value, ci_low, ci_high``)
        and the sidecar.
    """
    p = ResidualParams.of(params, **kwargs)
    examples = load_examples(p.dataset, n_examples=p.n_examples, seed=p.seed, selection=p.selection)
    key = dict(dataset=dataset_id(p.dataset), n_examples=p.n_examples, seed=p.seed, selection=p.selection,
               include_bos=p.include_bos, dtype=p.dtype, n_boot=p.n_boot)
    per_item = {k: v for k, v in key.items() if k not in ("n_examples", "n_boot")}
    return Job(ANALYSIS, p, key, per_item).execute(lambda store: _compute(p, key, examples, store))


def _compute(p: ResidualParams, key: dict[str, Any], examples: list[Example], store: RunStore
             ) -> tuple[pd.DataFrame, dict[str, Any]]:
    lm = load_model(p.model_name, device=p.device, dtype=p.dtype, remote=p.remote)
    # Tokenize everything first: a prompt that does not fit fails before any compute is spent.
    encoded = [(e.id, lm.encode(e.text, label=f"Example {e.id}")) for e in examples]
    if not p.include_bos:
        require_tokens(encoded, 2, "include_bos=False leaves no position to average")

    def one(_: str, ids: Any) -> dict[str, np.ndarray]:
        vals = prompt_metrics(lm, ids)
        ps = PromptStats.from_tokens(vals if p.include_bos else vals[:, :, 1:])
        return {"sum": ps.sum, "max": ps.max, "count": np.array(ps.count)}

    stats = DatasetStats()
    for item in per_unit(store, encoded, one, desc=f"{p.model_name}: residual stats"):
        stats.add(PromptStats(item["sum"], item["max"], int(item["count"])))
    table = tidy_table(stats, p.model_name, n_boot=p.n_boot, seed=p.seed)
    meta = {
        "parameters": {"model_name": p.model_name, **key, "device": p.device, "remote": p.remote},
        "model": lm.provenance(),
        "data": selection_record(p.dataset, p.selection, p.seed, examples),
        "n_tokens": stats.count,
    }
    return table, meta


def run_many(model_names: list[str], **kwargs: Any) -> tuple[pd.DataFrame, dict[str, dict[str, Any]]]:
    """:func:`run` for several models; returns the concatenated table and each model's sidecar."""
    results = many(run, model_names, **kwargs)
    return concat_tables(results), {m: r.meta for m, r in results.items()}


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
