"""Chapters as runnable units: find a chapter's jupytext source, check parameters, execute it with papermill.

papermill cannot read jupytext ``.py`` files, so a chapter is converted in memory, its parameters are checked
against the notebook's own ``parameters`` cell (names and types), and only then executed.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from jupyter_client import AsyncKernelManager

from lmdepth.analyses.complexity import ComplexityParams, GridParams
from lmdepth.analyses.erasure import CaseStudyParams, ErasureParams
from lmdepth.analyses.lens import LensParams
from lmdepth.analyses.maps import MapsParams
from lmdepth.analyses.residual import ResidualParams
from lmdepth.analyses.scratch import ScratchParams
from lmdepth.analyses.skipping import SkipParams
from lmdepth.data.datasets import NAMED_DATASETS, lone_surrogate, user_examples
from lmdepth.errors import MissingPackageError, ParameterError, StorageFull
from lmdepth.model.ndif import preflight
from lmdepth.model.registry import check_model_files, check_weight_files, current_weights_id
from lmdepth.params import CommonParams, Params, check_device, check_remote, check_results_dir, check_type
from lmdepth.runtime import REPO_ROOT
from lmdepth.traces.remote import NOT_REMOTE

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
PROFILES = ("smoke", "quick", "default", "paper")
#: The parameters classes whose checks a chapter's values go through before a kernel starts (the same checks the
#: analyses run when the chapter calls them); a name that several classes hold is checked by the first. Chapter 05
#: spans two analyses and gives some names the meaning of its grid (``max_answer_tokens`` 0 = whole solutions): its
#: grid's and case studies' classes come first. A chapter not listed is checked by :class:`CommonParams`.
CHAPTER_PARAMS: dict[str, tuple[type[Params], ...]] = {
    "norms": (ResidualParams,), "cosine": (ResidualParams,), "skipping": (SkipParams,), "lens": (LensParams,),
    "complexity": (GridParams, CaseStudyParams, ComplexityParams, ErasureParams), "maps": (MapsParams,),
    "moeut": (ScratchParams,)}

#: The chapter sources and profiles inside an installed wheel (``setup.py`` copies them there).
PACKAGE_BOOK = Path(__file__).resolve().parents[1] / "_book"


def _book_dir(env: str, name: str) -> Path:
    """``$env`` if set, else the checkout's ``name/``, else the installed wheel's copy (``lmdepth run`` after a
    plain ``pip install``)."""
    if env in os.environ:
        return Path(os.environ[env])
    return REPO_ROOT / name if (REPO_ROOT / name).is_dir() else PACKAGE_BOOK / name


def notebooks_dir() -> Path:
    """The folder of the chapter sources ``*.py``: ``$LMDEPTH_NOTEBOOKS``, the checkout's, or the wheel's."""
    return _book_dir("LMDEPTH_NOTEBOOKS", "notebooks")


def profiles_dir() -> Path:
    """The folder of the profiles ``*.yaml``: ``$LMDEPTH_PROFILES``, the checkout's, or the wheel's."""
    return _book_dir("LMDEPTH_PROFILES", "profiles")


def chapter_source(chapter: str) -> Path:
    """A chapter's jupytext source ``<stem>.py``; one line if the chapter or its file does not exist."""
    if chapter not in CHAPTERS:
        raise ParameterError(f"Unknown chapter {chapter!r}. Chapters: {', '.join(CHAPTERS)}.")
    path = notebooks_dir() / f"{CHAPTERS[chapter]}.py"
    if not path.exists():
        raise ParameterError(f"Chapter source {path} not found: run from a checkout of the repository, install the "
                             "package from a wheel (it carries the sources), or set LMDEPTH_NOTEBOOKS to the "
                             "repository's notebooks/ directory.")
    return path


