"""DeepMind Mathematics for the from-scratch experiment (paper Fig. 9; book/method.md#method-moeut): generation and cache.

Introduced in chapter 07 (MoEUT vs a standard Transformer). The data come from the ``mathematics-dataset``
generator (DeepMind, Apache-2.0; ``pip install mathematics-dataset==1.0.1``), run here instead of downloading the
v1.0 tarball:

* train: the chosen arithmetic modules at the three training difficulties (train-easy/medium/hard, a third each,
  as ``generate.py --train_split`` does); eval: the same modules' ``interpolate`` split and their ``extrapolate``
  counterparts (``*_big``, ``*_longer``; :data:`EXTRAPOLATE`).
* text: ``" Q: {q} A:"`` + ``" {a}"`` (book/method.md#method-data); one problem per row, BOS first, EOS after the answer, so greedy
  decoding knows where the answer ends and teacher-forced argmax over the answer (EOS included) equals greedy
  exact match.
* tokenizer: characters (:mod:`lmdepth.data.dm_tokens`).
* cache: one directory per (modules, sizes, seed, generator version) with the examples as JSONL and a sidecar.

The generator does not import on current sympy/numpy. :func:`patch_mathematics_dataset` applies four run-time fixes
without editing the installed package (book/method.md#method-data).

Copyright notice for the run-time fixes: they adapt code of ``mathematics_dataset``,
Copyright 2018 DeepMind Technologies Limited, licensed under the Apache License, Version 2.0
(http://www.apache.org/licenses/LICENSE-2.0). Distributed on an "AS IS" BASIS, WITHOUT WARRANTIES OR CONDITIONS OF
ANY KIND. The changes: ``base_solution_linear`` re-attached to ``sympy.solvers.diophantine``; a numpy stand-in
with ``object`` and ``itemset`` for ``mathematics_dataset.sample.polynomials``; integral floats accepted by
``random.randint`` inside ``mathematics_dataset.modules.numbers``.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import json
import random
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lmdepth.data.chains import CHAIN_EXTRAPOLATE, CHAIN_MODULES, chain_sampler, hops
from lmdepth.data.op_chains import OP_CHAIN_EXTRAPOLATE, OP_CHAIN_MODULES, op_sampler
from lmdepth.errors import DataError, MissingPackageError
from lmdepth.results import atomic_write_text

#: Version of the generation procedure below; part of the cache key.
DATA_VERSION = 1
#: Interpolate module -> its extrapolation counterpart in ``arithmetic.test_extra()``.
EXTRAPOLATE = {
    "add_or_sub": "add_or_sub_big",
    "mul": "mul_big",
    "div": "div_big",
    "add_sub_multiple": "add_sub_multiple_longer",
    "mul_div_multiple": "mul_div_multiple_longer",
    "mixed": "mixed_longer",
    "add_sub_multiple_small": "add_sub_multiple_small_longer",  # this book's variant (SMALL_MODULES)
    **CHAIN_EXTRAPOLATE,  # the depth score's positive control: pointer chains (lmdepth.data.chains), not learned
    **OP_CHAIN_EXTRAPOLATE,  # … and operation chains (lmdepth.data.op_chains), its task since 2026-12-03
}
#: Modules of this book built from the generator's own expression sampler (``sample.arithmetic.arithmetic``) with
#: smaller numbers, for models small enough to train on a CPU (chapter 07). ``add_sub_multiple_small``: an
#: ``add_sub_multiple`` question whose answer is uniform in [−49, 49] (99 values, so a constant answer is right ~1 %
#: of the time), operands from entropy 1 (mostly one digit, one operand near the answer) and 2, 3 or 4 operations,
#: in the generator's five question templates; its extrapolation split ``add_sub_multiple_small_longer`` has 5 or 6
#: operations, as ``*_longer`` adds operations. Every split draws from the same distribution (no easy/medium/hard
#: levels). The settings are part of the data's cache key and of every run key.
SMALL_MODULES = {
    "add_sub_multiple_small": dict(value_range=49, entropy=1.0, lengths=(2, 3, 4)),
    "add_sub_multiple_small_longer": dict(value_range=49, entropy=1.0, lengths=(5, 6)),
}
#: ``add_sub_multiple``'s question templates in the generator (``modules/arithmetic._calculate``).
_TEMPLATES = ("{op}", "What is {op}?", "Evaluate {op}.", "Calculate {op}.", "What is the value of {op}?")

#: The book's default: the multi-step modules of the paper's four probes, plus ``mixed``. Their answers are small
#: numbers, so a ~1M-parameter model can learn them on a CPU; ``add_or_sub``/``mul`` interpolate on 10-digit operands.
DEFAULT_MODULES = ("add_sub_multiple", "mul_div_multiple", "mixed")
#: Every module of ``arithmetic`` (the authors' filter is probably ``arithmetic__.*``: an inference, not stated by the paper).
ARITHMETIC_MODULES = ("add_or_sub", "add_or_sub_in_base", "add_sub_multiple", "div", "mixed", "mul", "mul_div_multiple",
                      "nearest_integer_root", "simplify_surd")
TRAIN_LEVELS = ("train-easy", "train-medium", "train-hard")

#: The paper's four DM-math probe problems (book/method.md#method-data), as (question, answer).
PROBES = (
    ("What is ((-14)/(-6))/(1162/(-4980))?", "-10"),
    ("What is the value of -24 + -10 + 22 + 1 + 1 + 25?", "-15"),
    ("What is 1 - 3 - (63 + 7 - 60)?", "-12"),
    ("(10/3)/((-8)/16)*(-90)/(-75)", "-8"),
)
#: The example whose position-mean residual the authors' MoEUT erasure script uses as the erasure value (book/method.md#method-erasure).
ERASURE_REFERENCE = (
    "Simplify 5 + -2*(sqrt(180)*1*2 - sqrt(180)) + 4 + (sqrt(180)*2 + -4 - sqrt(180)) + 4.",
    "-6*sqrt(5) + 9",
)


def prompt_text(question: str) -> str:
    """The prompt part of one example: ``" Q: {q} A:"``."""
    return f" Q: {question} A:"


def answer_text(answer: str) -> str:
    """The answer part: ``" {a}"``."""
    return f" {answer}"


# ---- the run-time fixes ---------------------------------------------------------------------------------------

class _ItemsetArray(np.ndarray):
    """ndarray with the ``itemset`` method numpy 2 removed (used by ``polynomials``)."""

    def itemset(self, *args: Any) -> None:
        if len(args) == 1:
            self.flat[0] = args[0]
        else:
            *index, value = args
            if len(index) == 1 and isinstance(index[0], (int, np.integer)):
                self.flat[index[0]] = value
            else:
                self[tuple(index[0]) if len(index) == 1 else tuple(index)] = value


class _NumpyShim:
    """Delegates to numpy, plus ``np.object`` and ``zeros``/``empty`` returning :class:`_ItemsetArray`."""

    object = object

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    @staticmethod
    def zeros(*args: Any, **kwargs: Any) -> np.ndarray:
        return np.zeros(*args, **kwargs).view(_ItemsetArray)

    @staticmethod
    def empty(*args: Any, **kwargs: Any) -> np.ndarray:
        return np.empty(*args, **kwargs).view(_ItemsetArray)


class _RandomShim:
    """Delegates to the global ``random`` module (so seeding it still works); ``randint`` takes integral floats."""

    def __getattr__(self, name: str) -> Any:
        return getattr(random, name)

    @staticmethod
    def randint(a: Any, b: Any) -> int:
        return random.randint(int(a), int(b))


_PATCHED = False


def patch_mathematics_dataset() -> None:
    """Make ``mathematics_dataset`` 1.0.1 importable and working on current sympy/numpy (idempotent).

    Raises:
        MissingPackageError: the package is not installed.
    """
    global _PATCHED
    if _PATCHED:
        return
    try:
        import mathematics_dataset  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise MissingPackageError(
            "The DeepMind Mathematics generator is not installed: pip install mathematics-dataset==1.0.1"
        ) from e
    # (1) sympy moved base_solution_linear into a submodule of the diophantine package.
    dio = importlib.import_module("sympy.solvers.diophantine")
    if not hasattr(dio, "base_solution_linear"):
        dio.base_solution_linear = importlib.import_module("sympy.solvers.diophantine.diophantine").base_solution_linear
    # (2) + (3) np.object and ndarray.itemset are gone in numpy 2.
    polynomials = importlib.import_module("mathematics_dataset.sample.polynomials")
    polynomials.np = _NumpyShim()
    # (4) Python 3.12's random.randint rejects integral floats.
    numbers = importlib.import_module("mathematics_dataset.modules.numbers")
    numbers.random = _RandomShim()
    _PATCHED = True


def _arithmetic() -> Any:
    patch_mathematics_dataset()
    return importlib.import_module("mathematics_dataset.modules.arithmetic")


def small_module_settings(modules: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The :data:`SMALL_MODULES` settings of ``modules`` and of their extrapolation splits ({} for the generator's
    own modules): what a cache key must hold so that changed settings are never served stale data."""
    own = SMALL_MODULES | CHAIN_MODULES | OP_CHAIN_MODULES
    names = [n for m in modules for n in (m, EXTRAPOLATE.get(m)) if n in own]
    return {n: {k: list(v) if isinstance(v, tuple) else v for k, v in own[n].items()} for n in names}


