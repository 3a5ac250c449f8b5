"""What a newcomer meets first: the one repository setting, builds that never overwrite the published book, the cost
notice before a long computation, and failures that read as one line."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lmdepth.book import build, cost
from lmdepth.book.chapters import declared_parameters, require_kernel
from lmdepth.book.cli import main
from lmdepth.book.repository_buttons import BY_HAND_LINES, colab_md, theme_options
from lmdepth.errors import MissingPackageError
from lmdepth.runtime import REPO_ROOT

pytestmark = pytest.mark.unit


def test_no_button_while_the_repository_url_is_unset():
    unset = theme_options({"repository_url": "", "launch_buttons": {"colab_url": "https://colab.research.google.com"},
                           "use_repository_button": True})
    assert "launch_buttons" not in unset and "repository_url" not in unset and not unset["use_repository_button"]
    on = theme_options({"repository_url": "https://github.com/me/book"})
    assert on["launch_buttons"]["colab_url"] and on["use_repository_button"]


def test_colab_instructions_follow_the_setting():
    """While no address is set, the book says how to open a chapter in Colab by hand (no button to point at, and no
    Colab address: a page without a launch button names none); once set, the launch button."""
    by_hand = colab_md("")
    assert "by hand" in by_hand and all(line in by_hand for line in BY_HAND_LINES)
    assert "colab.research.google.com" not in by_hand and "launch button (the rocket" not in by_hand
    assert "https://github.com/me/book" in colab_md("https://github.com/me/book") and "rocket" in colab_md("x")


#: A commit id as prose cites one: 7–40 hex digits with a letter and a digit among them.
COMMIT_ID = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")


def test_the_readme_is_short_and_speaks_to_readers():
    text = (REPO_ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    assert not COMMIT_ID.search(text), COMMIT_ID.search(text)
    assert "these machines" not in text


def test_reader_text_cites_no_issue_numbers():
    """Issue numbers are the project's bookkeeping (CHANGELOG.md); a reader of the book has no tracker to look in."""
    paths = [*(REPO_ROOT / "notebooks").glob("*.py"), *(REPO_ROOT / "book").glob("*.md"), REPO_ROOT / "README.md",
             *(REPO_ROOT / "lib" / "lmdepth" / "book").rglob("*.py")]
    cited = [f"{p.relative_to(REPO_ROOT)}: {m[0]}" for p in paths
             for m in re.finditer(r"\b[Ii]ssues? #?\d+", p.read_text())]
    assert cited == []


def test_repository_url_is_one_setting(tmp_path, monkeypatch):
    config = tmp_path / "_config.yml"
    config.write_text('repository:\n  url: ""\n')
    assert build.repository_url(config) == ""
    config.write_text("repository:\n  url: https://github.com/me/book/\n")
    assert build.repository_url(config) == "https://github.com/me/book"
    # an installed package outside a checkout (REPO_ROOT holds no _config.yml): the working directory's, else none
    monkeypatch.setattr(build, "REPO_ROOT", tmp_path / "site-packages")
    monkeypatch.chdir(tmp_path)
    assert build.repository_url() == "https://github.com/me/book"
    config.unlink()
    assert build.repository_url() == ""
    assert "lmdepth.book.repository_buttons" in (REPO_ROOT / "_config.yml").read_text()


def test_clean_notebook_writes_the_url_into_the_colab_cell(tmp_path):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell('if "google.colab" in sys.modules:\n    REPO = "https://old"  # set\n')]
    path = tmp_path / "x.ipynb"
    nbformat.write(nb, path)
    build.clean_notebook(path, "")
    assert 'REPO = ""  # set' in nbformat.read(path, as_version=4).cells[0].source
    build.clean_notebook(path, "https://github.com/me/book")
    assert 'REPO = "https://github.com/me/book"  # set' in nbformat.read(path, as_version=4).cells[0].source


def test_only_the_default_profile_builds_the_published_book(monkeypatch):
    assert build.build_root("default") == REPO_ROOT
    assert build.build_root("quick") == REPO_ROOT / "_build" / "profiles" / "quick"
    assert build.build_root("/home/me/my.yaml") == REPO_ROOT / "_build" / "profiles" / "my"
    seen = {}
    monkeypatch.setattr(build, "stage_book", lambda root: seen.setdefault("staged", root))
    monkeypatch.setattr(build, "execute_book", lambda **kw: seen.update(kw) or {})
    monkeypatch.setattr(build, "render_html", lambda root: seen.setdefault("html", root))
    build.build_book(profile="quick")
    quick = REPO_ROOT / "_build" / "profiles" / "quick"
    assert seen["book_dir"] == quick / "book" and seen["results_dir"] == quick / "results"
    assert seen["staged"] == seen["html"] == quick


