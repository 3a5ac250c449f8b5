"""Compare the tidy tables of two results directories: the check that a refactor changed no number.

    python scripts/compare_tables.py BASELINE NEW [--atol 1e-6] [--rtol 0]

Every ``table.csv`` under NEW is matched with the BASELINE table of the same analysis, model and parameters (the
``parameters`` of the sidecars; cache keys may differ, e.g. when the key gained a field). Numeric columns must agree
within ``--atol`` + ``--rtol`` × |baseline| (NaN equals NaN; ``--rtol`` for runs recomputed on another machine,
whose fp32 kernels differ: a norm of 19,109 moves by 1.6e-2), every other column exactly, and both tables must have the same rows and columns.
Exit status 1 if any table differs or has no baseline; the report lists each table with its largest difference.

Making the baseline: run the chapters with the old code into BASELINE before the change (e.g. a ``git worktree``
of the old commit, ``PYTHONPATH=<worktree>/lib lmdepth run <chapter> --profile smoke --results-dir BASELINE``),
then with the new code into NEW, and compare.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd


def identity(table: Path, root: Path) -> str:
    """analysis/model plus the run's parameters: what makes two runs the same run."""
    meta = json.loads((table.parent / "meta.json").read_text())
    analysis_model = table.parent.parent.relative_to(root)
    params = {k: v for k, v in meta.get("parameters", {}).items() if k != "remote"}  # where it ran, not what
    return f"{analysis_model}|{json.dumps(params, sort_keys=True, default=str)}"


def compare(base: Path, new: Path, atol: float, rtol: float = 0.0) -> tuple[list[str], list[str]]:
    """(report lines, failures) for every table under ``new``."""
    lines, failures = [], []
    tables = sorted(new.rglob("table.csv"))
    if not tables:
        failures.append(f"no table.csv under {new}")
    baseline = {identity(t, base): t for t in base.rglob("table.csv") if not t.parent.name.startswith(".")}
    for t in tables:
        if t.parent.name.startswith("."):
            continue
        rel = t.relative_to(new)
        b = baseline.get(identity(t, new))
        if b is None:
            failures.append(f"{rel}: no baseline run with these parameters")
            continue
        x, y = pd.read_csv(b), pd.read_csv(t)
        if list(x.columns) != list(y.columns) or len(x) != len(y):
            failures.append(f"{rel}: shape/columns differ {x.shape} {list(x.columns)} vs {y.shape} {list(y.columns)}")
            continue
        worst, outside = 0.0, 0
        for c in x.columns:
            a, n = x[c], y[c]
            if pd.api.types.is_numeric_dtype(a) and pd.api.types.is_numeric_dtype(n):
                av, nv = a.to_numpy(float), n.to_numpy(float)
                same_nan = np.isnan(av) == np.isnan(nv)
                diff = np.where(np.isnan(av) & np.isnan(nv), 0.0, np.abs(av - nv))
                if not same_nan.all():
                    failures.append(f"{rel}: column {c!r} NaN pattern differs")
                worst = max(worst, float(np.nanmax(diff)) if len(diff) else 0.0)
                outside += int((diff > atol + rtol * np.nan_to_num(np.abs(av))).sum())
            elif not a.astype(str).equals(n.astype(str)):
                failures.append(f"{rel}: column {c!r} differs")
        lines.append(f"{rel}: {len(y)} rows, max |diff| {worst:.2e}")
        if outside:
            failures.append(f"{rel}: max |diff| {worst:.2e}, {outside} value(s) beyond {atol:g} + {rtol:g} × |baseline|")
    return lines, failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("baseline", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--atol", type=float, default=1e-6)
    ap.add_argument("--rtol", type=float, default=0.0)
    args = ap.parse_args(argv)
    lines, failures = compare(args.baseline, args.new, args.atol, args.rtol)
    print("\n".join(lines))
    print(f"{len(lines)} tables compared, {len(failures)} problems")
    for f in failures:
        print("  FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