def profile_params(profile: str, chapter: str) -> dict[str, Any]:
    """Parameters of a profile for one chapter: its ``common`` block updated by the chapter's block.

    ``profile`` names a file of ``profiles/`` (``smoke``, ``default``, ``paper``) or is the path of a YAML file of
    the same shape (your own profile).
    """
    path = Path(profile).expanduser() if profile.endswith((".yaml", ".yml")) else profiles_dir() / f"{profile}.yaml"
    if not path.exists():
        raise ParameterError(f"Unknown profile {profile!r}: expected {path}. Profiles: {', '.join(PROFILES)}, or the "
                             "path of a .yaml file with 'common' and 'chapters' blocks.")
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise ParameterError(f"Profile {path} is not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(doc, dict) or not set(doc) <= {"common", "chapters"}:
        raise ParameterError(f"Profile {path} must be a mapping with 'common' and/or 'chapters' blocks.")
    common, blocks = doc.get("common") or {}, doc.get("chapters") or {}
    check_profile(path, common, blocks)
    if common:  # the shared block applies to the chapters that have those parameters (the atlas has no model)
        declared = declared_parameters(chapter)
        common = {k: v for k, v in common.items() if k in declared}
    return {**common, **(blocks.get(chapter) or {}), "profile": profile}


def check_profile(path: Path, common: Any, blocks: Any) -> None:
    """Every key of a profile means something: a typo in ``common`` (which no chapter declares), an unknown chapter
    or a parameter a chapter does not have stops here, in one line, instead of being silently dropped."""
    if not isinstance(common, dict) or not isinstance(blocks, dict) or \
            not all(isinstance(b, dict) or b is None for b in blocks.values()):
        raise ParameterError(f"Profile {path}: 'common' and each chapter's block under 'chapters' must be mappings.")
    unknown = sorted(set(blocks) - set(CHAPTERS))
    if unknown:
        raise ParameterError(f"Profile {path} names unknown chapter(s) {', '.join(map(str, unknown))}; chapters: "
                             f"{', '.join(CHAPTERS)}.")
    for chapter, block in blocks.items():
        unknown = sorted(set(block or {}) - set(declared_parameters(chapter)))
        if unknown:
            raise ParameterError(f"Profile {path}: chapter {chapter!r} has no parameter(s) {', '.join(unknown)}; its "
                                 f"parameters: {', '.join(declared_parameters(chapter))}.")
    known = set().union(*(declared_parameters(c) for c in CHAPTERS))
    unknown = sorted(set(common) - known)
    if unknown:
        raise ParameterError(f"Profile {path}: no chapter has the parameter(s) {', '.join(map(str, unknown))} of its "
                             f"'common' block (`lmdepth list -v` lists every chapter's parameters).")


@dataclass(frozen=True)
class ParamSpec:
    """One parameter of a chapter's ``parameters`` cell as papermill infers it: its name, type name, default
    (as written in the cell) and help (the comment beside it)."""

    name: str
    type_name: str
    default: str
    help: str


def declared_parameters(chapter: str) -> dict[str, ParamSpec]:
    """The chapter's ``parameters`` cell as papermill reads it: name → type, default and help."""
    source = chapter_source(chapter)
    return dict(_declared(source, source.stat().st_mtime_ns))


@functools.lru_cache(maxsize=64)
def _declared(source: Path, mtime_ns: int) -> dict[str, ParamSpec]:
    """:func:`declared_parameters`, read once per version of the source file (a profile check reads every chapter)."""
    import jupytext
    import nbformat
    import papermill

    nb = jupytext.read(source)
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "chapter.ipynb"
        nbformat.write(nb, p)
        found = papermill.inspect_notebook(str(p))
    return {k: ParamSpec(k, v["inferred_type_name"], v["default"], v["help"]) for k, v in found.items()}


#: The type papermill infers for a parameters cell's annotation (``remote: object`` declares none).
_DECLARED_TYPES = {"int": int, "float": float, "str": str, "bool": bool, "list": list, "dict": dict}


def check_parameters(chapter: str, params: dict[str, Any]) -> dict[str, Any]:
    """Reject unknown names, wrong types, ranges and choices before a kernel starts, by the chapter's declared types
    and its parameters classes (:data:`CHAPTER_PARAMS`). Returns the (possibly coerced) params."""
    spec = declared_parameters(chapter)
    out = {name: _typed(chapter, spec, name, value) for name, value in params.items()}
    # ranges and choices, by the analyses' own parameters classes (the shared vocabulary for the other pages)
    owner = {n: cls for cls in reversed(CHAPTER_PARAMS.get(chapter, (CommonParams,))) for n in cls.names()}
    for name, value in out.items():
        if name in owner:
            owner[name].check_known({name: value})
    if "device" in out:
        check_device(out["device"])  # before a kernel starts and a model loads
    model = out.get("model_name", spec["model_name"].default.strip("'\"") if "model_name" in spec else None)
    if model is not None:
        _check_models(model, out)
    if "results_dir" in out:
        check_results_dir(out["results_dir"])
    dataset = out.get("dataset")
    if isinstance(dataset, str) and dataset not in NAMED_DATASETS and (dataset.endswith((".jsonl", ".json"))
                                                                       or "/" in dataset):
        user_examples(Path(dataset).expanduser())  # missing, not a file, or a bad line: one line, no kernel
    return out


def _typed(chapter: str, spec: dict[str, Any], name: str, value: Any) -> Any:
    """One parameter checked against the chapter's declared names and types (a number given for a string becomes
    the string); one line naming the fix otherwise."""
    if name == "remote" and name not in spec and chapter in NOT_REMOTE:
        raise ParameterError(f"Chapter {chapter!r} does not run on NDIF: {NOT_REMOTE[chapter]} (it takes no "
                             "'remote' parameter).")
    if name not in spec:
        raise ParameterError(f"Chapter {chapter!r} has no parameter {name!r}. Parameters: {', '.join(spec)}.")
    declared = _DECLARED_TYPES.get(spec[name].type_name)
    if declared is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)  # "-p dataset 123" arrives as a number from YAML parsing
    if declared is str and isinstance(value, (dict, list)):
        raise ParameterError(f"Parameter {name!r} of chapter {chapter!r} must be a string, but the value was read "
                             f"as YAML {type(value).__name__} {value!r}. Quote it for YAML, e.g. "
                             f"-p {name} \"'Answer: 42'\".")
    if declared is not None:
        check_type(name, value, declared)
    half = lone_surrogate(value) if isinstance(value, str) else None
    if half is not None:  # no notebook can hold it: papermill's write would fail with a UnicodeEncodeError
        raise ParameterError(f"Parameter {name!r} of chapter {chapter!r} holds {half[1]} at character {half[0]}, half "
                             "of a UTF-16 surrogate pair (or a byte that is not UTF-8), which is no character and "
                             "which no notebook or tokenizer can take: give the value again without it.")
    return value


