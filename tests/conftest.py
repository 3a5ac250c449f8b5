"""Shared fixtures, and the test tiers (TransformerLens style; registered in pyproject.toml). Every test carries
exactly one tier marker, at module level (``pytestmark``) or per test where a module mixes tiers:

* ``unit``: no model at all (pure functions, data, parameters, CLI parsing); ``-m unit`` runs in 60–90 s on two
  workers (2 cores);
* ``integration``: tiny random-init models (``lmdepth.testing``, ``tiny_dirs``), scratch models, tiny training runs;
* ``packaged``: loads a real packaged model or its tokenizer (SmolLM2 & co.);
* ``slow``: executes chapters or the book (minutes);
* ``browser``: draws the executed book in headless Chromium (builds the book too: minutes);
* ``gpu``: runs on a CUDA device and compares with the CPU (skipped where there is none).

A test with no tier marker, or more than one, stops the collection (see ``pytest_collection_modifyitems``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lmdepth.testing import FAMILY_CONFIGS, save_tiny_model, tiny_tokenizer

FAMILIES = list(FAMILY_CONFIGS)
TIERS = ("unit", "integration", "packaged", "slow", "browser", "gpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the machines have no hub access: fail fast, never hang
os.environ.setdefault("LMDEPTH_PROGRESS", "0")


@pytest.hookimpl(tryfirst=True)  # before -m deselects: the whole collected suite is checked
def pytest_collection_modifyitems(config, items):
    """Every test has exactly one tier marker (no default: a test that builds a model must not pass as ``unit``)."""
    bad = []
    for item in items:
        tiers = sorted({m.name for m in item.iter_markers() if m.name in TIERS})
        if len(tiers) != 1:
            bad.append(f"  {item.nodeid}: {', '.join(tiers) or 'no tier marker'}")
    if bad:
        raise pytest.UsageError(f"Each test needs exactly one tier marker of {', '.join(TIERS)} "
                                "(see tests/conftest.py):\n" + "\n".join(bad))
    misplaced = [item.nodeid for item in items
                 if ("smoke_book" in getattr(item, "fixturenames", ())) != reads_smoke_book(item.nodeid)]
    if misplaced:
        raise pytest.UsageError("SMOKE_BOOK_TESTS (tests/conftest.py) must name exactly the tests that take the "
                                "smoke_book fixture; fix it for:\n  " + "\n  ".join(misplaced))


#: The tests that take the ``smoke_book`` fixture, by name. Under pytest-xdist (``scripts/test.sh`` runs two workers)
#: they form one work unit, so one worker executes the book once while the other runs the rest of the suite beside it.
#: The controller that hands out the units sees only test ids, so the names are listed here; the collection hook above
#: checks the list against the fixtures the tests take.
SMOKE_BOOK_TESTS = frozenset({
    "tests/test_book.py::test_smoke_executed_chapters_are_clean",
    "tests/test_book.py::test_charts_draw_offline_in_chromium",
    "tests/test_book.py::test_pages_have_no_reader_visible_defects",
    "tests/test_book.py::test_book_pages_link_each_other",
    "tests/test_book.py::test_pages_load_without_console_errors_or_network",
    "tests/test_book.py::test_internal_links_resolve",
    "tests/test_book.py::test_colab_buttons_point_to_committed_notebooks",
    "tests/test_colab.py::test_the_smoke_book_computed_every_run_in_a_fresh_environment",
    "tests/test_colab.py::test_the_summary_pages_run_in_colab_on_runs_without_a_book_record",
})


def reads_smoke_book(nodeid: str) -> bool:
    return nodeid.split("[", 1)[0] in SMOKE_BOOK_TESTS


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: without it (`-p no:xdist`) pytest ignores it
def pytest_xdist_make_scheduler(config, log):
    """Hand out whole test modules (their module fixtures are built once), except that the tests of the smoke book
    are one unit of their own (pytest-xdist's own ``xdist_group`` mark does not regroup tests under pytest 9.2)."""
    from xdist.scheduler import LoadScopeScheduling

    class SmokeBookTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "smoke_book" if reads_smoke_book(nodeid) else super()._split_scope(nodeid)

    return SmokeBookTogether(config, log)


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    """One saved tiny model directory per family."""
    root = tmp_path_factory.mktemp("tiny")
    return {fam: save_tiny_model(fam, root / fam) for fam in FAMILIES}


@pytest.fixture(scope="session")
def book_env(tmp_path_factory) -> Path:
    """The python of a fresh environment (tests/fresh_env.py) whose ``python3`` kernel spec lies in its folder's
    ``jupyter/``: the smoke book's kernels."""
    from fresh_env import install_wheel, kernel_spec

    env = tmp_path_factory.mktemp("book-env")  # outside the book's root, which the HTML build reads
    python = install_wheel(env)
    kernel_spec(python, env / "jupyter")
    return python


@pytest.fixture(scope="session")
def smoke_book(tmp_path_factory, book_env) -> Path:
    """Every chapter executed once with the smoke profile (``execute_book``, from scratch: an empty results folder),
    staged and rendered to HTML. Its root holds ``book/`` (the executed pages), ``results/`` (the runs they computed)
    and ``_build/html``. Shared by the page checks of tests/test_book.py and tests/test_colab.py (nothing here may be
    changed by a test).

    The chapters execute as a Colab or ``pip install`` reader runs them: each kernel is the python of a fresh
    environment (``book_env``: the wheel built from this checkout and only what its install brings), started in
    the root, which holds nothing of the repository."""
    from fresh_env import env_root
    from lmdepth.book.build import execute_book, render_html, stage_book

    root = tmp_path_factory.mktemp("book")
    with pytest.MonkeyPatch.context() as mp:  # the kernels see the fresh environment alone
        mp.setenv("JUPYTER_PATH", str(env_root(book_env) / "jupyter"))
        mp.setenv("PYTHONPATH", "")
        execute_book(profile="smoke", force=True, book_dir=root / "book", results_dir=root / "results", workdir=root)
    stage_book(root)
    render_html(root, strict=True)
    return root


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
