"""Results on disk: a tidy long table plus a JSON sidecar per run, cached, resumable, written atomically.

Layout::

    <results_dir>/<analysis>/<model-slug>/<key>/table.csv    tidy: model, metric, component, stat, layer, value, …
    <results_dir>/<analysis>/<model-slug>/<key>/meta.json    parameters, provenance, data selection, versions, wall time
    <results_dir>/<analysis>/<model-slug>/<item-key>.partial/  per-item checkpoints, shared by runs that differ only in
                                                           parameters that do not change an item (e.g. n_examples)

An item's name must fix what it computes on, given the item key: an index into a data set that the key names (a
packaged file, or a user file by its content hash), or else the item's text itself
(:attr:`lmdepth.data.datasets.Example.content_name`, used for generated items).

``key`` hashes the parameters that change the numbers plus :data:`lmdepth.COMPUTE_VERSION`. A finished run
directory appears in one ``os.replace``, so an interrupted run never looks complete; its ``.partial`` items are
reused by the next run (and by larger runs) with the same per-item parameters.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from lmdepth import COMPUTE_VERSION


def slug(name: str) -> str:
    """A filesystem-safe name for a model id or path."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name.strip("/")) or "model"


def cache_key(params: dict[str, Any]) -> str:
    """Stable hash of the parameters that change a result, and of the compute version."""
    blob = json.dumps({**params, "compute_version": COMPUTE_VERSION}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def atomic_write(path: Path, write: Callable[[Path], Any]) -> None:
    """The one atomic file write: ``write(tmp)`` fills a temporary file beside ``path`` (same suffix, so writers
    such as ``np.savez`` keep the name), which is flushed to disk and moved into place with ``os.replace``.
    Readers never see half a file, and a crash leaves the old file or none."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=path.suffix)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600: give the file ordinary permissions
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: Path, text: str) -> None:
    """:func:`atomic_write` of a UTF-8 text."""
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


@dataclass
class RunResult:
    """A finished run: its tidy table, its sidecar and where they live.

    ``units`` is the per-unit table (one row per problem, text or item and whatever it measured), which claim
    verdicts bootstrap over (:mod:`lmdepth.claims`); None for analyses that do not write one.
    """

    table: pd.DataFrame
    meta: dict[str, Any]
    path: Path
    from_cache: bool = False
    units: pd.DataFrame | None = None


class RunStore:
    """Cache entry of one (analysis, model, parameters) run, with per-item checkpoints for resuming."""

    def __init__(self, results_dir: str | Path, analysis: str, model: str, params: dict[str, Any],
                 item_params: dict[str, Any] | None = None):
        """``item_params``: the parameters that change one item's result (default: all). Leaving out e.g.
        ``n_examples`` lets a larger run reuse the per-problem checkpoints of a smaller one."""
        self.params = params
        self.key = cache_key({"analysis": analysis, "model": model, **params})
        self.dir = Path(results_dir) / analysis / slug(model) / self.key
        item_key = self.key if item_params is None else cache_key({"analysis": analysis, "model": model, **item_params})
        self.partial = self.dir.with_name(item_key + ".partial")
        self.unit_seconds: list[float | None] = []  # per unit of this execution: its compute seconds (None: unknown)

    @property
    def complete(self) -> bool:
        return (self.dir / "meta.json").exists() and (self.dir / "table.csv").exists()

    def load(self) -> RunResult:
        meta = json.loads((self.dir / "meta.json").read_text())
        units = pd.read_csv(self.dir / "units.csv") if (self.dir / "units.csv").exists() else None
        return RunResult(pd.read_csv(self.dir / "table.csv"), meta, self.dir, from_cache=True, units=units)

    def clear(self) -> None:
        """Forget both the finished result and any checkpoints (``use_cache=False``)."""
        for d in (self.dir, self.partial):
            shutil.rmtree(d, ignore_errors=True)

    # ---- per-item checkpoints -------------------------------------------------------------------------
    def _item_path(self, item: str) -> Path:
        return self.partial / f"{hashlib.sha1(item.encode()).hexdigest()[:16]}.npz"

    def load_item(self, item: str) -> dict[str, np.ndarray] | None:
        """The checkpoint of one unit, or None. A checkpoint that cannot be read (a crash or power loss while it
        was written) is discarded with a warning, so the unit is computed again."""
        p = self._item_path(item)
        if not p.exists():
            return None
        try:
            with np.load(p) as z:
                return {k: z[k] for k in z.files}
        except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as e:
            print(f"lmdepth: discarding the unreadable checkpoint {p} ({type(e).__name__}); recomputing it",
                  file=sys.stderr, flush=True)
            p.unlink(missing_ok=True)
            return None

    def save_item(self, item: str, arrays: dict[str, np.ndarray]) -> None:
        atomic_write(self._item_path(item), lambda tmp: np.savez(tmp, **arrays))

    # ---- finishing ------------------------------------------------------------------------------------
    def finalize(self, table: pd.DataFrame, meta: dict[str, Any], units: pd.DataFrame | None = None) -> RunResult:
        """Write table, per-unit table (if any) and sidecar into a temporary directory, then move it into place in one step.

        Two processes finishing the same run (same parameters, so the same numbers) is safe: the first one to
        land stays and the other discards its copy.
        """
        self.dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=self.dir.parent, prefix=f".{self.key}-"))
        meta = {**meta, "cache_key": self.key, "compute_version": COMPUTE_VERSION}
        try:
            _write_synced(tmp / "table.csv", table.to_csv(index=False))
            if units is not None:
                _write_synced(tmp / "units.csv", units.to_csv(index=False))
            _write_synced(tmp / "meta.json", json.dumps(meta, indent=2, default=str))
            os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp creates 0700: give the result ordinary permissions
            while True:
                try:
                    os.replace(tmp, self.dir)
                    break
                except OSError:  # the target exists and is not empty
                    if self.complete:  # another process finished the same run first: keep theirs
                        shutil.rmtree(tmp, ignore_errors=True)
                        break
                    aside = self.dir.with_name(f".{self.key}-stale-{os.getpid()}-{time.monotonic_ns()}")
                    try:
                        os.rename(self.dir, aside)  # an incomplete leftover: move it aside, then retry
                    except FileNotFoundError:
                        continue
                    shutil.rmtree(aside, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return RunResult(table, meta, self.dir, units=units)


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


#: Set by the book build while it executes a chapter: the directory where that chapter's runs and claims are
#: recorded (``<results>/book/<profile>/<chapter>/``). The summary pages read only what is recorded there, so an
#: ad-hoc run, whatever its parameters, never reaches the published findings.
BOOK_RECORD_ENV = "LMDEPTH_BOOK_RECORD"


def book_record_dir() -> Path | None:
    """The record directory of the chapter the book build is executing, or None outside a book build."""
    d = os.environ.get(BOOK_RECORD_ENV)
    return Path(d) if d else None


def record_run(result: RunResult) -> None:
    """Note a run (computed or served from the cache) in the book record of the chapter being built, if any."""
    d = book_record_dir()
    if d is None:
        return
    d.mkdir(parents=True, exist_ok=True)
    # relative to the results root (<results>/book/<profile>/<chapter> → <results>), so a results directory that is
    # moved or cloned elsewhere (stored with the book) keeps its record
    path = Path(result.path).resolve()
    root = d.resolve().parents[2]
    line = json.dumps({"path": os.path.relpath(path, root) if path.is_relative_to(root) else str(path),
                       "analysis": result.meta.get("analysis"), "cache_key": result.meta.get("cache_key")})
    with open(d / "runs.jsonl", "a", encoding="utf-8") as f:
        f.write(line + "\n")


def recorded_runs(record_root: str | Path, chapter: str = "*") -> set[Path]:
    """Every run recorded under a profile's book record (``<results>/book/<profile>``), or one chapter's."""
    out = set()
    root = Path(record_root).resolve().parents[1]  # <results>/book/<profile> → <results>
    for f in Path(record_root).glob(f"{chapter}/runs.jsonl"):
        out |= {(root / json.loads(line)["path"]).resolve()  # relative paths; older records hold absolute ones
                for line in f.read_text(encoding="utf-8").splitlines() if line.strip()}
    return out


def clean(results_dir: str | Path, partial_days: float = 7.0, temp_hours: float = 1.0) -> list[Path]:
    """Remove what interrupted runs left behind under ``results_dir``: temporary files and directories (names
    starting with ``.``) older than ``temp_hours``, and per-unit checkpoints (``*.partial``) of runs not touched
    for ``partial_days``. Finished results are never removed. Returns what was removed."""
    now, removed = time.time(), []
    root = Path(results_dir)
    for p in sorted(root.rglob("*")) if root.is_dir() else []:
        if not p.exists():
            continue
        age = now - p.stat().st_mtime
        stale_temp = p.name.startswith(".") and age > temp_hours * 3600
        stale_partial = p.is_dir() and p.name.endswith(".partial") and age > partial_days * 86400
        if stale_temp or stale_partial:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
            removed.append(p)
    return removed
