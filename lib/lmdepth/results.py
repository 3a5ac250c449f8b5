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

Results defend themselves:

* every temporary folder the library writes is made by :func:`temp_dir`: its name starts with :data:`TMP_PREFIX` and
  it holds the file :data:`TEMP_MARKER`, which names it; a results root carries the file :data:`ROOT_MARKER`.
  :func:`clean` removes only what it can prove is its own and not part of the record: marked temporaries, and marked
  checkpoint folders that no finished run uses, never a path git tracks, never because of age alone;
* the sidecar records each file's sha256 and row count (``meta["files"]``) and its own digest (:data:`META_DIGEST`);
  a finished run is served only when both still match (:meth:`RunStore.load_verified`), otherwise it is moved aside
  as ``<key>.damaged-<time>`` (kept for inspection) and recomputed;
* replacing a finished run is journaled (:func:`finish_swap`): a process killed at any step leaves the old or the
  new run whole under its name, and the next :class:`RunStore` of that run completes the swap;
* ``use_cache=False`` computes into a temporary checkpoint folder and replaces the finished run only when the new
  one is complete (:meth:`RunStore.begin_recompute`), so an interrupt leaves the previous run as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lmdepth import COMPUTE_VERSION
from lmdepth.errors import DataError, ParameterError

#: Every temporary folder the library writes starts with this (and holds :data:`TEMP_MARKER`).
TMP_PREFIX = ".lmdepth-tmp-"
#: The file that marks a directory as a results root (written by the first run saved there).
ROOT_MARKER = "lmdepth-results.json"
#: The file inside each temporary folder the library makes (:func:`temp_dir`), naming that folder: :func:`clean`
#: removes a folder only where it finds this file naming it, since a name alone proves nothing (a user may name a
#: folder anything).
TEMP_MARKER = ".lmdepth-temporary"
#: The file inside each per-unit checkpoint folder the library creates, naming it: :func:`clean` may remove such a
#: folder when no finished run uses it; folders without it (older ones, the stored results', a user's) are kept.
CHECKPOINT_MARKER = ".lmdepth-checkpoints"
#: The key of a sidecar's own digest: sha256 of the sidecar's other keys (:func:`meta_digest`).
META_DIGEST = "meta_sha256"
#: Swap journals (:func:`finish_swap`): ``.lmdepth-swap-<key>-<pid>-<ns>.json`` beside the run they replace.
SWAP_PREFIX = ".lmdepth-swap-"
_PARTIAL = re.compile(r"^[0-9a-f]{16}\.partial$")


def slug(name: str) -> str:
    """A filesystem-safe name for a model id or path: one path component that is neither hidden nor ``.``/``..``
    (``--model ..`` must be filed under its analysis like any other model)."""
    s = re.sub(r"[^A-Za-z0-9._-]+", "_", name.strip("/"))
    return re.sub(r"^\.+", lambda m: "_" * len(m.group()), s) or "model"


