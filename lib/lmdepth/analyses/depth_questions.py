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

import pandas as pd

from lmdepth.analyses.finetuned import finetune_states, finetuned_depths, over_training
from lmdepth.analyses.scratch import ScratchParams, TrainedRun, comparison_depths
from lmdepth.claims import report
from lmdepth.claims import scratch_claims as sc
from lmdepth.data.dm_math import MathData


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
    """

    units: pd.DataFrame
    verdicts: pd.DataFrame
    finetune_states: pd.DataFrame
    over_training: pd.DataFrame
    chapter_verdicts: pd.DataFrame


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
    ft_eval, ft_depths = (finetuned_depths(finetune_dir, data, n_per_operations, seed, results_dir) if finetune_dir
                          else (pd.DataFrame(), pd.DataFrame()))
    units = sc.depth_units_of(pd.concat([depths, ft_depths], ignore_index=True),
                              pd.concat([per_example, ft_eval], ignore_index=True))
    kw: dict[str, Any] = dict(n_boot=params.n_boot, seed=seed)
    verdicts = pd.concat([report.check("moeut", units, list(sc.RECIPES), only=list(sc.RECIPE_CLAIMS), **kw),
                          report.check("moeut", units, [sc.SUBJECT], only=list(sc.PAIR_CLAIMS), **kw),
                          report.check("moeut", units, [sc.FINETUNED], only=list(sc.FINETUNED_CLAIMS), **kw)],
                         ignore_index=True)
    chapter = pd.concat([earlier, verdicts], ignore_index=True) if earlier is not None else verdicts
    states = finetune_states(finetune_dir) if finetune_dir else pd.DataFrame(columns=["run", "seed", "state"])
    return DepthQuestions(units, verdicts, states, over_training(finetune_dir) if finetune_dir else pd.DataFrame(),
                          chapter)


__all__ = ["DepthQuestions", "ask"]
