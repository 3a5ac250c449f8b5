"""Synthetic arithmetic chains (chapter 05's ladder): answers checked by an independent solver, step counts,
partial results, balance, determinism, one-token answers."""

import re
from collections import Counter

import pytest

from lmdepth.data.arith import MAX_OPS, N_SHOTS, generate_examples
from lmdepth.data.difficulty import LEVELS, difficulty_examples
from lmdepth.data.multihop import one_token_answers
from lmdepth.errors import ParameterError

LINE = re.compile(r"(\d)((?: [+-] \d)+) =(?: (\d))?")


def solve(line: str) -> tuple[int, int, list[int]]:
    """(value, number of operations, partial results) of one "3 + 4 - 2 = " line, by Python's own arithmetic."""
    m = LINE.fullmatch(line)
    assert m, f"not a chain line: {line!r}"
    terms = re.findall(r"([+-]) (\d)", m[2])
    partial = [int(m[1])]
    for op, d in terms:
        partial.append(eval(f"{partial[-1]} {op} {d}"))  # noqa: S307 (digits and one operator, matched above)
    return partial[-1], len(terms), partial


@pytest.mark.unit
@pytest.mark.parametrize("k", range(1, MAX_OPS + 1))
def test_answers_steps_and_worked_examples_check_out(k):
    for e in generate_examples([k], 20, seed=3):
        *shots, question = e.prompt.split("\n")
        assert len(shots) == N_SHOTS and question.endswith("= ") and e.answer in "0123456789"
        value, n_ops, partial = solve(question.rstrip())
        assert (value, n_ops) == (int(e.answer), k) and e.meta["level"] == k
        assert all(0 <= p <= 9 for p in partial)
        for s in shots:  # every worked example is right and has the question's number of steps
            value, n_ops, partial = solve(s)
            assert n_ops == k and value == int(LINE.fullmatch(s)[3]) and all(0 <= p <= 9 for p in partial)


@pytest.mark.unit
def test_answers_are_balanced_and_items_deterministic():
    exs = generate_examples([2], 30, seed=0)
    assert set(Counter(e.answer for e in exs).values()) == {3}  # 30 items: each digit three times
    assert len({e.prompt for e in exs}) == 30
    assert exs == generate_examples([2], 30, seed=0) and exs != generate_examples([2], 30, seed=1)
    assert generate_examples([1, 2], 30, seed=0)[30:] == exs  # a rung does not depend on the other rungs
    assert generate_examples([2], 4, seed=0) == exs[:4]  # nor item i on the sample size (an id is one question)
    assert difficulty_examples("arith", None, 2) == generate_examples(LEVELS["arith"], 2)


@pytest.mark.unit
def test_the_prompt_grows_with_the_number_of_steps_as_documented():
    mean = {k: sum(len(e.prompt) for e in generate_examples([k], 10)) / 10 for k in (1, 5)}
    assert mean[5] > 2 * mean[1]  # the confound the chapter reports


@pytest.mark.unit
def test_bad_step_counts_are_refused():
    with pytest.raises(ParameterError, match="1 to 5 operations"):
        generate_examples([6], 2)
    with pytest.raises(ParameterError, match="levels"):
        difficulty_examples("arith", [0])


@pytest.mark.packaged
@pytest.mark.parametrize("model", ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"])
def test_answers_are_one_token_after_the_prompt_for_every_packaged_tokenizer(model):
    from lmdepth.model.registry import load_model

    tok = load_model(model).tokenizer
    assert one_token_answers(tok, generate_examples(LEVELS["arith"], 10)) == []
