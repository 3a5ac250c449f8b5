"""The one cached, resumable run template every analysis uses.

validation (the analysis's :class:`~lmdepth.params.Params`) → the model resolved once → cache key →
:class:`~lmdepth.results.RunStore` → model load → per-unit loop with checkpoints → tidy table → sidecar, finished in
one atomic step::

    def run(params=None, **kwargs):
        p, ref = resolved(MyParams, params, kwargs)       # bad input stops here, before any model loads
        job = Job(ANALYSIS, p, key={...}, item_key={...}, refs=ref)
        return job.execute(lambda store: compute(p, ref, store))   # compute loads load_model(ref, ...)

``compute`` returns ``(table, meta)`` or ``(table, meta, units)`` (a per-unit table for claim verdicts); the template
adds the analysis name, the weights, the environment, the wall time and the cost (:func:`execute`) to the sidecar. :func:`per_unit` is the
checkpointed loop over problems (or items, prompts, runs). The model name is resolved once per run
(:class:`~lmdepth.model.registry.ModelRef`): the cache key, the checkpoints and the load read that one resolution.

What the book's pages and the atlas read of a finished run is its typed summary: :class:`RunSummary` (or
:class:`SampleSummary`) extended by each analysis and built by its ``of(result)`` from the stored sidecar alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from lmdepth.errors import DataError
from lmdepth.model.registry import ModelRef
from lmdepth.params import ModelParams, Params
from lmdepth.results import RunResult, RunStore, record_run
from lmdepth.runtime import environment, progress

X = TypeVar("X")
P = TypeVar("P", bound=Params)
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
        models: every model whose weights the numbers depend on (default: ``[model]``). Their
            :func:`~lmdepth.model.registry.weights_id` is part of the cache key and of every per-unit checkpoint's
            key, so a local directory retrained in place (or another hub revision) gets a new key: a result computed
            with other weights is never served. The sidecar records the ids.
        refs: those models resolved (:meth:`~lmdepth.model.registry.ModelRef.of`), each once per run: the ones given
            (by :func:`resolved`) are used as they are, the others resolved when the job is made. The computation
            reads them from here (:attr:`ref`) instead of resolving the names again.
        bare_weights: key the run by its one model's weights id as a plain string, not a ``{model: id}`` map: the
            tuned lens's entries were keyed so before it ran through this template, and keep their keys.
        record: note the run in the book record of the chapter being built; False for a run that only serves
            another run, which names it in its own sidecar (the tuned lens, named by the lens run).
    """

    analysis: str
    params: ModelParams
    key: dict[str, Any]
    item_key: dict[str, Any] | None = None
    model: str | None = None
    models: list[str] | None = None
    refs: dict[str, ModelRef] | ModelRef | None = None
    bare_weights: bool = False
    record: bool = True

    def __post_init__(self) -> None:
        remote = getattr(self.params, "remote", False)
        given = {self.refs.name: self.refs} if isinstance(self.refs, ModelRef) else dict(self.refs or {})
        for ref in given.values():
            if ref.remote != remote:
                raise ValueError(f"{ref.name!r} was resolved with remote={ref.remote!r}; the run has remote={remote!r}")
        names = self.models or [self.model or self.params.model_name]
        self.refs = {m: given[m] if m in given else ModelRef.of(m, remote) for m in names}

    @property
    def ref(self) -> ModelRef:
        """The resolved model the run is filed under."""
        return self.refs[self.model or self.params.model_name]

    def store(self, weights: dict[str, str] | None = None) -> RunStore:
        """The cache entry of these parameters and weights (default: the resolved models'), its per-unit
        checkpoints keyed by the weights too."""
        p = self.params
        weights = self.weights() if weights is None else weights
        ids: dict[str, str] | str = weights[self.ref.name] if self.bare_weights else weights
        key = {**self.key, "weights": ids}
        item_key = {**(self.key if self.item_key is None else self.item_key), "weights": ids}
        return RunStore(p.results_dir, self.analysis, self.model or p.model_name, key, item_params=item_key)

    def weights(self) -> dict[str, str]:
        """The weights id of every model the run depends on, as resolved for this run."""
        return {m: ref.weights_id for m, ref in self.refs.items()}

    def stored(self) -> RunResult | None:
        """The finished run of these parameters and weights if the cache holds it intact, else None; nothing is
        computed or recorded (a run that is not part of the build, read where it was stored)."""
        return self.store().load_verified()

    def execute(self, compute: Callable[[RunStore], tuple[Any, ...]]) -> RunResult:
        """Serve a finished run from the cache, or compute it (resuming from checkpoints) and finish it.

        ``compute`` returns ``(table, meta)``, ``(table, meta, units)`` or ``(table, meta, units, artifacts)``
        (``artifacts``: name → bytes, kept beside the tables in the same atomic finish; see
        :meth:`~lmdepth.results.RunStore.finalize`).
        """
        weights = self.weights()
        return execute(self.store(weights), compute, {"analysis": self.analysis, "weights": weights},
                       use_cache=self.params.use_cache, record=self.record)


