"""Pointer chains: the depth score's positive control from scratch (chapter 07, "Can the depth score see depth grow?").

A question is a list of assignments, several chains interleaved, and a query, e.g. ``"q=7;x=4;c=q;h=c;...
What is h?"`` with answer ``"7"``: the queried variable names another, which names another, …, until a digit. The
number of hops k is the length of that chain (``q=7``, ``c=q``, ``h=c``: k = 3). Each hop needs the previous
one's result — which variable to look up next is known only once the last lookup is done — so a model answering
it must chain k lookups. That is what a sum of small numbers (chapter 07's arithmetic, computable in one parallel
pass) does not force, and what a depth score that can see sequential depth should rise with.

Each chain is written in the order it is defined (a variable is assigned before it is used; the chains' lines are
interleaved at random), so a model reading left to right can resolve every assignment where it stands, one hop
per step of depth. Every question holds two chains of exactly k hops, the queried one and its twin, ending in two
different digits; the rest of its lines are one-hop fillers (``x=5``) of any digit. Nothing but following the query
tells the two long chains apart: their lengths are equal, where their lines stand is random, and how often a digit
occurs says nothing about which one ends the queried chain.

Two earlier designs were not learned and were replaced before any depth of a chain run was measured (the design
is part of the data's key, :data:`DESIGN`):

* 2026-12-01, "shuffled": every line shuffled, so a line could use a variable assigned only later, which a causal
  model cannot resolve where it stands. Seed 0 stood at 23 % exact match at step 9,000 of 30,000, about what
  guessing among the digits present scores.
* 2026-12-02, "distractors of 1 … 4 hops": the queried chain among distractor chains of 1 … 4 hops. For k ≥ 5 the
  queried chain was the longest, and a longer chain tends to own the first line: seed 0 learned to answer the
  first digit of the question or the longest chain's, not to follow the query (its loss flat from step 500 to
  15,500; at step 15,500 on 60 fresh questions per k, k = 1: 4 right, 21 the first digit; k = 8: 49 right, all 49
  the longest chain's digit). The twin removes both cues: the longest chains are two, and either may come first.

* 2026-12-02 (stop), "twin chains, fillers of the other digits": the fillers drew only from the eight digits
  that end neither long chain, so the answer was one of the digits that occur once. Trained on every hop count,
  seed 0 stood at 32.5 % interpolation exact match at step 9,000 (below the twin-guessing level, about 44 %);
  with the curriculum (shortest chains first, :mod:`lmdepth.scratch.curriculum`) it never passed one-hop chains
  by step 20,500 and answered, on 150 fresh one-hop questions, a digit that occurs once every time. The fillers
  now draw from all ten digits (:data:`DESIGN`).

No chain run has trained on this design yet: one-hop pilots (``scripts/pilot_chain_recipe.py``) stayed at
12–30 % exact match after 3,000 steps for every recipe tried, so its recipe is still to be chosen, with a dated
note, before any depth of a chain run is measured.

Design rules (each checked by ``tests/test_chains.py`` with the independent solver :func:`hops`):

* every question has :data:`STATEMENTS` assignments whatever k (fillers make up the rest), so its length does not
  change with k;
* every variable is assigned before it is used (each chain in order, the chains interleaved at random);
* the queried chain and its twin end in two different digits; the fillers draw from all ten (repeats
  allowed), so answering a digit that occurs once is right no more often than guessing among the digits present;
* guessing: among the digits present; for k = 1 every line is a one-hop chain;
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

STATEMENTS = 14  # assignments per question: two chains of the longest k (7, the extrapolation split) fill it
#: This book's chain modules (the data's ``modules``) and their settings: the hop counts of each split. Training and
#: the interpolation split draw k = 1 … 6; the extrapolation split k = 7 (longer than anything in training).
DESIGN = "twin chains, defined before used, fillers of any digit"  # the module docstring: the designs before it
CHAIN_MODULES = {
    "pointer_chain": dict(hops=(1, 2, 3, 4, 5, 6), statements=STATEMENTS, design=DESIGN),
    "pointer_chain_longer": dict(hops=(7,), statements=STATEMENTS, design=DESIGN),
}
CHAIN_EXTRAPOLATE = {"pointer_chain": "pointer_chain_longer"}
_ASSIGN = re.compile(r"([a-z])=([a-z0-9])")
_QUERY = re.compile(r"What is ([a-z])\?$")


@dataclass(frozen=True)
class ChainProblem:
    """One generated question and its digit (the shape of the arithmetic samplers' problems)."""

    question: str
    answer: int


def chain_question(k: int, rng: random.Random, statements: int = STATEMENTS, solved: int = 0) -> ChainProblem:
    """One question whose queried chain has ``k`` hops, beside a twin of ``k`` hops and one-hop fillers,
    ``statements`` assignments in all, and ``solved`` fillers' lookups written out before the query (``x?4``)."""
    if not 1 <= 2 * k <= statements:
        raise DataError(f"two chains of {k} hops do not fit {statements} assignments")
    if solved > statements - 2 * k:
        raise DataError(f"{solved} solved lookups need as many fillers; {k} hops leave {statements - 2 * k}")
    names = rng.sample(string.ascii_lowercase, statements)
    answer, twin = rng.sample(string.digits, 2)
    fillers = [rng.choice(string.digits) for _ in range(statements - 2 * k)]  # any digit: no count marks the answer
    chains, at = [], 0
    for length, digit in zip([k, k] + [1] * len(fillers), [answer, twin] + fillers):
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
    at = 2 * k  # the fillers' names: names[2k:]
    shown = rng.sample(range(len(fillers)), solved) if solved else []
    worked = "".join(f"{';'.join(f'{names[at + i]}?{fillers[i]}' for i in shown)}. " if shown else "")
    return ChainProblem(";".join(lines) + f". {worked}What is {names[k - 1]}?", int(answer))


def chain_sampler(hops: tuple[int, ...], statements: int = STATEMENTS, design: str = DESIGN, solved: int = 0
                  ) -> Any:
    """A sampler of one module's questions (a hop count uniform in ``hops``, ``solved`` fillers' lookups written
    out), drawing from the global ``random`` (``design``: only :data:`DESIGN` is generated; it is a parameter so
    that it enters the data's key)."""
    if design != DESIGN:
        raise DataError(f"pointer chains are generated in the design {DESIGN!r}, not {design!r}")

    def problem() -> ChainProblem:
        rng = random.Random(random.getrandbits(64))
        return chain_question(random.choice(hops), rng, statements, solved)

    return problem


def parse(question: str) -> tuple[dict[str, str], str] | None:
    """The assignments and the queried variable of a chain question (None if it is not one)."""
    q = _QUERY.search(question)
    if q is None:
        return None
    body = question[: q.start()].split(". ")[0].rstrip(". ")  # the assignments, without solved lookups
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