@dataclass(frozen=True)
class _Problem:
    question: str
    answer: int


def _small_add_sub(value_range: int, entropy: float, lengths: tuple[int, ...]) -> Any:
    """A sampler of :data:`SMALL_MODULES` questions (uses the global ``random``, seeded by the caller)."""
    sample = importlib.import_module("mathematics_dataset.sample.arithmetic")

    def problem() -> _Problem:
        value, length = random.randint(-value_range, value_range), random.choice(lengths)
        op = sample.arithmetic(value=value, entropy=entropy, length=length, add_sub=True, mul_div=False)
        return _Problem(random.choice(_TEMPLATES).format(op=op), value)
    return problem


def module_generators(split: str, modules: Sequence[str]) -> dict[str, Any]:
    """Problem samplers of the arithmetic ``modules`` for one split.

    Args:
        split: ``train-easy``/``train-medium``/``train-hard``, ``interpolate`` or ``extrapolate``.
        modules: interpolate names (e.g. ``"add_or_sub"``); for ``extrapolate`` they are mapped through
            :data:`EXTRAPOLATE`, and modules without an extrapolation split (``simplify_surd``, …) are left out.

    Returns:
        ``{module name as stored: callable returning a Problem}``.
    """
    if split not in (*TRAIN_LEVELS, "interpolate", "extrapolate"):
        raise DataError(f"Unknown split {split!r}: use one of {[*TRAIN_LEVELS, 'interpolate', 'extrapolate']}.")
    for own, sampler in ((CHAIN_MODULES, chain_sampler), (OP_CHAIN_MODULES, op_sampler)):  # no generator needed
        chains = [m for m in modules if m in own]
        if chains:
            if len(chains) != len(modules):
                raise DataError(f"The chain modules {chains} cannot be mixed with other modules in one run.")
            names = [EXTRAPOLATE[m] if split == "extrapolate" else m for m in modules]
            return {n: sampler(**own[n]) for n in names}
    arith = _arithmetic()
    gen = importlib.import_module("mathematics_dataset.generate")
    small = [m for m in modules if m in SMALL_MODULES]
    if small:
        if len(small) != len(modules):
            raise DataError(f"Modules {small} (this book's small-number variants) cannot be mixed with the generator's "
                            f"own modules {[m for m in modules if m not in SMALL_MODULES]} in one run.")
        names = [EXTRAPOLATE[m] if split == "extrapolate" else m for m in modules]
        return {n: _small_add_sub(**SMALL_MODULES[n]) for n in names}
    if split in TRAIN_LEVELS:
        table = arith.train(gen._make_entropy_fn(TRAIN_LEVELS.index(split), 3))
        names = list(modules)
    elif split == "interpolate":
        table, names = arith.test(), list(modules)
    else:  # extrapolate
        table = arith.test_extra()
        names = [EXTRAPOLATE[m] for m in modules if m in EXTRAPOLATE]
        if not names:
            raise DataError(f"None of {list(modules)} has an extrapolation split; modules with one: {sorted(EXTRAPOLATE)}.")
    unknown = [n for n in names if n not in table]
    if unknown:
        raise DataError(f"Unknown arithmetic module(s) {unknown}; available: {sorted(table)}.")
    return {n: table[n] for n in names}


