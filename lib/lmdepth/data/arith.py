"""Synthetic arithmetic chains: a difficulty ladder the small packaged models can climb (chapter 05).

The multi-hop sets of :mod:`lmdepth.data.multihop` are built to be hard (distractor chains, hard negatives), and
the packaged 135M–500M models solve them at chance, so their difficulty never engages the model's computation. This
ladder is the plainest compositional task with a known number of steps: a chain of k single-digit additions and
subtractions, every intermediate value inside 0–9, shown after eight worked examples with the same k::

    3 + 4 - 2 = 5
    ...                      (eight worked examples)
    8 - 3 + 1 = |6           (the prompt ends with "= "; the answer is the digit "6")

* k = 1 … 5 operations (``meta["level"]`` = k). Measured on 30 items per rung before this ladder was adopted, the
  three packaged models answer k = 1 at 47–100 % and fall to the 10 % chance level by k = 3–4.
* Answers are one digit, balanced over 0–9 (each run of ten items uses every digit once, in a shuffled order), so
  always giving the same answer scores 10 %.
* The prompt ends with ``"= "`` and the answer is the digit alone: in the packaged tokenizers a space before a digit
  is a token of its own, so the answer is exactly one token after the prompt (checked by
  :func:`lmdepth.data.multihop.one_token_answers` before a run).
* The worked examples have the same k as the question, so the prompt grows with k (about 27 tokens per step):
  a change of depth with k is confounded with length, and the chapter reports the lengths per rung.
* Everything is seeded per (seed, k): item i has its own random stream and the answers another, so item i does not
  depend on how many items are drawn (a larger sample extends a smaller one; an id always names the same question).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from lmdepth.data.datasets import Example
from lmdepth.data.multihop import DIGITS, balanced_answers
from lmdepth.errors import ParameterError

KIND = "arith"
MAX_OPS = 5
N_SHOTS = 8


def chain(rng: random.Random, k: int) -> tuple[str, int]:
    """A chain of ``k`` operations on single digits: ``("3 + 4 - 2", 5)``; every partial result lies in 0–9."""
    v = rng.randint(0, 9)
    text = str(v)
    for _ in range(k):
        ups = [d for d in range(1, 10) if v + d <= 9]
        downs = [d for d in range(1, 10) if v - d >= 0]
        op = rng.choice([o for o, ok in (("+", ups), ("-", downs)) if ok])
        d = rng.choice(ups if op == "+" else downs)
        v = v + d if op == "+" else v - d
        text += f" {op} {d}"
    return text, v


def chain_with_value(rng: random.Random, k: int, value: int) -> str:
    """A random chain of ``k`` operations whose result is ``value`` (rejection sampling; ~10 draws on average)."""
    while True:
        text, v = chain(rng, k)
        if v == value:
            return text


def evaluate(text: str) -> int:
    """The value of a chain, read left to right (the tests' independent solver)."""
    tokens = text.split()
    v = int(tokens[0])
    for op, d in zip(tokens[1::2], tokens[2::2]):
        v = v + int(d) if op == "+" else v - int(d)
    return v


def generate_examples(levels: Sequence[int], n_per_level: int, seed: int = 0) -> list[Example]:
    """``n_per_level`` questions with k operations for each k in ``levels``.

    Returns:
        Examples with id ``"synthetic-arith/k2/7"``, prompt (worked examples, then the question ending in ``"= "``),
        answer (one digit) and ``meta`` = ``{"level": k, "hops": k, "kind": "arith", "synthetic": True}``.
    """
    out: list[Example] = []
    for k in levels:
        if not 1 <= k <= MAX_OPS:
            raise ParameterError(f"Arithmetic chains have 1 to {MAX_OPS} operations, got {k}.")
        answers = balanced_answers(n_per_level, DIGITS, random.Random(f"lmdepth-arith:{seed}:{k}:answers"))
        for i, answer in enumerate(answers):
            rng = random.Random(f"lmdepth-arith:{seed}:{k}:{i}")
            shots = "".join(f"{t} = {v}\n" for t, v in (chain(rng, k) for _ in range(N_SHOTS)))
            question = chain_with_value(rng, k, int(answer))
            out.append(Example(f"synthetic-{KIND}/k{k}/{i}", f"{shots}{question} = ", answer,
                               {"level": k, "hops": k, "kind": KIND, "synthetic": True}))
    return out
