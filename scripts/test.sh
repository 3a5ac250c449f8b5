#!/usr/bin/env bash
# Run the whole test-suite from a fresh clone: install everything, then pytest (unit, tiny-model integration,
# the real packaged SmolLM2, both chapters executed with the smoke profile and rendered in headless Chromium).
# Extra arguments go to pytest (e.g. -m "not slow" for the fast tier).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
# Headless Chromium, needed only by the browser tests (tier `browser`): the Debian package, installed where this
# shell may (root or sudo); otherwise those tests fail with what to install.
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; elif command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else SUDO="none"; fi
  if [ "$SUDO" != none ]; then
    echo "[test] installing chromium for the browser tests"
    $SUDO apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null \
      || echo "[test] could not install chromium: the browser tests will fail; install it, or run with -m 'not browser'"
  else
    echo "[test] no chromium and no root/sudo: the browser tests will fail; install chromium, or run with -m 'not browser'"
  fi
fi
# One torch thread per process unless told otherwise: the suite's models are tiny and overhead-bound, and the chapters
# run in kernel subprocesses beside pytest, so more threads only contend (clean clones on 2 cores: 1,116 s with one
# thread, 1,318 s with torch's default).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# Two pytest workers (pytest-xdist; LMDEPTH_TEST_WORKERS=0 for one process): the suite is one core's work for most
# of its length (the smoke book executes its chapters one after the other), so the second core runs the other tests
# beside it. The tests of the smoke book run on one worker (tests/conftest.py), which executes the book once.
exec "${LMDEPTH_VENV:-.venv}/bin/python" -m pytest -q -p no:cacheprovider -n "${LMDEPTH_TEST_WORKERS:-2}" "$@"