def sample_problem(module: Any) -> tuple[str, str]:
    """One (question, answer) pair, dropping overlong ones like the generator's ``sample_from_module``."""
    settings = importlib.import_module("mathematics_dataset.generate_settings")
    while True:
        problem = module()
        q, a = str(problem.question), str(problem.answer)
        if len(q) <= settings.MAX_QUESTION_LENGTH and len(a) <= settings.MAX_ANSWER_LENGTH:
            return q, a


# ---- examples and the cache -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MathExample:
    """One problem: ``module`` is the generator's module name (e.g. ``add_sub_multiple_longer``)."""

    question: str
    answer: str
    module: str
    split: str

    @property
    def prompt(self) -> str:
        return prompt_text(self.question)

    @property
    def target(self) -> str:
        return answer_text(self.answer)

    @property
    def n_operations(self) -> int | None:
        """Arithmetic operations (:func:`n_operations`), or, for a pointer-chain question, its hops."""
        return hops(self.question) if self.module in CHAIN_MODULES else n_operations(self.question)


def generate_split(split: str, modules: Sequence[str], n_per_module: int, seed: int,
                   train_levels: Sequence[str] = TRAIN_LEVELS) -> list[MathExample]:
    """Generate ``n_per_module`` problems per module; ``split="train"`` splits them evenly over ``train_levels``
    (default: easy, medium and hard, a third each, as the v1.0 release).

    Seeds ``random`` and ``np.random`` (the generator uses both) from (seed, level), so every split is reproducible
    on its own.
    """
    levels = tuple(train_levels) if split == "train" else (split,)
    out: list[MathExample] = []
    for li, level in enumerate(levels):
        n = n_per_module // len(levels) + (1 if li < n_per_module % len(levels) else 0)
        digest = int(hashlib.sha256(f"{seed}:{level}".encode()).hexdigest()[:8], 16)
        random.seed(digest)
        np.random.seed(digest)
        for name, module in module_generators(level, modules).items():
            for _ in range(n):
                q, a = sample_problem(module)
                out.append(MathExample(q, a, name, split))
    return out


