"""What a profile costs to compute, per chapter and model, read from the runs a book build recorded.

Every run's sidecar keeps its units' own compute seconds (``unit_compute_s``: total, units, timed — see
:func:`lmdepth.analyses.run.per_unit`), whether the units were computed in that execution or read from their
checkpoints. A unit computed before the timing existed is untimed; the table then says how many are. Every sidecar
also keeps ``wall_time_s``, the wall time of the execution that finished the run: the one cost known for runs
without units (a benchmark) or without unit timings, but only a lower bound for a run resumed from checkpoints.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from lmdepth.results import recorded_runs

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


__all__ = ["cost_table"]
