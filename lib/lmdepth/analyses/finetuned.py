"""The fine-tuned pretrained runs of chapter 07 (:mod:`lmdepth.scratch.finetune`): where each stands, their depth per
problem on chapter 07's depth sample (as :func:`lmdepth.analyses.scratch.comparison_depths` for the from-scratch
runs), and the depth score over training, read from the snapshots ``scripts/finetune_runs.py`` stores beside each
run (step 0 is the pretrained model).

The book never fine-tunes: a run takes hours on a CPU; the chapter reads what is finished and says what is not.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

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
from lmdepth.runtime import progress as progress_bar
from lmdepth.scratch.evaluate import evaluate
from lmdepth.scratch.finetune import FinetuneConfig, finetune_configs, finetune_dir, load_finetuned
from lmdepth.scratch.training import readable, safe_load


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
    stores = {path: RunStore(results_dir, "dm_math_ft_depth", path.parent.name,
                                 {"n_per_operations": n_per_operations, "seed": seed, "weights": path.parent.name,
                                  "data": {k: data.meta.get(k) for k in SAMPLE_DATA_KEYS}, "n_sample": len(sample)})
              for cfg, path in finished if path.is_file()}
    announce_missing(list(stores.values()), "the evaluation (both splits) and depth of the fine-tuned", len(sample))
    evals, depths = [], []
    for cfg, path in finished:
        if path not in stores:
            continue
        store = stores[path]
        done = store.load_verified()
        if done is None:
            t0 = time.time()
            ev, table = _evaluate_and_depths(store, cfg, path, data, sample)
            done = store.finalize(table, {"run": path.parent.name, "wall_time_s": round(time.time() - t0, 1)},
                                  units=ev)
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
    evals = []
    for split in ("interpolate", "extrapolate"):
        got = store.load_item(f"evaluation {split}")
        if got is None:
            got = _as_arrays(evaluate(model, tok, data.split(split)))
            store.save_item(f"evaluation {split}", got)
        evals.append(pd.DataFrame(got).assign(split=split))
    mu = reference_mean(model, tok)
    rows = []
    for i, example in enumerate(progress_bar(sample, f"depth of {path.parent.name}")):
        got = store.load_item(f"problem {i}")
        if got is None:
            got = _as_arrays(problem_depths(model, tok, [example], mu))
            store.save_item(f"problem {i}", got)
        rows.append(pd.DataFrame(got).assign(unit=i))
    return pd.concat(evals, ignore_index=True), pd.concat(rows, ignore_index=True)


def over_training(checkpoint_dir: str | Path, configs: list[FinetuneConfig] | None = None) -> pd.DataFrame:
    """The depth score over fine-tuning, from each run's stored snapshots (:func:`~lmdepth.analyses.scratch.
    snapshot_curve`; step 0 is the pretrained model)."""
    return snapshot_curve([(cfg.seed, finetune_dir(cfg, checkpoint_dir)) for cfg in configs or finetune_configs()])


__all__ = ["finetune_states", "finetuned_depths", "over_training"]
