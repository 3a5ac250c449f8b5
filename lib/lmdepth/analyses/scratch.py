"""Analyses of the from-scratch runs of chapter 07 (paper Fig. 9; book/method.md#method-moeut).

Four runs — MoEUT and a dense Transformer, each trained with the question modelled (``lm``) or not
(``answer_only``) — are loaded or trained (:mod:`lmdepth.scratch.training`), then compared on

* exact match and answer loss on the interpolate and extrapolate splits (:func:`evaluate_runs`),
* residual erasure on the paper's four DM-math probes, with the authors' erasure value: the position mean of one
  other DM-math example's residual (:func:`probe_erasure`),
* the depth score of :mod:`lmdepth.analyses.complexity` against the number of operations in the problem
  (:func:`depth_by_operations`).

The erasure and skip code is the same as for the pretrained models — the same nnsight traces
(:mod:`lmdepth.traces.skip_effects`, :mod:`lmdepth.traces.erasure_trace`), here on a generic ``NNsight`` wrapper
(:func:`traced`): a from-scratch model's taps are those of a :class:`~lmdepth.model.families.ModelAdapter` whose
"layers" are the depth steps (block applications for MoEUT, a distinct module per step over the shared weights).

The chapter's parameters (:class:`ScratchParams`), display tables, prose, claims (:func:`claims`) and checks
(:func:`check_results`) are built here from those results.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from lmdepth.analyses.run import execute
from lmdepth.claims.scratch_claims import UNTRAINED
from lmdepth.data.dm_math import ERASURE_REFERENCE, PROBES, MathData, MathExample
from lmdepth.data.dm_tokens import CharTokenizer
from lmdepth.errors import DataError
from lmdepth.metrics.bootstrap import draws, percentile_interval
from lmdepth.metrics.depth import depth_score, group_statistics, layer_effect, level_statistics, partial_slope
from lmdepth.metrics.intervals import exact_match
from lmdepth.model.families import ModelAdapter
from lmdepth.params import Params, param
from lmdepth.results import RunStore, atomic_write
from lmdepth.runtime import progress as progress_bar
from lmdepth.scratch.evaluate import evaluate, greedy_answer
from lmdepth.scratch.models import ScratchLM, adapter_for, build_model
from lmdepth.scratch.shipped import finished_model
from lmdepth.scratch.training import (
    ARCHS,
    OBJECTIVE_LABELS,
    OBJECTIVES,
    PRESETS,
    TrainConfig,
    load_trained,
    matched_configs,
    readable,
    run_config,
    run_dir,
    safe_load,
    train_run,
)
from lmdepth.traces.erasure_trace import boundary_sums, erasure_effects
from lmdepth.traces.residual_metrics import TapPaths
from lmdepth.traces.skip_effects import skip_effects

ARCH_LABELS = {"moeut": "MoEUT", "transformer": "Transformer"}


@dataclass(frozen=True)
class TrainingSummary:
    """What chapter 07 reads of a finished training run's meta (:meth:`of`).

    Attributes:
        n_parameters: all parameters; ``active_parameters``: those one token uses (MoEUT: its selected experts).
        steps, batch_size, lr, modules: the training configuration's (problems per step; DM-math modules).
        wall_time_s: the training's wall time; ``cpu_time_s``: its CPU time (None for runs trained before it was
            recorded); ``cpu_threads``: torch threads of the training process.
        history: the loss per step, ``(step, loss)``.
        curve: exact match during training on the fixed learning-curve problems, ``(step, interpolate,
            extrapolate)`` (empty for runs trained without one).
        skipped_updates: updates skipped for a non-finite gradient (0-based steps; for runs trained before the
            guard, the steps whose loss was not finite).
    """

    n_parameters: int
    active_parameters: int
    steps: int
    batch_size: int
    lr: float
    modules: tuple[str, ...]
    wall_time_s: float
    cpu_time_s: float | None
    cpu_threads: int | None
    history: tuple[tuple[int, float], ...]
    skipped_updates: tuple[int, ...]
    curve: tuple[tuple[int, float, float], ...] = ()

    @classmethod
    def of(cls, meta: dict[str, Any]) -> TrainingSummary:
        tc, history = meta["train_config"], tuple((int(s), float(v)) for s, v in meta["history"])
        skipped = meta.get("skipped_updates", [s - 1 for s, v in history if not np.isfinite(v)])
        return cls(n_parameters=int(meta["n_parameters"]), active_parameters=int(meta["active_parameters"]),
                   steps=int(tc["steps"]), batch_size=int(tc["batch_size"]), lr=float(tc["lr"]),
                   modules=tuple(tc["modules"]), wall_time_s=float(meta["wall_time_s"]),
                   cpu_time_s=meta.get("cpu_time_s"),
                   cpu_threads=(meta.get("environment") or {}).get("cpu_threads"), history=history,
                   skipped_updates=tuple(int(s) for s in skipped),
                   curve=tuple((int(c[0]), float(c[1]), float(c[2])) for c in meta.get("curve", [])))

    @property
    def final_loss(self) -> float:
        """The mean loss of the last 50 steps."""
        return float(np.mean([loss for _, loss in self.history[-50:]]))


@dataclass
class TrainedRun:
    """One finished run: the model in eval mode, its tokenizer, its training meta (incl. loss ``history``), and
    whether this call trained it (False: loaded from a finished checkpoint)."""

    name: str
    arch: str
    objective: str
    model: ScratchLM
    tok: CharTokenizer
    meta: dict[str, Any]
    path: Path
    trained_now: bool = False

    @property
    def summary(self) -> TrainingSummary:
        """What the chapter reads of the run's meta, typed."""
        return TrainingSummary.of(self.meta)


