"""The Colab cell as Colab runs it, with its commands recorded instead of run: it clones the repository its notebook
names; without an address it uses a clone made by hand (the by-hand route of lmdepth.book.repository_buttons) or
says how to make one — and never stops the notebook."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import jupytext
import pytest

from lmdepth.book.repository_buttons import BY_HAND_LINES
from lmdepth.runtime import REPO_ROOT

pytestmark = pytest.mark.unit

CHAPTER = REPO_ROOT / "notebooks" / "01_residual_norms.py"  # the cell is the same everywhere (test_chapter_shape)


def _cell(repo: str) -> str:
    src = next(c.source for c in jupytext.read(CHAPTER).cells if c.cell_type == "code" and "google.colab" in c.source)
    assert 'REPO = ""' in src
    return src.replace('REPO = ""', f"REPO = {repo!r}")


def _run(cell: str, tmp_path, monkeypatch, make_clone: bool = False) -> list[str]:
    """Run the cell in ``tmp_path`` as if in Colab; the shell commands it ran, in order."""
    ran = []

    def fake(cmd, **kw):
        ran.append(cmd)
        if "git clone" in cmd:  # the clone, as git would leave it
            (tmp_path / "lmdepth-book").mkdir()
            (tmp_path / "lmdepth-book" / "pyproject.toml").write_text("")
        return subprocess.CompletedProcess(cmd, 0)

    if make_clone:
        (tmp_path / "lmdepth-book").mkdir()
        (tmp_path / "lmdepth-book" / "pyproject.toml").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    monkeypatch.setattr(subprocess, "run", fake)
    exec(compile(cell, "colab-cell", "exec"), {})
    return ran


def test_with_an_address_it_clones_goes_inside_and_installs(tmp_path, monkeypatch):
    ran = _run(_cell("https://example.org/book.git"), tmp_path, monkeypatch)
    assert "git clone -q --depth 1 https://example.org/book.git lmdepth-book" in ran[0]
    assert "pip install -q ." in ran[1] and "requirements-assets.txt" in ran[1]
    assert os.path.basename(os.getcwd()) == "lmdepth-book"


def test_without_an_address_it_uses_a_clone_made_by_hand(tmp_path, monkeypatch):
    ran = _run(_cell(""), tmp_path, monkeypatch, make_clone=True)
    assert len(ran) == 1 and "pip install -q ." in ran[0] and "git clone" not in ran[0]


def test_without_an_address_or_a_clone_it_says_how_and_goes_on(tmp_path, monkeypatch, capsys):
    assert _run(_cell(""), tmp_path, monkeypatch) == []  # no exception: the notebook is not stopped here
    said = capsys.readouterr().out
    assert "git clone -q --depth 1 ADDRESS lmdepth-book" in said and "git clone -q --depth 1 ADDRESS" in BY_HAND_LINES[0]
