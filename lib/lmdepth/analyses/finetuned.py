"""The fine-tuned pretrained runs of chapter 07 (:mod:`lmdepth.scratch.finetune`): where each stands, their depth per
problem on chapter 07's depth sample (as :func:`lmdepth.analyses.scratch.comparison_depths` for the from-scratch
runs), and the depth score over training, read from the snapshots ``scripts/finetune_runs.py`` stores beside each
run (step 0 is the pretrained model).

The book never fine-tunes: a run takes hours on a CPU; the chapter reads what is finished and says what is not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lmdepth.analyses.run import execute, per_unit
from lmdepth.analyses.scratch import (
    SAMPLE_DATA_KEYS,
    announce_missing,
    depth_sample,
    problem_depths,
    reference_mean,
    snapshot_curve,
)
from lmdepth.claims.scratch_claims import FINETUNED_RUN
from lmdepth.data.dm_math import MathData
from lmdepth.results import RunStore
from lmdepth.scratch.evaluate import evaluate
from lmdepth.scratch.finetune import FinetuneConfig, finetune_configs, finetune_dir, load_finetuned
from lmdepth.scratch.training import readable, safe_load

#: The results folder of the fine-tuned runs' evaluations and depths (:func:`finetuned_depths`).
FT_DEPTH_RUNS = "dm_math_ft_depth"


def finetune_states(checkpoint_dir: str | Path, configs: list[FinetuneConfig] | None = None) -> pd.DataFrame:
    """Per planned run: ``seed, state`` (``finished``, ``training`` with the step of its checkpoint, ``not
    trained``), ``steps`` and ``snapshots`` (how many are stored)."""
    rows = []
    for cfg in configs or finetune_configs():
        rd = finetune_dir(cfg, checkpoint_dir)
        if (rd / "adapter.pt").is_file() and (rd / "meta.json").is_file():
            state, step = ("finished", cfg.steps) if readable(rd / "adapter.pt") else ("damaged (adapter.pt is cut "
                                                                                        "or empty)", 0)
        elif (rd / "ckpt.pt").is_file():
            state, step = (("training", int(safe_load(rd / "ckpt.pt")["step"])) if readable(rd / "ckpt.pt") else
                           ("training (its checkpoint is damaged: the next run starts again)", 0))
        else:
            state, step = "not trained", 0
        rows.append({"run": cfg.name, "seed": cfg.seed, "state": state, "steps": f"{step:,} of {cfg.steps:,}",
                     "snapshots": len(list(rd.glob("snapshot-*.npz")))})
    return pd.DataFrame(rows)


def finetuned_depths(checkpoint_dir: str | Path, data: MathData, n_per_operations: int, seed: int,
                     results_dir: str | Path, configs: list[FinetuneConfig] | None = None) -> tuple[pd.DataFrame,
                                                                                                     pd.DataFrame]:
    """Every finished fine-tuned run on chapter 07's depth sample: (its evaluation on both splits, in the layout of
    :func:`~lmdepth.analyses.scratch.evaluate_runs`; its :func:`~lmdepth.analyses.scratch.problem_depths` with
    ``run`` :data:`~lmdepth.claims.scratch_claims.FINETUNED_RUN`, ``train_seed``, ``lr``, ``path`` and ``solved``).
    Both are stored per run (a :class:`~lmdepth.results.RunStore` under ``results_dir/dm_math_ft_depth``). Empty
    tables when no run is finished."""
    sample = depth_sample(data, n_per_operations, seed)
    finished = [(cfg, finetune_dir(cfg, checkpoint_dir) / "adapter.pt") for cfg in configs or finetune_configs()]
    stores = {path: RunStore(results_dir, FT_DEPTH_RUNS, path.parent.name,
                                 {"n_per_operations": n_per_operations, "seed": seed, "weights": path.parent.name,
                                  "data": {k: data.meta.get(k) for k in SAMPLE_DATA_KEYS}, "n_sample": len(sample)})
              for cfg, path in finished if path.is_file()}
    announce_missing(list(stores.values()), "the evaluation (both splits) and depth of the fine-tuned", len(sample))
    evals, depths = [], []
    for cfg, path in finished:
        if path not in stores:
            continue

        def compute(store: RunStore, cfg=cfg, path=path) -> tuple[pd.DataFrame, dict[str, Any], pd.DataFrame]:
            ev, table = _evaluate_and_depths(store, cfg, path, data, sample)
            return table, {"run": path.parent.name}, ev

        done = execute(stores[path], compute, {"analysis": FT_DEPTH_RUNS})
        ev = done.units.assign(run=FINETUNED_RUN, arch="smollm2", objective="answer_only", lr=cfg.lr,
                               train_seed=cfg.seed, path=str(path))
        correct = ev.groupby(["split", "question"]).correct.first()
        t = done.table.assign(run=FINETUNED_RUN, arch="smollm2", objective="answer_only", train_seed=cfg.seed,
                              lr=cfg.lr, path=str(path))
        t["solved"] = [bool(correct.get((s, q), False)) for s, q in zip(t.split, t.question)]
        evals.append(ev)
        depths.append(t)
    if not depths:
        return pd.DataFrame(), pd.DataFrame()
    return pd.concat(evals, ignore_index=True), pd.concat(depths, ignore_index=True)


def _as_arrays(table: pd.DataFrame) -> dict[str, np.ndarray]:
    """A table's columns as arrays a checkpoint holds without pickling (text as unicode arrays)."""
    return {c: table[c].to_numpy() if pd.api.types.is_numeric_dtype(table[c]) else table[c].to_numpy().astype(str)
            for c in table}


def _evaluate_and_depths(store: RunStore, cfg: FinetuneConfig, path: Path, data: MathData,
                         sample: list) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One fine-tuned run's evaluation on both splits and :func:`problem_depths` of every problem of ``sample``,
    each split's evaluation and each problem a checkpoint of ``store`` (a run takes hours on a CPU: an interrupted
    one resumes from its last problem). :func:`problem_depths` treats each problem on its own, so a table put
    together from checkpoints is the table of one uninterrupted call."""
    model, tok, _ = load_finetuned(path, cfg)
    splits = ("interpolate", "extrapolate")
    evals = per_unit(store, [(f"evaluation {split}", split) for split in splits],
                     lambda _, split: _as_arrays(evaluate(model, tok, data.split(split))), "evaluation")
    mu = reference_mean(model, tok)
    rows = per_unit(store, [(f"problem {i}", example) for i, example in enumerate(sample)],
                    lambda _, example: _as_arrays(problem_depths(model, tok, [example], mu)),
                    f"depth of {path.parent.name}")
    return (pd.concat([_table(got).assign(split=split) for got, split in zip(evals, splits)], ignore_index=True),
            pd.concat([_table(got).assign(unit=i) for i, got in enumerate(rows)], ignore_index=True))


def _table(item: dict[str, np.ndarray]) -> pd.DataFrame:
    """A checkpointed table's columns, without the unit's recorded seconds (:func:`~lmdepth.analyses.run.per_unit`)."""
    return pd.DataFrame({k: v for k, v in item.items() if not k.startswith("_")})


def over_training(checkpoint_dir: str | Path, configs: list[FinetuneConfig] | None = None) -> pd.DataFrame:
    """The depth score over fine-tuning, from each run's stored snapshots (:func:`~lmdepth.analyses.scratch.
    snapshot_curve`; step 0 is the pretrained model)."""
    return snapshot_curve([(cfg.seed, finetune_dir(cfg, checkpoint_dir)) for cfg in configs or finetune_configs()])


__all__ = ["finetune_states", "finetuned_depths", "over_training"]
