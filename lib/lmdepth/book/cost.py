"""What a profile costs to compute, per chapter and model, read from the runs a book build recorded.

Every run's sidecar keeps its units' own compute seconds (``unit_compute_s``: total, units, timed — see
:func:`lmdepth.analyses.run.per_unit`), whether the units were computed in that execution or read from their
checkpoints. A unit computed before the timing existed is untimed; the table then says how many are. Every sidecar
also keeps ``wall_time_s``, the wall time of the execution that finished the run: the one cost known for runs
without units (a benchmark) or without unit timings, but only a lower bound for a run resumed from checkpoints.
"""

from __future__ import annotations

import ast
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from lmdepth.errors import LmDepthError
from lmdepth.results import check_recorded, recorded_runs
from lmdepth.runtime import REPO_ROOT

COLUMNS = ["chapter", "model", "runs", "units", "timed units", "s / unit", "profile total (min)", "run wall time (min)"]


def cost_table(results_dir: str | Path, profile: str) -> pd.DataFrame:
    """Per chapter and model of ``profile``'s book record: runs, units (problems, items — each analysis's own
    unit), how many were timed, seconds per timed unit, the profile's total when every unit was timed, and the sum
    of the runs' ``wall_time_s`` (NaN if a sidecar lacks it).

    NaN (the display reads "—") where no unit, or for the total not every unit, was timed: runs of one chapter
    can be different analyses, so untimed units are not extrapolated. Empty when there is no record.
    """
    root = Path(results_dir) / "book" / Path(profile).stem
    rows = []
    for chapter_dir in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        for run in sorted(recorded_runs(root, chapter_dir.name)):
            meta_path = run / "meta.json"
            if not meta_path.exists():
                continue
            meta = json.loads(meta_path.read_text())
            cost = meta.get("unit_compute_s") or {}
            # a run without the record (older than the timing) has unknown units: NaN, not 0
            rows.append({"chapter": chapter_dir.name, "model": run.parent.name, "units": cost.get("units", math.nan),
                         "timed": cost.get("timed", 0), "seconds": cost.get("total", 0.0),
                         "wall": meta.get("wall_time_s", math.nan)})
    if not rows:
        return pd.DataFrame(columns=COLUMNS)
    g = pd.DataFrame(rows).groupby(["chapter", "model"], sort=False).agg(
        runs=("units", "size"), units=("units", lambda u: u.sum(min_count=len(u))), timed=("timed", "sum"),
        seconds=("seconds", "sum"), wall=("wall", lambda w: w.sum(min_count=len(w))))
    per_unit = (g.seconds / g.timed).where(g.timed > 0)
    complete = (g.timed == g.units) & (g.units > 0)
    return pd.DataFrame({"runs": g.runs, "units": g.units.round().astype("Int64"), "timed units": g.timed,
                         "s / unit": per_unit.round(2),
                         "profile total (min)": (g.seconds / 60).where(complete).round(1),
                         "run wall time (min)": (g.wall / 60).round(1)}).reset_index()[COLUMNS]


#: Parameters that do not select which runs a chapter computes: the profile's label, where results and pages are
#: read and written, the device.
NOT_RUN_SETTINGS = frozenset({"profile", "results_dir", "book_dir", "device"})
#: A recomputation estimated at least this long (minutes) is announced before it starts.
NOTICE_MINUTES = 3.0


def stored_difference(chapter: str, params: Mapping[str, Any], profile: str = "default") -> dict[str, tuple]:
    """The chapter's parameters whose value in ``params`` differs from ``profile``'s (the notebook's default where
    the profile does not set it), as name → (given, profile's), leaving out :data:`NOT_RUN_SETTINGS`."""
    from lmdepth.book.chapters import declared_parameters, profile_params

    declared = declared_parameters(chapter)
    stored = {name: ast.literal_eval(spec.default) for name, spec in declared.items()}
    stored |= profile_params(profile, chapter)
    return {name: (params[name], stored.get(name)) for name in declared
            if name not in NOT_RUN_SETTINGS and name in params and params[name] != stored.get(name)}