def test_p_takes_name_value_or_name_equals_value(tmp_path, capsys):
    from lmdepth.book.cli import _pairs

    assert _pairs([["n_examples=2"], ["dataset", "/x #3.jsonl"], ["a", "b=c"]]) == [
        ("n_examples", "2"), ("dataset", "/x #3.jsonl"), ("a", "b=c")]
    assert main(["run", "norms", "-p", "n_examples", "--results-dir", str(tmp_path)]) == 2
    assert "give `-p NAME VALUE` or `-p NAME=VALUE`" in capsys.readouterr().err


def test_a_missing_kernel_is_one_line():
    require_kernel()  # this environment has one
    with pytest.raises(MissingPackageError, match="install ipykernel"):
        require_kernel("no-such-kernel")
    deps = (REPO_ROOT / "pyproject.toml").read_text().split("[project.optional-dependencies]")[0]
    assert '"ipykernel' in deps  # a core dependency: `pip install -e .` can run a chapter


def test_check_pages_without_chromium_is_one_line(tmp_path):
    empty = tmp_path / "bin"  # a PATH on which no Chromium can be found
    empty.mkdir()
    run = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "check_pages.py"), str(tmp_path)],
                         env={**os.environ, "PATH": str(empty)}, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert len(run.stderr.strip().splitlines()) == 1 and "Chromium" in run.stderr and not run.stdout


def _defaults(chapter: str) -> dict:
    return {name: ast.literal_eval(p.default) for name, p in declared_parameters(chapter).items()}


def test_no_cost_notice_when_the_stored_runs_are_read():
    params = _defaults("skipping")
    assert cost.stored_difference("skipping", params) == {}
    assert cost.cost_notice("skipping", params, REPO_ROOT / "results") is None


def test_cost_notice_before_a_long_recomputation(tmp_path):
    params = _defaults("skipping") | {"n_examples": 40}
    assert cost.stored_difference("skipping", params) == {"n_examples": (40, 20)}
    text = cost.cost_notice("skipping", params, REPO_ROOT / "results")
    found = cost.chapter_minutes("skipping", [REPO_ROOT / "results"])
    assert found is not None and f"took {found[0]:.0f} min" in text  # the cost table's own number
    assert "n_examples=40 (stored: 20)" in text and "lmdepth run skipping --profile quick" in text
    # nothing stored where the chapter writes: the same estimate, read from the repository's record
    elsewhere = cost.cost_notice("skipping", _defaults("skipping"), tmp_path)
    assert "not stored" in elsewhere and f"took {found[0]:.0f} min" in elsewhere
    # a short chapter says nothing
    assert cost.cost_notice("norms", _defaults("norms") | {"n_examples": 21}, REPO_ROOT / "results") is None


def test_a_quick_run_announces_the_quick_profiles_cost_not_the_defaults(tmp_path, monkeypatch, capsys):
    """The chapter's own ``profile`` parameter picks the record: with no timed record of the quick profile the
    notice says so and gives the default profile's minutes only as that (never as the quick run's cost)."""
    from lmdepth.book.chapters import profile_params

    monkeypatch.delenv("LMDEPTH_BOOK_BUILD", raising=False)
    params = _defaults("skipping") | profile_params("quick", "skipping") | {"results_dir": str(tmp_path)}
    cost.announce_cost("skipping", params)
    out = capsys.readouterr().out
    found = cost.chapter_minutes("skipping", [REPO_ROOT / "results"])
    assert "the quick profile's runs of this chapter are not stored" in out
    assert f"unknown for the quick profile (no timed record of it); the default profile's runs of this chapter took " \
           f"{found[0]:.0f} min" in out
    assert "For a smaller run" not in out  # it is the quick run


def test_book_builds_announce_nothing(monkeypatch, capsys):
    monkeypatch.setenv("LMDEPTH_BOOK_BUILD", "1")
    cost.announce_cost("skipping", _defaults("skipping") | {"n_examples": 40, "results_dir": str(Path("/nowhere"))})
    assert capsys.readouterr().out == ""


@pytest.mark.unit
def test_every_committed_sidecar_carries_its_digest_and_an_edit_of_one_is_damage(tmp_path):
    """The stored runs' sidecars were sealed once (scripts/seal_sidecars.py): an edited sample size in one is then
    damage, not a stored run that passes."""
    import json
    import shutil
    import subprocess
    import sys

    from lmdepth.results import damage
    from lmdepth.runtime import REPO_ROOT

    check = subprocess.run([sys.executable, "scripts/seal_sidecars.py", "results", "--check"], cwd=REPO_ROOT,
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
    run = next(p.parent for p in sorted((REPO_ROOT / "results" / "residual_stream").rglob("meta.json")))
    copy = shutil.copytree(run, tmp_path / run.name)
    assert damage(copy) is None
    meta = json.loads((copy / "meta.json").read_text())
    meta["data"]["n"] = 2  # what a careless edit would do
    (copy / "meta.json").write_text(json.dumps(meta, indent=2))
    assert "digest does not match" in damage(copy)