def trained_runs(profile: str, checkpoint_dir: str | Path, data_dir: str | Path, train: bool = True,
                 device: str = "cpu", progress: bool = True, **overrides: Any) -> dict[str, TrainedRun]:
    """The four runs of a profile, trained first where no finished checkpoint exists (and ``train`` is True).

    A finished run is looked up in ``checkpoint_dir``, then among the runs shipped with the library
    (:mod:`lmdepth.scratch.shipped`); a run trained here goes to ``checkpoint_dir``. An interrupted training run
    resumes from its last checkpoint on the next call.

    Raises:
        DataError: a run is missing and ``train`` is False.
    """
    runs = {}
    for arch in ARCHS:
        for objective in OBJECTIVES:
            cfg = run_config(profile, arch, objective, **overrides)
            path = finished_model(run_dir(cfg, checkpoint_dir).name, checkpoint_dir)
            trained_now = path is None
            if trained_now:
                path = run_dir(cfg, checkpoint_dir) / "model.pt"
                if not train:
                    raise DataError(f"No trained {cfg.name} run for profile {profile!r} under {checkpoint_dir} or "
                                    "among the runs shipped with lmdepth "
                                    f"(expected {path}). Set train=True (CLI: -p train true) to train it, or point "
                                    "checkpoint_dir at a directory that holds it.")
                # say so loudly: a reader who expected the committed runs (e.g. in Colab, without the repository's
                # checkpoints/) must not wait for a silent training
                print(f"lmdepth: no trained {cfg.name} run of profile {profile!r} in {checkpoint_dir} "
                      f"(expected {path}): training it now ({cfg.steps} steps; resumable)", file=sys.stderr, flush=True)
                train_run(cfg, checkpoint_dir, data_dir=data_dir, progress=progress, device=device)
            model, tok, meta = load_trained(path, device=device)
            runs[cfg.name] = TrainedRun(cfg.name, arch, objective, model, tok, meta, path, trained_now)
    return runs


def matched_runs(profile: str, checkpoint_dir: str | Path, device: str = "cpu",
                 loaded: dict[str, TrainedRun] | None = None, configs: Sequence[TrainConfig] | None = None,
                 ) -> tuple[dict[str, TrainedRun], pd.DataFrame]:
    """Chapter 07's comparison runs (:func:`~lmdepth.scratch.training.matched_configs`; or ``configs``, e.g. the
    positive control's :func:`~lmdepth.scratch.training.chain_configs`) that are finished, keyed ``"<run> seed
    <s>"`` (each run's ``name`` stays ``<arch>-<objective>``), and the state of every planned run: ``run, seed, lr,
    state, steps`` (state ``finished``, ``training`` with the step of its last checkpoint, or ``not trained``).
    A damaged run (its ``model.pt`` cut or empty) is listed as such and not read. Looked up like
    :func:`trained_runs`, but never trained here: they take hours each on a CPU
    (``scripts/train_matched_runs.py``). A run already in ``loaded`` (the chapter's own runs) is not loaded again."""
    reuse = {r.path: r for r in (loaded or {}).values()}
    runs, rows = {}, []
    for cfg in matched_configs(profile) if configs is None else configs:
        state, step, path = run_state(cfg, checkpoint_dir)
        if path is not None:
            if path not in reuse:
                model, tok, meta = load_trained(path, device=device)
                reuse[path] = TrainedRun(cfg.name, cfg.arch, cfg.objective, model, tok, meta, path)
            runs[f"{cfg.name} seed {cfg.seed}"] = reuse[path]
        rows.append(dict(run=cfg.name, seed=cfg.seed, lr=cfg.lr, state=state, steps=f"{step:,} of {cfg.steps:,}"))
    return runs, pd.DataFrame(rows)


def run_state(cfg: TrainConfig, checkpoint_dir: str | Path) -> tuple[str, int, Path | None]:
    """Where one run stands: ``("finished", steps, model.pt)`` when a finished run is found (in ``checkpoint_dir``,
    then among the shipped runs: :func:`~lmdepth.scratch.shipped.finished_model`), ``("training", step of its last
    checkpoint, None)`` while a checkpoint in ``checkpoint_dir`` waits to be resumed, else ``("not trained", 0,
    None)``."""
    folder = run_dir(cfg, checkpoint_dir)
    path = finished_model(folder.name, checkpoint_dir)
    if path is not None:
        return ("finished", cfg.steps, path) if readable(path) else (f"damaged ({path} is cut or empty)", 0, None)
    if (folder / "ckpt.pt").is_file():
        if not readable(folder / "ckpt.pt"):
            return "training (its checkpoint is damaged: see train_run)", 0, None
        return "training", int(safe_load(folder / "ckpt.pt")["step"]), None
    return "not trained", 0, None


# ---- accuracy -------------------------------------------------------------------------------------------------


#: The columns of :func:`evaluate_runs` (also of its empty table, when no run is given).
EVALUATION_COLUMNS = ("split", "module", "n_operations", "question", "answer", "correct", "answer_nll", "run", "arch",
                      "objective", "lr", "train_seed", "path")


