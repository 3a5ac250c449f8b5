"""Chapters as runnable units: find a chapter's jupytext source, check parameters, execute it with papermill.

papermill cannot read jupytext ``.py`` files, so a chapter is converted in memory, its parameters are checked
against the notebook's own ``parameters`` cell (names and types), and only then executed.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lmdepth.errors import ParameterError
from lmdepth.runtime import REPO_ROOT

CHAPTERS: dict[str, str] = {
    "norms": "01_residual_norms",
    "cosine": "02_cosine_similarity",
    "skipping": "03_layer_skipping",
    "lens": "04_logit_lens",
    "complexity": "05_depth_vs_complexity",
    "maps": "06_linear_maps",
    "moeut": "07_moeut_vs_transformer",
    "atlas": "90_across_models",
    "explorer": "91_explorer",
    "reproducibility": "92_reproducibility",
}
PROFILES = ("smoke", "default", "paper")


def notebooks_dir() -> Path:
    return Path(os.environ.get("LMDEPTH_NOTEBOOKS", REPO_ROOT / "notebooks"))


def profiles_dir() -> Path:
    return Path(os.environ.get("LMDEPTH_PROFILES", REPO_ROOT / "profiles"))


def chapter_source(chapter: str) -> Path:
    if chapter not in CHAPTERS:
        raise ParameterError(f"Unknown chapter {chapter!r}. Chapters: {', '.join(CHAPTERS)}.")
    path = notebooks_dir() / f"{CHAPTERS[chapter]}.py"
    if not path.exists():
        raise ParameterError(f"Chapter source {path} not found: run from a checkout of the repository, or set "
                             "LMDEPTH_NOTEBOOKS to its notebooks/ directory.")
    return path


def profile_params(profile: str, chapter: str) -> dict[str, Any]:
    """Parameters of a profile file for one chapter: its ``common`` block updated by the chapter's block."""
    path = profiles_dir() / f"{profile}.yaml"
    if not path.exists():
        raise ParameterError(f"Unknown profile {profile!r}: expected {path}. Profiles: {', '.join(PROFILES)}.")
    doc = yaml.safe_load(path.read_text()) or {}
    common = doc.get("common") or {}
    if common:  # the shared block applies to the chapters that have those parameters (the atlas has no model)
        declared = declared_parameters(chapter)
        common = {k: v for k, v in common.items() if k in declared}
    return {**common, **((doc.get("chapters") or {}).get(chapter) or {}), "profile": profile}


@dataclass(frozen=True)
class ParamSpec:
    name: str
    type_name: str
    default: str
    help: str


def declared_parameters(chapter: str) -> dict[str, ParamSpec]:
    """The chapter's ``parameters`` cell as papermill reads it: name → type, default and help."""
    import jupytext
    import nbformat
    import papermill

    nb = jupytext.read(chapter_source(chapter))
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "chapter.ipynb"
        nbformat.write(nb, p)
        found = papermill.inspect_notebook(str(p))
    return {k: ParamSpec(k, v["inferred_type_name"], v["default"], v["help"]) for k, v in found.items()}


_PY_TYPES = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,), "list": (list,), "dict": (dict,)}


def check_parameters(chapter: str, params: dict[str, Any]) -> dict[str, Any]:
    """Reject unknown names and wrong types before a kernel starts. Returns the (possibly coerced) params."""
    spec = declared_parameters(chapter)
    out = {}
    for name, value in params.items():
        if name not in spec:
            raise ParameterError(f"Chapter {chapter!r} has no parameter {name!r}. Parameters: {', '.join(spec)}.")
        types = _PY_TYPES.get(spec[name].type_name)
        if types and spec[name].type_name == "str" and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)  # "-p dataset 123" arrives as a number from YAML parsing
        if types and (not isinstance(value, types) or (isinstance(value, bool) and bool not in types)):
            raise ParameterError(f"Parameter {name!r} of chapter {chapter!r} must be {spec[name].type_name} "
                                 f"(default {spec[name].default}), got {value!r}.")
        out[name] = value
    from lmdepth.params import check_common

    check_common(**out)  # ranges and choices of the shared vocabulary, before a kernel starts
    return out


def parse_cli_value(raw: str) -> Any:
    """``-p name value`` values are YAML: 5 → int, true → bool, "[a, b]" → list, anything else → str.

    An empty value stays the empty string (YAML would read it as null), e.g. ``-p checkpoint_dir ""``.
    """
    if not raw.strip():
        return raw
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def execute_chapter(
    chapter: str,
    params: dict[str, Any],
    output: Path,
    cwd: Path | None = None,
    log_output: bool = False,
    progress_bar: bool = False,
) -> Path:
    """Execute a chapter with papermill into ``output`` (written atomically: only a finished run lands there).

    Raises:
        papermill.PapermillExecutionError: a cell failed; the failed notebook is kept at ``output`` with the
            suffix ``.failed.ipynb`` for inspection.
    """
    import jupytext
    import nbformat
    import papermill

    params = check_parameters(chapter, params)
    nb = jupytext.read(chapter_source(chapter))
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / f"{CHAPTERS[chapter]}.ipynb"
        nbformat.write(nb, src)
        partial = output.with_name(output.stem + ".failed.ipynb")
        papermill.execute_notebook(str(src), str(partial), parameters=params, cwd=str(cwd or REPO_ROOT),
                                   kernel_name="python3", log_output=log_output, progress_bar=progress_bar)
        os.replace(partial, output)
    return output
