"""Residual-stream statistics of paper Fig. 2: relative contributions, cosines and norms per layer.

Introduced in chapters 01 (norms) and 02 (cosine similarity); both read the same cached run, since one forward
pass per prompt yields every metric (book/method.md#method-norms).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from lmdepth.analyses.run import Job, SampleSummary, concat_tables, per_unit, require_tokens, resolved
from lmdepth.analyses.run import run_many as many
from lmdepth.claims.spec import EARLY_LAYERS
from lmdepth.data.datasets import Example, dataset_id, load_examples, selection_record
from lmdepth.metrics import layer_curves
from lmdepth.metrics.residual_stats import RESIDUAL_METRICS, DatasetStats, PromptStats
from lmdepth.model.registry import LoadedModel, ModelRef, load_model
from lmdepth.params import CommonParams, param
from lmdepth.results import RunResult, RunStore
from lmdepth.traces.residual_metrics import TapPaths, residual_metrics

ANALYSIS = "residual_stream"


def prompt_metrics(lm: LoadedModel, ids: Any) -> np.ndarray:
    """One traced forward pass → per-token metrics of every layer.

    Args:
        lm: loaded model.
        ids: [1, tokens] token ids.

    Returns:
        [metrics, layers, tokens] fp32, rows in :data:`RESIDUAL_METRICS` order.
    """
    vals = residual_metrics(lm.nn, TapPaths.of(lm.adapter), ids, remote=lm.remote_mode)  # [L, M, 1, T]
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


def units_table(ids: list[str], items: list[dict[str, np.ndarray]], model: str) -> pd.DataFrame:
    """Per-problem table for claim verdicts: the token mean of every metric and layer within each problem, with
    the problem's token count (so a resample of problems can be re-weighted by tokens, as the main table is).

    Columns: ``model, unit, tokens, metric, component, layer, value``.
    """
    frames = []
    for uid, item in zip(ids, items):
        mean = item["sum"] / float(item["count"])  # [metrics, layers]
        n_layers = mean.shape[1]
        for i, (metric, component) in enumerate(RESIDUAL_METRICS):
            frames.append(pd.DataFrame({"model": model, "unit": uid, "tokens": int(item["count"]), "metric": metric,
                                        "component": component, "layer": np.arange(n_layers), "value": mean[i]}))
    return pd.concat(frames, ignore_index=True)


@dataclass(frozen=True)
class ResidualParams(CommonParams):
    """Parameters of the residual-stream run (chapters 01 and 02)."""

    include_bos: bool = param(True, help="include position 0 in the averages (faithful default; book/method.md#method-positions)")


def run(params: ResidualParams | ModelRef | str | None = None, **kwargs: Any) -> RunResult:
    """Compute (or load from cache) the residual statistics of one model on a data set.

    Args:
        params: a :class:`ResidualParams`, or its fields as keyword arguments (``model_name``, ``dataset``,
            ``n_examples``, ``include_bos``, ``n_boot`` (bootstrap resamples over prompts) …).

    Returns:
        The tidy table (``model, metric, component, stat, layer, n_layers, rel_depth, value, ci_low, ci_high``)
        and the sidecar.
    """
    p, ref = resolved(ResidualParams, params, kwargs)
    examples = load_examples(p.dataset, n_examples=p.n_examples, seed=p.seed, selection=p.selection)
    key = dict(dataset=dataset_id(p.dataset), n_examples=p.n_examples, seed=p.seed, selection=p.selection,
               include_bos=p.include_bos, dtype=p.dtype, n_boot=p.n_boot,
               outputs=2)  # 2: also the per-problem table (runs finished before it recompute from their checkpoints)
    per_item = {k: v for k, v in key.items() if k not in ("n_examples", "n_boot", "outputs")}
    return Job(ANALYSIS, p, key, per_item, refs=ref).execute(lambda store: _compute(p, ref, key, examples, store))


def _compute(p: ResidualParams, ref: ModelRef, key: dict[str, Any], examples: list[Example], store: RunStore
             ) -> tuple[pd.DataFrame, dict[str, Any], pd.DataFrame]:
    lm = load_model(ref, device=p.device, dtype=p.dtype)
    # Tokenize everything first: a prompt that does not fit fails before any compute is spent.
    encoded = [(e.id, lm.encode(e.text, label=f"Example {e.id}")) for e in examples]
    if not p.include_bos:
        require_tokens(encoded, 2, "include_bos=False leaves no position to average")

    def one(_: str, ids: Any) -> dict[str, np.ndarray]:
        vals = prompt_metrics(lm, ids)
        ps = PromptStats.from_tokens(vals if p.include_bos else vals[:, :, 1:])
        return {"sum": ps.sum, "max": ps.max, "count": np.array(ps.count)}

    stats = DatasetStats()
    items = per_unit(store, encoded, one, desc=f"{p.model_name}: residual stats")
    for item in items:
        stats.add(PromptStats(item["sum"], item["max"], int(item["count"])))
    table = tidy_table(stats, p.model_name, n_boot=p.n_boot, seed=p.seed)
    meta = {
        "parameters": {"model_name": p.model_name, **key, "device": p.device, "remote": p.remote},
        "model": lm.provenance(),
        "data": selection_record(p.dataset, p.selection, p.seed, examples),
        "n_tokens": stats.count,
    }
    return table, meta, units_table([uid for uid, _ in encoded], items, p.model_name)


@dataclass(frozen=True)
class ResidualSummary(SampleSummary):
    """What chapters 01–02 and the atlas read of a residual run (:meth:`of`).

    Attributes:
        d_model: the residual width.
        n_tokens: tokens averaged over (position 0 included when ``include_bos``).
        bos_policy: how the model's tokenizer treats the beginning of a text (the model's provenance).
        additivity_error: the error of the load-time self-check that the writes add up to the residual (None
            when it was skipped, e.g. on NDIF).
    """

    d_model: int
    n_tokens: int
    bos_policy: str
    additivity_error: float | None

    @classmethod
    def of(cls, result: RunResult) -> ResidualSummary:
        m = result.meta
        return cls(**cls.fields_of(result), d_model=int(m["model"]["d_model"]), n_tokens=int(m["n_tokens"]),
                   bos_policy=str(m["model"]["bos_policy"]), additivity_error=m["model"].get("additivity_error"))


def run_many(model_names: list[str], **kwargs: Any) -> tuple[pd.DataFrame, dict[str, ResidualSummary]]:
    """:func:`run` for several models; returns the concatenated table and each model's summary."""
    results = many(run, model_names, **kwargs)
    return concat_tables(results), {m: ResidualSummary.of(r) for m, r in results.items()}


