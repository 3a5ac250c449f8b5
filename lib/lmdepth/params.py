"""Typed parameters: one dataclass per analysis, validated in one place.

Every analysis's ``run`` builds its parameters object first, so a papermill, CLI or library call with a bad value
stops before any model is loaded, with a message that says which parameter, what was given and what is allowed.
The CLI checks a chapter's ``-p`` values through the same classes (:func:`check_known`).

A field declares its constraints with :func:`param`::

    n_examples: int = param(20, lo=1, hi=100_000, help="problems")

and its type through the annotation (``int``, ``float``, ``str``, ``bool``, ``list[str]``, ``list[float]`` …).
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

import torch

from lmdepth.errors import ParameterError
from lmdepth.runtime import REPO_ROOT

DTYPE_NAMES = ("float32", "bfloat16", "float16")
_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true/false", list: "a list"}
P = TypeVar("P", bound="Params")


def check_type(name: str, value: Any, expected: type | tuple[type, ...]) -> None:
    """Raise :class:`ParameterError` unless ``value`` has the expected type (bool is not accepted as int)."""
    types = expected if isinstance(expected, tuple) else (expected,)
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if float in types and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        want = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types)
        raise ParameterError(f"Parameter {name!r} must be {want}, got {value!r} ({type(value).__name__}).")


def check_range(name: str, value: float, lo: float | None = None, hi: float | None = None) -> None:
    """Raise :class:`ParameterError` unless ``lo <= value <= hi`` (a bound left ``None`` is open)."""
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f"between {lo} and {hi}" if lo is not None and hi is not None else (f">= {lo}" if lo is not None else f"<= {hi}")
        raise ParameterError(f"Parameter {name!r} must be {bounds}, got {value!r}.")


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> None:
    """Raise :class:`ParameterError` unless ``value`` is one of ``choices``."""
    choices = list(choices)
    if value not in choices:
        raise ParameterError(f"Parameter {name!r} must be one of {choices}, got {value!r}.")


def param(default: Any, help: str = "", choices: Iterable[Any] | None = None, lo: float | None = None,
          hi: float | None = None, nullable: bool = False) -> Any:
    """A dataclass field with its constraints (checked by :meth:`Params.validate`). ``choices`` and the bounds
    apply to every element of a list."""
    meta = {"help": help, "choices": tuple(choices) if choices is not None else None, "lo": lo, "hi": hi,
            "nullable": nullable}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return field(default=default, metadata=meta)


def param_of(cls: type[Params], name: str) -> Any:
    """A field declared like the field ``name`` of another :class:`Params` class (same default, constraints and help):
    a parameter one analysis passes on to another (chapter 04's tuned-lens budget) is declared once, by the analysis
    that uses it."""
    f = next(f for f in fields(cls) if f.name == name)
    default = f.default_factory() if f.default is dataclasses.MISSING else f.default
    return param(default, **{k: f.metadata[k] for k in ("help", "choices", "lo", "hi", "nullable")})


def _check_value(name: str, value: Any, hint: Any, meta: dict[str, Any]) -> None:
    if value is None and meta.get("nullable"):
        return
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):  # X | None: check against the non-None member
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None and len(args) < len(typing.get_args(hint)):
            return
        if len(args) == 1:
            return _check_value(name, value, args[0], meta)
        check_type(name, value, tuple(typing.get_origin(a) or a for a in args))
    elif origin in (list, tuple):
        check_type(name, value, (list, tuple))
        (elem,) = typing.get_args(hint)[:1] or (Any,)
        for v in value:
            _check_value(f"{name}[]", v, elem, meta)
        return
    elif hint in (int, float, str, bool):
        check_type(name, value, hint)
    if meta.get("choices") is not None:
        check_choice(name, value, meta["choices"])
    if meta.get("lo") is not None or meta.get("hi") is not None:
        check_range(name, value, meta.get("lo"), meta.get("hi"))


@dataclass(frozen=True)
class Params:
    """Base of every analysis's parameters: validation from the fields' annotations and :func:`param` metadata."""

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def _hints(cls) -> dict[str, Any]:
        return typing.get_type_hints(cls)

    def validate(self) -> None:
        hints = self._hints()
        for f in fields(self):
            _check_value(f.name, getattr(self, f.name), hints[f.name], dict(f.metadata))
        for cls in reversed(type(self).__mro__):  # every class's own checks, base classes first (no super() needed)
            own = cls.__dict__.get("check_consistency")
            if own is not None:
                own(self)

    def check_consistency(self) -> None:
        """Constraints between fields and with the machine (define in a subclass; each class's own runs)."""

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def check_known(cls, values: dict[str, Any]) -> None:
        """Validate the given values of this class's fields (others are ignored): the CLI's check."""
        hints = cls._hints()
        for f in fields(cls):
            if f.name in values:
                _check_value(f.name, values[f.name], hints[f.name], dict(f.metadata))

    @classmethod
    def of(cls: type[P], params: P | str | None = None, **kwargs: Any) -> P:
        """``params`` if given (then ``kwargs`` override its fields), else a new object from ``kwargs``.

        A string ``params`` is the model name (``run("smollm2-135m", n_examples=5)``).
        """
        if isinstance(params, str):
            params, kwargs = None, {"model_name": params, **kwargs}
        if params is None:
            unknown = set(kwargs) - set(cls.names())
            if unknown:
                raise ParameterError(f"Unknown parameter(s) {sorted(unknown)} for {cls.__name__}; "
                                     f"parameters: {', '.join(cls.names())}.")
            return cls(**kwargs)
        return dataclasses.replace(params, **kwargs) if kwargs else params

    def asdict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def check_device(device: str) -> None:
    """A device this machine has: ``cpu``, ``auto``, ``cuda``/``cuda:N`` only where CUDA is available, ``mps`` on
    Apple silicon."""
    if device in ("cpu", "auto"):
        return
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ParameterError(f"Parameter 'device' is {device!r} but this machine has no CUDA GPU. Use 'cpu', or "
                                 "'auto' (a GPU where there is one).")
        idx = device.partition(":")[2]
        if idx and (not idx.isdigit() or int(idx) >= torch.cuda.device_count()):
            raise ParameterError(f"Parameter 'device' is {device!r}; this machine has {torch.cuda.device_count()} "
                                 "CUDA device(s).")
        return
    if device == "mps" and torch.backends.mps.is_available():
        return
    raise ParameterError(f"Parameter 'device' must be 'cpu', 'auto', 'cuda' or 'cuda:N' (or 'mps' on Apple silicon), "
                         f"got {device!r}.")


def check_remote_mode(remote: Any) -> None:
    """``remote`` is false (here), true (NDIF) or ``"local"`` (the strict offline simulation of NDIF)."""
    if not (remote is False or remote is True or remote == "local"):
        raise ParameterError(f"Parameter 'remote' must be false (run here), true (NDIF) or 'local' (the offline "
                             f"simulation of NDIF), got {remote!r}.")


def check_remote(model_name: str, remote: bool | str) -> None:
    """A valid ``remote`` mode; ``remote=True`` needs a hub id: NDIF runs models from the Hugging Face hub, not local
    files."""
    check_remote_mode(remote)
    if remote is True and (model_name.count("/") != 1 or Path(model_name).expanduser().exists()):
        raise ParameterError(f"remote=True runs a Hugging Face hub id (e.g. 'meta-llama/Llama-3.1-70B') on NDIF; "
                             f"{model_name!r} is not one. Packaged models and local directories run here: "
                             "use remote=False.")


def check_results_dir(results_dir: str | Path) -> None:
    """The results directory is a directory (or can be made one) and writable, and not a folder whose other contents
    runs and ``clean`` would share: the filesystem root, the home folder or the repository's root (links resolved)."""
    path = Path(results_dir).expanduser()
    real = path.resolve()
    for name, where in (("the filesystem root", Path("/")), ("your home folder", Path.home()),
                        ("the repository's root", REPO_ROOT)):
        if real == where.resolve():
            shown = str(path) if real == path.absolute() else f"{path} (which resolves to {real})"
            raise ParameterError(f"Parameter 'results_dir' is {shown}, {name}: results go into a folder of their own. "
                                 "Choose one such as ./lmdepth-results.")
    existing = next((q for q in (path, *path.parents) if q.exists()), None)
    if path.exists() and not path.is_dir():
        raise ParameterError(f"Parameter 'results_dir' is {str(path)!r}, which is a file, not a directory. Choose a "
                             "directory (it is created if missing).")
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        raise ParameterError(f"Parameter 'results_dir': {str(existing)!r} is not writable, so results cannot be saved "
                             "there. Choose a directory you can write to.")


@dataclass(frozen=True)
class ModelParams(Params):
    """Where and how the model runs, and where results go."""

    model_name: str = param("smollm2-135m", help="packaged short name, hub id or local directory")
    seed: int = param(0, lo=0, hi=2**32 - 1, help="seed of every random choice (0 to 2**32 - 1, numpy's range)")
    device: str = param("auto", help="'auto' (a GPU where there is one), 'cpu', 'cuda', 'cuda:1' …")
    dtype: str = param("float32", choices=DTYPE_NAMES, help="model weights' dtype")
    results_dir: str | Path = param("results", help="root of the results cache")
    use_cache: bool = param(True, help="reuse finished runs and checkpoints; False recomputes")
    n_boot: int = param(1000, lo=10, hi=1_000_000, help="bootstrap resamples for the intervals")

    def check_consistency(self) -> None:
        check_device(self.device)
        check_results_dir(self.results_dir)


@dataclass(frozen=True)
class CommonParams(ModelParams):
    """The vocabulary shared by the chapters that read a data set of texts."""

    dataset: str = param("gsm8k", help="'gsm8k', 'math' or a .jsonl file")
    n_examples: int = param(20, lo=1, hi=100_000, help="number of examples")
    selection: str = param("random", choices=("random", "first"), help="seeded random sample or the first N")
    remote: bool | str = param(False, help="false: here; true: on NDIF (hub ids only); 'local': the offline "
                                            "simulation of NDIF")

    def check_consistency(self) -> None:
        check_remote(self.model_name, self.remote)