def execute(store: RunStore, compute: Callable[[RunStore], tuple[Any, ...]], stamp: dict[str, Any],
            use_cache: bool = True, record: bool = True) -> RunResult:
    """:meth:`Job.execute` on a store of one's own: serve ``store``'s finished run, or compute it and finish it
    with ``stamp`` (the analysis name, the weights …), the environment and what it cost. ``compute`` returns
    ``(table, meta[, units[, artifacts]])``.

    The cost: the units' own seconds where ``compute`` went through :func:`per_unit`; otherwise this execution's
    CPU seconds (``cpu_time_s``) beside how many checkpointed items it read (``resumed_items``): with none read,
    this execution is the whole run and its CPU time the run's cost.
    """
    if use_cache:
        cached = store.load_verified()  # a damaged run is moved aside (and said so) and computed again
        if cached is not None:
            if record:
                record_run(cached)
            return cached
    else:  # the previous finished run and its checkpoints stay untouched until the new run replaces them
        store.begin_recompute()
    finished = False
    try:
        clock = UnitClock()
        table, meta, *more = compute(store)
        units, artifacts = (*more, None, None)[:2]
        wall, cpu = clock.elapsed()
        meta = {**meta, **stamp, "environment": environment(), "wall_time_s": round(wall, 2)}
        if store.unit_seconds:  # the units' own cost, whether computed now or read from checkpoints
            meta["unit_compute_s"] = unit_cost(store.unit_seconds, store.unit_cpu_seconds)
        else:
            meta |= {"cpu_time_s": round(cpu, 2), "resumed_items": store.items_read}
        result = store.finalize(table, meta, units, replace=not use_cache, artifacts=artifacts)
        finished = True
    finally:
        store.end_recompute(finished)
    if record:
        record_run(result)
    return result


def resolved(cls: type[P], params: P | ModelRef | str | None, kwargs: dict[str, Any]) -> tuple[P, ModelRef]:
    """A run's validated parameters (``cls.of(params, **kwargs)``: bad input stops here) and its model, resolved once.

    ``params`` may be a :class:`~lmdepth.model.registry.ModelRef`, the model already resolved (by :func:`run_many`,
    or by the run that asks for this one), which is then used as it is.
    """
    if isinstance(params, ModelRef):
        p = cls.of(params.name, **kwargs)
        if p.model_name != params.name:
            raise ValueError(f"model_name={p.model_name!r} for the model resolved as {params.name!r}")
        return p, params
    p = cls.of(params, **kwargs)
    return p, ModelRef.of(p.model_name, getattr(p, "remote", False))


def unit_cost(wall: Sequence[float | None], cpu: Sequence[float | None]) -> dict[str, float | int]:
    """The sidecar's ``unit_compute_s``: the units' wall seconds (``total``, over the ``timed`` of ``units``) and
    their CPU seconds, every thread of the process counted (``cpu_total`` over ``cpu_timed``; units computed before
    CPU time was kept have none), so a cost can be read free of what else the machine was running."""
    known, known_cpu = [x for x in wall if x is not None], [x for x in cpu if x is not None]
    return {"total": round(sum(known), 2), "units": len(wall), "timed": len(known),
            "cpu_total": round(sum(known_cpu), 2), "cpu_timed": len(known_cpu)}


class UnitClock:
    """Times one unit of work, in wall and CPU seconds, for its checkpoint (``_seconds``, ``_cpu_seconds``)."""

    def __init__(self) -> None:
        self.wall0, self.cpu0 = time.time(), time.process_time()

    def elapsed(self, share: int = 1) -> tuple[float, float]:
        """(wall, CPU) seconds since this clock started, divided among ``share`` units."""
        return (time.time() - self.wall0) / share, (time.process_time() - self.cpu0) / share

    def stamp(self, item: Arrays, extra: tuple[float, float] = (0.0, 0.0)) -> Arrays:
        """``item`` with the (wall, CPU) seconds since this clock started, plus ``extra`` (a share of batched work)."""
        wall, cpu = self.elapsed()
        item["_seconds"], item["_cpu_seconds"] = np.array(wall + extra[0]), np.array(cpu + extra[1])
        return item


