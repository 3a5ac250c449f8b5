"""A fresh environment as ``pip install 'lmdepth @ git+<repository>'`` makes it, built offline for the tests: the
wheel built from this checkout, the distributions its install would bring linked in from the test's own environment
(a real install downloads for minutes), nothing else. Used by the Colab simulation (tests/test_colab.py) and by the
smoke book (tests/conftest.py), whose chapters execute in such an environment."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

from lmdepth.runtime import REPO_ROOT

#: What a Colab runtime provides beyond the package's own dependencies (widgets; pip and setuptools, with which the
#: install cell builds the package). The Jupyter kernel is not here: the package declares ipykernel itself.
COLAB_RUNTIME = ("ipywidgets", "pip", "setuptools")


def _closure(requirements: list[str]) -> set[str]:
    """Names of the installed distributions these requirement strings pull in, recursively (markers evaluated)."""
    todo, seen = [Requirement(r) for r in requirements], set()
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = metadata.distribution(req.name).metadata["Name"]
        if name.lower() in seen:
            continue
        seen.add(name.lower())
        todo += [Requirement(r) for r in metadata.requires(name) or []]
    return seen


def _link_distributions(names: set[str], site: Path) -> None:
    """Make ``site`` hold (symlinks to) the installed files of these distributions: their top-level packages,
    modules and metadata folders."""
    site.mkdir(parents=True)
    for name in names:
        dist = metadata.distribution(name)
        for top in {Path(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            if not (site / top).exists() and Path(dist.locate_file(top)).exists():
                (site / top).symlink_to(dist.locate_file(top))


def fresh_env(root: Path) -> tuple[Path, Path]:
    """A new virtual environment under ``root`` that sees exactly the wheel's declared dependencies (and theirs),
    the packaged models and :data:`COLAB_RUNTIME`, linked in; lmdepth itself is not installed. Returns (its python,
    the wheel built from this checkout)."""
    # Built from a private copy of the checkout's files (tracked, or untracked and not ignored: what a commit of the
    # working tree would hold): pip builds in the source folder (build/, *.egg-info), and the two pytest workers build
    # this fixture at the same time (its tests lie in two work units, tests/conftest.py), which in one folder races.
    source = root / "source"
    listed = subprocess.run(["git", "-C", str(REPO_ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            check=True, capture_output=True, text=True).stdout.split("\0")
    for name in filter(None, listed):
        if (REPO_ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(REPO_ROOT / name, source / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                            str(root / "wheel"), str(source)], capture_output=True, text=True)
    assert built.returncode == 0, f"pip wheel failed:\n{built.stdout}\n{built.stderr}"
    wheel = next((root / "wheel").glob("lmdepth-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        wheel_meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    declared = [line.split(":", 1)[1].strip() for line in wheel_meta.splitlines() if line.startswith("Requires-Dist:")]
    assets = [line.split("#")[0].strip() for line in (REPO_ROOT / "requirements-assets.txt").read_text().splitlines()]
    names = _closure(declared + list(COLAB_RUNTIME)) | {Requirement(a).name.lower() for a in assets if a}
    assert "lmdepth" not in names
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "env")], check=True)
    python = root / "env" / "bin" / "python"
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                  check=True, capture_output=True, text=True).stdout.strip())
    _link_distributions(names, root / "preinstalled")
    (purelib / "preinstalled.pth").write_text(str(root / "preinstalled") + "\n")
    return python, wheel


def env_root(python: Path) -> Path:
    """The ``root`` that :func:`fresh_env` was given, from the python it returned (``root/env/bin/python``)."""
    return python.parents[2]


def install_wheel(root: Path) -> Path:
    """:func:`fresh_env` under ``root`` with the wheel installed (no dependencies: they are linked in); its python."""
    python, wheel = fresh_env(root)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
                    str(wheel)], check=True, capture_output=True)
    return python


def kernel_spec(python: Path, jupyter_path: Path) -> Path:
    """Write the ``python3`` kernel spec of ``python`` under ``jupyter_path`` (put it first on ``JUPYTER_PATH`` and
    papermill starts that interpreter's kernel, not the caller's); returns the spec's folder."""
    spec = jupyter_path / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (fresh environment)", "language": "python"}))
    return spec
