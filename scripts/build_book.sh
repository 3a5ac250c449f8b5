#!/usr/bin/env bash
# Build the book from a fresh clone: install everything, execute every chapter on the packaged default models
# (only chapters whose inputs changed; pass --force for all), render HTML that works offline.
# Output: _build/html/index.html. Extra arguments go to `lmdepth book` (e.g. --force, --profile quick); a profile other
# than default builds into _build/profiles/<name>/ (its own pages, results and HTML), never into book/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec "${LMDEPTH_VENV:-.venv}/bin/lmdepth" book "$@"
