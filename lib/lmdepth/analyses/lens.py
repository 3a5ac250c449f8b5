"""Logit lens and tuned lens (paper Fig. 4; chapter 04): when does the model's prediction settle?

The **logit lens** decodes the residual entering layer l (h_l, l = 0..L-1; h_0 = embeddings) with the model's own
final norm and unembedding, ``P_l = softmax(unembed(h_l))``, and compares it with the model's output distribution
``P_final = softmax(unembed(h_L))`` (book/method.md#method-lens):

- ``KL(P_l ‖ P_final)`` — the direction of the authors' code (also reported: ``KL(P_final ‖ P_l)``, the direction
  the tuned lens is trained on);
- top-5 overlap ``|top5(P_l) ∩ top5(P_final)| / 5``.

The **tuned lens** (Belrose et al. 2023) first applies a learned affine *translator* per layer,
``h ↦ h + A_l h + s_l b_l`` (A_l, b_l initialised to zero, so it starts as the logit lens; s_l is the mean RMS of
h_l, a constant that makes the bias step size scale-free), trained to minimise ``KL(P_final ‖ P_tuned)``.

Memory: vocabularies reach 262k tokens (Gemma 3), so every layer is reduced to per-token KL and overlap
immediately after its logits are computed; a [layers × tokens × vocab] tensor never exists. The unembedding
matmul runs in ``lens_dtype`` (fp32 by default; bf16 as in the paper's models is fast on GPUs but several times
slower than fp32 on CPUs without bf16 units); log-softmax is always fp32.

The tuned lens is an analysis of its own (:mod:`lmdepth.analyses.tuned_lens`: its parameters, training and cache
entry), fitted as its own cached job before this run's problems are read; this run applies its translators and
names its entry in the sidecar (``tuned_lens``).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from lmdepth.analyses import tuned_lens
from lmdepth.analyses.run import Job, SampleSummary, concat_tables, per_unit, require_tokens, resolved
from lmdepth.analyses.run import run_many as many
from lmdepth.analyses.tuned_lens import TunedLensParams, TunedLensTraining
from lmdepth.data.datasets import Example, dataset_id, load_examples, selection_record
from lmdepth.metrics.distributions import LENS_METRICS as METRICS
from lmdepth.metrics.distributions import TOP_K
from lmdepth.metrics.residual_stats import DatasetStats, PromptStats
from lmdepth.model.registry import LoadedModel, ModelRef, load_model
from lmdepth.model.translators import Translators
from lmdepth.model.unembed import DEFAULT_LENS_DTYPE
from lmdepth.params import CommonParams, param, param_of
from lmdepth.results import RunResult, RunStore
from lmdepth.traces.lens_trace import lens_readings
from lmdepth.traces.residual_metrics import TapPaths

ANALYSIS = "logit_lens"
LENSES = ("logit_lens", "tuned_lens")
STATS = ("mean", "token_mean")  # per-problem mean then mean over problems (paper); token-weighted ([NB])


def sample_positions(n_tokens: int, n: int, key: str, include_bos: bool = True) -> torch.Tensor:
    """A seeded, sorted sample of ``n`` positions of a text (all of them when ``n`` is 0 or ≥ the count).

    Uniform sampling keeps the per-problem mean over positions unbiased. Position 0 is excluded when
    ``include_bos`` is False.
    """
    pool = list(range(0 if include_bos else 1, n_tokens))
    if 0 < n < len(pool):
        pool = sorted(random.Random(key).sample(pool, n))
    return torch.tensor(pool, dtype=torch.long)


# ---- the run ------------------------------------------------------------------------------------------------

def tidy_table(per_prompt: np.ndarray, counts: np.ndarray, model: str, n_boot: int, seed: int) -> pd.DataFrame:
    """Long table: one row per (lens, metric, stat, layer).

    Args:
        per_prompt: [problems, lenses, metrics, layers] per-problem means over the evaluated positions.
        counts: [problems] tokens of each problem (the weights of the token-weighted mean).

    ``rel_depth`` is l / L: the fraction of layers applied before the residual entering layer l.
    """
    n_lens, n_layers = per_prompt.shape[1], per_prompt.shape[3]
    flat = per_prompt.reshape(len(per_prompt), -1, n_layers)  # [problems, lenses·metrics, layers]: DatasetStats' shape
    rows = []
    for stat in STATS:
        ds = DatasetStats()
        for v, c in zip(flat, counts):
            w = 1 if stat == "mean" else int(c)
            ds.add(PromptStats(sum=v * w, max=v, count=w))
        mean = ds.mean().reshape(per_prompt.shape[1:])
        lo, hi = (x.reshape(per_prompt.shape[1:]) for x in ds.bootstrap_mean_ci(n_boot=n_boot, seed=seed))
        for i in range(n_lens):
            for j, metric in enumerate(METRICS):
                for l in range(n_layers):
                    rows.append(dict(model=model, metric=metric, component=LENSES[i], stat=stat, layer=l,
                                     n_layers=n_layers, rel_depth=l / n_layers, value=mean[i, j, l],
                                     ci_low=lo[i, j, l], ci_high=hi[i, j, l]))
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class LensParams(CommonParams):
    """Parameters of the lens run (chapter 04)."""

    include_bos: bool = param(True, help="include position 0 (faithful default; book/method.md#method-positions)")
    positions_per_example: int = param(64, lo=0, hi=100_000,
                                       help="positions evaluated per problem, a seeded uniform sample (0 = all)")
    lens_dtype: str = param_of(TunedLensParams, "lens_dtype")
    tuned_lens: bool = param(True, help="also train (or load) and evaluate the tuned lens")
    n_train_tokens: int = param_of(TunedLensParams, "n_train_tokens")
    train_epochs: int = param_of(TunedLensParams, "train_epochs")

    def tuned(self) -> TunedLensParams | None:
        """The parameters of the tuned lens this run applies (None when it is switched off)."""
        return TunedLensParams.of(**{k: getattr(self, k) for k in TunedLensParams.names()}) if self.tuned_lens else None


@torch.no_grad()
def prompt_lens(lm: LoadedModel, ids: torch.Tensor, positions: torch.Tensor, lens_dtype: str = DEFAULT_LENS_DTYPE,
                translators: Translators | None = None) -> tuple[torch.Tensor, float]:
    """One problem's logit and tuned lens through the remote-ready trace (:func:`lmdepth.traces.lens_trace.lens_readings`),
    here, on NDIF or under its offline simulation (``lm.remote_mode``).

    Args:
        lm: loaded model.
        ids: [1, tokens] token ids.
        positions: [P] positions to evaluate.
        lens_dtype: dtype of the unembedding matmul.
        translators: tuned-lens translators (applied inside the trace) or None for the logit lens alone.

    Returns:
        ([lenses, metrics, layers, P] fp32, KL(lens on h_L ‖ model output) at the last position: ≈0).
    """
    tensors = None if translators is None else (translators.A.detach(), translators.b.detach(),
                                                 translators.scale.detach())
    softcap = getattr(lm.model.config, "final_logit_softcapping", None) or None
    return lens_readings(lm.nn, TapPaths.of(lm.adapter), ids, positions, lens_dtype, softcap, tensors, TOP_K,
                         remote=lm.remote_mode)


def run(params: LensParams | ModelRef | str | None = None, **kwargs: Any) -> RunResult:
    """Compute (or load from cache) the logit lens and the tuned lens of one model on a data set.

    Args:
        params: a :class:`LensParams`, or its fields as keyword arguments (or the model already resolved, with
            them). ``positions_per_example`` positions per problem are a seeded uniform sample, so the per-problem
            mean over positions stays unbiased; ``n_train_tokens``, ``train_epochs``: the tuned-lens budget
            (:class:`~lmdepth.analyses.tuned_lens.TunedLensParams`; the rest of the recipe is fixed).

    Returns:
        The tidy table (``model, metric, component, stat, layer, n_layers, rel_depth, value, ci_low, ci_high``;
        component = lens) and the sidecar (with ``tuned_lens``: the translators' cache entry and training info).
    """
    p, ref = resolved(LensParams, params, kwargs)
    examples = load_examples(p.dataset, n_examples=p.n_examples, seed=p.seed, selection=p.selection)
    tp = p.tuned()
    key = dict(dataset=dataset_id(p.dataset), n_examples=p.n_examples, seed=p.seed, selection=p.selection,
               include_bos=p.include_bos, dtype=p.dtype, n_boot=p.n_boot, positions_per_example=p.positions_per_example,
               lens_dtype=p.lens_dtype, top_k=TOP_K, tuned_lens=None if tp is None else tuned_lens.cache_key(tp, ref),
               outputs=2)  # 2: also the per-problem table (runs finished before it recompute from their checkpoints)
    # A problem's numbers do not depend on which other problems are in the sample: share its checkpoint.
    item_key = {k: v for k, v in key.items() if k not in ("n_examples", "selection", "n_boot", "outputs")}
    return Job(ANALYSIS, p, key, item_key, refs=ref).execute(lambda store: _compute(p, tp, ref, key, examples, store))


def _compute(p: LensParams, tp: TunedLensParams | None, ref: ModelRef, key: dict[str, Any], examples: list[Example],
             store: RunStore) -> tuple[pd.DataFrame, dict[str, Any], pd.DataFrame]:
    loaded: list[LoadedModel] = []

    def model() -> LoadedModel:
        """Loaded on first use: by the tuned lens's job when it trains, else by this run."""
        if not loaded:
            loaded.append(load_model(ref, device=p.device, dtype=p.dtype))
        return loaded[0]

    # The tuned lens first, as its own cached job: its entry (curve and sidecar) is served or trained here.
    tuned = None if tp is None else tuned_lens.run(ref, model, p.remote, **tp.asdict())
    if tuned is not None and p.remote is not False and not tuned_lens.has_translators(tuned):
        tuned_lens.refuse_remote_training(p.remote)  # they would be trained again: refused before the model loads
    lm = model()
    encoded = [(e.id, lm.encode(e.text, label=f"Example {e.id}")) for e in examples]
    if not p.include_bos:
        require_tokens(encoded, 2, "include_bos=False leaves no position to average")
    fitted: list[Translators] = []

    def translators() -> Translators | None:
        """Read (or trained again) on first use only: a run whose every problem is checkpointed needs no
        translators (stored results omit them: they are large and regenerable)."""
        nonlocal tuned
        if tuned is not None and not fitted:
            t = tuned_lens.translators_of(tuned)
            if t is None:  # the entry keeps no translators (stored results omit them): train again, replacing it
                tuned = tuned_lens.run(ref, model, p.remote, **dict(tp.asdict(), use_cache=False))
                t = tuned_lens.translators_of(tuned)
            fitted.append(t)
        return fitted[0] if fitted else None

    t_eval = time.time()

    def one(uid: str, ids: Any) -> dict[str, np.ndarray]:
        pos = sample_positions(ids.shape[1], p.positions_per_example, f"{p.seed}:{uid}", p.include_bos)
        vals, check = prompt_lens(lm, ids, pos.to(ids.device), p.lens_dtype, translators())
        return {"mean": vals.mean(-1).numpy(), "count": np.array(ids.shape[1] - (0 if p.include_bos else 1)),
                "positions": pos.numpy(), "check": np.array(check)}

    items = per_unit(store, encoded, one, desc=f"{p.model_name}: lenses")
    counts = np.array([int(it["count"]) for it in items])
    table = tidy_table(np.stack([it["mean"] for it in items]), counts, p.model_name, n_boot=p.n_boot, seed=p.seed)
    meta = {
        "parameters": {"model_name": p.model_name, **key, "tuned_lens": p.tuned_lens,
                       "n_train_tokens": p.n_train_tokens, "train_epochs": p.train_epochs, "device": p.device,
                       "remote": p.remote},
        "model": lm.provenance(),
        "data": selection_record(p.dataset, p.selection, p.seed, examples),
        "n_tokens": int(counts.sum()),
        "n_positions_evaluated": int(sum(len(it["positions"]) for it in items)),
        "last_layer_check_kl_max": max(float(it["check"]) for it in items),
        "tuned_lens": None if tuned is None else tuned_lens.sidecar(tuned, tp),
        "eval_time_s": round(time.time() - t_eval, 2),
    }
    return table, meta, units_table(p.model_name, [uid for uid, _ in encoded], [it["mean"] for it in items])


def units_table(model: str, ids: list[str], means: list[np.ndarray]) -> pd.DataFrame:
    """Per-problem table for claim verdicts: each problem's mean over its evaluated positions.

    Args:
        means: per problem, [lenses, metrics, layers].

    Returns:
        ``model, unit, lens, metric, layer, value`` rows.
    """
    rows = [{"model": model, "unit": uid, "lens": LENSES[i], "metric": metric, "layer": layer, "value": float(v)}
            for uid, mean in zip(ids, means) for i in range(mean.shape[0]) for j, metric in enumerate(METRICS)
            for layer, v in enumerate(mean[i, j])]
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class LensSummary(SampleSummary):
    """What chapter 04 and the atlas read of a lens run (:meth:`of`).

    Attributes:
        n_tokens: positions the problems have (position 0 included when ``include_bos``).
        n_positions_evaluated: the sampled positions the lenses were read at.
        last_layer_check_kl_max: the self-check: the largest KL(lens on h_L ‖ model output) over problems.
        eval_time_s: seconds of the evaluation (the tuned lens's training excluded).
        tuned: how the tuned lens was obtained; None when it was switched off.
    """

    n_tokens: int
    n_positions_evaluated: int
    last_layer_check_kl_max: float
    eval_time_s: float
    tuned: TunedLensTraining | None

    @classmethod
    def of(cls, result: RunResult) -> LensSummary:
        m = result.meta
        tuned = TunedLensTraining.of(m["tuned_lens"]) if m.get("tuned_lens") else None
        return cls(**cls.fields_of(result), n_tokens=int(m["n_tokens"]),
                   n_positions_evaluated=int(m["n_positions_evaluated"]),
                   last_layer_check_kl_max=float(m["last_layer_check_kl_max"]), eval_time_s=float(m["eval_time_s"]),
                   tuned=tuned)


def run_many(model_names: list[str], **kwargs: Any) -> tuple[pd.DataFrame, dict[str, LensSummary], pd.DataFrame]:
    """:func:`run` for several models: (concatenated table, each model's summary, concatenated training curves)."""
    results = many(run, model_names, **kwargs)
    curves = [tuned_lens.training_curve(r) for r in results.values()]
    curves = [c for c in curves if not c.empty]
    return (concat_tables(results),
            {m: LensSummary.of(r) for m, r in results.items()},
            pd.concat(curves, ignore_index=True) if curves else pd.DataFrame())


# ---- scalar summaries (arXiv 2512.14064) ------------------------------------------------------------------------

def select(table: pd.DataFrame, metric: str, lens: str, stat: str = "mean", model: str | None = None) -> pd.Series:
    """Values indexed by layer for one (model, metric, lens, stat)."""
    t = table[(table.metric == metric) & (table.component == lens) & (table.stat == stat)]
    if model is not None:
        t = t[t.model == model]
    return t.set_index("layer")["value"].sort_index()


def first_layer_below(values: pd.Series, threshold: float) -> int | None:
    """First layer whose value is < threshold (None if none)."""
    hits = values.index[values.to_numpy() < threshold]
    return int(hits[0]) if len(hits) else None


def first_layer_above(values: pd.Series, threshold: float) -> int | None:
    """First layer whose value is > threshold (None if none)."""
    hits = values.index[values.to_numpy() > threshold]
    return int(hits[0]) if len(hits) else None


def settling_layers(table: pd.DataFrame, model: str, lens: str, kl_fraction: float = 0.1, overlap: float = 0.2,
                    kl_threshold: float | None = None, stat: str = "mean") -> dict[str, int | None]:
    """Where a lens' prediction settles (arXiv 2512.14064): the first layer with KL < ``kl_fraction`` × max KL
    (of the same lens), and the first layer with top-5 overlap > ``overlap``. ``kl_threshold`` overrides the
    relative threshold with an absolute one (to compare two lenses at the same KL). ``stat``: "mean" (per-problem
    means, the paper's script) or "token_mean" ([NB])."""
    kl = select(table, "kl", lens, stat=stat, model=model)
    thr = kl_fraction * float(kl.max()) if kl_threshold is None else kl_threshold
    ov = select(table, "top5_overlap", lens, stat=stat, model=model)
    return {"kl": first_layer_below(kl, thr), "overlap": first_layer_above(ov, overlap)}


KL_CRITERION = "KL < 10 % of max"
OVERLAP_CRITERION = "top-5 overlap > 0.2"
SHARED_KL_CRITERION = "KL < 10 % of the logit lens' max"
COSINE_CRITERION = "cosine transition"


def settling_summary(table: pd.DataFrame, transitions: dict[str, int | None] | None = None,
                     stat: str = "mean") -> pd.DataFrame:
    """Per model: where each lens settles, and the cosine phase-transition layer, on one relative-depth axis.

    A lens reads h_l (l = 0..L-1), placed at l / L. "Never below the threshold before the output" is reported as
    l = L (relative depth 1), since at h_L the lens *is* the output. The cosine transition layer t writes between
    h_t and h_(t+1), so it is placed at (t + 0.5) / L — the convention of chapter 02.

    Args:
        table: :func:`run` tables (one or more models).
        transitions: model → :func:`lmdepth.analyses.residual.cosine_transition_layer` (None: no sign change).
        stat: which average of the table to summarise (see :func:`settling_layers`).

    Returns:
        ``model, lens, criterion, layer, n_layers, rel_depth`` rows.
    """
    rows = []
    for model, t in table.groupby("model", sort=False):
        n_layers = int(t["n_layers"].iloc[0])
        lenses = [lens for lens in LENSES if lens in set(t.component)]
        logit_max = float(select(t, "kl", "logit_lens", stat=stat).max())

        def add(lens: str, criterion: str, layer: int | None) -> None:
            layer = n_layers if layer is None else layer
            rows.append(dict(model=model, lens=lens, criterion=criterion, layer=layer, n_layers=n_layers,
                             rel_depth=layer / n_layers))

        for lens in lenses:
            s = settling_layers(t, model, lens, stat=stat)
            add(lens, KL_CRITERION, s["kl"])
            add(lens, OVERLAP_CRITERION, s["overlap"])
        if "tuned_lens" in lenses:
            shared = settling_layers(t, model, "tuned_lens", kl_threshold=0.1 * logit_max, stat=stat)
            add("tuned_lens", SHARED_KL_CRITERION, shared["kl"])
        if transitions is not None:
            tr = transitions.get(model)
            rows.append(dict(model=model, lens="cosine", criterion=COSINE_CRITERION, layer=tr, n_layers=n_layers,
                             rel_depth=None if tr is None else tr / n_layers))
    return pd.DataFrame(rows)


def summary_wide(summary: pd.DataFrame) -> pd.DataFrame:
    """:func:`settling_summary` as one row per model and one column per (lens, criterion): "layer (l/L)" text,
    "output" when a lens never crosses its threshold before the output, "none" when there is no cosine transition."""
    def cell(r: pd.Series) -> str:
        if pd.isna(r["layer"]):
            return "none"
        if r["lens"] != "cosine" and r["layer"] >= r["n_layers"]:
            return "output"
        return f"{int(r['layer'])} ({r['rel_depth']:.2f})"

    s = summary.assign(column=summary["lens"].str.replace("_", " ") + ": " + summary["criterion"],
                       text=summary.apply(cell, axis=1))
    wide = s.pivot(index="model", columns="column", values="text")
    wide = wide.reindex(index=list(dict.fromkeys(s["model"])), columns=list(dict.fromkeys(s["column"])))
    layers = s.groupby("model", sort=False)["n_layers"].first()
    return wide.rename_axis(columns=None).reset_index().merge(layers.rename("layers").reset_index(), on="model")


def curve_ends(curve: pd.DataFrame) -> pd.DataFrame:
    """Per model, layer means of the training curve: held-out at the start (the logit lens), held-out of the
    selected translators (each layer's lowest held-out point), and the last logged training batches."""
    out = {}
    for model, c in curve.groupby("model", sort=False):
        ho, trn = c[c.split == "held-out"], c[c.split == "train"]
        out[model] = {"held-out start": ho[ho.step == 0]["value"].mean(),
                      "held-out selected": ho.groupby("layer")["value"].min().mean(),
                      "train end": trn[trn.step == trn.step.max()]["value"].mean() if len(trn) else float("nan")}
    return pd.DataFrame.from_dict(out, orient="index")


def tuned_convergence(curve: pd.DataFrame, rel_tol: float = 0.02) -> pd.DataFrame:
    """Per model, from the held-out curve: how many layers' selected translators beat the logit lens (the identity
    at step 0), and how many were still improving at the last held-out point (their lowest point is the last one
    and it fell by more than ``rel_tol`` of the previous point's value): a budget that stops there is too small.

    Columns: ``model, layers, beat logit lens, still improving``.
    """
    rows = []
    for model, c in curve[curve.split == "held-out"].groupby("model", sort=False):
        wide = c.pivot_table(index="step", columns="layer", values="value").sort_index()
        start, best, last = wide.iloc[0], wide.min(), wide.iloc[-1]
        prev = wide.iloc[-2] if len(wide) > 1 else start
        improving = (last <= best) & (prev - last > rel_tol * prev)
        rows.append({"model": model, "layers": wide.shape[1], "beat logit lens": int((best < start).sum()),
                     "still improving": int(improving.sum())})
    return pd.DataFrame(rows, columns=["model", "layers", "beat logit lens", "still improving"])


def settled_depth(summary: pd.DataFrame, model: str, lens: str, criterion: str) -> float | None:
    """Relative depth of one row of :func:`settling_summary` (None when absent)."""
    r = summary[(summary.model == model) & (summary.lens == lens) & (summary.criterion == criterion)]
    return None if r.empty or pd.isna(r["rel_depth"].iloc[0]) else float(r["rel_depth"].iloc[0])


__all__ = [
    "ANALYSIS", "LENSES", "METRICS", "LensParams", "LensSummary", "prompt_lens", "run", "run_many", "run_units",
    "select", "settling_layers", "settling_summary", "settled_depth", "summary_wide", "curve_ends", "tuned_convergence",
    "STATS", "KL_CRITERION", "OVERLAP_CRITERION", "SHARED_KL_CRITERION", "COSINE_CRITERION",
]


def run_units(model_names: list[str], **kwargs: Any) -> pd.DataFrame:
    """The per-problem tables of :func:`run` for several models, concatenated (what claim verdicts resample)."""
    return pd.concat([r.units for r in many(run, model_names, **kwargs).values()], ignore_index=True)
