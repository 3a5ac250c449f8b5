"""Cross-model linear maps between residual streams (paper Fig. 8; book/method.md#method-maps; chapter 06).

For a source model A and a target model B read on the same text, fit for every pair of residual boundaries
(m in A, l in B; m = 0 is the embedding output, m = L the last layer's output before the final norm) an affine map
f(h) = h W + b that predicts h_l^B from h_m^A at the same text position, and report its held-out error

    relative error(m, l) = sqrt( Σ_t ‖h_l(t) − f(h_m(t))‖² / Σ_t ‖h_l(t)‖² )      (a ratio of sums over test tokens).

How (all closed form, no SGD):

1. Positions: where every model's tokenizer ends a token at the same character offset
   (:mod:`lmdepth.data.alignment`); position 0 and special tokens are dropped. Texts are assigned whole to the test,
   validation and training splits, so neighbouring tokens never straddle two splits.
2. Residuals h_0..h_L of each model are collected once at those positions ([tokens, L+1, d] float32 in memory).
3. Sufficient statistics per split, streamed over 2048-token chunks and centred by the *training* means:
   per-layer Gram matrices X̃_mᵀX̃_m (float64 accumulators), the cross-products X̃_mᵀỸ_l of every layer pair (one
   matrix [(L_A+1)·d_A, (L_B+1)·d_B], shared by both directions A→B and B→A), and Σ‖h‖² per layer.
4. Per source layer m: one eigendecomposition of X̃_mᵀX̃_m (float64) serves every ridge strength λ and every
   target layer l: W_λ = V diag(1/(s+λ)) Vᵀ X̃_mᵀỸ, bias b = μ_Y − μ_X W. λ = α · mean eigenvalue, α per (m, l)
   chosen on the validation split. Validation and test errors follow exactly from their statistics:
   Σ‖ỹ − x̃W‖² = Σ‖ỹ‖² − 2⟨W, X̃ᵀỸ⟩ + ⟨W, X̃ᵀX̃ W⟩.

Cost: dominated by the cross-products, 2 · tokens · (L_A+1)d_A · (L_B+1)d_B flops per model pair (both
directions); minutes on a CPU against the paper's 80 GPU-days of SGD.

What chapter 06 shows is built here from the tidy table and its sidecar: the run's paragraph (:func:`run_md`), the
summary and control tables, the best-source prose, the claims (:func:`claims`), the checks (:func:`check_run`) and
the speed section.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from transformers import AutoConfig, AutoTokenizer

from lmdepth.analyses.run import Job, RunSummary, resolved
from lmdepth.data.alignment import GENERAL_TEXTS, general_text_id
from lmdepth.data.corpus import CorpusPlan, corpus_docs, plan_corpus
from lmdepth.data.datasets import dataset_id
from lmdepth.errors import ParameterError
from lmdepth.metrics.ridge import (
    DEFAULT_ALPHAS,
    PRODUCT_DTYPES,
    MapFit,
    boundary_layers,
    error_matrix,
    fit_maps,
)
from lmdepth.model.registry import ModelRef, load_model
from lmdepth.params import ModelParams, check_remote, param
from lmdepth.results import RunResult, RunStore, temporary_dir
from lmdepth.runtime import load_average, progress, resolve_device
from lmdepth.traces.boundary_residuals import boundary_residuals_at
from lmdepth.traces.residual_metrics import TapPaths
from lmdepth.traces.server import MAX_RESULT

ANALYSIS = "linear_maps"


@torch.no_grad()
def collect(lm: Any, plan: CorpusPlan, model_index: int, batch_tokens: int = 2048, desc: str = "",
            spool: Path | None = None, max_result_bytes: int = MAX_RESULT) -> np.ndarray:
    """Residuals h_0..h_L of one model at the plan's aligned positions, in row order.

    With ``spool`` (a ``.npy`` path) they are written to that file and returned memory-mapped: the same float32
    values, held by the operating system's page cache instead of the process (which may evict them under memory
    pressure, e.g. on a 12 GB Colab runtime).

    Consecutive texts are batched (right-padded, up to ``batch_tokens`` padded tokens per batch; causal attention
    never lets a position see a later one, so padding changes nothing before it): fewer, larger matrix products,
    which suits a GPU. One batch is one request on NDIF, and what comes back is (L + 1) · d · 4 bytes per aligned
    position, so a batch also holds at most ``max_result_bytes`` of them (the strict server's bound, 50 MB: 18
    positions of Llama 3.1 70B); a text with more positions than that is run once per share of them.

    Returns:
        [rows, L + 1, d_model] float32.
    """
    shape = (plan.n_rows, lm.n_layers + 1, lm.adapter.d_model)
    out = (np.lib.format.open_memmap(spool, mode="w+", dtype=np.float32, shape=shape) if spool is not None
           else np.empty(shape, dtype=np.float32))
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    r, paths = 0, TapPaths.of(lm.adapter)
    for batch in progress(request_batches(plan, model_index, batch_tokens, max_result_bytes // (4 * shape[1] * shape[2])),
                          desc=desc or f"{lm.name}: residuals"):
        seqs = [plan.ids[k][model_index] for k, _ in batch]
        width = max(len(q) for q in seqs)
        ids = torch.tensor([q + [pad] * (width - len(q)) for q in seqs])
        ids = ids if lm.remote else ids.to(lm.device)
        pos = [torch.as_tensor(plan.positions[k][model_index][share], dtype=torch.long) for k, share in batch]
        rows = torch.cat([torch.full((len(p),), b, dtype=torch.long) for b, p in enumerate(pos)])
        h = boundary_residuals_at(lm.nn, paths, ids, rows, torch.cat(pos), remote=lm.remote_mode)  # [L+1, R, d]
        out[r : r + h.shape[1]] = h.transpose(0, 1).numpy()
        r += h.shape[1]
    assert r == plan.n_rows
    if spool is not None:
        out.flush()
    return out


def request_batches(plan: CorpusPlan, model_index: int, batch_tokens: int, max_rows: int) -> list[list[tuple[int, slice]]]:
    """The collection's requests, in row order: each a list of (text index, share of its aligned positions), at most
    ``batch_tokens`` padded tokens (a text alone may exceed it) and at most ``max_rows`` positions (≥ 1) each."""
    max_rows = max(1, int(max_rows))
    units = [(k, slice(i, i + max_rows)) for k in range(len(plan.ids))
             for i in range(0, max(1, len(plan.positions[k][model_index])), max_rows)]
    batches, cur, n_rows = [], [], 0
    for k, share in units:
        n = len(plan.positions[k][model_index][share])
        longest = max([len(plan.ids[j][model_index]) for j, _ in cur] + [len(plan.ids[k][model_index])])
        if cur and (longest * (len(cur) + 1) > batch_tokens or n_rows + n > max_rows):
            batches.append(cur)
            cur, n_rows = [], 0
        cur.append((k, share))
        n_rows += n
    return batches + [cur]


# ---- summaries -------------------------------------------------------------------------------------------------

def best_matches(err: np.ndarray, src_layers: list[int], tgt_layers: list[int], n_src: int, n_tgt: int) -> pd.DataFrame:
    """Per source boundary (row), the target boundary with the lowest error, with relative depths m/L_A, l/L_B."""
    j = np.argmin(err, axis=1)
    d = pd.DataFrame({"source_layer": src_layers, "best_target_layer": np.asarray(tgt_layers)[j],
                      "error": err[np.arange(len(j)), j]})
    d["source_depth"] = d.source_layer / n_src
    d["target_depth"] = d.best_target_layer / n_tgt
    d["offset"] = d.target_depth - d.source_depth
    return d


def best_sources(err: np.ndarray, src_layers: list[int], tgt_layers: list[int], n_src: int, n_tgt: int) -> pd.DataFrame:
    """Per target boundary (column), the source boundary that predicts it best.

    Unlike :func:`best_matches` this compares errors of the *same* target, so a target boundary that is easy to
    predict from anything (e.g. mostly a constant direction) cannot attract every row's best match.
    """
    i = np.argmin(err, axis=0)
    d = pd.DataFrame({"target_layer": tgt_layers, "best_source_layer": np.asarray(src_layers)[i],
                      "error": err[i, np.arange(len(i))]})
    d["source_depth"] = d.best_source_layer / n_src
    d["target_depth"] = d.target_layer / n_tgt
    d["offset"] = d.target_depth - d.source_depth
    return d


def diagonal_summary(best: pd.DataFrame) -> dict[str, float]:
    """How close best matches (:func:`best_matches` or :func:`best_sources`) lie to the equal-relative-depth line.

    Returns:
        ``corr``: Pearson correlation of source and best-target relative depth (NaN if either is constant);
        ``mean_abs_offset``: mean |l*/L_B − m/L_A|; ``max_abs_offset``.
    """
    a, b = best.source_depth.to_numpy(), best.target_depth.to_numpy()
    corr = float(np.corrcoef(a, b)[0, 1]) if a.std() > 0 and b.std() > 0 else float("nan")
    off = np.abs(best.offset.to_numpy())
    return {"corr": corr, "mean_abs_offset": float(off.mean()), "max_abs_offset": float(off.max())}


def map_table(fit: MapFit, label: str, kind: str, source: str, target: str, n_src: int, n_tgt: int) -> pd.DataFrame:
    """Tidy rows: one per (source boundary, target boundary, metric), plus the mean-only baseline per target."""
    rows = []
    metrics = {"relative_error": fit.rel_error, "unexplained_variance": fit.fvu,
               "val_relative_error": fit.val_rel_error, "ridge_alpha": fit.alpha}
    base = dict(map=label, kind=kind, source=source, target=target, n_source_layers=n_src, n_target_layers=n_tgt)
    for i, m in enumerate(fit.src_layers):
        for j, l in enumerate(fit.tgt_layers):
            for name, arr in metrics.items():
                rows.append({**base, "source_layer": m, "target_layer": l, "source_depth": m / n_src,
                             "target_depth": l / n_tgt, "metric": name, "value": float(arr[i, j])})
    for j, l in enumerate(fit.tgt_layers):
        rows.append({**base, "source_layer": -1, "target_layer": l, "source_depth": np.nan, "target_depth": l / n_tgt,
                     "metric": "mean_baseline_error", "value": float(fit.baseline[j])})
    return pd.DataFrame(rows)


def summarize_map(table: pd.DataFrame, label: str) -> dict[str, Any]:
    """Best matches per row (source boundary) and per column (target boundary) and how close each set lies to the
    equal-relative-depth line (``row_corr``, ``row_mean_abs_offset``, …, ``col_corr``, …), from the tidy table."""
    t = table[table["map"] == label]
    n_src, n_tgt = int(t.n_source_layers.iloc[0]), int(t.n_target_layers.iloc[0])
    e = error_matrix(table, label)
    args = (e.to_numpy(), list(e.index), list(e.columns), n_src, n_tgt)
    rows, cols = best_matches(*args), best_sources(*args)
    return {"map": label, "kind": t.kind.iloc[0], "source": t.source.iloc[0], "target": t.target.iloc[0],
            "n_source_layers": n_src, "n_target_layers": n_tgt,
            **{f"row_{k}": v for k, v in diagonal_summary(rows).items()},
            **{f"col_{k}": v for k, v in diagonal_summary(cols).items()},
            "best_rows": rows.to_dict(orient="list"), "best_cols": cols.to_dict(orient="list")}


# ---- what chapter 06 shows: tables, prose, claims and checks from a finished run ----------------------------------

def mean_baseline(table: pd.DataFrame, label: str) -> pd.Series:
    """Held-out error of the mean-only predictor (the target's training mean) per target boundary of one map."""
    return table[(table["map"] == label) & (table.metric == "mean_baseline_error")].set_index("target_layer")["value"]


def error_over_baseline(table: pd.DataFrame, label: str) -> np.ndarray:
    """[source boundary × target boundary] error of one map divided by the mean-only error of its column."""
    e = error_matrix(table, label)
    return (e / mean_baseline(table, label)[e.columns].to_numpy()).to_numpy()


# ---- the run ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MapSpec:
    """One map family to fit: ``kind`` is "main" (both directions), "self" or "shuffled"."""

    kind: str
    source: str
    target: str
    stride: int = 1

    @property
    def labels(self) -> list[str]:
        if self.kind == "main":
            return [f"{self.source} → {self.target}", f"{self.target} → {self.source}"]
        suffix = " (self-map)" if self.kind == "self" else " (shuffled pairs)"
        return [f"{self.source} → {self.target}{suffix}"]


def map_specs(model_name: str, compare_models: list[str], self_map_model: str, shuffle_control: bool,
              control_stride: int, layer_stride: int = 1, all_pairs: bool = False) -> list[MapSpec]:
    """The maps of one run: ``model_name`` with each compare model (and, with ``all_pairs``, every pair of compare
    models too), both directions each, then the controls."""
    specs = [MapSpec("main", model_name, c, layer_stride) for c in compare_models]
    if all_pairs:
        specs += [MapSpec("main", a, b, layer_stride) for i, a in enumerate(compare_models) for b in compare_models[i + 1:]]
    if self_map_model:
        specs.append(MapSpec("self", self_map_model, self_map_model, control_stride))
    if shuffle_control and compare_models:
        specs.append(MapSpec("shuffled", model_name, compare_models[0], control_stride))
    return specs


def tokenizer_of(model: str | ModelRef) -> tuple[Any, int | None]:
    """A model's tokenizer and context length, without loading its weights (a name is resolved; a run passes its
    :class:`~lmdepth.model.registry.ModelRef`)."""
    path = (model if isinstance(model, ModelRef) else ModelRef.of(model)).location()
    cfg = AutoConfig.from_pretrained(path)
    return AutoTokenizer.from_pretrained(path), getattr(cfg, "max_position_embeddings", None)


@dataclass(frozen=True)
class MapsParams(ModelParams):
    """Parameters of the cross-model linear maps (chapter 06)."""

    compare_models: list[str] = param(["gemma3-270m"], help="the other model of each pair")
    all_pairs: bool = param(True, help="also map every pair of compare_models onto each other")
    self_map_model: str = param("gemma3-270m", help="model mapped onto itself (control: the identity line); '' to skip")
    shuffle_control: bool = param(True, help="also fit model_name → compare_models[0] on shuffled token pairs")
    dataset: str = param("gsm8k", help="word problems ('gsm8k', 'math' — train split — or a JSONL file)")
    general_text: str = param("python-docs", choices=GENERAL_TEXTS,
                              help="'python-docs' (the Python language reference shipped with CPython) or 'none'")
    general_fraction: float = param(0.5, lo=0.0, hi=1.0, help="share of the general text in every split (characters)")
    n_train_tokens: int = param(12000, lo=2, hi=10_000_000, help="minimum aligned positions in the training split")
    n_val_tokens: int = param(4000, lo=1, hi=10_000_000, help="minimum aligned positions in the validation split")
    n_test_tokens: int = param(20000, lo=1, hi=10_000_000, help="minimum aligned positions in the test split")
    max_doc_chars: int = param(1200, lo=50, hi=100_000, help="texts are cut to this many characters")
    ridge_alphas: list[float] = param(list(DEFAULT_ALPHAS),
                                      help="ridge strengths relative to the mean eigenvalue; chosen on validation")
    layer_stride: int = param(1, lo=1, hi=1000, help="main maps use every k-th boundary (and the last)")
    control_stride: int = param(2, lo=1, hi=1000, help="controls use every k-th boundary (and the last)")
    product_dtype: str = param("float32", choices=tuple(PRODUCT_DTYPES), help="dtype of the streamed products")
    max_stats_gb: float = param(6.0, lo=0.001, hi=1e6, help="memory budget of the cross-product statistics")
    remote: bool | str = param(False, help="where the residuals are collected: false here, true on NDIF (hub ids; "
                                            "they come back, [L+1, d] per aligned token), 'local' the offline "
                                            "simulation of NDIF; the maps are fitted here")

    def check_consistency(self) -> None:
        for m in {self.model_name, *self.compare_models, *([self.self_map_model] if self.self_map_model else [])}:
            check_remote(m, self.remote)
        if not [m for m in self.compare_models if m != self.model_name]:
            raise ParameterError("compare_models must name at least one model other than model_name: the maps go "
                                 f"between two models (got model_name={self.model_name!r}, compare_models="
                                 f"{self.compare_models!r}). Example: compare_models: [gemma3-270m].")
        if self.general_text == "none" and self.general_fraction > 0:
            raise ParameterError("general_fraction must be 0 when general_text is 'none'.")
        # α = 0 would divide by the zero eigenvalues of a rank-deficient Gram (NaN errors): use a tiny α instead
        if not self.ridge_alphas or not all(isinstance(a, (int, float)) and not isinstance(a, bool) and a > 0
                                            for a in self.ridge_alphas):
            raise ParameterError(f"ridge_alphas must be a non-empty list of numbers > 0 (e.g. 1e-8 for almost no "
                                 f"regularisation), got {self.ridge_alphas!r}.")


def run(params: MapsParams | ModelRef | str | None = None, **kwargs: Any) -> RunResult:
    """Fit every layer-pair linear map between ``model_name`` and each of ``compare_models`` (both directions),
    plus the controls, or load the run from the cache.

    Args:
        params: a :class:`MapsParams`, or its fields as keyword arguments. Token budgets are minimum aligned
            positions per split (whole texts are added until each is reached); ``max_stats_gb`` bounds the
            cross-product statistics (above it target layers go in groups); the residuals themselves take
            tokens · Σ(L+1)·d · 4 bytes.

    Returns:
        Tidy table (``map, kind, source, target, source_layer, target_layer, n_source_layers, n_target_layers,
        source_depth, target_depth, metric, value``) and the sidecar (corpus, coverage, summaries, timings).
    """
    p, ref = resolved(MapsParams, params, kwargs)
    compare_models = [m for m in dict.fromkeys(p.compare_models) if m != p.model_name]
    specs = map_specs(p.model_name, compare_models, p.self_map_model, p.shuffle_control, p.control_stride,
                      p.layer_stride, p.all_pairs)
    models = list(dict.fromkeys([p.model_name, *compare_models] + ([p.self_map_model] if p.self_map_model else [])))
    key = dict(compare_models=compare_models, self_map_model=p.self_map_model, shuffle_control=p.shuffle_control,
               **({"all_pairs": True} if p.all_pairs and len(compare_models) > 1 else {}),
               dataset=dataset_id(p.dataset), general_text=p.general_text, general_fraction=p.general_fraction,
               n_train_tokens=p.n_train_tokens, n_val_tokens=p.n_val_tokens, n_test_tokens=p.n_test_tokens,
               max_doc_chars=p.max_doc_chars, ridge_alphas=list(p.ridge_alphas), layer_stride=p.layer_stride,
               control_stride=p.control_stride, product_dtype=p.product_dtype, seed=p.seed, dtype=p.dtype)
    if p.general_text == "python-docs" and p.general_fraction > 0:
        key["general_text_id"] = general_text_id()
    job = Job(ANALYSIS, p, key, models=models, refs=ref)  # the other models resolved here, once
    return job.execute(lambda store: _compute(p, job.refs, specs, models, key, store))


def _compute(p: MapsParams, refs: dict[str, ModelRef], specs: list[MapSpec], models: list[str], key: dict[str, Any],
             store: RunStore) -> tuple[pd.DataFrame, dict[str, Any]]:
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    load_before = load_average()
    # The corpus is planned with the tokenizers alone; then one model at a time is loaded, its residuals collected
    # and the model released, so peak memory is one model plus the residuals (the paper profile maps 1.5B ↔ 14B).
    toks = {m: tokenizer_of(refs[m]) for m in models}
    timings["load_tokenizers"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    docs = corpus_docs(p.dataset, p.general_text, p.general_fraction, p.max_doc_chars, p.seed)
    plan = plan_corpus({m: tok for m, (tok, _) in toks.items()}, docs,
                       {"train": p.n_train_tokens, "val": p.n_val_tokens, "test": p.n_test_tokens},
                       {m: max_len for m, (_, max_len) in toks.items()})
    timings["tokenize_and_align"] = time.perf_counter() - t1

    fits: dict[str, MapFit] = {}
    for spec in specs:
        for label in spec.labels:
            cached = store.load_item(label)
            if cached is not None:
                fits[label] = MapFit.from_arrays(cached)

    residuals: dict[str, np.ndarray] = {}
    provenance: dict[str, dict[str, Any]] = {}
    needed = {m for s in specs if any(l not in fits for l in s.labels) for m in (s.source, s.target)}
    # Residuals go to files beside the results and are read memory-mapped: the default set (three models, 36k
    # positions) is 7.6 GB, which with the statistics would not fit a 12 GB Colab runtime in RAM. Removed at the end
    # (and by `lmdepth clean` if the process dies: a marked temporary).
    with temporary_dir(p.results_dir, "residuals-") as spool:
        for i, m in enumerate(models):
            t1 = time.perf_counter()
            lm = load_model(refs[m], device=p.device, dtype=p.dtype)
            provenance[m] = lm.provenance()
            if m in needed:
                residuals[m] = collect(lm, plan, i, spool=Path(spool) / f"{i}.npy")
                timings[f"residuals {m}"] = time.perf_counter() - t1
            del lm
            gc.collect()

        n_layers = {m: provenance[m]["n_layers"] for m in models}
        for spec in specs:
            if all(l in fits for l in spec.labels):
                continue
            t1 = time.perf_counter()
            a, b = residuals[spec.source], residuals[spec.target]
            sl = boundary_layers(n_layers[spec.source], spec.stride)
            tl = boundary_layers(n_layers[spec.target], spec.stride)
            fwd, bwd = fit_maps(a, b, plan.split_rows, sl, tl, p.ridge_alphas, both_directions=spec.kind == "main",
                                shuffle_seed=p.seed if spec.kind == "shuffled" else None, product_dtype=p.product_dtype,
                                device=resolve_device(p.device), max_stats_gb=p.max_stats_gb)
            for label, fit in zip(spec.labels, (fwd, bwd)):
                fits[label] = fit
                store.save_item(label, fit.arrays())
            timings[f"fit {spec.kind} {spec.source}→{spec.target}"] = time.perf_counter() - t1
        residuals.clear()

    tables = []
    for spec in specs:
        ends = [(spec.source, spec.target), (spec.target, spec.source)]
        for label, (s, t) in zip(spec.labels, ends):
            tables.append(map_table(fits[label], label, spec.kind, s, t, n_layers[s], n_layers[t]))
    table = pd.concat(tables, ignore_index=True)
    timings["total"] = time.perf_counter() - t0
    meta = {
        "analysis": ANALYSIS,
        "parameters": {"model_name": p.model_name, **key, "device": p.device,
                       **({"remote": p.remote} if p.remote is not False else {})},
        "models": provenance,
        "corpus": {"general_text": general_text_id() if p.general_text == "python-docs" else None,
                   "dataset": p.dataset, **plan.record()},
        "maps": [{"labels": s.labels, "kind": s.kind, "source": s.source, "target": s.target, "stride": s.stride}
                 for s in specs],
        "summaries": {label: {k: v for k, v in summarize_map(table, label).items() if not k.startswith("best")}
                      for s in specs for label in s.labels},
        "timings_s": {k: round(v, 2) for k, v in timings.items()},
        "wall_time_s": round(timings["total"], 2),
        # 1-minute load average of the machine before and after: wall times on a busy machine are not comparable
        "load_average": [load_before, load_average()],
    }
    return table, meta




# ---- what chapter 06 and the atlas read of a run ------------------------------------------------------------------

@dataclass(frozen=True)
class MapModel:
    """One model of a maps run, from its provenance."""

    n_layers: int
    d_model: int
    family: str


@dataclass(frozen=True)
class MapFamily:
    """One fitted map family of a run (a :class:`MapSpec` as the sidecar records it, with its maps' labels)."""

    kind: str
    source: str
    target: str
    stride: int
    labels: tuple[str, ...]


@dataclass(frozen=True)
class MapAlignment:
    """How closely one map's best matches follow equal relative depth (:func:`summarize_map`, without the matches).

    Attributes:
        row_*: the best target boundary of each source boundary; ``col_*``: the best source boundary of each target
            boundary. ``corr``: correlation of the two relative depths; ``mean_abs_offset`` / ``max_abs_offset``: the
            mean and largest |difference| of relative depth.
    """

    map: str
    kind: str
    source: str
    target: str
    n_source_layers: int
    n_target_layers: int
    row_corr: float
    row_mean_abs_offset: float
    row_max_abs_offset: float
    col_corr: float
    col_mean_abs_offset: float
    col_max_abs_offset: float


@dataclass(frozen=True)
class MapsSummary(RunSummary):
    """What chapter 06 and the atlas read of a maps run (:meth:`of`).

    Attributes:
        compare_models: the other model of each pair (as the run's parameters list them).
        n_test_tokens: the held-out aligned positions asked for.
        models: every model the run read → its layers, width and family.
        aligned_tokens: aligned positions per split (``train``, ``val``, ``test``); ``texts``: texts per split;
            ``texts_by_source``: texts per source (word problems, general text).
        coverage: per model, the share of its tokens (position 0 and specials excluded) that align with every other
            model's.
        general_text: the general text's id (None: no general text).
        families: the map families in the order they were fitted.
        alignments: map label → :class:`MapAlignment`.
        timings_s: seconds per step (tokenizers, alignment, residuals per model, fits per family, total).
        cpu_time_s: CPU time of the process, all threads (None for runs that did not record it).
        cpu_threads: torch threads of the run; ``cuda``: its GPU, if any.
    """

    compare_models: tuple[str, ...]
    n_test_tokens: int
    models: dict[str, MapModel]
    aligned_tokens: dict[str, int]
    texts: dict[str, int]
    texts_by_source: dict[str, int]
    coverage: dict[str, float]
    general_text: str | None
    families: tuple[MapFamily, ...]
    alignments: dict[str, MapAlignment]
    timings_s: dict[str, float]
    cpu_time_s: float | None
    cpu_threads: int | None
    cuda: str | None

    @classmethod
    def of(cls, result: RunResult) -> MapsSummary:
        m = result.meta
        p, corpus, env = m["parameters"], m["corpus"], m.get("environment") or {}
        return cls(
            **cls.fields_of(result), compare_models=tuple(p.get("compare_models") or ()),
            n_test_tokens=int(p["n_test_tokens"]),
            models={k: MapModel(int(v["n_layers"]), int(v["d_model"]), str(v["family"]))
                    for k, v in m["models"].items()},
            aligned_tokens=dict(corpus["aligned_tokens"]), texts=dict(corpus["texts"]),
            texts_by_source=dict(corpus["texts_by_source"]), coverage=dict(corpus["coverage"]),
            general_text=corpus.get("general_text"),
            families=tuple(MapFamily(f["kind"], f["source"], f["target"], int(f["stride"]), tuple(f["labels"]))
                           for f in m["maps"]),
            alignments={k: MapAlignment(**v) for k, v in m["summaries"].items()},
            timings_s=dict(m["timings_s"]), cpu_time_s=m.get("cpu_time_s"), cpu_threads=env.get("cpu_threads"),
            cuda=env.get("cuda") or None)

    def labels(self, kind: str) -> list[str]:
        """Labels of the run's maps of one ``kind`` ("main", "self" or "shuffled"), in the order they were fitted."""
        return [lab for f in self.families if f.kind == kind for lab in f.labels]


__all__ = ["ANALYSIS", "MapsParams", "MapSpec", "map_specs", "collect", "best_matches", "best_sources",
           "diagonal_summary", "summarize_map", "map_table", "run", "MapsSummary", "MapFamily", "MapAlignment", "MapModel",
           "mean_baseline", "error_over_baseline"]