def cache_key(params: dict[str, Any]) -> str:
    """Stable hash of the parameters that change a result, and of the compute version."""
    blob = json.dumps({**params, "compute_version": COMPUTE_VERSION}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    """sha256 of a file's content, read in chunks: what names a user's data file in a cache key and pins a model's
    weights file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def temp_dir(parent: str | Path, label: str = "") -> Path:
    """A new, empty temporary folder in ``parent`` (created if missing), marked as the library's own: its name starts
    with :data:`TMP_PREFIX` and it holds :data:`TEMP_MARKER`, which records that name, so :func:`clean` can tell it
    from a user's folder of the same name. The caller removes it (or renames it into place, see :func:`unmark`)."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    d = Path(tempfile.mkdtemp(dir=parent, prefix=f"{TMP_PREFIX}{label}"))
    (d / TEMP_MARKER).write_text(json.dumps({"lmdepth": "temporary", "name": d.name, "pid": os.getpid()}) + "\n",
                                 encoding="utf-8")
    return d


@contextmanager
def temporary_dir(parent: str | Path, label: str = "") -> Iterator[Path]:
    """:func:`temp_dir` as a context: removed on leaving it, whatever happened inside. (A kill between removing its
    marker and the folder itself leaves an empty, unmarked folder, which :func:`clean` keeps: it holds nothing.)"""
    d = temp_dir(parent, label)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def unmark(folder: str | Path) -> None:
    """Drop a temporary's marker once it is in place under its real name (the marker names the temporary, so even a
    left-over one never makes the folder look temporary)."""
    (Path(folder) / TEMP_MARKER).unlink(missing_ok=True)


def is_temporary(path: str | Path) -> bool:
    """Whether ``path`` is a temporary folder the library made (:func:`temp_dir`): a real folder (not a link) named
    with :data:`TMP_PREFIX` holding a :data:`TEMP_MARKER` that names it."""
    return _marked(Path(path), TEMP_MARKER) and Path(path).name.startswith(TMP_PREFIX)


def orphaned(path: str | Path) -> bool:
    """Whether ``path`` is a temporary folder the library made (:func:`is_temporary`) whose maker, the process its
    marker names, no longer runs on this machine: what a process killed before it could remove its folder left."""
    path = Path(path)
    if not is_temporary(path):
        return False
    try:
        pid = int(json.loads((path / TEMP_MARKER).read_text(encoding="utf-8"))["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return False  # no pid recorded: nothing proves its maker is gone
    if pid <= 0:  # os.kill would signal a process group
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's process: running
        return False
    return False


def _marked(path: Path, marker: str) -> bool:
    """``path`` is a real folder holding the file ``marker`` (not a link) whose recorded name is the folder's own."""
    m = path / marker
    try:
        if path.is_symlink() or not path.is_dir() or m.is_symlink() or not m.is_file():
            return False
        return json.loads(m.read_text(encoding="utf-8")).get("name") == path.name
    except (OSError, ValueError, AttributeError):
        return False


def atomic_write(path: Path, write: Callable[[Path], Any]) -> None:
    """The one atomic file write: ``write(tmp)`` fills a file of the same name in a marked temporary folder beside
    ``path`` (:func:`temp_dir`; same suffix, so writers such as ``np.savez`` keep the name), which is flushed to disk
    and moved into place with ``os.replace``. Readers never see half a file, and a crash leaves the old file or none
    (and a temporary folder that :func:`clean` recognises)."""
    path = Path(path)
    with temporary_dir(path.parent, f"{path.stem[:40]}-") as d:
        tmp = d / path.name
        tmp.touch()
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)


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
        self.root = Path(results_dir)
        self.params = params
        self.key = cache_key({"analysis": analysis, "model": model, **params})
        self.dir = self.root / analysis / slug(model) / self.key
        item_key = self.key if item_params is None else cache_key({"analysis": analysis, "model": model, **item_params})
        self.partial = self.dir.with_name(item_key + ".partial")
        self._kept_partial: Path | None = None  # the shared checkpoints while recomputing (begin_recompute)
        self.unit_seconds: list[float | None] = []  # per unit of this execution: its compute seconds (None: unknown)
        self.unit_cpu_seconds: list[float | None] = []  # … and its CPU seconds (None: computed before they were kept)
        self.items_read = 0  # checkpoints this execution read: none, and it computed the whole run
        if self.dir.parent.is_dir():  # a swap of this run that a killed process left half done: complete it
            for journal in sorted(self.dir.parent.glob(f"{SWAP_PREFIX}{self.key}-*.json")):
                finish_swap(journal)

    @property
    def complete(self) -> bool:
        """Both files of a finished run exist (not yet verified: see :meth:`load_verified`)."""
        return (self.dir / "meta.json").exists() and (self.dir / "table.csv").exists()

    def load(self) -> RunResult:
        meta = json.loads((self.dir / "meta.json").read_text())
        units = pd.read_csv(self.dir / "units.csv") if (self.dir / "units.csv").exists() else None
        return RunResult(pd.read_csv(self.dir / "table.csv"), meta, self.dir, from_cache=True, units=units)

    def load_verified(self) -> RunResult | None:
        """The finished run if its files match what its sidecar recorded; None when there is none. A damaged run is
        moved aside (kept for inspection, one line says where) and None is returned, so the caller recomputes it."""
        if not (self.dir / "meta.json").exists():  # a finished run's folder lands whole, sidecar included
            return None
        problem = damage(self.dir)
        if problem is None:
            try:
                return self.load()
            except (OSError, ValueError, pd.errors.ParserError) as e:  # recorded before digests: parse is the check
                problem = f"{type(e).__name__}: {e}"
        aside = quarantine(self.dir)
        print(f"lmdepth: the finished run {self.dir} is damaged ({problem}); moved aside to {aside.name} and "
              "computing it again", file=sys.stderr, flush=True)
        return None

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
                item = {k: z[k] for k in z.files}
            self.items_read += 1
            return item
        except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as e:
            print(f"lmdepth: discarding the unreadable checkpoint {p} ({type(e).__name__}); recomputing it",
                  file=sys.stderr, flush=True)
            p.unlink(missing_ok=True)
            return None

    def save_item(self, item: str, arrays: dict[str, np.ndarray]) -> None:
        mark_root(self.root)
        _checkpoint_dir(self.partial)
        atomic_write(self._item_path(item), lambda tmp: np.savez(tmp, **arrays))

    # ---- recomputing without destroying -------------------------------------------------------------------
    def begin_recompute(self) -> None:
        """``use_cache=False``: read no checkpoint and write new ones into a temporary folder, so that until
        :meth:`finalize` replaces it the previous finished run and its checkpoints stay exactly as they were."""
        mark_root(self.root)
        self._kept_partial = self.partial
        self.partial = temp_dir(self.dir.parent, f"{self.key}-recompute-")

    def end_recompute(self, finished: bool) -> None:
        """After :meth:`begin_recompute`: a finished run's new checkpoints replace the old ones of the same units
        (the others, e.g. of a larger sample, are kept); an unfinished one's are dropped."""
        if self._kept_partial is None:
            return
        fresh, self.partial, self._kept_partial = self.partial, self._kept_partial, None
        new = sorted(fresh.glob("*.npz"))
        if finished and new:  # a run without units (the tuned lens) leaves no empty checkpoint folder
            _checkpoint_dir(self.partial)
            for f in new:
                os.replace(f, self.partial / f.name)
        shutil.rmtree(fresh, ignore_errors=True)

    # ---- finishing ------------------------------------------------------------------------------------
    def finalize(self, table: pd.DataFrame, meta: dict[str, Any], units: pd.DataFrame | None = None,
                 replace: bool = False, artifacts: dict[str, bytes] | None = None) -> RunResult:
        """Write table, per-unit table (if any), artifacts (if any) and sidecar into a temporary directory, then move
        it into place in one step.

        The sidecar records each file's sha256 and row count (``meta["files"]``), which :meth:`load_verified` checks.
        ``artifacts`` are files a run keeps beside its tables that stored results may omit (large and regenerable:
        the tuned lens's translators); the sidecar records their digests apart (``meta["artifacts"]``), checked when
        one is read (:func:`read_artifact`), never required. Two processes finishing the same run (same parameters,
        so the same numbers) is safe: the first one to land stays and the other discards its copy. ``replace=True``
        (a recomputation) swaps a finished run for the new one instead.
        """
        mark_root(self.root)
        tmp = temp_dir(self.dir.parent, f"{self.key}-")
        files = {"table.csv": table.to_csv(index=False)}
        if units is not None:
            files["units.csv"] = units.to_csv(index=False)
        artifacts = artifacts or {}
        meta = {**meta, "cache_key": self.key, "compute_version": COMPUTE_VERSION,
                # the checkpoint folder this run's units came from: `clean` keeps the folders a finished run uses
                "checkpoints": (self._kept_partial or self.partial).name,
                "files": {name: _file_record(text.encode("utf-8")) for name, text in files.items()},
                **({"artifacts": {name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
                                  for name, data in artifacts.items()}} if artifacts else {})}
        meta = json.loads(json.dumps(meta, default=str))  # as it will be read back, so the digest is of that
        meta[META_DIGEST] = meta_digest(meta)
        try:
            for name, text in files.items():
                _write_synced(tmp / name, text)
            for name, data in artifacts.items():
                _write_synced(tmp / name, data)
            _write_synced(tmp / "meta.json", json.dumps(meta, indent=2))
            os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp creates 0700: give the result ordinary permissions
            while True:
                try:
                    os.replace(tmp, self.dir)  # the one step, when nothing stands at the run's name
                    unmark(self.dir)
                    break
                except FileNotFoundError:
                    raise
                except OSError:  # the target exists and is not empty
                    if self.complete and not replace:  # another process finished the same run first: keep theirs
                        shutil.rmtree(tmp, ignore_errors=True)
                        break
                    if not self.dir.exists():  # it went away in between: try the one step again
                        continue
                    # an incomplete leftover, or the run being recomputed: swap it for the new one, journaled
                    self._swap(tmp)
                    break
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return RunResult(table, meta, self.dir, units=units)

    def _swap(self, new: Path) -> None:
        """Replace what stands at the run's name by the finished folder ``new``: a journal naming both is written
        first, then :func:`finish_swap` does the two renames, so a kill at any step is completed by the next
        :class:`RunStore` of this run (or by the next call here)."""
        stamp = f"{self.key}-{os.getpid()}-{time.monotonic_ns()}"
        journal = self.dir.parent / f"{SWAP_PREFIX}{stamp}.json"
        atomic_write_text(journal, json.dumps({"run": self.dir.name, "new": new.name,
                                               "old": f"{TMP_PREFIX}{stamp}-replaced"}) + "\n")
        try:
            finish_swap(journal)
        except BaseException:  # an interrupt between the renames: complete the swap (the new run is whole) first
            with suppress(Exception):
                finish_swap(journal)
            raise


def finish_swap(journal: str | Path) -> None:
    """Complete the swap a journal records (:meth:`RunStore._swap`): the whole new run goes to the run's name, the
    old one is removed, then the journal. Every step may be repeated, so a swap killed at any point is completed by
    calling this again; a new run that is not whole (it was damaged after it was written) is dropped and the old
    one put back instead. Nothing is ever left without a whole run under its name, except while one rename runs."""
    journal = Path(journal)
    try:
        rec = json.loads(journal.read_text(encoding="utf-8"))
        run, new, old = (journal.parent / Path(rec[k]).name for k in ("run", "new", "old"))
    except FileNotFoundError:
        return  # another process completed it
    except (OSError, ValueError, KeyError, TypeError) as e:  # written atomically: this is not a cut journal
        print(f"lmdepth: cannot read the swap journal {journal} ({type(e).__name__}); left as it is",
              file=sys.stderr, flush=True)
        return
    for _ in range(3):  # another process may take a step at the same time: look again
        try:
            if new.is_dir() and damage(new) is None:
                if run.exists() and not old.exists():
                    os.rename(run, old)
                try:
                    os.rename(new, run)
                except OSError:
                    if not run.is_dir():
                        raise
                    # another process's copy of the run landed in the emptied name first: it stays, ours goes
                else:
                    unmark(run)
            elif not run.exists() and old.is_dir():
                os.rename(old, run)
            break
        except FileNotFoundError:
            continue
    if run.is_dir():
        unmark(run)  # a kill right after the rename leaves the temporary's marker in the run: harmless, but not its own
        for leftover in (old, new):
            shutil.rmtree(leftover, ignore_errors=True)
        journal.unlink(missing_ok=True)


def swap_journaled(folder: str | Path) -> set[str]:
    """The names that swap journals in ``folder`` are about (the run, its old and its new copy): :func:`clean` keeps
    them (the next :class:`RunStore` of that run completes the swap)."""
    out = set()
    for journal in Path(folder).glob(f"{SWAP_PREFIX}*.json"):
        out.add(journal.name)
        try:
            rec = json.loads(journal.read_text(encoding="utf-8"))
            out |= {Path(str(rec[k])).name for k in ("run", "new", "old") if k in rec}
        except (OSError, ValueError, TypeError):
            out.add("*")  # unreadable: it could name anything here, so nothing here is removed
    return out


def _checkpoint_dir(path: Path) -> None:
    """Create a per-unit checkpoint folder, marked as the library's own (:data:`CHECKPOINT_MARKER`); an existing
    folder is left as it is (the stored results' folders stay unmarked: `clean` never removes them)."""
    try:
        path.mkdir(parents=True)
    except FileExistsError:
        return
    atomic_write_text(path / CHECKPOINT_MARKER, json.dumps({"lmdepth": "checkpoints", "name": path.name}) + "\n")


def meta_digest(meta: dict[str, Any]) -> str:
    """sha256 of a sidecar's content apart from its own digest (:data:`META_DIGEST`): canonical JSON, so reading and
    writing it again gives the same digest."""
    body = {k: v for k, v in meta.items() if k != META_DIGEST}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _file_record(data: bytes) -> dict[str, Any]:
    """What a sidecar records of one of its run's files: sha256 and data rows (lines after the header)."""
    return {"sha256": hashlib.sha256(data).hexdigest(), "rows": max(data.count(b"\n") - 1, 0)}


def damage(run_dir: str | Path) -> str | None:
    """What is wrong with a finished run's files, or None when they match what its sidecar recorded.

    A run finished before the sidecar recorded digests (no ``files``) is checked by :meth:`RunStore.load`'s parse."""
    run_dir = Path(run_dir)
    try:
        meta = json.loads((run_dir / "meta.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return "meta.json is missing"
    except (OSError, ValueError) as e:
        return f"meta.json cannot be read: {type(e).__name__}"
    if not isinstance(meta, dict):
        return "meta.json is not a JSON object"
    if META_DIGEST in meta and meta_digest(meta) != meta[META_DIGEST]:  # sidecars written before it have none
        return "meta.json was changed after the run was written (its digest does not match)"
    if not (run_dir / "table.csv").exists():
        return "table.csv is missing"
    for name, want in (meta.get("files") or {}).items():
        try:
            data = (run_dir / name).read_bytes()
        except OSError:
            return f"{name} is missing"
        got = _file_record(data)
        if got["sha256"] != want.get("sha256"):
            return (f"{name} has {got['rows']} rows and {len(data)} bytes, not the {want.get('rows')} rows it was "
                    "written with")
    return None


def quarantine(run_dir: str | Path) -> Path:
    """Move a damaged finished run aside as ``<key>.damaged-<UTC time>`` (not a temporary: :func:`clean` keeps it)."""
    run_dir = Path(run_dir)
    aside = run_dir.with_name(f"{run_dir.name}.damaged-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-"
                              f"{time.monotonic_ns() % 10**6}")
    os.rename(run_dir, aside)
    return aside


def mark_root(root: str | Path) -> None:
    """Mark ``root`` as a results root (once), so that :func:`clean` may clean it."""
    marker = Path(root) / ROOT_MARKER
    if not marker.exists():
        atomic_write_text(marker, json.dumps({"lmdepth": "results root", "written_by": "lmdepth.results",
                                              "clean": "removes only marked temporaries and unused marked checkpoints"},
                                             indent=1)
                          + "\n")


def _write_synced(path: Path, content: str | bytes) -> None:
    with (open(path, "wb") if isinstance(content, bytes) else open(path, "w", encoding="utf-8")) as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())


def read_artifact(result: RunResult, name: str) -> bytes | None:
    """An artifact a finished run kept beside its tables (:meth:`RunStore.finalize`): its bytes, or None when the
    run keeps none of that name (stored results omit them) or it no longer matches the digest its sidecar recorded
    (one line says so). A run finished before artifacts were recorded is read as it is."""
    path = Path(result.path) / name
    try:
        data = path.read_bytes()
    except OSError:
        return None
    want = (result.meta.get("artifacts") or {}).get(name)
    if want is not None and hashlib.sha256(data).hexdigest() != want.get("sha256"):
        print(f"lmdepth: {path} has {len(data)} bytes, not the {want.get('bytes')} it was written with; not used",
              file=sys.stderr, flush=True)
        return None
    return data


#: Set by the book build while it executes a chapter: the directory where that chapter's runs and claims are
#: recorded (``<results>/book/<profile>/<chapter>/``). The summary pages read only what is recorded there, so an
#: ad-hoc run, whatever its parameters, never reaches the published findings.
BOOK_RECORD_ENV = "LMDEPTH_BOOK_RECORD"
#: The file of a chapter's book record that lists the runs the chapter read (:func:`record_run`), one JSON a line.
RECORD_RUNS = "runs.jsonl"
#: Set by ``lmdepth run`` for the chapter's kernel: a digest of the chapter, model and parameters, which names the
#: run's executed notebook and verdict files (:func:`run_id`).
RUN_ID_ENV = "LMDEPTH_RUN_ID"
_USED_KEYS: list[str] = []  # cache keys of the runs this process used (served or computed)


def run_id(fallback: bytes = b"") -> str:
    """The name of an ad-hoc run's own records, so that a run with other settings does not overwrite them:
    ``$LMDEPTH_RUN_ID`` (set by ``lmdepth run``), else a digest of the runs this process used, else of
    ``fallback`` (e.g. the records' own content)."""
    if os.environ.get(RUN_ID_ENV):
        return os.environ[RUN_ID_ENV]
    blob = "\n".join(sorted(set(_USED_KEYS))).encode() or fallback
    return hashlib.sha256(blob).hexdigest()[:10]


def book_record_dir() -> Path | None:
    """The record directory of the chapter the book build is executing, or None outside a book build."""
    d = os.environ.get(BOOK_RECORD_ENV)
    return Path(d) if d else None


def record_run(result: RunResult) -> None:
    """Note a run (computed or served from the cache) in the book record of the chapter being built, if any."""
    _USED_KEYS.append(str(result.meta.get("cache_key")))
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
    with open(d / RECORD_RUNS, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def recorded_runs(record_root: str | Path, chapter: str = "*") -> set[Path]:
    """Every run recorded under a profile's book record (``<results>/book/<profile>``), or one chapter's."""
    out = set()
    root = Path(record_root).resolve().parents[1]  # <results>/book/<profile> → <results>
    for f in Path(record_root).glob(f"{chapter}/{RECORD_RUNS}"):
        out |= {(root / json.loads(line)["path"]).resolve()  # relative paths; older records hold absolute ones
                for line in f.read_text(encoding="utf-8").splitlines() if line.strip()}
    return out


@dataclass(frozen=True)
class RecordedCost:
    """What a finished run's sidecar says it cost (written by :func:`lmdepth.analyses.run.execute`).

    Attributes:
        units: the run's units (problems, items); NaN for a run older than the units' timing.
        timed: how many of them have their compute seconds.
        seconds: those units' compute seconds, whether computed in the finishing execution or read from their
            checkpoints.
        wall_s: the wall time of the execution that finished the run (NaN where not recorded).
        cpu_timed, cpu_seconds: how many units have their CPU seconds (every thread of the process), and those
            seconds (runs computed before CPU time was kept have none).
        whole_cpu_s: for a run without per-unit timings (no ``unit_compute_s``), the CPU seconds of the execution that finished it when that
            execution read no checkpoint (so computed the whole run); NaN otherwise.
    """

    units: float
    timed: int
    seconds: float
    wall_s: float
    cpu_timed: int = 0
    cpu_seconds: float = 0.0
    whole_cpu_s: float = float("nan")

    @classmethod
    def read(cls, run_dir: str | Path) -> RecordedCost | None:
        """The cost recorded in ``run_dir``'s sidecar, or None when the run has no sidecar."""
        meta_path = Path(run_dir) / "meta.json"
        if not meta_path.exists():
            return None
        meta = json.loads(meta_path.read_text())
        cost = meta.get("unit_compute_s") or {}
        return cls(units=float(cost.get("units", float("nan"))), timed=int(cost.get("timed", 0)),
                   seconds=float(cost.get("total", 0.0)), wall_s=float(meta.get("wall_time_s", float("nan"))),
                   cpu_timed=int(cost.get("cpu_timed", 0)), cpu_seconds=float(cost.get("cpu_total", 0.0)),
                   whole_cpu_s=float(meta["cpu_time_s"]) if meta.get("resumed_items") == 0 else float("nan"))


def check_recorded(record_root: str | Path, chapters: Iterable[str] | None = None) -> None:
    """Stop, in one line, when a run the book recorded (for ``chapters``, default all) is missing or damaged: the
    pages that read it would otherwise publish fewer rows, or numbers from a cut file.

    Raises:
        DataError: naming the first such run, its chapter, what is wrong and the commands that restore it.
    """
    record_root = Path(record_root)
    results = record_root.resolve().parents[1]
    bad = []
    for f in sorted(record_root.glob(f"*/{RECORD_RUNS}")):
        chapter = f.parent.name
        if chapters is not None and chapter not in chapters:
            continue
        for run in sorted(recorded_runs(record_root, chapter)):
            problem = "missing" if not run.is_dir() else damage(run)
            if problem:
                bad.append((chapter, run, problem if problem == "missing" else f"damaged ({problem})"))
    if bad:
        chapter, run, problem = bad[0]
        rel = os.path.relpath(run, results.parent) if run.is_relative_to(results.parent) else str(run)
        more = f" ({len(bad) - 1} more recorded run(s) too)" if len(bad) > 1 else ""
        raise DataError(f"The book's recorded run {rel} (chapter {chapter}) is {problem}{more}: restore it with "
                        f"`git checkout -- {rel}` if it is committed, or recompute it with "
                        f"`lmdepth book --force --chapters {chapter}`.")


def is_results_root(path: str | Path) -> bool:
    """Whether ``path`` was marked a results root by :func:`mark_root` (so :func:`clean` may clean it)."""
    return (Path(path) / ROOT_MARKER).is_file()


def clean(results_dir: str | Path, partial_days: float | None = 7.0, temp_hours: float = 1.0,
          dry_run: bool = False) -> list[Path]:
    """Remove what interrupted runs left behind under a results root, and only what can be proven to be the
    library's own and not part of the record:

    * temporary folders the library made (:func:`is_temporary`: named with :data:`TMP_PREFIX` *and* holding the
      marker that names them) untouched for ``temp_hours`` (a running process may still be writing a younger one);
    * per-unit checkpoint folders that the library created (they hold :data:`CHECKPOINT_MARKER`), that no finished
      run beside them uses (each records its folder, ``meta["checkpoints"]``; where one does not, all are kept) and
      that are untouched for ``partial_days`` (None: never).

    Never a path git tracks, or a folder holding one (git is asked when ``results_dir`` is inside a work tree; where it
    cannot be asked there, nothing is removed), never a finished run, a damaged run moved aside or what a swap journal
    names, never a folder by its name or age alone; no hidden folder is entered. ``dry_run``: only list them.

    Returns:
        What was (or would be) removed.

    Raises:
        ParameterError: ``results_dir`` is not a results root (it has no :data:`ROOT_MARKER`).
    """
    root = Path(results_dir)
    if not is_results_root(root):
        raise ParameterError(
            f"{root} is not an lmdepth results root (it has no {ROOT_MARKER}, which the first run saved there writes), "
            "so `clean` removes nothing there. Give the --results-dir your runs were saved to.")
    tracked = git_tracked(root)
    if tracked is None:
        print(f"lmdepth: {root} is inside a git work tree but git cannot be asked which files are committed there, so "
              "`clean` removes nothing; run it where `git ls-files` works.", file=sys.stderr, flush=True)
        return []
    now, found = time.time(), []
    for dirpath, dirnames, _ in os.walk(root):  # symlinks are not followed
        here = Path(dirpath)
        journaled = swap_journaled(here)
        used: set[str] | None = None if "*" in journaled else _used_checkpoints(here)
        for name in sorted(dirnames):
            p = here / name
            if name in journaled or p.relative_to(root).as_posix() in tracked:
                continue
            try:
                age = now - p.lstat().st_mtime
            except FileNotFoundError:
                continue
            if is_temporary(p):
                if age > temp_hours * 3600:
                    found.append(p)
            elif (partial_days is not None and used is not None and _PARTIAL.match(name) and name not in used
                  and _marked(p, CHECKPOINT_MARKER) and age > partial_days * 86400):
                found.append(p)
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and here / d not in found]
    for p in found if not dry_run else []:
        shutil.rmtree(p, ignore_errors=True)
    return found


def _used_checkpoints(folder: Path) -> set[str] | None:
    """The checkpoint folders that the finished runs in ``folder`` (one model's runs of one analysis) record; None
    when a finished run there records none (written before runs recorded it) or cannot be read: all are kept then."""
    used = set()
    for meta in folder.glob("*/meta.json"):
        try:
            rec = json.loads(meta.read_text(encoding="utf-8"))
            used.add(str(rec["checkpoints"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None
    return used


def git_tracked(folder: str | Path) -> set[str] | None:
    """The paths under ``folder`` (relative, with ``/``) that git tracks, and every folder holding one; an empty set
    outside a git work tree; None when ``folder`` is inside one (a ``.git`` above it) but git cannot be asked (not
    installed, or it refuses the repository)."""
    folder = Path(folder).resolve()
    try:
        out = subprocess.run(["git", "-C", str(folder), "ls-files", "-z"], capture_output=True, timeout=120)
        ok = out.returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    if not ok:
        in_tree = any((q / ".git").exists() for q in (folder, *folder.parents))
        return None if in_tree else set()
    tracked: set[str] = set()
    for rel in out.stdout.decode("utf-8", "surrogateescape").split("\0"):
        parts = rel.split("/") if rel else []
        tracked |= {"/".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return tracked


def discard(path: str | Path) -> bool:
    """Remove a file the library wrote and no longer needs (a finished run's resume checkpoint) — unless git tracks
    it or cannot be asked: a checkpoint committed to carry a run across sessions is the repository's, and only its
    owner removes it (``git rm``). True when the file was removed."""
    path = Path(path)
    tracked = git_tracked(path.parent)
    if tracked is None or path.name in tracked:
        return False
    path.unlink(missing_ok=True)
    return True