def _check_models(model: str, out: dict[str, Any]) -> None:
    """The model (and the models compared with it) exist, fit the route asked for and have whole weight files."""
    check_remote(model, out.get("remote", False))
    if out.get("remote") is True:
        preflight(model)  # an API key, the network, the model hosted, matching versions: before a kernel starts
    for m in [model, *out.get("compare_models", [])]:  # a typo in the last model stops here, not after hours
        if isinstance(m, str) and Path(m).expanduser().is_dir():
            if (Path(m).expanduser() / "config.json").exists():  # without one, the name's resolution says so below
                check_model_files(m)  # weights and a tokenizer: a folder with a config alone stops here
            check_weight_files(m)  # a cut weights file, named before a kernel starts (and before it is hashed)
        current_weights_id(m, remote=out.get("remote", False))


def parse_cli_value(raw: str, as_string: bool = False) -> Any:
    """``-p name value`` values are YAML: 5 → int, true → bool, "[a, b]" → list, anything else → str.

    ``as_string`` (a parameter the chapter declares as ``str``): the value as typed, so a path keeps a ``#`` or a
    ``: `` that YAML would read as a comment or a mapping; one pair of surrounding quotes is removed
    (``-p answer "'Answer: 42'"`` still works). An empty value stays the empty string (YAML would read it as null),
    e.g. ``-p checkpoint_dir ""``.
    """
    if as_string:
        quoted = len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\""
        return raw[1:-1] if quoted else raw
    if not raw.strip():
        return raw
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


