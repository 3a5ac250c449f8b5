"""scripts/compare_tables.py: the check that a refactor changed no number."""

import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

pytestmark = pytest.mark.unit
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "compare_tables.py"


def load():
    spec = importlib.util.spec_from_file_location("compare_tables", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write(root: Path, key: str, values: list[float], params: dict) -> None:
    d = root / "residual_stream" / "m" / key
    d.mkdir(parents=True)
    pd.DataFrame({"layer": range(len(values)), "value": values}).to_csv(d / "table.csv", index=False)
    (d / "meta.json").write_text(json.dumps({"parameters": params}))


def test_runs_match_by_parameters_and_differences_are_reported(tmp_path):
    ct = load()
    write(tmp_path / "base", "k1", [1.0, 2.0], {"n": 2})
    write(tmp_path / "base", "k2", [5.0, 6.0], {"n": 3})
    write(tmp_path / "new", "other-key", [1.0, 2.0 + 5e-7], {"n": 2})  # same run under a new key, within tolerance
    lines, failures = ct.compare(tmp_path / "base", tmp_path / "new", atol=1e-6)
    assert failures == [] and "max |diff| 5.00e-07" in lines[0]
    write(tmp_path / "new", "k3", [5.0, 6.1], {"n": 3})
    write(tmp_path / "new", "k4", [0.0], {"n": 99})
    _, failures = ct.compare(tmp_path / "base", tmp_path / "new", atol=1e-6)
    assert any("1.00e-01, 1 value(s) beyond 1e-06" in f for f in failures) and any("no baseline" in f for f in failures)
    # a relative tolerance: 6.1 against 6.0 is within 2 % of the baseline, not within 1 %
    _, failures = ct.compare(tmp_path / "base", tmp_path / "new", atol=1e-6, rtol=0.02)
    assert not any("k3" in f for f in failures)
    _, failures = ct.compare(tmp_path / "base", tmp_path / "new", atol=1e-6, rtol=0.01)
    assert any("k3" in f for f in failures)
