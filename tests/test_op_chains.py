"""The depth score's positive control since 2026-12-03: operation-chain questions checked by a solver of the test's
own (answers, lengths, the design rules of :mod:`lmdepth.data.op_chains`) and their splits."""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest

from lmdepth.data import op_chains
from lmdepth.data.dm_math import data_key, generate_split
from lmdepth.errors import DataError

pytestmark = pytest.mark.unit


def evaluate(question: str) -> tuple[int, int]:
    """(the number of operations, the answer), read from the text alone: the start digit, then each operator and
    digit applied to the running value in Python integers, reduced mod 10 at the end (every operation is a ring
    operation, so reducing once equals reducing at each step)."""
    start, rest = re.fullmatch(r" *(\d)((?:[-+*]\d)+)", question).groups()
    value = int(start)
    pairs = re.findall(r"([-+*])(\d)", rest)
    for op, d in pairs:
        value = value + int(d) if op == "+" else value - int(d) if op == "-" else value * int(d)
    return len(pairs), value % 10


def test_every_question_has_the_answer_and_length_an_independent_solver_finds():
    interp = generate_split("interpolate", ("op_chain",), 3000, seed=0)
    extra = generate_split("extrapolate", ("op_chain",), 600, seed=0)
    for e in interp + extra:
        k, answer = evaluate(e.question)
        assert (k, str(answer)) == (e.n_operations, e.answer), e
        assert op_chains.solve(e.question) == (k, answer)
    assert {e.n_operations for e in interp} == {1, 2, 3, 4, 5, 6}
    assert {e.n_operations for e in extra} == {7, 8} and {e.module for e in extra} == {"op_chain_longer"}
    # one width per split: neither the length nor the answer's position tells k
    assert {len(e.question) for e in interp} == {13} and {len(e.question) for e in extra} == {17}
    assert {len(e.prompt) for e in interp} == {len(interp[0].prompt)}


def test_the_answer_is_uniform_at_every_length_and_every_operation_is_drawn():
    train = generate_split("train", ("op_chain",), 30_000, seed=1)
    for k in range(1, 7):
        answers = Counter(e.answer for e in train if e.n_operations == k)
        n = sum(answers.values())
        assert len(answers) == 10 and max(answers.values()) / n < 0.125 and min(answers.values()) / n > 0.075, (k, answers)
    ops = Counter(m for e in train for m in re.findall(r"[-+*]\d", e.question))
    assert set(ops) == set(op_chains.OPERATIONS) and len(ops) == 21
    assert max(ops.values()) / min(ops.values()) < 1.15  # uniform among the 21
    # the last operation alone says nothing of the answer: for each last operation, every answer occurs
    last = Counter((re.findall(r"[-+*]\d", e.question)[-1], e.answer) for e in train if e.n_operations >= 2)
    assert all(sum(1 for (op, _a) in last if op == o) == 10 for o in op_chains.OPERATIONS)


def test_the_splits_are_reproducible_keyed_and_not_mixed():
    a = generate_split("interpolate", ("op_chain",), 200, seed=0)
    assert [e.question for e in a] == [e.question for e in generate_split("interpolate", ("op_chain",), 200, seed=0)]
    assert [e.question for e in a] != [e.question for e in generate_split("interpolate", ("op_chain",), 200, seed=1)]
    assert data_key(("op_chain",), 10, 10, 0) not in {data_key(("pointer_chain",), 10, 10, 0),
                                                       data_key(("add_sub_multiple_small",), 10, 10, 0)}
    with pytest.raises(DataError, match="cannot be mixed"):
        generate_split("interpolate", ("op_chain", "add_sub_multiple_small"), 2, seed=0)


def test_the_sampler_refuses_another_design_or_a_width_too_small():
    with pytest.raises(DataError, match="design"):
        op_chains.op_sampler((1, 2), 13, design="something else")
    with pytest.raises(DataError, match="do not fit"):
        op_chains.op_sampler((7,), 13)
    assert op_chains.solve("What is 2 + 3?") is None and op_chains.solve("7") is None
    q = op_chains.op_question(3, random.Random(0), 13)
    assert len(q.question) == 13 and evaluate(q.question) == (3, q.answer)
