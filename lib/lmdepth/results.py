"""Results on disk: a tidy long table plus a JSON sidecar per run, cached, resumable, written atomically.

Layout::

    <results_dir>/<analysis>/<model-slug>/<key>/table.csv    tidy: model, metric, component, stat, layer, value, …
    <results_dir>/<analysis>/<model-slug>/<key>/meta.json    parameters, provenance, data selection, versions, wall time
    <results_dir>/<analysis>/<model-slug>/<item-key>.partial/  per-item checkpoints, shared by runs that differ only in
                                                           parameters that do not change an item (e.g. n_examples)

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
import tempfile
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
    """A finished run: its tidy table, its sidecar and where they live."""

    table: pd.DataFrame
    meta: dict[str, Any]
    path: Path
    from_cache: bool = False


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

    @property
    def complete(self) -> bool:
        return (self.dir / "meta.json").exists() and (self.dir / "table.csv").exists()

    def load(self) -> RunResult:
        meta = json.loads((self.dir / "meta.json").read_text())
        return RunResult(pd.read_csv(self.dir / "table.csv"), meta, self.dir, from_cache=True)

    def clear(self) -> None:
        """Forget both the finished result and any checkpoints (``use_cache=False``)."""
        for d in (self.dir, self.partial):
            shutil.rmtree(d, ignore_errors=True)

    # ---- per-item checkpoints -------------------------------------------------------------------------
    def _item_path(self, item: str) -> Path:
        return self.partial / f"{hashlib.sha1(item.encode()).hexdigest()[:16]}.npz"

    def load_item(self, item: str) -> dict[str, np.ndarray] | None:
        p = self._item_path(item)
        if not p.exists():
            return None
        with np.load(p) as z:
            return {k: z[k] for k in z.files}

    def save_item(self, item: str, arrays: dict[str, np.ndarray]) -> None:
        atomic_write(self._item_path(item), lambda tmp: np.savez(tmp, **arrays))

    # ---- finishing ------------------------------------------------------------------------------------
    def finalize(self, table: pd.DataFrame, meta: dict[str, Any]) -> RunResult:
        """Write table and sidecar into a temporary directory, then move it into place in one step."""
        self.dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=self.dir.parent, prefix=f".{self.key}-"))
        try:
            table.to_csv(tmp / "table.csv", index=False)
            meta = {**meta, "cache_key": self.key, "compute_version": COMPUTE_VERSION}
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2, default=str))
            if self.dir.exists():
                shutil.rmtree(self.dir)
            os.replace(tmp, self.dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return RunResult(table, meta, self.dir)
