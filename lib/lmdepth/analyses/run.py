"""The one cached, resumable run template every analysis uses.

validation (the analysis's :class:`~lmdepth.params.Params`) → cache key → :class:`~lmdepth.results.RunStore`
→ model load → per-unit loop with checkpoints → tidy table → sidecar, finished in one atomic step::

    def run(params=None, **kwargs):
        p = MyParams.of(params, **kwargs)                  # bad input stops here, before any model loads
        job = Job(ANALYSIS, p, key={...}, item_key={...})
        return job.execute(lambda store: compute(p, store))

``compute`` returns ``(table, meta)``; the template adds the analysis name, the environment and the wall time to
the sidecar. :func:`per_unit` is the checkpointed loop over problems (or items, prompts, runs).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from lmdepth.params import ModelParams
from lmdepth.results import RunResult, RunStore
from lmdepth.runtime import environment, progress

X = TypeVar("X")
Arrays = dict[str, np.ndarray]


@dataclass
class Job:
    """One (analysis, model, parameters) run.

    Attributes:
        analysis: the results folder name (e.g. ``"residual_stream"``).
        params: the validated parameters (model name, results directory and cache switch are read from them).
        key: every parameter that changes the numbers (hashed into the cache key).
        item_key: the parameters that change one unit's numbers (default: ``key``); leaving out e.g.
            ``n_examples`` lets a larger run reuse a smaller one's per-unit checkpoints.
        model: the model name the run is filed under (default: ``params.model_name``).
    """

    analysis: str
    params: ModelParams
    key: dict[str, Any]
    item_key: dict[str, Any] | None = None
    model: str | None = None

    @property
    def store(self) -> RunStore:
        p = self.params
        return RunStore(p.results_dir, self.analysis, self.model or p.model_name, self.key, item_params=self.item_key)

    def execute(self, compute: Callable[[RunStore], tuple[pd.DataFrame, dict[str, Any]]]) -> RunResult:
        """Serve a finished run from the cache, or compute it (resuming from checkpoints) and finish it."""
        store = self.store
        if self.params.use_cache and store.complete:
            return store.load()
        if not self.params.use_cache:
            store.clear()
        t0 = time.time()
        table, meta = compute(store)
        meta = {"analysis": self.analysis, **meta, "environment": environment(),
                "wall_time_s": round(time.time() - t0, 2)}
        return store.finalize(table, meta)


def per_unit(store: RunStore, units: Sequence[tuple[str, X]], compute: Callable[[str, X], Arrays],
             desc: str) -> list[Arrays]:
    """For each ``(unit id, payload)``: the checkpointed arrays, or ``compute(id, payload)`` saved as a checkpoint.

    Returns the arrays of every unit in order.
    """
    out = []
    for uid, payload in progress(units, desc=desc):
        item = store.load_item(uid)
        if item is None:
            item = compute(uid, payload)
            store.save_item(uid, item)
        out.append(item)
    return out


def run_many(run: Callable[..., RunResult], model_names: Sequence[str], **kwargs: Any) -> dict[str, RunResult]:
    """``run(model_name=m, **kwargs)`` for each model, in order."""
    return {m: run(model_name=m, **kwargs) for m in model_names}


def concat_tables(results: dict[str, RunResult]) -> pd.DataFrame:
    return pd.concat([r.table for r in results.values()], ignore_index=True)
