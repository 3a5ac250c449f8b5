"""scripts/gpu_check.sh and scripts/gpu_check.py: one line and exit 0 without CUDA; the timing script's rows on a tiny
Llama on the CPU (the same code the GPU runs on the paper's shapes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.unit
@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the script runs the gpu tier instead")
def test_the_gpu_check_says_in_one_line_that_there_is_no_gpu_and_exits_0():
    out = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=ROOT, capture_output=True, text=True,
                         env={"LMDEPTH_VENV": str(Path(sys.executable).parents[1]), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0 and out.stdout.strip().count("\n") == 0 and "no CUDA device" in out.stdout


@pytest.mark.integration
def test_the_gpu_timings_run_on_a_tiny_llama_on_the_cpu(tmp_path):
    out = subprocess.run([sys.executable, "scripts/gpu_check.py", "--shape", "tiny", "--device", "cpu", "--tokens",
                          "40", "--problems", "1", "--out", str(tmp_path / "g.json")], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["path"] for r in rows] == ["skip session", "logit lens"]
    assert all(r["forwards"] >= 1 and r["seconds"] > 0 and r["efficiency"] > 0 for r in rows)
    assert rows[0]["forwards"] > rows[1]["forwards"] == 1  # the lens is one traced pass; the skip session many
    assert json.loads((tmp_path / "g.json").read_text())["rows"] == rows
    refused = subprocess.run([sys.executable, "scripts/gpu_check.py", "--device", "cpu"], cwd=ROOT,
                             capture_output=True, text=True)
    assert refused.returncode == 2 and "needs a GPU" in refused.stderr
