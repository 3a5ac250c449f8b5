"""Everything is declared in pyproject.toml; this file only adds the book's own files to the package.

A wheel built from a checkout copies
- each finished run of ``checkpoints/dm_math`` (a folder holding both ``model.pt`` and ``meta.json``; unfinished
  runs hold only ``ckpt.pt``) to ``lmdepth/_checkpoints/dm_math``, where ``lmdepth.scratch.shipped`` finds it, so
  ``pip install 'lmdepth @ git+<repository>'`` (Colab) loads the committed runs instead of retraining them;
- the chapter sources ``notebooks/*.py`` and ``profiles/*.yaml`` to ``lmdepth/_book``, so ``lmdepth run`` works
  outside a checkout (``lmdepth.book.chapters.notebooks_dir``).
An editable install needs no copy: it reads the checkout's folders.
"""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
RUNS = ROOT / "checkpoints" / "dm_math"


class BuildPyWithBookFiles(build_py):
    """``build_py`` that also copies the finished runs and the chapter sources into the wheel (see above)."""

    def run(self) -> None:
        package = Path(self.build_lib) / "lmdepth"
        if not getattr(self, "editable_mode", False):
            # setuptools reuses build/lib and never removes what was deleted or renamed since (pypa/setuptools#1871):
            # a wheel built in a checkout would ship stale modules beside the current ones
            shutil.rmtree(package, ignore_errors=True)
        super().run()
        if getattr(self, "editable_mode", False):
            return
        files = [(meta.parent / name, package / "_checkpoints" / "dm_math" / meta.parent.name / name)
                 for meta in sorted(RUNS.glob("*/meta.json")) if (meta.parent / "model.pt").is_file()
                 for name in ("meta.json", "model.pt")]
        files += [(path, package / "_book" / folder / path.name)
                  for folder, pattern in (("notebooks", "*.py"), ("profiles", "*.yaml"))
                  for path in sorted((ROOT / folder).glob(pattern))]
        for source, target in files:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)


setup(cmdclass={"build_py": BuildPyWithBookFiles})
