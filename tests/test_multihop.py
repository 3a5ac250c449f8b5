"""Synthetic multi-hop generators: answers checked by an independent solver, hop counts, balance, determinism."""

import re
import statistics
import subprocess
import sys
from collections import Counter

import pytest

from lmdepth.data.multihop import COLOURS, KINDS, MAX_HOPS, generate, generate_examples, one_token_answers
from lmdepth.errors import ParameterError

pytestmark = pytest.mark.unit

N = 30


# ---- independent solvers: they read only the prompt text ---------------------------------------------------------

def solve_vars(prompt: str) -> tuple[str, int]:
    """Evaluate every assignment line in order; return (value of the queried variable, its dependency depth)."""
    value: dict[str, int] = {}
    depth: dict[str, int] = {}
    for line in prompt.splitlines():
        m = re.fullmatch(r"([a-z])=(\d)", line)
        if m:
            assert m[1] not in value, f"{m[1]} assigned twice"
            value[m[1]], depth[m[1]] = int(m[2]), 0
            continue
        m = re.fullmatch(r"([a-z])=([a-z])([+-])(\d)", line)
        if m:
            assert m[1] not in value and m[2] in value, f"bad order at {line!r}"
            value[m[1]] = value[m[2]] + int(m[4]) * (1 if m[3] == "+" else -1)
            depth[m[1]] = depth[m[2]] + 1
    q = re.search(r"what is the value of ([a-z])\?\nAnswer: \1=$", prompt)
    assert q, "the prompt must end with the answer cue"
    return str(value[q[1]]), depth[q[1]]


def solve_facts(prompt: str) -> tuple[str, int]:
    """Parse 'The R of X is Y.' facts and follow the question's relation path; return (answer, facts used)."""
    facts: dict[tuple[str, str], str] = {}
    for r, x, y in re.findall(r"^The ([a-z ]+?) of ([A-Z][a-z]+) is ([A-Za-z]+)\.$", prompt, flags=re.M):
        assert (r, x) not in facts, f"two facts for {r} of {x}"
        facts[r, x] = y
    q = re.search(r"Question: What is the (.+)\?\nAnswer:$", prompt)
    assert q
    parts = q[1].split(" of ")
    # "favourite colour of the mentor of the neighbour of X" → path from X: neighbour, mentor, favourite colour
    subject, rels = parts[-1], [p.removeprefix("the ") for p in parts[:-1]][::-1]
    for r in rels:
        subject = facts[r, subject]
    return " " + subject, len(rels)


SOLVERS = {"vars": solve_vars, "facts": solve_facts}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("hops", range(1, MAX_HOPS + 1))
def test_answers_and_hop_counts_check_out(kind, hops):
    for item in generate(kind, hops, N, seed=3):
        answer, used = SOLVERS[kind](item.prompt)
        assert answer == item.answer, item.id
        assert used == hops == item.hops, item.id
        assert len(item.chain) == hops + (1 if kind == "vars" else 0)


@pytest.mark.parametrize("kind", KINDS)
def test_skipping_a_hop_gives_a_wrong_answer_often(kind):
    """Hard negatives: answering the (k−1)-hop question instead usually gives a different answer."""
    differ = total = 0
    for item in generate(kind, 3, N, seed=1):
        if kind == "facts":
            short = item.prompt.replace(f"the {item.meta['relations'][-1]} of ", "", 1)
            alt, _ = solve_facts(short)
        else:
            parent = item.chain[-2].split("=")[0]
            alt, _ = solve_vars(item.prompt.replace(f"of {item.meta['query']}?", f"of {parent}?")
                                .replace(f"Answer: {item.meta['query']}=", f"Answer: {parent}="))
        differ += alt != item.answer
        total += 1
    assert differ / total > 0.8


@pytest.mark.parametrize("kind", KINDS)
def test_prompt_length_barely_changes_with_hops(kind):
    lines = {k: {len(i.statements) for i in generate(kind, k, N)} for k in range(1, MAX_HOPS + 1)}
    assert all(v == {8} for v in lines.values())  # same number of statements whatever k
    mean_len = {k: statistics.mean(len(i.prompt) for i in generate(kind, k, N)) for k in range(1, MAX_HOPS + 1)}
    assert max(mean_len.values()) / min(mean_len.values()) < 1.25, mean_len


@pytest.mark.parametrize("kind", KINDS)
def test_answers_are_balanced(kind):
    for k in range(1, MAX_HOPS + 1):
        counts = Counter(i.answer.strip() for i in generate(kind, k, 20))
        assert len(counts) == 10 and set(counts.values()) == {2}
        if kind == "facts":
            assert set(counts) == set(COLOURS)


@pytest.mark.parametrize("kind", KINDS)
def test_deterministic_by_seed(kind):
    a, b = generate(kind, 2, 10, seed=5), generate(kind, 2, 10, seed=5)
    assert a == b
    assert [i.prompt for i in generate(kind, 2, 10, seed=6)] != [i.prompt for i in a]
    # the first items do not depend on how many are asked for, also across a round of balanced answers (10):
    # an id names one question at every sample size
    big = generate(kind, 2, 23, seed=5)
    assert [i.prompt for i in generate(kind, 2, 4, seed=5)] == [i.prompt for i in a[:4]] == [i.prompt for i in big[:4]]
    assert [(i.id, i.prompt, i.answer) for i in a] == [(i.id, i.prompt, i.answer) for i in big[:10]]


def test_deterministic_across_processes():
    """Nothing depends on Python's per-process string hashing (set order)."""
    code = "from lmdepth.data.multihop import generate; print([i.prompt for k in (1,4) for i in generate('facts', k, 5)])"
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={"PYTHONHASHSEED": str(s), "PATH": ""}).stdout for s in (1, 2)}
    assert len(outs) == 1 and next(iter(outs))


def test_examples_carry_level_and_are_labelled_synthetic():
    exs = generate_examples("facts", [1, 2], 3)
    assert [e.meta["level"] for e in exs] == [1, 1, 1, 2, 2, 2]
    assert all(e.id.startswith("synthetic-") and e.meta["synthetic"] for e in exs)
    assert not any("mquake" in (e.id + e.prompt).lower() for e in exs)


def test_one_token_answers_with_the_character_tokenizer(tok):
    exs = generate_examples("vars", [1, 3], 5)
    assert one_token_answers(tok, exs) == []  # one digit is one character
    assert len(one_token_answers(tok, generate_examples("facts", [1], 5))) == 5  # " red" is 4 characters


def test_bad_arguments_are_refused():
    with pytest.raises(ParameterError, match="kind"):
        generate("mquake", 2, 3)
    with pytest.raises(ParameterError, match="hops"):
        generate("vars", 5, 3)
    with pytest.raises(ParameterError, match="n_statements"):
        generate("vars", 2, 3, n_statements=4)
