"""Operation chains: the depth score's positive control from scratch (chapter 07, "Can the depth score see depth grow?").

A question is a digit and k operations applied to it left to right, mod 10: ``7+3*3-4`` is ((7 + 3) · 3 − 4) mod 10
= 6. Each operation acts on the result of the ones before it: with multiplications among them, the answer is a
composition of k affine maps of the digits, which cannot be had by adding the operands at once (as chapter 07's
sums of small numbers can, in one parallel pass); composed one after the other, or pairwise, it takes a number of
steps that grows with k. That is what a depth score that can see sequential depth should rise with. The operations are ``+d`` and ``-d`` (d = 1 … 9) and
``*3``, ``*7``, ``*9``: each is a bijection of the ten digits, so no operation erases the ones before it and the
last one alone says nothing of the answer.

Every question of a split is left-padded with spaces to one width (the longest question of that split: 13
characters for k ≤ 6), so its length does not tell k, and the answer's position is the same for every k.

Chosen on 2026-12-03, before any depth of an operation-chain run was measured, after pointer chains
(:mod:`lmdepth.data.chains`, four designs) were not learned by any recipe tried (the chain claim's history, which
also gives the pilots of this task and the recipe chosen from them: :data:`lmdepth.scratch.training.CHAIN_TRAIN`).

Design rules (each checked by ``tests/test_op_chains.py`` with the independent solver :func:`solve`):

* the start digit uniform, each operation uniform among the 21 (``+1`` … ``+9``, ``-1`` … ``-9``, ``*3``, ``*7``,
  ``*9``), so the answer digit is uniform whatever k;
* k uniform in the split's lengths (1 … 6; the extrapolation split 7 and 8, longer than anything in training);
* the sampler uses the global ``random`` (seeded per split by :func:`lmdepth.data.dm_math.generate_split`, as the
  arithmetic modules are), so the same data key always gives the same problems.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from lmdepth.errors import DataError

#: The operations, each a bijection of the digits mod 10.
OPERATIONS = tuple(f"+{d}" for d in range(1, 10)) + tuple(f"-{d}" for d in range(1, 10)) + ("*3", "*7", "*9")
DESIGN = "a digit and k operations mod 10, left to right, left-padded to the split's width"
#: This book's operation-chain modules (the data's ``modules``): the lengths of each split, and its width.
OP_CHAIN_MODULES = {
    "op_chain": dict(lengths=(1, 2, 3, 4, 5, 6), width=13, design=DESIGN),
    "op_chain_longer": dict(lengths=(7, 8), width=17, design=DESIGN),
}
OP_CHAIN_EXTRAPOLATE = {"op_chain": "op_chain_longer"}
_QUESTION = re.compile(r" *([0-9])((?:[-+*][0-9])+)")


@dataclass(frozen=True)
class OpProblem:
    """One generated question and its digit (the shape of the arithmetic samplers' problems)."""

    question: str
    answer: int


def op_question(k: int, rng: random.Random, width: int = 0) -> OpProblem:
    """A digit and ``k`` operations, left-padded with spaces to ``width`` characters."""
    value = rng.randrange(10)
    text = str(value)
    for _ in range(k):
        op = rng.choice(OPERATIONS)
        value = (value + int(op[1]) if op[0] == "+" else value - int(op[1]) if op[0] == "-" else value * int(op[1])) % 10
        text += op
    return OpProblem(text.rjust(width), value)


def op_sampler(lengths: tuple[int, ...], width: int, design: str = DESIGN) -> Any:
    """A sampler of one module's questions (k uniform in ``lengths``), drawing from the global ``random``
    (``design``: only :data:`DESIGN` is generated; it is a parameter so that it enters the data's key)."""
    if design != DESIGN:
        raise DataError(f"operation chains are generated in the design {DESIGN!r}, not {design!r}")
    if 1 + 2 * max(lengths) > width:
        raise DataError(f"{max(lengths)} operations do not fit a width of {width} characters")

    def problem() -> OpProblem:
        rng = random.Random(random.getrandbits(64))
        return op_question(rng.choice(lengths), rng, width)

    return problem


def solve(question: str) -> tuple[int, int] | None:
    """(k, the answer) of an operation-chain question, computed with Python's own ``eval`` step by step; None if
    the question is no operation chain."""
    m = _QUESTION.fullmatch(question)
    if m is None:
        return None
    value, ops = int(m.group(1)), m.group(2)
    for i in range(0, len(ops), 2):
        value = eval(f"({value}){ops[i:i + 2]}") % 10  # noqa: S307 - a digit and an operator matched above
    return len(ops) // 2, value


__all__ = ["DESIGN", "OPERATIONS", "OP_CHAIN_EXTRAPOLATE", "OP_CHAIN_MODULES", "OpProblem", "op_question",
           "op_sampler", "solve"]
