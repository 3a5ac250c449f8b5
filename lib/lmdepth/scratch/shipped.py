"""Where a finished from-scratch run is found: the chapter's ``checkpoint_dir`` first, then the runs shipped with
the library.

The book's default runs are committed in the repository's ``checkpoints/dm_math``. A wheel carries a copy of them
in ``lmdepth/_checkpoints/dm_math`` (``setup.py``), so an installed package (Colab, ``pip install``) loads them
from any working directory. A folder's name holds the hash of everything that determines its weights
(``TrainConfig.key``), so a run found in either place is the run the configuration asks for.
"""
from __future__ import annotations

from pathlib import Path

from lmdepth.runtime import REPO_ROOT

#: Finished runs inside an installed wheel.
PACKAGE_RUNS = Path(__file__).resolve().parents[1] / "_checkpoints" / "dm_math"
#: Where to look after ``checkpoint_dir``: the wheel's copy, and a checkout's own folder (an editable install used
#: from another directory).
SHIPPED_DIRS = (PACKAGE_RUNS, REPO_ROOT / "checkpoints" / "dm_math")


def finished_model(run_folder: str, checkpoint_dir: str | Path) -> Path | None:
    """``model.pt`` of the finished run ``run_folder`` (``<name>-<key>``): under ``checkpoint_dir`` if it is there,
    else among the shipped runs; None when neither has it (the run must be trained)."""
    for root in (Path(checkpoint_dir), *SHIPPED_DIRS):
        path = root / run_folder / "model.pt"
        if path.is_file() and (path.parent / "meta.json").is_file():
            return path
    return None
