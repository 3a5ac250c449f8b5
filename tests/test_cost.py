"""The cost table (lmdepth.book.cost) from a hand-made book record and sidecars."""

import json

import pandas as pd
import pytest

from lmdepth.book.cost import COLUMNS, cost_table

pytestmark = pytest.mark.unit


def run(root, analysis, model, key, cost, wall=None):
    d = root / analysis / model / key
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"analysis": analysis, **({"unit_compute_s": cost} if cost else {}),
                                             **({"wall_time_s": wall} if wall is not None else {})}))
    return f"{analysis}/{model}/{key}"


def test_cost_per_chapter_and_model_from_the_recorded_runs(tmp_path):
    record = tmp_path / "book" / "default"
    runs = {"lens": [run(tmp_path, "logit_lens", "m", "a", {"total": 30.0, "units": 20, "timed": 20}, wall=120.0),
                     run(tmp_path, "tuned_lens", "m", "b", {"total": 10.0, "units": 20, "timed": 5}, wall=60.0)],
            "norms": [run(tmp_path, "residual_stream", "m", "c", {"total": 60.0, "units": 20, "timed": 20}),
                      run(tmp_path, "residual_stream", "n", "d", None)]}
    run(tmp_path, "residual_stream", "m", "unrecorded", {"total": 999.0, "units": 1, "timed": 1})  # ad hoc: not read
    for chapter, paths in runs.items():
        (record / chapter).mkdir(parents=True)
        (record / chapter / "runs.jsonl").write_text("".join(json.dumps({"path": p}) + "\n" for p in paths))
    t = cost_table(tmp_path, "default").set_index(["chapter", "model"])
    assert list(t.reset_index().columns) == COLUMNS
    lens = t.loc[("lens", "m")]
    assert (lens.runs, lens.units, lens["timed units"], lens["s / unit"]) == (2, 40, 25, 1.6)
    assert pd.isna(lens["profile total (min)"])  # 15 units untimed: no extrapolation across analyses
    assert lens["run wall time (min)"] == 3.0  # the sidecars' wall times, summed over the runs
    assert t.loc[("norms", "m"), "profile total (min)"] == 1.0 and t.loc[("norms", "m"), "s / unit"] == 3.0
    unknown = t.loc[("norms", "n")]  # no unit_compute_s at all: units, seconds and total unknown, never 0
    assert pd.isna(unknown["s / unit"]) and pd.isna(unknown.units) and pd.isna(unknown["profile total (min)"])
    assert pd.isna(t.loc[("norms", "m"), "run wall time (min)"])  # a sidecar without wall_time_s: unknown, not 0
    assert cost_table(tmp_path, "paper").empty