def run_units(model_names: list[str], **kwargs: Any) -> pd.DataFrame | None:
    """The per-problem tables of :func:`run` for several models, concatenated (what claim verdicts resample); None
    for no models (e.g. no controls on a remote run)."""
    results = many(run, model_names, **kwargs)
    return pd.concat([r.units for r in results.values()], ignore_index=True) if results else None


# ---- summaries used by the chapters' claim checks ---------------------------------------------------------

def select(table: pd.DataFrame, metric: str, component: str, stat: str = "mean", model: str | None = None) -> pd.Series:
    """Values indexed by layer for one (model, metric, component, stat)."""
    t = table[(table.metric == metric) & (table.component == component) & (table.stat == stat)]
    if model is not None:
        t = t[t.model == model]
    return t.set_index("layer")["value"].sort_index()


def half_means(values: pd.Series, skip_first: int = 0) -> tuple[float, float]:
    """Mean over the first and over the second half of the layers (:func:`lmdepth.metrics.layer_curves.half_means`);
    ``skip_first`` leaves the first layers out of the first half."""
    return layer_curves.half_means(values.to_numpy(), skip_first)


def half_ratio(values: pd.Series, skip_first: int = 0) -> float:
    """Second-half mean / first-half mean (see :func:`half_means`)."""
    return layer_curves.half_ratio(values.to_numpy(), skip_first)


def mean_cosine(table: pd.DataFrame, model: str | None = None) -> pd.Series:
    """Per layer, the mean of the attention, MLP and whole-layer cosines."""
    return sum(select(table, "cosine", c, model=model) for c in ("attention", "mlp", "layer")) / 3


def cosine_transition_layer(table: pd.DataFrame, model: str | None = None) -> int | None:
    """The cosine phase transition (the book's one definition, also its claim check ``cosine.sign_change``): the
    change point of the mean cosine over layers 2…L−1, if the curve is negative on average before it and positive
    after it; None if there is no such sustained sign change."""
    curve = mean_cosine(table, model).to_numpy()
    if layer_curves.sign_change_margin(curve, EARLY_LAYERS) <= 0:
        return None
    return layer_curves.change_point(curve, EARLY_LAYERS)


__all__ = ["ANALYSIS", "ResidualSummary", "run", "run_many", "run_units", "select", "half_means", "half_ratio",
           "mean_cosine", "cosine_transition_layer", "Example"]
