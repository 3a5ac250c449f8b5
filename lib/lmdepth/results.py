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

* every temporary name the library writes starts with :data:`TMP_PREFIX`, and a results root carries the file
  :data:`ROOT_MARKER`; :func:`clean` removes only such temporaries (and old ``<key>.partial`` checkpoints) inside a
  marked root, so a ``.git``, ``.venv`` or ``.env`` can never match;
* the sidecar records each file's sha256 and row count (``meta["files"]``); a finished run is served only when its
  files still match (:meth:`RunStore.load_verified`), otherwise it is moved aside as ``<key>.damaged-<time>`` (kept
  for inspection) and recomputed;
* ``use_cache=False`` computes into a temporary checkpoint folder and replaces the finished run only when the new
  one is complete (:meth:`RunStore.begin_recompute`), so an interrupt leaves the previous run as it was.
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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lmdepth import COMPUTE_VERSION
from lmdepth.errors import DataError, ParameterError

#: Every temporary file or folder the library writes starts with this; :func:`clean` removes nothing else.
TMP_PREFIX = ".lmdepth-tmp-"
#: The file that marks a directory as a results root (written by the first run saved there).
ROOT_MARKER = "lmdepth-results.json"
#: Temporaries of versions before :data:`TMP_PREFIX`: ``.<key>-XXXXXXXX`` run folders and their ``-stale-`` copies,
#: ``.<item>-XXXXXXXX.npz`` checkpoints (``<key>`` and ``<item>``: 16 hex digits).
_LEGACY_TMP = re.compile(r"^\.[0-9a-f]{16}-(?:stale-\d+-\d+|[a-z0-9_]{8}(?:\.npz)?)$")
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


def atomic_write(path: Path, write: Callable[[Path], Any]) -> None:
    """The one atomic file write: ``write(tmp)`` fills a temporary file beside ``path`` (same suffix, so writers
    such as ``np.savez`` keep the name), which is flushed to disk and moved into place with ``os.replace``.
    Readers never see half a file, and a crash leaves the old file or none."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f"{TMP_PREFIX}{path.stem}-", suffix=path.suffix)
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
        self.root = Path(results_dir)
        self.params = params
        self.key = cache_key({"analysis": analysis, "model": model, **params})
        self.dir = self.root / analysis / slug(model) / self.key
        item_key = self.key if item_params is None else cache_key({"analysis": analysis, "model": model, **item_params})
        self.partial = self.dir.with_name(item_key + ".partial")
        self._kept_partial: Path | None = None  # the shared checkpoints while recomputing (begin_recompute)
        self.unit_seconds: list[float | None] = []  # per unit of this execution: its compute seconds (None: unknown)

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
                return {k: z[k] for k in z.files}
        except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as e:
            print(f"lmdepth: discarding the unreadable checkpoint {p} ({type(e).__name__}); recomputing it",
                  file=sys.stderr, flush=True)
            p.unlink(missing_ok=True)
            return None

    def save_item(self, item: str, arrays: dict[str, np.ndarray]) -> None:
        mark_root(self.root)
        atomic_write(self._item_path(item), lambda tmp: np.savez(tmp, **arrays))

    # ---- recomputing without destroying -------------------------------------------------------------------
    def begin_recompute(self) -> None:
        """``use_cache=False``: read no checkpoint and write new ones into a temporary folder, so that until
        :meth:`finalize` replaces it the previous finished run and its checkpoints stay exactly as they were."""
        mark_root(self.root)
        self.dir.parent.mkdir(parents=True, exist_ok=True)
        self._kept_partial = self.partial
        self.partial = Path(tempfile.mkdtemp(dir=self.dir.parent, prefix=f"{TMP_PREFIX}{self.key}-recompute-"))

    def end_recompute(self, finished: bool) -> None:
        """After :meth:`begin_recompute`: a finished run's new checkpoints replace the old ones of the same units
        (the others, e.g. of a larger sample, are kept); an unfinished one's are dropped."""
        if self._kept_partial is None:
            return
        fresh, self.partial, self._kept_partial = self.partial, self._kept_partial, None
        new = sorted(fresh.glob("*.npz"))
        if finished and new:  # a run without units (the tuned lens) leaves no empty checkpoint folder
            self.partial.mkdir(parents=True, exist_ok=True)
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
        self.dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=self.dir.parent, prefix=f"{TMP_PREFIX}{self.key}-"))
        files = {"table.csv": table.to_csv(index=False)}
        if units is not None:
            files["units.csv"] = units.to_csv(index=False)
        artifacts = artifacts or {}
        meta = {**meta, "cache_key": self.key, "compute_version": COMPUTE_VERSION,
                "files": {name: _file_record(text.encode("utf-8")) for name, text in files.items()},
                **({"artifacts": {name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
                                  for name, data in artifacts.items()}} if artifacts else {})}
        asides: list[Path] = []  # what stood at self.dir: removed only once the new run is in place
        try:
            for name, text in files.items():
                _write_synced(tmp / name, text)
            for name, data in artifacts.items():
                _write_synced(tmp / name, data)
            _write_synced(tmp / "meta.json", json.dumps(meta, indent=2, default=str))
            os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp creates 0700: give the result ordinary permissions
            while True:
                try:
                    os.replace(tmp, self.dir)
                    break
                except OSError:  # the target exists and is not empty
                    if self.complete and not replace:  # another process finished the same run first: keep theirs
                        shutil.rmtree(tmp, ignore_errors=True)
                        break
                    # an incomplete leftover, or the run being recomputed: move it aside, then retry
                    aside = self.dir.with_name(f"{TMP_PREFIX}{self.key}-replaced-{os.getpid()}-{time.monotonic_ns()}")
                    try:
                        os.rename(self.dir, aside)
                    except FileNotFoundError:
                        continue
                    asides.append(aside)
                    replace = False  # once: a run that lands between the two renames is this same run
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            if asides and not self.dir.exists():  # interrupted between the two renames: put the old run back
                os.rename(asides.pop(), self.dir)
            raise
        finally:
            for aside in asides:
                shutil.rmtree(aside, ignore_errors=True)
        return RunResult(table, meta, self.dir, units=units)


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
                                              "clean": "removes only .lmdepth-tmp-* and old <key>.partial"}, indent=1)
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


