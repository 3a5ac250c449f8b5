"""Parameter checks with messages that say which parameter, what was given and what is allowed.

Chapters call these right after their ``parameters`` cell, so a papermill or CLI run with a bad value stops
before any model is loaded.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .errors import ParameterError

_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true/false", list: "a list"}


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
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f"between {lo} and {hi}" if lo is not None and hi is not None else (f">= {lo}" if lo is not None else f"<= {hi}")
        raise ParameterError(f"Parameter {name!r} must be {bounds}, got {value!r}.")


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> None:
    choices = list(choices)
    if value not in choices:
        raise ParameterError(f"Parameter {name!r} must be one of {choices}, got {value!r}.")


def check_common(
    model_name: Any = "x", dataset: Any = "gsm8k", n_examples: Any = 1, seed: Any = 0, selection: Any = "random",
    device: Any = "cpu", dtype: Any = "float32", use_cache: Any = True, remote: Any = False,
    **_: Any,
) -> None:
    """Checks of the parameter vocabulary shared by every chapter."""
    check_type("model_name", model_name, str)
    check_type("dataset", dataset, str)
    check_type("n_examples", n_examples, int)
    check_range("n_examples", n_examples, 1, 100_000)
    check_type("seed", seed, int)
    check_choice("selection", selection, ["random", "first"])
    check_type("device", device, str)
    check_choice("dtype", dtype, ["float32", "bfloat16", "float16"])
    check_type("use_cache", use_cache, bool)
    check_type("remote", remote, bool)