def chapter_minutes(chapter: str, results_dirs: list[str | Path], profile: str = "default") -> tuple[float, Path] | None:
    """Compute minutes of ``chapter`` at ``profile`` from the first of ``results_dirs`` whose book record times it:
    per model, the profile's total where every unit was timed, else the runs' wall time (a lower bound for resumed
    runs); with the results folder it came from. None where no record has the chapter."""
    for root in results_dirs:
        table = cost_table(root, profile)
        rows = table[table.chapter == chapter]
        if len(rows):
            per_model = rows["profile total (min)"].astype(float).fillna(rows["run wall time (min)"].astype(float))
            return float(per_model.sum()), Path(root)
    return None


def cost_notice(chapter: str, params: Mapping[str, Any], results_dir: str | Path = "results",
                profile: str = "default") -> str | None:
    """What a chapter prints before it computes for more than :data:`NOTICE_MINUTES`: the estimated cost and how to
    run a smaller profile; None when it reads ``profile``'s stored runs or the computation is short.

    The chapter reads stored runs when its parameters are ``profile``'s (:func:`stored_difference`) and the book's
    record of the chapter's runs under ``results_dir`` is present and intact. Otherwise the estimate is the
    chapter's compute time at ``profile`` (:func:`chapter_minutes`, from ``results_dir`` or the repository's
    ``results/``): the runs' own timings, not a prediction for other sizes or hardware.
    """
    differ = stored_difference(chapter, params, profile)
    record = Path(results_dir) / "book" / Path(profile).stem / chapter
    if not differ:
        if (record / "runs.jsonl").is_file():
            try:
                check_recorded(record.parent, [chapter])
                return None  # the stored runs are read
            except LmDepthError:
                pass
        why = f"the {profile} profile's runs of this chapter are not stored (intact) under {results_dir}"
    else:
        shown = ", ".join(f"{k}={v!r} (stored: {w!r})" for k, (v, w) in list(differ.items())[:4])
        why = f"these parameters differ from the {profile} profile's stored runs: {shown}"
    found = chapter_minutes(chapter, [results_dir, REPO_ROOT / "results"], profile)
    if found is not None and found[0] < NOTICE_MINUTES:
        return None
    cost = ("its cost is unknown here (no timed record of this chapter)" if found is None else
            f"at the {profile} profile its runs took {found[0]:.0f} min to compute (their own timings, recorded in "
            f"{found[1]}; the Reproducibility page's cost table), and larger samples take longer")
    from lmdepth.book.chapters import profile_params

    quick = {k: v for k, v in profile_params("quick", chapter).items() if k != "profile"}
    smaller = ("" if all(params.get(k) == v for k, v in quick.items()) else
               f" For a smaller run, set the quick profile's parameters "
               f"({', '.join(f'{k}={v!r}' for k, v in quick.items())}) or run `lmdepth run {chapter} --profile quick`.")
    return (f"lmdepth: this chapter computes what is not stored: {why}. Estimated cost: {cost}.{smaller} "
            "Finished units are checkpointed: an interrupted run resumes.")


def announce_cost(chapter: str, params: Mapping[str, Any], profile: str = "default") -> None:
    """Print :func:`cost_notice` (if any) for a chapter's parameters, read from its namespace (``globals()``).
    Silent inside a book build (``LMDEPTH_BOOK_BUILD=1``), which reports each page's time itself."""
    if os.environ.get("LMDEPTH_BOOK_BUILD") == "1":
        return
    text = cost_notice(chapter, params, params.get("results_dir", "results"), profile)
    if text:
        print(text, flush=True)


__all__ = ["NOTICE_MINUTES", "announce_cost", "chapter_minutes", "cost_notice", "cost_table", "stored_difference"]
