"""Lint as a habit: ``ruff check`` with the project's configuration (``[tool.ruff]`` in pyproject.toml) passes on the
library, the tests, the scripts and the chapter sources.

The rules: pyflakes (F), import sorting (I, ``lmdepth`` first-party), and for the library the docstring rules it
follows (every public module, class and function documented, in triple double quotes, never empty). The version is
the one pinned in requirements.txt: another ruff may sort or flag differently. Fix with ``ruff check --fix`` (imports,
unused imports) and by hand (the rest).
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
PATHS = ("lib", "tests", "scripts", "notebooks", "setup.py")


def pinned_ruff() -> str:
    """The ruff version requirements.txt pins."""
    found = re.search(r"^ruff==(\S+)$", (ROOT / "requirements.txt").read_text(encoding="utf-8"), re.MULTILINE)
    assert found, "requirements.txt pins no ruff (ruff==<version>)"
    return found[1]


def ruff(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """``ruff <args>`` from the repository root (so pyproject.toml's configuration applies); fails the test in one
    line when the pinned ruff is not what is installed."""
    want = pinned_ruff()
    try:
        have = importlib.metadata.version("ruff")
    except importlib.metadata.PackageNotFoundError:
        pytest.fail(f"ruff is not installed: run `bash scripts/setup_env.sh` (it installs ruff=={want}).")
    if have != want:
        pytest.fail(f"ruff {have} is installed but requirements.txt pins {want}: run `bash scripts/setup_env.sh`.")
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, input=stdin, capture_output=True,
                          text=True, timeout=120)


def test_ruff_check_is_clean():
    out = ruff("check", "--no-cache", *PATHS)
    if out.returncode != 0:
        pytest.fail(f"`ruff check {' '.join(PATHS)}` found problems (`ruff check --fix` mends imports):\n"
                    f"{out.stdout}{out.stderr}", pytrace=False)


PROBE = "import os\nimport sys\n\nimport lmdepth\nimport numpy\n\n\ndef f(x):\n    return x\n"


def probe_codes(filename: str) -> set[str]:
    """The rule codes ruff reports for :data:`PROBE` as if it were ``filename`` (a file that need not exist)."""
    out = ruff("check", "--no-cache", "--output-format", "concise", "--stdin-filename", filename, stdin=PROBE)
    return set(re.findall(r": ([A-Z]+[0-9]+) ", out.stdout))


def test_the_configuration_is_the_one_ruff_reads():
    """A clean check means something only if the rules are on: unused imports, ``lmdepth`` sorted with the
    third-party imports and an undocumented module and function are flagged in the library; the tests and scripts
    are held to all but the docstring rules."""
    assert probe_codes("lib/lmdepth/probe.py") == {"F401", "I001", "D100", "D103"}
    assert probe_codes("tests/test_probe.py") == probe_codes("scripts/probe.py") == {"F401", "I001"}