class QuietKernelManager(AsyncKernelManager):
    """A kernel whose own stderr (ZMQ transport warnings, shutdown noise after Ctrl-C) goes to a log file instead
    of the user's terminal. Errors in cells still come back through the notebook; the log is at
    :func:`kernel_log`."""

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw: Any) -> None:
        kw["stderr"] = open(kernel_log(), "ab")  # noqa: SIM115 (the kernel process owns it until it exits)
        await super()._async_launch_kernel(kernel_cmd, **kw)

    _launch_kernel = _async_launch_kernel


class OrphanedKernelDeath(logging.Filter):
    """Drops asyncio's "Task exception was never retrieved" report of nbclient's ``DeadKernelError``.

    After Ctrl-C, nbclient shuts the kernel down while a cell task is still polling it; that task then fails with
    ``DeadKernelError`` and, never awaited, is logged with a traceback when it is garbage-collected (when depends on
    load). The interruption is reported once by the CLI; a kernel that really dies mid-run still reaches the caller
    through papermill, which awaits its task.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        from nbclient.exceptions import DeadKernelError

        return not (record.exc_info and isinstance(record.exc_info[1], DeadKernelError))


def quiet_orphaned_kernel_deaths() -> None:
    """Install :class:`OrphanedKernelDeath` on the ``asyncio`` logger once per process."""
    log = logging.getLogger("asyncio")
    if not any(isinstance(f, OrphanedKernelDeath) for f in log.filters):
        log.addFilter(OrphanedKernelDeath())


def kernel_log() -> Path:
    """Where the chapter kernels' own stderr goes."""
    return Path(tempfile.gettempdir()) / f"lmdepth-kernels-{os.getuid() if hasattr(os, 'getuid') else 0}.log"


def require_kernel(name: str = "python3") -> None:
    """Check that the Jupyter kernel the chapters run in exists in this environment (before papermill starts).

    Raises:
        MissingPackageError: no such kernel (ipykernel is not installed in this environment).
    """
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec(name)
    except NoSuchKernel:
        raise MissingPackageError(f"no Jupyter kernel {name!r} in this environment ({sys.executable}): install "
                                  f"ipykernel there (`{sys.executable} -m pip install ipykernel`) and run again.") from None


def execute_chapter(
    chapter: str,
    params: dict[str, Any],
    output: Path,
    cwd: Path | None = None,
    log_output: bool = False,
    progress_bar: bool = False,
) -> Path:
    """Execute a chapter with papermill into ``output`` (written atomically: only a finished run lands there).

    While it runs, the notebook is written beside ``output`` with the suffix ``.running.ipynb``; an interrupted or
    otherwise broken run removes it (a cut notebook is nothing to inspect).

    Raises:
        papermill.PapermillExecutionError: a cell failed; the failed notebook is kept at ``output`` with the
            suffix ``.failed.ipynb`` for inspection.
    """
    import jupytext
    import nbformat
    import papermill

    params = check_parameters(chapter, params)
    require_kernel()
    quiet_orphaned_kernel_deaths()
    nb = jupytext.read(chapter_source(chapter))
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / f"{CHAPTERS[chapter]}.ipynb"
        nbformat.write(nb, src)
        partial = output.with_name(output.stem + ".running.ipynb")
        try:
            papermill.execute_notebook(str(src), str(partial), parameters=params, cwd=str(cwd or REPO_ROOT),
                                       kernel_name="python3", log_output=log_output, progress_bar=progress_bar,
                                       kernel_manager_class=QuietKernelManager)
        except papermill.PapermillExecutionError:
            if partial.exists():
                os.replace(partial, output.with_name(output.stem + ".failed.ipynb"))  # kept for inspection
            raise
        except OSError as e:
            partial.unlink(missing_ok=True)  # a cut notebook is not a failed run to inspect
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise StorageFull(f"The disk filled while the executed notebook {partial} was written ({e.strerror}): "
                              f"free space under {output.parent} (or pass another results folder) and run the same "
                              "command again; every finished unit of the computation is checkpointed.") from None
        except BaseException:  # interrupted (Ctrl-C, a signal) or broken: no half-written page is left behind
            partial.unlink(missing_ok=True)
            raise
        os.replace(partial, output)
    return output
