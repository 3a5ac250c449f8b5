"""Pointer chains: the depth score's positive control from scratch (chapter 07, "Can the depth score see depth grow?").

A question is a list of assignments, several chains interleaved, and a query, e.g. ``"q=7;x=4;c=q;h=c;...
What is h?"`` with answer ``"7"``: the queried variable names another, which names another, …, until a digit. The
number of hops k is the length of that chain (``q=7``, ``c=q``, ``h=c``: k = 3). Each hop needs the previous
one's result — which variable to look up next is known only once the last lookup is done — so a model answering
it must chain k lookups. That is what a sum of small numbers (chapter 07's arithmetic, computable in one parallel
pass) does not force, and what a depth score that can see sequential depth should rise with.

Each chain is written in the order it is defined (a variable is assigned before it is used; the chains' lines are
interleaved at random), so a model reading left to right can resolve every assignment where it stands, one hop
per step of depth. The first design shuffled all lines, so a line could use a variable assigned only later: under
a causal mask such a line cannot be resolved where it stands, and every lookup had to run at the query. It was not
learned — seed 0 stood at 23 % exact match at step 9,000 of 30,000, where guessing among the digits present
scores about 25 % — and was replaced on 2026-12-01, before any depth of a chain run was measured (:data:`ORDER`
is part of the data's key).

Design rules (each checked by ``tests/test_chains.py`` with the independent solver :func:`hops`):

* every question has :data:`STATEMENTS` assignments whatever k (distractor chains fill up), so its length does not
  change with k;
* every variable is assigned before it is used (each chain in order, the chains interleaved at random);
* every chain ends in its own digit (distinct in a question), so the answer digit occurs once and a model cannot
  answer by picking "the" digit: it must find which chain the query belongs to;
* distractor chains have 1 … 4 hops (for k ≥ 5 the queried chain is the only longer one, which does not give its
  digit away: finding its end still takes k lookups); longer queried chains leave fewer other chains, so guessing
  among the digits present gets easier with k (about 20 % at k = 1, 35 % at k = 6, 42 % at k = 8);
* the variables are distinct lowercase letters, the answer digit uniform;
* the sampler uses the global ``random`` (seeded per split by :func:`lmdepth.data.dm_math.generate_split`, as the
  arithmetic modules are), so the same data key always gives the same problems.
"""

from __future__ import annotations

import random
import re
import string
from dataclasses import dataclass
from typing import Any

from lmdepth.errors import DataError

STATEMENTS = 10  # assignments per question
MAX_DISTRACTOR_HOPS = 4
#: This book's chain modules (the data's ``modules``) and their settings: the hop counts of each split. Training and
#: the interpolation split draw k = 1 … 6; the extrapolation split k = 7, 8 (longer than anything in training).
ORDER = "defined before used"  # see the module docstring (the first design: "shuffled")
CHAIN_MODULES = {
    "pointer_chain": dict(hops=(1, 2, 3, 4, 5, 6), statements=STATEMENTS, order=ORDER),
    "pointer_chain_longer": dict(hops=(7, 8), statements=STATEMENTS, order=ORDER),
}
CHAIN_EXTRAPOLATE = {"pointer_chain": "pointer_chain_longer"}
_ASSIGN = re.compile(r"([a-z])=([a-z0-9])")
_QUERY = re.compile(r"What is ([a-z])\?$")


@dataclass(frozen=True)
class ChainProblem:
    """One generated question and its digit (the shape of the arithmetic samplers' problems)."""

    question: str
    answer: int


def _partition(n: int, rng: random.Random) -> list[int]:
    """``n`` split into chain lengths of 1 … :data:`MAX_DISTRACTOR_HOPS`."""
    out = []
    while n:
        out.append(rng.randint(1, min(n, MAX_DISTRACTOR_HOPS)))
        n -= out[-1]
    return out


def chain_question(k: int, rng: random.Random, statements: int = STATEMENTS) -> ChainProblem:
    """One question whose queried chain has ``k`` hops, among distractor chains, ``statements`` assignments in all."""
    if not 1 <= k <= statements:
        raise DataError(f"a chain of {k} hops does not fit {statements} assignments")
    lengths = [k] + _partition(statements - k, rng)
    if len(lengths) > 10:
        raise DataError(f"{len(lengths)} chains need distinct digits; there are 10")
    names = rng.sample(string.ascii_lowercase, statements)
    digits = rng.sample(string.digits, len(lengths))
    chains, at = [], 0
    for length, digit in zip(lengths, digits):
        chain = names[at: at + length]  # chain[0] = digit, chain[i] = chain[i-1]
        at += length
        chains.append([f"{chain[0]}={digit}"] + [f"{chain[i]}={chain[i - 1]}" for i in range(1, length)])
    # interleave: a random order of the chains' slots, each chain's lines kept in their order
    slots = [c for c, lines in enumerate(chains) for _ in lines]
    rng.shuffle(slots)
    nxt = [0] * len(chains)
    lines = []
    for c in slots:
        lines.append(chains[c][nxt[c]])
        nxt[c] += 1
    return ChainProblem(";".join(lines) + f". What is {names[k - 1]}?", int(digits[0]))


def chain_sampler(hops: tuple[int, ...], statements: int = STATEMENTS, order: str = ORDER) -> Any:
    """A sampler of one module's questions (a hop count uniform in ``hops``), drawing from the global ``random``
    (``order``: only :data:`ORDER` is generated; it is a parameter so that it enters the data's key)."""
    if order != ORDER:
        raise DataError(f"pointer chains are generated in the order {ORDER!r}, not {order!r}")

    def problem() -> ChainProblem:
        rng = random.Random(random.getrandbits(64))
        return chain_question(random.choice(hops), rng, statements)

    return problem


def parse(question: str) -> tuple[dict[str, str], str] | None:
    """The assignments and the queried variable of a chain question (None if it is not one)."""
    q = _QUERY.search(question)
    if q is None:
        return None
    body = question[: q.start()].rstrip(". ")
    parts = body.split(";")
    pairs = [_ASSIGN.fullmatch(p) for p in parts]
    if not parts or any(m is None for m in pairs):
        return None
    return {m.group(1): m.group(2) for m in pairs}, q.group(1)


def hops(question: str) -> int | None:
    """The number of lookups from the queried variable to its digit (None if the question is no chain question)."""
    parsed = parse(question)
    if parsed is None:
        return None
    table, var = parsed
    n = 0
    while var in table and n <= len(table):
        var, n = table[var], n + 1
    return n if var.isdigit() else None
