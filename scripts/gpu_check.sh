#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: the `gpu` test tier (the book's traces on CUDA against the CPU), then the timings
# of chapter 03's skip session and chapter 04's logit lens on a random-init Llama 3.1 8B in bf16, two prompts
# (scripts/gpu_check.py), written to $OUT/gpu_check.json (or results/gpu_check.json). About 8 minutes on one H200
# by its shapes (not yet run on one). On a machine without CUDA: one line, exit 0.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${LMDEPTH_VENV:-.venv}/bin/python"
[ -x "$PY" ] || bash scripts/setup_env.sh >/dev/null
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: no CUDA device on this machine; nothing to check (the gpu tier skips without one)"
  exit 0
fi
"$PY" -m pytest -q -p no:cacheprovider -m gpu tests
"$PY" scripts/gpu_check.py --out "${OUT:-results}/gpu_check.json" "$@"
