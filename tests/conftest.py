"""Shared fixtures. Tiers (TransformerLens style): unit tests need no model; integration tests use tiny
random-init models of each family; tests marked ``slow`` load the real packaged SmolLM2 or execute chapters."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lmdepth.testing import FAMILY_CONFIGS, save_tiny_model, tiny_tokenizer

FAMILIES = list(FAMILY_CONFIGS)
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the machines have no hub access: fail fast, never hang
os.environ.setdefault("LMDEPTH_PROGRESS", "0")


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    """One saved tiny model directory per family."""
    root = tmp_path_factory.mktemp("tiny")
    return {fam: save_tiny_model(fam, root / fam) for fam in FAMILIES}


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models are overhead-bound: one intra-op thread avoids thrashing on a shared 2-core machine.
    Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tok():
    return tiny_tokenizer()


@pytest.fixture
def jsonl(tmp_path):
    """Write lines to a .jsonl file and return its path."""

    def write(lines: list[str], name: str = "data.jsonl") -> Path:
        p = tmp_path / name
        p.write_text("\n".join(lines) + ("\n" if lines else ""))
        return p

    return write