def record_unit_cost(store: RunStore, item: Arrays) -> None:
    """Append a unit's recorded seconds (None where its checkpoint predates them) to the store's cost lists."""
    for key, out in (("_seconds", store.unit_seconds), ("_cpu_seconds", store.unit_cpu_seconds)):
        out.append(float(item[key]) if key in item else None)


def per_unit(store: RunStore, units: Sequence[tuple[str, X]], compute: Callable[[str, X], Arrays],
             desc: str) -> list[Arrays]:
    """For each ``(unit id, payload)``: the checkpointed arrays, or ``compute(id, payload)`` saved as a checkpoint.

    Returns the arrays of every unit in order. Each checkpoint keeps the wall and CPU seconds its unit took
    (:class:`UnitClock`), so a run finished from checkpoints still reports what its units cost (sidecar
    ``unit_compute_s``).
    """
    out = []
    for uid, payload in progress(units, desc=desc):
        item = store.load_item(uid)
        if item is None:
            clock = UnitClock()
            item = clock.stamp(compute(uid, payload))  # what the unit cost, kept with it
            store.save_item(uid, item)
        record_unit_cost(store, item)
        out.append(item)
    return out


def require_tokens(encoded: Sequence[tuple[str, Any]], n: int, why: str) -> None:
    """Raise a :class:`~lmdepth.errors.DataError` naming the first unit with fewer than ``n`` tokens."""
    for uid, ids in encoded:
        if ids.shape[-1] < n:
            raise DataError(f"Example {uid} has {ids.shape[-1]} token(s); {why}. Use longer texts or drop it.")


def run_many(run: Callable[..., RunResult], model_names: Sequence[str], **kwargs: Any) -> dict[str, RunResult]:
    """``run(model_name=m, **kwargs)`` for each model, in order. Every name is resolved first, so a typo in the last
    one stops the call before the first model is loaded; each run gets its model as resolved here."""
    refs = [ModelRef.of(m, kwargs.get("remote", False)) for m in model_names]
    return {ref.name: run(ref, **kwargs) for ref in refs}


def concat_tables(results: dict[str, RunResult]) -> pd.DataFrame:
    """The runs' tables stacked into one, in the runs' order (a fresh index)."""
    return pd.concat([r.table for r in results.values()], ignore_index=True)


# ---- typed summaries: what the pages and the atlas read of a run ---------------------------------------------------

@dataclass(frozen=True)
class RunSummary:
    """What every finished run says about itself, typed; each analysis extends it with what its pages read.

    An analysis's summary is built by its ``of(result)`` from the stored sidecar alone (no new storage format, nothing
    recomputed), so every stored run reads as it was written, and the sidecar's layout is known in one place: the
    module that writes it. A page never indexes a sidecar.

    Attributes:
        model: the model the run is filed under (its parameters' ``model_name``).
        path: the run's folder.
        from_cache: served from the results cache (True) or computed by this call.
        wall_time_s: seconds the run took when it was computed (a cached run keeps that measurement).
    """

    model: str
    path: Path
    from_cache: bool
    wall_time_s: float

    @staticmethod
    def fields_of(result: RunResult) -> dict[str, Any]:
        """The :class:`RunSummary` fields of a finished run (for an analysis's ``of``)."""
        return dict(model=result.meta["parameters"]["model_name"], path=Path(result.path),
                    from_cache=result.from_cache, wall_time_s=float(result.meta.get("wall_time_s", np.nan)))


@dataclass(frozen=True)
class SampleSummary(RunSummary):
    """A run of one model over a sample of a data set.

    Attributes:
        n_layers: the model's layers.
        dataset: the data set as its parameters name it (a named set, or a user file by its content).
        n_examples: problems asked for; ``n_problems``: problems the run evaluated (its data selection).
    """

    n_layers: int
    dataset: str
    n_examples: int
    n_problems: int

    @staticmethod
    def fields_of(result: RunResult) -> dict[str, Any]:
        """The :class:`SampleSummary` fields of a finished run."""
        m = result.meta
        return dict(RunSummary.fields_of(result), n_layers=int(m["model"]["n_layers"]),
                    dataset=str(m["parameters"].get("dataset", "")), n_examples=int(m["parameters"]["n_examples"]),
                    n_problems=int(m["data"]["n"]))
