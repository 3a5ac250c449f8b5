"""The paper's §5 depth questions asked of chapter 07's trained runs (book/method.md#method-moeut): does depth grow with
the number of operations for a model trained from scratch, does MoEUT use deeper layers than the Transformer and in
a more input-dependent way, and does fine-tuning a pretrained model leave its depth flat?

One call, :func:`ask`, measures the depth of every problem of the depth sample on the twelve comparison runs
(:func:`lmdepth.analyses.scratch.comparison_depths`) and on the finished fine-tuned runs
(:func:`lmdepth.analyses.finetuned.finetuned_depths`), and decides the registry's depth claims
(:data:`lmdepth.claims.scratch_claims.DEPTH_CLAIMS`) on them, at the level of training seeds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from lmdepth.analyses.finetuned import finetune_states, finetuned_depths, over_training
from lmdepth.analyses.scratch import (
    ScratchParams,
    TrainedRun,
    comparison_depths,
    evaluate_runs,
    evaluation_splits,
    matched_runs,
    snapshot_curve,
    untrained_depths,
)
from lmdepth.claims import report
from lmdepth.claims import scratch_claims as sc
from lmdepth.claims.spec import replicates
from lmdepth.data.dm_math import MathData
from lmdepth.errors import DataError
from lmdepth.scratch.training import chain_configs, load_data, matched_configs, run_dir


@dataclass(frozen=True)
class DepthQuestions:
    """What chapter 07's section "Does depth grow with the problem?" shows.

    Attributes:
        units: the claims' per-problem table (:func:`~lmdepth.claims.scratch_claims.depth_units_of`): one row per
            (run, training seed, problem) with its relative depth score (layer and answer effect), erasure depth and
            whether the run solves it.
        verdicts: the depth claims' rows: one per recipe for "depth grows", the MoEUT − Transformer rows, and the
            fine-tuned model's row.
        finetune_states: where each fine-tuned run stands (:func:`~lmdepth.analyses.finetuned.finetune_states`).
        over_training: the fine-tuned runs' depth over training (:func:`~lmdepth.analyses.finetuned.over_training`).
        chapter_verdicts: the chapter's earlier verdict rows, then these (what the chapter saves and counts).
        chain_states: where each positive-control run stands (``run, seed, lr, state, steps``).
        chain_accuracy: the positive-control runs' exact match per split and number of operations (``train_seed, split,
            n_operations, exact_match, n``).
        chain_over_training: the positive-control runs' depth over training, from their snapshots
            (:func:`~lmdepth.analyses.scratch.snapshot_curve`).
        comparison_over_training: the same for the comparison runs that stored snapshots (the seeds trained since
            snapshots exist), with ``run`` their recipe's run name.
    """

    units: pd.DataFrame
    verdicts: pd.DataFrame
    finetune_states: pd.DataFrame
    over_training: pd.DataFrame
    chapter_verdicts: pd.DataFrame
    chain_states: pd.DataFrame
    chain_accuracy: pd.DataFrame
    chain_over_training: pd.DataFrame
    comparison_over_training: pd.DataFrame


def chain_questions(params: ScratchParams) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The positive control's finished runs (:func:`~lmdepth.scratch.training.chain_configs` in ``chain_dir``):
    their evaluation and their depth on the chain task's own depth sample, both with ``run``
    :data:`~lmdepth.claims.scratch_claims.CHAIN_RUN`, and the state of every planned run."""
    configs = chain_configs(params.profile) if params.chain_dir else []
    if not configs:
        return pd.DataFrame(), pd.DataFrame(), pd.DataFrame(columns=["run", "seed", "lr", "state", "steps"])
    runs, states = matched_runs(params.profile, params.chain_dir, device=params.device, configs=configs)
    if not runs:
        return pd.DataFrame(), pd.DataFrame(), states
    data = load_data(configs[0], params.data_dir)
    evaluation = evaluate_runs(runs, evaluation_splits(data), device=params.device)
    depths = comparison_depths(runs, data, evaluation, params.n_depth_per_operations, params.seed,
                               params.results_dir, device=params.device)
    return evaluation.assign(run=sc.CHAIN_RUN), depths.assign(run=sc.CHAIN_RUN), states


#: The depth summaries the pair rows read, and the objective contrasts within each architecture.
PAIR_METRICS = {"depth_layer": "depth score (layer effect)", "erasure_depth": "erasure depth"}
OBJECTIVE_PAIRS = {"MoEUT": ("moeut-answer_only", "moeut-lm"), "Transformer": ("transformer-answer_only",
                                                                               "transformer-lm")}