@dataclass
class MathData:
    """A generated, cached data set.

    Attributes:
        train, interpolate, extrapolate: the examples of each split.
        meta: parameters, seed, generator version, wall time.
        path: cache directory.
    """

    train: list[MathExample]
    interpolate: list[MathExample]
    extrapolate: list[MathExample]
    meta: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    def split(self, name: str) -> list[MathExample]:
        return getattr(self, name)

    @property
    def generator(self) -> str:
        """The generator that made the problems (the mathematics_dataset package and its version)."""
        return str(self.meta["generator"])


def _write_jsonl(path: Path, examples: list[MathExample]) -> None:
    atomic_write_text(path, "".join(json.dumps(asdict(e)) + "\n" for e in examples))


def _read_jsonl(path: Path) -> list[MathExample]:
    return [MathExample(**json.loads(line)) for line in path.read_text().splitlines() if line]


def data_key(modules: Sequence[str], n_train_per_module: int, n_eval_per_module: int, seed: int,
             train_levels: Sequence[str] = TRAIN_LEVELS) -> str:
    params = dict(modules=list(modules), n_train=n_train_per_module, n_eval=n_eval_per_module, seed=seed,
                  version=DATA_VERSION)
    settings = small_module_settings(modules)
    if settings:  # the release's modules: keys as before
        params["settings"] = settings
    if tuple(train_levels) != TRAIN_LEVELS:
        params["train_levels"] = list(train_levels)
    blob = json.dumps(params, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def load_or_generate(
    cache_dir: str | Path,
    modules: Sequence[str] = DEFAULT_MODULES,
    n_train_per_module: int = 20_000,
    n_eval_per_module: int = 250,
    seed: int = 0,
    train_levels: Sequence[str] = TRAIN_LEVELS,
) -> MathData:
    """Generate the data once and cache it under ``cache_dir/dm_math/<key>/``; later calls read the cache.

    Training problems whose question also occurs in an evaluation split are dropped (a handful for easy modules).
    ``train_levels`` restricts training to some difficulties (e.g. ``("train-easy",)`` for a small CPU budget).
    """
    unknown = [lv for lv in train_levels if lv not in TRAIN_LEVELS]
    if unknown or not train_levels:
        raise DataError(f"train_levels must be a non-empty subset of {list(TRAIN_LEVELS)}, got {list(train_levels)}.")
    d = Path(cache_dir) / "dm_math" / data_key(modules, n_train_per_module, n_eval_per_module, seed, train_levels)
    files = {s: d / f"{s}.jsonl" for s in ("train", "interpolate", "extrapolate")}
    if (d / "meta.json").exists() and all(p.exists() for p in files.values()):
        return MathData(**{s: _read_jsonl(p) for s, p in files.items()}, meta=json.loads((d / "meta.json").read_text()),
                        path=d)
    t0 = time.time()
    interp = generate_split("interpolate", modules, n_eval_per_module, seed)
    extra = generate_split("extrapolate", modules, n_eval_per_module, seed)
    held_out = {e.question for e in interp + extra}
    train_all = generate_split("train", modules, n_train_per_module, seed, train_levels)
    train = [e for e in train_all if e.question not in held_out]
    from importlib import metadata

    meta = dict(modules=list(modules), n_train_per_module=n_train_per_module, n_eval_per_module=n_eval_per_module,
                seed=seed, train_levels=list(train_levels), data_version=DATA_VERSION, generator=f"mathematics-dataset {metadata.version('mathematics-dataset')}",
                n_train=len(train), n_train_dropped_overlap=len(train_all) - len(train), n_interpolate=len(interp),
                n_extrapolate=len(extra), format='" Q: {q} A:" + " {a}"', wall_time_s=round(time.time() - t0, 2))
    for s, ex in (("train", train), ("interpolate", interp), ("extrapolate", extra)):
        _write_jsonl(files[s], ex)
    atomic_write_text(d / "meta.json", json.dumps(meta, indent=2))
    return MathData(train, interp, extra, meta, d)


# ---- problem complexity ------------------------------------------------------------------------------------------

_EXPR = re.compile(r"[-+*/()0-9. ]+")


def n_operations(question: str) -> int | None:
    """Number of binary arithmetic operations (+ − × ÷) in the longest arithmetic expression of a question.

    Unary minus (``-24``, ``(-14)``) is not an operation. Worded problems (``"Add 3 and 5."``, ``"Divide 6 by 2"``)
    count one operation. Returns None when the question holds no parsable expression.

    >>> n_operations("What is the value of -24 + -10 + 22 + 1 + 1 + 25?")
    5
    """
    candidates = sorted((m.group().strip() for m in _EXPR.finditer(question)), key=len, reverse=True)
    for expr in candidates:
        expr = expr.rstrip(".").strip()
        try:
            tree = ast.parse(expr, mode="eval")
        except SyntaxError:
            continue
        n = sum(isinstance(node, ast.BinOp) for node in ast.walk(tree))
        if n:
            return n
        break
    words = ("add", "sum", "plus", "minus", "subtract", "take away", "less than", "total", "product", "times",
             "multiply", "divide", "divided", "difference", "distance", "put together")
    return 1 if any(w in question.lower() for w in words) else None





__all__ = ["DEFAULT_MODULES", "ARITHMETIC_MODULES", "SMALL_MODULES", "EXTRAPOLATE", "PROBES", "ERASURE_REFERENCE", "MathExample", "MathData",
           "load_or_generate", "generate_split", "n_operations", "patch_mathematics_dataset",
           "prompt_text", "answer_text"]