def evaluate_runs(runs: dict[str, TrainedRun], splits: dict[str, list[MathExample]], device: str = "cpu",
                  known: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (run, example): ``run, arch, objective, split, module, n_operations, question, answer, correct,
    answer_nll``, the run's training ``lr`` and ``train_seed`` (a fair comparison needs one learning rate and
    several seeds: :mod:`lmdepth.claims.scratch_claims`) and its checkpoint ``path``.

    Args:
        known: an earlier table of this function on the same ``splits``: a run whose checkpoint ``path`` it holds
            is taken from it instead of evaluated again (chapter 07's comparison runs include its own MoEUT runs).
    """
    frames = []
    for r in runs.values():
        if known is not None and (done := known[known.path == str(r.path)]).shape[0]:
            frames.append(done)
            continue
        cfg = r.meta.get("train_config", {})
        for split, examples in splits.items():
            df = evaluate(r.model, r.tok, examples, device=device)
            frames.append(df.assign(run=r.name, arch=r.arch, objective=r.objective, split=split,
                                    lr=cfg.get("lr", float("nan")), train_seed=cfg.get("seed", -1),
                                    path=str(r.path)))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=EVALUATION_COLUMNS)


def accuracy_summary(per_example: pd.DataFrame) -> pd.DataFrame:
    """Per (run, split): ``n, correct, accuracy, ci_low, ci_high`` (Wilson 95 %), the mean ``answer_nll`` and the
    constant-answer ``baseline`` (the exact match of always giving the split's most common answer)."""
    rows = []
    for (run, arch, objective, split), g in per_example.groupby(["run", "arch", "objective", "split"], sort=False):
        em = exact_match(g.correct, g.answer)
        rows.append({"run": run, "arch": arch, "objective": objective, "split": split, "n": em.n,
                     "correct": em.correct, "accuracy": em.accuracy, "ci_low": em.ci_low, "ci_high": em.ci_high,
                     "answer_nll": float(g.answer_nll.mean()), "baseline": em.baseline})
    return pd.DataFrame(rows)


def _paired_differences(per_example: pd.DataFrame, split: str,
                        differences: Callable[[pd.DataFrame], dict[str, np.ndarray]], n_boot: int, seed: int
                        ) -> pd.DataFrame:
    """Per-problem differences between runs, with paired bootstrap 95 % intervals (all runs answer the same
    problems, so problems are resampled jointly). ``differences(w)`` maps a problem × run table of one metric
    (exact match, or minus the answer loss, so that larger is better for both) to ``{comparison: [n] values}``."""
    d = per_example[per_example.split == split].copy()
    d["item"] = d.groupby("run").cumcount()  # evaluate() keeps the order of the examples for every run
    n = int(d.item.nunique())
    rows = []
    for metric, col, sign in (("exact match", "correct", 1.0), ("answer loss reduction", "answer_nll", -1.0)):
        w = sign * d.pivot(index="item", columns="run", values=col).astype(float)
        for name, g in differences(w).items():  # the same seed: every comparison on the same resamples
            lo, hi = percentile_interval(draws(lambda x: x.mean(1), (g,), n_boot, seed, vectorised=True))
            rows.append({"split": split, "metric": metric, "comparison": name, "gain": float(g.mean()),
                         "ci_low": float(lo), "ci_high": float(hi), "n": n})
    return pd.DataFrame(rows)


def paired_gains(per_example: pd.DataFrame, split: str, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """What not modelling the question changes, per architecture and MoEUT − Transformer, with paired bootstrap 95 %
    intervals.

    Metrics: ``exact match`` (answer-only − all-token accuracy) and ``answer loss reduction`` (all-token − answer-only
    mean answer cross-entropy, nats per token; positive = the answer-only run predicts the answers better).

    Returns:
        ``split, metric, comparison ("moeut", "transformer", "moeut − transformer"), gain, ci_low, ci_high, n``.
    """
    def gains(w: pd.DataFrame) -> dict[str, np.ndarray]:
        g = {a: (w[f"{a}-answer_only"] - w[f"{a}-lm"]).to_numpy() for a in ARCHS}
        return {**g, "moeut − transformer": g["moeut"] - g["transformer"]}

    return _paired_differences(per_example, split, gains, n_boot, seed)


def architecture_gaps(per_example: pd.DataFrame, splits: Sequence[str], n_boot: int = 1000, seed: int = 0
                      ) -> pd.DataFrame:
    """MoEUT − Transformer trained with the same objective, per split: exact match (points) and answer loss
    reduction (Transformer − MoEUT nats per answer token; positive = MoEUT predicts the answers better), with paired
    bootstrap 95 % intervals. An interval that contains 0 means the two architectures do not differ beyond noise.

    Returns:
        ``split, metric, comparison (the objective's label), gain, ci_low, ci_high, n``.
    """
    def gaps(w: pd.DataFrame) -> dict[str, np.ndarray]:
        return {OBJECTIVE_LABELS[o]: (w[f"moeut-{o}"] - w[f"transformer-{o}"]).to_numpy() for o in OBJECTIVES}

    return pd.concat([_paired_differences(per_example, s, gaps, n_boot, seed) for s in splits], ignore_index=True)


# ---- residual erasure on the probes ----------------------------------------------------------------------------

@torch.no_grad()
def probe_erasure(run: TrainedRun, probes: Sequence[tuple[str, str]] = PROBES,
                  reference: tuple[str, str] = ERASURE_REFERENCE, batch_size: int = 64,
                  device: str = "cpu") -> tuple[pd.DataFrame, dict[str, Any]]:
    """Residual erasure maps of the probes, as the authors' script for these models (book/method.md#method-erasure).

    The erasure value at boundary b is the mean over positions of ``reference``'s residual at b; positions
    1 … T−2 of ``" Q: {q} A: {a}"`` (no EOS) are erased one at a time; the effect is the largest L2 change of the
    answer-token distributions. Rows are boundaries 0 … L−1 (0 = embeddings; the final output, which the paper's
    figure has no row for, is dropped).

    Returns:
        (table ``model, prompt, method, layer, position, token, is_answer, value`` in the layout of
         :func:`lmdepth.charts.erasure_charts.map_chart`, with ``model`` = the run name;
         per probe: greedy answer, whether it is right, the number of tokens and the answer start).
    """
    nn_model, paths = traced(run.model)
    mu = reference_mean(run.model, run.tok, reference, device=device)  # [L+1, D]
    rows, info = [], {}
    for q, a in probes:
        ids, a_start = run.tok.encode_example(q, a, eos=False)
        T = len(ids)
        er = erasure_effects(nn_model, paths, torch.tensor([ids], device=device), a_start, mu, batch_size=batch_size,
                             positions=range(1, T - 1))[:-1]  # [L, T]
        labels = run.tok.tokens(ids)
        rows += [{"model": run.name, "prompt": q, "method": "erasure", "layer": l, "position": p, "token": labels[p],
                  "is_answer": p >= a_start, "value": float(er[l, p])} for l in range(er.shape[0]) for p in range(T)]
        got = greedy_answer(run.model, run.tok, q, device=device)
        info[q] = {"answer": a, "greedy": got, "correct": got == a, "n_tokens": T, "a_start": a_start}
    return pd.DataFrame(rows), info


def question_depth(effect: np.ndarray) -> float:
    """The effect-weighted mean boundary of one erasure map over its question positions, relative to the number of
    boundaries − 1 (``Σ_b b·m_b / Σ_b m_b / (B − 1)``, m_b the summed effect of boundary b): where in depth erasing
    the question still changes the answer. NaN where no erasure changes anything.

    Args:
        effect: [B, question positions] the map's rows (boundaries) at the question's tokens.
    """
    m = np.asarray(effect, dtype=float).sum(1)
    return float((np.arange(len(m)) * m).sum() / m.sum() / max(len(m) - 1, 1)) if m.sum() > 0 else float("nan")


def erasure_depth(table: pd.DataFrame) -> pd.DataFrame:
    """Per (run, probe): the effect-weighted mean boundary of the erasure map, over question positions only
    (``Σ_b b·m_b / Σ_b m_b`` with m_b the summed effect of boundary b), relative to the number of boundaries − 1.
    A summary of where in depth erasing the question still changes the answer."""
    q = table[(table.method == "erasure") & ~table.is_answer & (table.position > 0)]
    return pd.DataFrame([{"run": run, "prompt": prompt,
                          "erasure_depth": question_depth(g.pivot(index="layer", columns="position", values="value"))}
                         for (run, prompt), g in q.groupby(["model", "prompt"], sort=False)])


# ---- depth score against the number of operations ---------------------------------------------------------------

def operation_sample(examples: Sequence[MathExample], n_per_count: int, seed: int = 0,
                     min_count: int = 1) -> list[MathExample]:
    """Up to ``n_per_count`` examples per number of operations (seeded), counts with fewer than ``min_count``
    examples dropped, ordered by count."""
    rng = np.random.default_rng(seed)
    by: dict[int, list[MathExample]] = {}
    for e in examples:
        if e.n_operations is not None:
            by.setdefault(e.n_operations, []).append(e)
    out = []
    for k in sorted(by):
        pool = by[k]
        if len(pool) < min_count:
            continue
        take = rng.choice(len(pool), size=min(n_per_count, len(pool)), replace=False)
        out += [pool[i] for i in sorted(take)]
    return out


def model_adapter(model: torch.nn.Module) -> ModelAdapter:
    """The adapter of a from-scratch model (layers = depth steps) or of a (fine-tuned) pretrained one."""
    return adapter_for(model) if isinstance(model, ScratchLM) else ModelAdapter.for_model(model)


def traced(model: torch.nn.Module) -> tuple[Any, TapPaths]:
    """(nnsight wrapper, taps) the traces run this chapter's models on: a generic ``NNsight`` wrapper — a from-scratch
    model has no Hugging Face class for ``TransformersModel`` and the fine-tuned one needs none, as these traces pass
    token ids — and the taps of :func:`model_adapter`. Wrapping is cheap (milliseconds) and leaves the model's
    outputs as they were."""
    from nnsight import NNsight

    return NNsight(model), TapPaths.of(model_adapter(model))


@torch.no_grad()
def reference_mean(model: torch.nn.Module, tok: Any, reference: tuple[str, str] = ERASURE_REFERENCE,
                   device: str = "cpu") -> torch.Tensor:
    """[L+1, D] fp32 the erasure value of this chapter's models: the mean over every position of ``reference``'s
    ``" Q: {q} A: {a}"`` (no EOS) of the residual at each boundary (the authors' value for these models)."""
    nn_model, paths = traced(model)
    ids = torch.tensor([tok.encode_example(*reference, eos=False)[0]], device=device)
    return boundary_sums(nn_model, paths, ids) / ids.shape[1]


@torch.no_grad()
def skip_depth_effects(model: torch.nn.Module, tok: Any, examples: Sequence[MathExample], device: str = "cpu",
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Layer-skip effects of each example for the depth score (:func:`lmdepth.traces.skip_effects.skip_effects`, part
    "layer", future version), on a from-scratch or a (fine-tuned) pretrained model with its tokenizer.

    The cut is the first answer token: each depth step is skipped on the whole prompt (positions 1 … a−1) and the
    effect measured where the answer is written (positions ≥ a).

    Returns:
        E [P, L, L] and O [P, L].
    """
    nn_model, paths = traced(model)
    Es, Os = [], []
    for e in examples:
        ids, a_start = tok.encode_example(e.question, e.answer, eos=False)
        effects = skip_effects(nn_model, paths, torch.tensor([ids], device=device), cuts=[a_start], parts=("layer",),
                               local=False, current=False, config=model.config)
        E, O = effects["future", "layer"]
        Es.append(E.numpy())
        Os.append(O.numpy())
    return np.stack(Es), np.stack(Os)


def depth_by_operations(run: TrainedRun, examples: Sequence[MathExample], device: str = "cpu",
                        ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`skip_depth_effects` of a trained run: E [P, L, L] and O [P, L]."""
    return skip_depth_effects(run.model, run.tok, examples, device=device)


#: Problems per split in a snapshot's exact match, and per number of operations (and split) in its depth sample.
SNAPSHOT_CURVE, SNAPSHOT_PER_OPERATIONS = 200, 12


def snapshot_writer(run_folder: Path, data: MathData, sample_seed: int = 0,
                    base: Callable[[torch.nn.Module], torch.nn.Module] = lambda m: m,
                    ) -> Callable[[int, torch.nn.Module, Any], None]:
    """The ``on_snapshot(step, model, tok)`` of one training run: ``run_folder/snapshot-<step>.npz`` with the exact
    match on the first :data:`SNAPSHOT_CURVE` problems of each evaluation split, and the layer-skip effects of the
    depth score (:func:`skip_depth_effects`: E [P, L, L], O [P, L]) on the operation sample of both splits with each
    problem's correctness (what :func:`lmdepth.analyses.finetuned.over_training` reads). A snapshot already written
    is kept. ``base`` maps the trained model to the one to measure (a fine-tuned model's base under its adapters)."""
    curve = {s: data.split(s)[:SNAPSHOT_CURVE] for s in ("interpolate", "extrapolate")}
    sample = operation_sample(data.interpolate, SNAPSHOT_PER_OPERATIONS, seed=sample_seed) + \
        operation_sample(data.extrapolate, SNAPSHOT_PER_OPERATIONS, seed=sample_seed + 1)

    def on_snapshot(step: int, model: torch.nn.Module, tok: Any) -> None:
        path = Path(run_folder) / f"snapshot-{step:05d}.npz"
        if path.exists():
            return
        t0 = time.time()
        m = base(model)
        em = {s: evaluate(m, tok, ex).correct.to_numpy() for s, ex in curve.items()}
        E, O = skip_depth_effects(m, tok, sample)
        arrays = dict(step=np.array(step), E=E.astype(np.float32), O=O.astype(np.float32),
                      n_operations=np.array([e.n_operations for e in sample]),
                      split=np.array([e.split for e in sample]), question=np.array([e.question for e in sample]),
                      solved=evaluate(m, tok, sample).correct.to_numpy(), interpolate=em["interpolate"],
                      extrapolate=em["extrapolate"])
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda tmp: np.savez_compressed(open(tmp, "wb"), **arrays))
        print(f"{Path(run_folder).name} step {step}: exact match interpolate {em['interpolate'].mean():.1%}, "
              f"extrapolate {em['extrapolate'].mean():.1%}; snapshot in {time.time() - t0:.0f} s", flush=True)

    return on_snapshot


def snapshot_curve(folders: Sequence[tuple[int, Path]]) -> pd.DataFrame:
    """The depth score over training, from the snapshots :func:`snapshot_writer` stored in each ``(seed, run
    folder)``: per (seed, step) the exact match on the learning-curve problems of each split, the mean relative depth
    score (layer effect) of the snapshot's depth sample, and its within-split rise per operation on every problem
    of the sample (solved or not: early snapshots solve none) and on the solved ones (NaN with fewer than 4).

    Returns:
        ``seed, folder`` (the run folder's name), ``step, interpolate, extrapolate, depth, rise, rise_solved,
        n_solved``; empty when no snapshot exists.
    """
    rows = []
    for seed, folder in folders:
        for f in sorted(Path(folder).glob("snapshot-*.npz")):
            with np.load(f) as z:
                E, ops, split, solved = z["E"], z["n_operations"], z["split"], z["solved"].astype(bool)
                L = E.shape[-1]
                depth = depth_score(layer_effect(E)) / (L - 1)  # [P]
                extra = (split == "extrapolate").astype(float)
                rows.append({"seed": seed, "folder": Path(folder).name, "step": int(z["step"]),
                             "interpolate": float(z["interpolate"].mean()),
                             "extrapolate": float(z["extrapolate"].mean()), "depth": float(np.nanmean(depth)),
                             "rise": partial_slope(depth, ops, extra),
                             "rise_solved": partial_slope(depth[solved], ops[solved], extra[solved])
                             if solved.sum() >= 4 else float("nan"),
                             "n_solved": int(solved.sum())})
    return pd.DataFrame(rows)


# ---- depth per problem on the comparison runs (the paper's §5 depth questions) ------------------------------------

#: What of the generated data fixes the depth sample's problems (the evaluation splits).
SAMPLE_DATA_KEYS = ("modules", "n_eval_per_module", "seed", "data_version", "generator")
#: The columns of :func:`problem_depths` (one row per problem of the depth sample).
DEPTH_COLUMNS = ("unit", "split", "n_operations", "question", "depth_layer", "depth_answer", "erasure_depth")


@torch.no_grad()
def problem_depths(model: torch.nn.Module, tok: Any, sample: Sequence[MathExample], reference_mean: torch.Tensor,
                   device: str = "cpu") -> pd.DataFrame:
    """Three depth summaries of every problem of ``sample``, each relative to the model's last index (0 = first
    depth step, 1 = last): ``depth_layer`` and ``depth_answer``, the depth score D/(L − 1) of the problem's layer
    effect and answer effect (:func:`skip_depth_effects`, :func:`lmdepth.metrics.depth.depth_score`), and
    ``erasure_depth``, where erasing a question token still changes the answer (:func:`question_depth` of the
    problem's erasure map, with ``reference_mean`` [L+1, D] as the erased value, as :func:`probe_erasure`).

    Returns:
        :data:`DEPTH_COLUMNS`, one row per problem in sample order (``unit`` its index).
    """
    E, O = skip_depth_effects(model, tok, sample, device=device)
    L = E.shape[-1]
    nn_model, paths = traced(model)
    erased = []
    for e in sample:
        ids, a_start = tok.encode_example(e.question, e.answer, eos=False)
        er = erasure_effects(nn_model, paths, torch.tensor([ids], device=device), a_start, reference_mean,
                             positions=range(1, len(ids) - 1))[:-1]  # [L, T]: the final output has no row
        erased.append(question_depth(er[:, 1:a_start].numpy()))
    return pd.DataFrame({"unit": np.arange(len(sample)), "split": [e.split for e in sample],
                         "n_operations": [e.n_operations for e in sample], "question": [e.question for e in sample],
                         "depth_layer": depth_score(layer_effect(E)) / (L - 1), "depth_answer": depth_score(O) / (L - 1),
                         "erasure_depth": erased})


def depth_sample(data: MathData, n_per_operations: int, seed: int) -> list[MathExample]:
    """The problems the depth questions are asked on: up to ``n_per_operations`` per number of operations of each
    evaluation split (:func:`operation_sample`, interpolate then extrapolate)."""
    return operation_sample(data.interpolate, n_per_operations, seed=seed) + \
        operation_sample(data.extrapolate, n_per_operations, seed=seed + 1)


def announce_missing(stores: list[RunStore], what: str, n_sample: int) -> None:
    """Before computing runs that are not stored, say how many and what they cost: the stored runs' own mean
    ``wall_time_s`` (on the machine that stored them), or that none is timed yet."""
    missing = [st for st in stores if not st.complete]
    if not missing:
        return
    timed = [json.loads((st.dir / "meta.json").read_text()).get("wall_time_s", 0.0) for st in stores if st.complete]
    each = f"~{np.mean(timed):.0f} s each on the machine that stored the others" if timed else "cost not yet timed"
    print(f"lmdepth: computing {what} {len(missing)} of {len(stores)} runs on {n_sample} problems ({each}); each run "
          "is stored as it finishes", file=sys.stderr, flush=True)


#: The results folder of chapter 07's depth runs (:func:`comparison_depths`, :func:`untrained_depths`).
DEPTH_RUNS = "dm_math_depth"


def sample_depths(model: ScratchLM, tok: CharTokenizer, sample: list[MathExample], device: str = "cpu") -> pd.DataFrame:
    """:func:`problem_depths` of every problem of ``sample``, against the model's own reference mean."""
    return problem_depths(model, tok, sample, reference_mean(model, tok, device=device), device=device)


def comparison_depths(runs: dict[str, TrainedRun], data: MathData, per_example: pd.DataFrame, n_per_operations: int,
                      seed: int, results_dir: str | Path, device: str = "cpu", progress: bool = True) -> pd.DataFrame:
    """:func:`problem_depths` of every run on one :func:`depth_sample`, with whether the run solves each problem.

    Each run's table is stored under ``results_dir/dm_math_depth/<run folder>/`` (a :class:`~lmdepth.results.RunStore`
    keyed by the sample, the run's weights and the compute version), so a rebuild reads it and a damaged one is
    recomputed.

    Args:
        per_example: :func:`evaluate_runs` of the same runs (its ``correct`` on the problem's split decides
            ``solved``; the sample's problems are drawn from the evaluation splits).

    Returns:
        :data:`DEPTH_COLUMNS` plus ``run, arch, objective, train_seed, lr, path, solved``, one row per (run, problem).
    """
    sample = depth_sample(data, n_per_operations, seed)
    correct = per_example.groupby(["path", "split", "question"]).correct.first()  # a question may repeat in a split
    stores = {name: RunStore(results_dir, DEPTH_RUNS, r.path.parent.name,
                             {"n_per_operations": n_per_operations, "seed": seed, "weights": r.path.parent.name,
                              "data": {k: data.meta.get(k) for k in SAMPLE_DATA_KEYS}, "n_sample": len(sample)})
              for name, r in runs.items()}
    announce_missing(list(stores.values()), "the depth of", len(sample))
    frames = []
    for name, r in progress_bar(list(runs.items()), "depth per problem") if progress else runs.items():
        cfg = r.meta.get("train_config", {})
        done = execute(stores[name], lambda _, r=r, name=name: (sample_depths(r.model, r.tok, sample, device),
                                                               {"run": name}), {"analysis": DEPTH_RUNS})
        t = done.table
        t["solved"] = [bool(correct.get((str(r.path), s, q), False)) for s, q in zip(t.split, t.question)]
        frames.append(t.assign(run=r.name, arch=r.arch, objective=r.objective, train_seed=cfg.get("seed", -1),
                               lr=cfg.get("lr", float("nan")), path=str(r.path)))
    columns = list(DEPTH_COLUMNS) + ["solved", "run", "arch", "objective", "train_seed", "lr", "path"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


#: The ``run`` of the untrained twins' rows in :func:`untrained_depths`, by architecture (what the claims read).
INIT_RUNS = UNTRAINED


def untrained_depths(data: MathData, n_per_operations: int, seed: int, results_dir: str | Path,
                     seeds: Sequence[int], profile: str = "default", device: str = "cpu",
                     progress: bool = True) -> pd.DataFrame:
    """:func:`problem_depths` of the untrained twins of chapter 07's comparison runs on the same depth sample: for
    each architecture and training seed s, the weights run s starts from (:func:`~lmdepth.scratch.models.build_model`
    with seed s, the comparison recipe's configuration), so run s minus its twin is what training added. Stored like
    :func:`comparison_depths` (``results_dir/dm_math_depth/<arch>-untrained-seed<s>/``).

    Returns:
        :data:`DEPTH_COLUMNS` plus ``solved`` (False: the twins are not read for it), ``run`` (:data:`INIT_RUNS`),
        ``arch, objective, train_seed, lr, path``, one row per (twin, problem).
    """
    sample = depth_sample(data, n_per_operations, seed)
    tok = CharTokenizer()
    recipe = {(c.arch, c.seed): c for c in matched_configs(profile)}  # either objective: the same initialisation
    twins = [(arch, sd, recipe[arch, sd]) for arch in ARCHS for sd in seeds if (arch, sd) in recipe]
    stores = {(arch, sd): RunStore(results_dir, DEPTH_RUNS, f"{arch}-untrained-seed{sd}",
                                   {"n_per_operations": n_per_operations, "seed": seed, "model": cfg.model,
                                    "init_seed": sd, "data": {k: data.meta.get(k) for k in SAMPLE_DATA_KEYS},
                                    "n_sample": len(sample)})
              for arch, sd, cfg in twins}
    announce_missing(list(stores.values()), "the depth of the untrained twins:", len(sample))
    frames = []
    for arch, sd, cfg in progress_bar(twins, "untrained twins") if progress else twins:
        store = stores[arch, sd]

        def compute(_: RunStore, arch=arch, cfg=cfg, sd=sd) -> tuple[pd.DataFrame, dict[str, Any]]:
            model = build_model(cfg.model_config(tok.vocab_size), seed=sd).to(device).eval()
            return sample_depths(model, tok, sample, device), {"run": INIT_RUNS[arch]}

        done = execute(store, compute, {"analysis": DEPTH_RUNS})
        frames.append(done.table.assign(solved=False, run=INIT_RUNS[arch], arch=arch, objective="untrained",
                                        train_seed=sd, lr=cfg.lr, path=str(store.dir)))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


# ---- what chapter 07 shows: parameters, tables, prose, claims and checks ----------------------------------------

@dataclass(frozen=True)
class ScratchParams(Params):
    """Parameters of chapter 07 (MoEUT vs Transformer trained from scratch), validated when built."""

    profile: str = param("default", choices=tuple(PRESETS), help="training preset: smoke, default (CPU) or paper (GPU)")
    train: bool = param(True, help="train runs that have no finished checkpoint; False: error instead")
    checkpoint_dir: str | Path = param("checkpoints/dm_math", help="finished runs; '' puts them under results_dir")
    n_per_operations: int = param(12, lo=1, hi=10_000, help="depth score: problems per number of operations and split")
    n_depth_per_operations: int = param(40, lo=1, hi=10_000, help="depth questions (comparison and fine-tuned runs): "
                                        "problems per number of operations and split")
    finetune_dir: str | Path = param("checkpoints/dm_math_ft", help="the fine-tuned pretrained runs "
                                     "(scripts/finetune_runs.py); '' reads none")
    chain_dir: str | Path = param("checkpoints/chains", help="the depth score's positive control, trained on pointer "
                                  "chains (scripts/train_matched_runs.py --task chains); '' reads none")
    n_boot: int = param(1000, lo=10, hi=100_000, help="bootstrap resamples for the intervals")
    seed: int = param(0, lo=0, hi=2**32 - 1, help="seed of the problem sample and the bootstrap")
    device: str = param("cpu", help="'cpu', 'cuda', 'auto' …")
    results_dir: str | Path = param("results", help="generated data and (with checkpoint_dir '') the trained runs")

    @property
    def runs_dir(self) -> Path:
        """Where the trained runs live: ``checkpoint_dir``, or ``results_dir/dm_math_runs`` when it is empty."""
        return Path(self.checkpoint_dir or Path(self.results_dir) / "dm_math_runs")

    @property
    def data_dir(self) -> Path:
        """Where the generated problems are cached."""
        return Path(self.results_dir) / "dm_math_data"


def evaluation_splits(data: MathData) -> dict[str, list[MathExample]]:
    """The two evaluation splits of a data set by name: ``interpolate`` and ``extrapolate``."""
    return {"interpolate": data.interpolate, "extrapolate": data.extrapolate}


def gains_by_split(per_example: pd.DataFrame, splits: Sequence[str], n_boot: int = 1000, seed: int = 0
                   ) -> pd.DataFrame:
    """:func:`paired_gains` of every split, in one table."""
    return pd.concat([paired_gains(per_example, s, n_boot=n_boot, seed=seed) for s in splits], ignore_index=True)


def probe_erasures(runs: dict[str, TrainedRun], device: str = "cpu") -> tuple[pd.DataFrame, pd.DataFrame]:
    """:func:`probe_erasure` of every run.

    Returns:
        (the erasure maps of all runs in one table; per run and probe ``run, probe, answer, greedy answer, right``).
    """
    erasure_tables, probe_info = [], []
    for name, r in runs.items():
        t, inf = probe_erasure(r, device=device)
        erasure_tables.append(t)
        probe_info += [{"run": name, "probe": q, "answer": v["answer"], "greedy answer": v["greedy"],
                        "right": "yes" if v["correct"] else "no"} for q, v in inf.items()]
    return pd.concat(erasure_tables, ignore_index=True), pd.DataFrame(probe_info)


@dataclass(frozen=True)
class DepthByOperations:
    """The depth score of every run against the number of operations (chapter 07, beyond the paper).

    Attributes:
        sample: the problems (interpolate, then extrapolate); n_ops: their number of operations.
        levels: per run and count, :func:`~lmdepth.metrics.depth.level_statistics`, with ``rel_*`` columns
            (relative to L − 1) and ``n_layers``.
        slopes: per run, the fitted slope over all counts, with ``rel_slope, rel_ci_low, rel_ci_high``.
        split_rises: per run and split, the fitted rise within the split (layer effect, mean aggregation), for
            display.
        solved_groups: per run, the depth score of the solved and unsolved problems, with ``n_layers``.
    """

    sample: list[MathExample]
    n_ops: np.ndarray
    levels: pd.DataFrame
    slopes: pd.DataFrame
    split_rises: pd.DataFrame
    solved_groups: pd.DataFrame


def depth_vs_operations(runs: dict[str, TrainedRun], data: MathData, per_example: pd.DataFrame,
                        n_per_operations: int, n_boot: int = 1000, seed: int = 0, device: str = "cpu",
                        ) -> DepthByOperations:
    """Depth score against the number of operations: up to ``n_per_operations`` problems per count from each
    evaluation split (:func:`operation_sample`), every depth step skipped (:func:`depth_by_operations`), per run
    the score per count and its fitted rise over all counts and within each split, and the score of the problems
    the run solves and fails (``per_example``: :func:`evaluate_runs`)."""
    sample = operation_sample(data.interpolate, n_per_operations, seed=seed) + \
        operation_sample(data.extrapolate, n_per_operations, seed=seed + 1)
    n_ops = np.array([e.n_operations for e in sample])
    split_of = np.array([e.split for e in sample])
    lv_frames, slope_rows, split_rows, solved_rows = [], [], [], []
    correct_of = per_example.groupby(["run", "split", "question"]).correct.first()  # a question may repeat in a split
    for name, r in runs.items():
        E, O = depth_by_operations(r, sample, device=device)
        L = E.shape[-1]
        lv, sl = level_statistics(E, O, n_ops, n_boot=n_boot, seed=seed)
        for c in ("depth_score", "ci_low", "ci_high"):
            lv["rel_" + c] = lv[c] / (L - 1)
        lv_frames.append(lv.assign(run=name, n_layers=L))
        sl["rel_slope"], sl["rel_ci_low"], sl["rel_ci_high"] = sl.slope / (L - 1), sl.ci_low / (L - 1), sl.ci_high / (L - 1)
        slope_rows.append(sl.assign(run=name))
        for split in ("interpolate", "extrapolate"):  # the rise within one split: operations without the length shift
            keep = split_of == split
            _, ss = level_statistics(E[keep], O[keep], n_ops[keep], n_boot=n_boot, seed=seed)
            ss = ss[(ss.aggregation == "mean") & (ss.metric == "layer_effect")]
            span_s = int(n_ops[keep].max() - n_ops[keep].min())
            split_rows += [{"run": name, "split": split, "operations": f"{int(n_ops[keep].min())}–{int(n_ops[keep].max())}",
                            "rise within the split (rel. depth)": round(x.slope * span_s / (L - 1), 3),
                            "95% CI": f"{x.ci_low * span_s / (L - 1):+.3f} … {x.ci_high * span_s / (L - 1):+.3f}"}
                           for _, x in ss.iterrows()]
        solved = np.array([bool(correct_of[(name, e.split, e.question)]) for e in sample])
        gs = group_statistics(E, O, {"solved": solved, "unsolved": ~solved}, n_boot=n_boot, seed=seed)
        solved_rows.append(gs.assign(run=name, n_layers=L))
    return DepthByOperations(sample, n_ops, pd.concat(lv_frames, ignore_index=True),
                             pd.concat(slope_rows, ignore_index=True), pd.DataFrame(split_rows),
                             pd.concat(solved_rows, ignore_index=True))


RISE = "rise over all counts (rel. depth)"


def overall_rises(depth: DepthByOperations) -> pd.DataFrame:
    """Per run and metric (mean aggregation): the fitted rise of the relative depth score from the fewest to the
    most operations (``RISE``, rounded) with its 95 % interval (``"95% CI"``), beside the slopes."""
    sl_show = depth.slopes[depth.slopes.aggregation == "mean"].copy()
    span = int(depth.n_ops.max() - depth.n_ops.min())
    sl_show[RISE] = (sl_show.rel_slope * span).round(3)
    sl_show["95% CI"] = [f"{lo * span:+.3f} … {hi * span:+.3f}" for lo, hi in zip(sl_show.rel_ci_low, sl_show.rel_ci_high)]
    return sl_show


def extrapolation_gains(gains: pd.DataFrame) -> pd.DataFrame:
    """The extrapolate rows of :func:`gains_by_split`, indexed by (metric, comparison)."""
    return gains[gains.split == "extrapolate"].set_index(["metric", "comparison"])


def answer_only_rises(rises: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """The layer-effect rows of :func:`overall_rises` of MoEUT and of the Transformer trained on the answer only."""
    rise = {row["run"]: row for _, row in rises[rises.metric == "layer_effect"].iterrows()}
    return rise["moeut-answer_only"], rise["transformer-answer_only"]


__all__ = ["TrainedRun", "TrainingSummary", "trained_runs", "evaluate_runs", "accuracy_summary", "paired_gains",
           "architecture_gaps", "probe_erasure", "erasure_depth", "operation_sample", "depth_by_operations", "skip_depth_effects",
           "model_adapter", "ARCH_LABELS",
           "ScratchParams", "evaluation_splits", "gains_by_split", "probe_erasures", "DepthByOperations",
           "depth_vs_operations", "RISE", "DEPTH_COLUMNS", "problem_depths",
           "depth_sample", "comparison_depths", "overall_rises", "extrapolation_gains", "answer_only_rises"]