def pair_gaps(units: pd.DataFrame) -> pd.DataFrame:
    """Where the MoEUT − Transformer depth gap comes from, per depth summary (means over the problems the pair rows
    read and over seeds; descriptive, no verdict): the trained gap, the same gap of the untrained twins, what
    training adds (the pair rows' statistic), and the answer-only − all-token contrast within each architecture
    (on the problems and seeds both of its runs have). NaN where the runs or twins are missing."""
    rows = []
    for metric, label in PAIR_METRICS.items():
        row: dict[str, Any] = {"depth summary": label}
        try:
            w = replicates(sc.pair_values(metric, twins=True)(units, sc.SUBJECT))[0]
            m, t, m0, t0 = (w[c].to_numpy() for c in (*sc.PAIR, *sc.TWINS))
            row |= {"trained gap": (m - t).mean(), "untrained twins' gap": (m0 - t0).mean(),
                    "training adds": ((m - t) - (m0 - t0)).mean(), "problems": len(w)}
        except DataError:
            row |= {"trained gap": np.nan, "untrained twins' gap": np.nan, "training adds": np.nan, "problems": 0}
        for arch, runs in OBJECTIVE_PAIRS.items():
            try:
                w = replicates(sc.pair_values(metric, runs=runs)(units, sc.SUBJECT))[0]
                row[f"{arch}: answer-only − all-token"] = (w[runs[0]] - w[runs[1]]).mean()
            except DataError:
                row[f"{arch}: answer-only − all-token"] = np.nan
        rows.append(row)
    return pd.DataFrame(rows)


def _accuracy_by_length(evaluation: pd.DataFrame) -> pd.DataFrame:
    if evaluation.empty:
        return pd.DataFrame(columns=["train_seed", "split", "n_operations", "exact_match", "n"])
    return (evaluation.groupby(["train_seed", "split", "n_operations"]).correct.agg(exact_match="mean", n="size")
            .reset_index())


def ask(matched: dict[str, TrainedRun], data: MathData, per_example: pd.DataFrame, params: ScratchParams,
        earlier: pd.DataFrame | None = None) -> DepthQuestions:
    """Measure and decide the depth questions (see the module docstring).

    Args:
        matched: the comparison runs (:func:`~lmdepth.analyses.scratch.matched_runs`); per_example: their
            :func:`~lmdepth.analyses.scratch.evaluate_runs`.
        params: chapter 07's parameters: the depth sample's size (``n_depth_per_operations`` per number of
            operations and split) and seed, where the fine-tuned runs live (``finetune_dir``), ``results_dir``,
            ``n_boot`` and ``device``.
        earlier: the chapter's other verdict rows, put first in ``chapter_verdicts``.
    """
    n_per_operations, seed, results_dir = params.n_depth_per_operations, params.seed, params.results_dir
    finetune_dir, device = params.finetune_dir, params.device
    depths = comparison_depths(matched, data, per_example, n_per_operations, seed, results_dir, device=device)
    pair_seeds = sorted({r.meta["train_config"]["seed"] for r in matched.values() if r.name in sc.PAIR})
    twins = untrained_depths(data, n_per_operations, seed, results_dir, pair_seeds, params.profile, device=device)
    ft_eval, ft_depths = (finetuned_depths(finetune_dir, data, n_per_operations, seed, results_dir) if finetune_dir
                          else (pd.DataFrame(), pd.DataFrame()))
    chain_eval, chain_depths, chain_states = chain_questions(params)
    units = sc.depth_units_of(pd.concat([depths, twins, ft_depths, chain_depths], ignore_index=True),
                              pd.concat([per_example, ft_eval, chain_eval], ignore_index=True))
    kw: dict[str, Any] = dict(n_boot=params.n_boot, seed=seed)
    verdicts = pd.concat([report.check("moeut", units, list(sc.RECIPES), only=list(sc.RECIPE_CLAIMS), **kw),
                          report.check("moeut", units, [sc.CHAIN_RECIPE], only=list(sc.CHAIN_CLAIMS), **kw),
                          report.check("moeut", units, [sc.SUBJECT], only=list(sc.PAIR_CLAIMS), **kw),
                          report.check("moeut", units, [sc.FINETUNED], only=list(sc.FINETUNED_CLAIMS), **kw)],
                         ignore_index=True)
    chapter = pd.concat([earlier, verdicts], ignore_index=True) if earlier is not None else verdicts
    states = finetune_states(finetune_dir) if finetune_dir else pd.DataFrame(columns=["run", "seed", "state"])
    chain_curve = snapshot_curve([(c.seed, run_dir(c, params.chain_dir)) for c in chain_configs(params.profile)]
                                 if params.chain_dir else [])
    comparison = matched_configs(params.profile)
    names = {run_dir(c, params.runs_dir).name: c.name for c in comparison}
    curve = snapshot_curve([(c.seed, run_dir(c, params.runs_dir)) for c in comparison])
    if len(curve):  # one line per (recipe, seed)
        curve = curve.assign(run=curve.folder.map(names))
        curve = curve.assign(seed=curve.run + " seed " + curve.seed.astype(str))
    return DepthQuestions(units, verdicts, states, over_training(finetune_dir) if finetune_dir else pd.DataFrame(),
                          chapter, chain_states, _accuracy_by_length(chain_eval), chain_curve, curve)


__all__ = ["DepthQuestions", "ask", "chain_questions", "pair_gaps"]