@dataclass(frozen=True)
class RecordedCost:
    """What a finished run's sidecar says it cost (written by :class:`lmdepth.analyses.run.Job`).

    Attributes:
        units: the run's units (problems, items); NaN for a run older than the units' timing.
        timed: how many of them have their compute seconds.
        seconds: those units' compute seconds, whether computed in the finishing execution or read from their
            checkpoints.
        wall_s: the wall time of the execution that finished the run (NaN where not recorded).
    """

    units: float
    timed: int
    seconds: float
    wall_s: float

    @classmethod
    def read(cls, run_dir: str | Path) -> RecordedCost | None:
        """The cost recorded in ``run_dir``'s sidecar, or None when the run has no sidecar."""
        meta_path = Path(run_dir) / "meta.json"
        if not meta_path.exists():
            return None
        meta = json.loads(meta_path.read_text())
        cost = meta.get("unit_compute_s") or {}
        return cls(units=float(cost.get("units", float("nan"))), timed=int(cost.get("timed", 0)),
                   seconds=float(cost.get("total", 0.0)), wall_s=float(meta.get("wall_time_s", float("nan"))))


def check_recorded(record_root: str | Path, chapters: Iterable[str] | None = None) -> None:
    """Stop, in one line, when a run the book recorded (for ``chapters``, default all) is missing or damaged: the
    pages that read it would otherwise publish fewer rows, or numbers from a cut file.

    Raises:
        DataError: naming the first such run, its chapter, what is wrong and the commands that restore it.
    """
    record_root = Path(record_root)
    results = record_root.resolve().parents[1]
    bad = []
    for f in sorted(record_root.glob("*/runs.jsonl")):
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


def clean(results_dir: str | Path, partial_days: float = 7.0, temp_hours: float = 1.0,
          dry_run: bool = False) -> list[Path]:
    """Remove what interrupted runs left behind under a results root: the library's own temporaries
    (:data:`TMP_PREFIX`, and the older ``.<key>-XXXXXXXX`` names) older than ``temp_hours``, and per-unit
    checkpoint folders (``<key>.partial``) not touched for ``partial_days``. Nothing else is touched: not finished
    runs, not damaged runs moved aside, not any other file or folder (``.git``, ``.venv``, ``.env`` …), and no hidden
    folder is entered. ``dry_run``: only list them. Returns what was (or would be) removed.

    Raises:
        ParameterError: ``results_dir`` is not a results root (it has no :data:`ROOT_MARKER`).
    """
    root = Path(results_dir)
    if not is_results_root(root):
        raise ParameterError(
            f"{root} is not an lmdepth results root (it has no {ROOT_MARKER}, which the first run saved there writes), "
            "so `clean` removes nothing there. Give the --results-dir your runs were saved to.")
    now, found = time.time(), []
    for dirpath, dirnames, filenames in os.walk(root):  # symlinks are not followed
        here = Path(dirpath)
        for name in sorted(dirnames + filenames):
            p = here / name
            try:
                age = now - p.lstat().st_mtime
            except FileNotFoundError:
                continue
            temp = name.startswith(TMP_PREFIX) or bool(_LEGACY_TMP.match(name))
            old_partial = name in dirnames and bool(_PARTIAL.match(name)) and age > partial_days * 86400
            if (temp and age > temp_hours * 3600) or old_partial:
                found.append(p)
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and here / d not in found]
    for p in found if not dry_run else []:
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
    return found
