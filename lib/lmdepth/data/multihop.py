"""Synthetic multi-hop questions with a known hop count k (chapter 05, "depth vs problem complexity").

The paper's multi-hop set (MQuAKE) cannot be had offline, so the library generates two kinds of questions whose
difficulty is known by construction. They are **synthetic** and are never called MQuAKE.

* ``"vars"`` — variable-binding chains: ``a=3``, ``b=a+2``, …; "what is the value of d?" needs k additions or
  subtractions along one chain (k = 1 … 4). The answer is one digit 0–9.
* ``"facts"`` — fact chains over fictional entities: "The mentor of Vorlin is Tasmek." … "What is the favourite
  colour of the mentor of the neighbour of Vorlin?" needs k facts (k − 1 entity relations, then the colour).
  The answer is one colour word.

Design rules, each checked by the tests with an independent solver (:mod:`tests.test_multihop`):

* every passage has the same number of statements whatever k (distractor statements fill up), so the prompt
  length barely changes with k;
* distractors include hard negatives (other chains branching off the same variables; colours of the
  intermediate entities of the chain), so skipping hops gives a wrong answer;
* answers are one token in the packaged tokenizers (a digit after ``=``; a colour word after a space) and are
  balanced: item i of a level gets answer ``ANSWERS[perm[i mod |ANSWERS|]]``;
* everything is seeded per (seed, kind, k): the same arguments always give the same items.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lmdepth.data.datasets import Example
from lmdepth.errors import ParameterError

KINDS = ("vars", "facts")
MAX_HOPS = 4
DIGITS = tuple(str(d) for d in range(10))
COLOURS = ("red", "blue", "green", "black", "white", "brown", "pink", "gray", "gold", "orange")
RELATIONS = ("mentor", "neighbour", "sibling", "manager", "landlord", "rival")
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gr", "tr", "st", "sk")
_VOWELS = ("a", "e", "i", "o", "u", "ae", "io")
_CODAS = ("", "n", "r", "l", "s", "th", "k", "x", "m")

VARS_INSTRUCTION = "Work out the value of the variable. Each line assigns a variable.\n"
FACTS_INSTRUCTION = "Read the facts about these people and answer the question.\n"


@dataclass(frozen=True)
class HopItem:
    """One generated question (turned into an :class:`~lmdepth.data.datasets.Example` by :meth:`example`).

    Attributes:
        id: ``"synthetic-vars/k2/7"``.
        kind: ``"vars"`` or ``"facts"``.
        hops: the number of steps the question needs (k).
        prompt: the passage, the question and the answer cue (ends right before the answer).
        answer: the one-token answer continuation (``"7"`` or ``" red"``).
        statements: the passage lines, in prompt order.
        chain: the statements the answer depends on, from the root to the queried one.
    """

    id: str
    kind: str
    hops: int
    prompt: str
    answer: str
    statements: tuple[str, ...]
    chain: tuple[str, ...]
    meta: dict[str, Any] = field(default_factory=dict)

    def example(self) -> Example:
        return Example(self.id, self.prompt, self.answer, {"level": self.hops, "hops": self.hops, "kind": self.kind,
                                                          "synthetic": True, **self.meta})


def _rng(seed: int, kind: str, hops: int, stream: int | str) -> random.Random:
    """The random stream of one item (``stream`` = its index) or of a hop count's answers (``"answers"``)."""
    return random.Random(f"lmdepth-multihop:{seed}:{kind}:{hops}:{stream}")


def balanced_answers(n: int, answers: Sequence[str], rng: random.Random) -> list[str]:
    """``n`` answers that use every answer equally often (±1): repeated shuffled rounds of ``answers``. The first
    m of them do not depend on ``n`` (rounds are drawn in order), as long as ``rng`` serves nothing else."""
    out: list[str] = []
    while len(out) < n:
        round_ = list(answers)
        rng.shuffle(round_)
        out += round_
    return out[:n]


# ---- variable-binding chains ------------------------------------------------------------------------------------

def _step(rng: random.Random, value: int) -> tuple[str, int, int]:
    """A random ``+n`` / ``-n`` (n = 1..4) that keeps ``value`` op n inside 0..9: returns (op, n, result)."""
    options = [("+", n, value + n) for n in range(1, 5) if value + n <= 9]
    options += [("-", n, value - n) for n in range(1, 5) if value - n >= 0]
    return rng.choice(options)


def _vars_item(rng: random.Random, hops: int, answer: int, n_statements: int, idx: int, seed: int) -> HopItem:
    names = rng.sample("abcdefghjkmnpqrstuvwxyz", n_statements)
    # Build the target chain backwards from the answer: x_k = answer, x_{i} = x_{i-1} op n.
    values = [answer]
    ops: list[tuple[str, int]] = []
    for _ in range(hops):
        # x_next = x_prev + n  ⇔  x_prev = x_next − n;  x_next = x_prev − n  ⇔  x_prev = x_next + n
        prev_options = [("+", n, values[0] - n) for n in range(1, 5) if values[0] - n >= 0]
        prev_options += [("-", n, values[0] + n) for n in range(1, 5) if values[0] + n <= 9]
        op, n, prev = rng.choice(prev_options)
        values.insert(0, prev)
        ops.insert(0, (op, n))
    chain_names = names[: hops + 1]
    lines = [f"{chain_names[0]}={values[0]}"]
    lines += [f"{chain_names[i + 1]}={chain_names[i]}{op}{n}" for i, (op, n) in enumerate(ops)]
    # Distractors: new roots and derivations from any variable already defined (branches off the target chain are
    # hard negatives); emitted as separate chains interleaved with the target chain in a random valid order.
    chains: list[list[str]] = [list(lines)]
    defined = {chain_names[i]: values[i] for i in range(hops + 1)}
    pending = names[hops + 1:]
    while pending:
        name = pending.pop()
        if rng.random() < 0.35:  # a new root
            v = rng.randrange(10)
            chains.append([f"{name}={v}"])
        else:
            src = rng.choice(sorted(defined))
            op, n, v = _step(rng, defined[src])
            chains.append([f"{name}={src}{op}{n}"])
        defined[name] = v
    # A valid order: each line after the definitions it reads. Shuffle, then repeatedly emit ready lines.
    flat = [line for c in chains for line in c]
    rng.shuffle(flat)
    ordered, known = [], set()
    while flat:
        for line in flat:
            name, expr = line.split("=")
            src = expr.rstrip("0123456789+-")
            if not src or src in known:
                ordered.append(line)
                known.add(name)
                flat.remove(line)
                break
    query = chain_names[-1]
    prompt = VARS_INSTRUCTION + "\n".join(ordered) + f"\nQuestion: what is the value of {query}?\nAnswer: {query}="
    return HopItem(f"synthetic-vars/k{hops}/{idx}", "vars", hops, prompt, str(answer), tuple(ordered), tuple(lines),
                   {"seed": seed, "query": query})


# ---- fact chains over fictional entities ------------------------------------------------------------------------

def fictional_names(rng: random.Random, n: int) -> list[str]:
    """``n`` distinct pronounceable made-up names (two syllables, capitalised)."""
    out: list[str] = []  # a list, not a set: set order depends on PYTHONHASHSEED
    while len(out) < n:
        name = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(2)).capitalize()
        if 5 <= len(name) <= 9 and name not in out:
            out.append(name)
    return out


def question_phrase(relations: Sequence[str], start: str) -> str:
    """``["neighbour", "mentor"]`` (followed in that order from ``start``) → "the mentor of the neighbour of X"."""
    phrase = start
    for rel in relations:
        phrase = f"the {rel} of {phrase}"
    return phrase


def _facts_item(rng: random.Random, hops: int, answer: str, n_statements: int, n_colour_facts: int,
                idx: int, seed: int) -> HopItem:
    n_relation_facts = n_statements - n_colour_facts
    people = fictional_names(rng, hops + n_colour_facts + 2)
    chain_people = people[:hops]  # X_0 … X_{k-1}; the colour of X_{k-1} is the answer
    others = people[hops:]
    rels = [rng.choice(RELATIONS) for _ in range(hops - 1)]
    facts: dict[tuple[str, str], str] = {}  # (relation, subject) -> object; functional by construction
    chain = []
    for i, rel in enumerate(rels):
        facts[rel, chain_people[i]] = chain_people[i + 1]
        chain.append(f"The {rel} of {chain_people[i]} is {chain_people[i + 1]}.")
    facts["favourite colour", chain_people[-1]] = answer
    chain.append(f"The favourite colour of {chain_people[-1]} is {answer}.")
    lines = list(chain)
    # Colour distractors: first the other chain people (hops skipped → wrong colour), then outsiders.
    colour_subjects = chain_people[:-1] + others
    wrong = [c for c in COLOURS if c != answer]
    rng.shuffle(wrong)
    for subj, colour in zip(colour_subjects[: n_colour_facts - 1], wrong):
        facts["favourite colour", subj] = colour
        lines.append(f"The favourite colour of {subj} is {colour}.")
    # Relation distractors: any free (relation, subject) slot, objects anyone else.
    everyone = chain_people + others
    while len(lines) < n_statements:
        rel, subj = rng.choice(RELATIONS), rng.choice(everyone)
        if (rel, subj) in facts:
            continue
        obj = rng.choice([p for p in everyone if p != subj])
        facts[rel, subj] = obj
        lines.append(f"The {rel} of {subj} is {obj}.")
    assert len(lines) == n_statements and n_relation_facts >= hops - 1
    rng.shuffle(lines)
    q = question_phrase(rels, chain_people[0])
    prompt = (FACTS_INSTRUCTION + "\n".join(lines)
              + f"\nQuestion: What is the favourite colour of {q}?\nAnswer:")
    return HopItem(f"synthetic-facts/k{hops}/{idx}", "facts", hops, prompt, " " + answer, tuple(lines), tuple(chain),
                   {"seed": seed, "start": chain_people[0], "relations": rels})


# ---- public API -------------------------------------------------------------------------------------------------

def generate(kind: str, hops: int, n: int, seed: int = 0, n_statements: int = 8, n_colour_facts: int = 3) -> list[HopItem]:
    """``n`` synthetic questions of one kind and hop count, deterministic in (kind, hops, seed).

    Item i does not depend on ``n`` (its own random stream; the answers come from a separate stream of shuffled
    rounds), so a larger sample extends a smaller one and an id such as ``synthetic-vars/k3/2`` always names the same
    question.

    Args:
        kind: ``"vars"`` (variable-binding chains) or ``"facts"`` (fact chains over fictional entities).
        hops: k, 1 … :data:`MAX_HOPS`.
        n: number of items; answers are balanced over the 10 digits / 10 colours.
        seed: generator seed (items for other k or kinds use independent streams).
        n_statements: passage lines per item, the same for every k (≥ k + 3 for ``vars``, ≥ k + ``n_colour_facts``
            for ``facts``).
        n_colour_facts: ``facts`` only: colour statements per passage (1 answer + distractors).
    """
    if kind not in KINDS:
        raise ParameterError(f"Synthetic multi-hop kind must be one of {list(KINDS)}, got {kind!r}.")
    if not (isinstance(hops, int) and 1 <= hops <= MAX_HOPS):
        raise ParameterError(f"hops must be an integer between 1 and {MAX_HOPS}, got {hops!r}.")
    need = MAX_HOPS + 3 if kind == "vars" else MAX_HOPS - 1 + n_colour_facts + 1
    if n_statements < need:
        raise ParameterError(f"n_statements must be at least {need} for {kind!r} (so every k has distractors), "
                             f"got {n_statements}.")
    if kind == "facts" and not 2 <= n_colour_facts <= len(COLOURS):
        raise ParameterError(f"n_colour_facts must be between 2 and {len(COLOURS)}, got {n_colour_facts}.")
    if kind == "vars":
        answers = balanced_answers(n, DIGITS, _rng(seed, kind, hops, "answers"))
        return [_vars_item(_rng(seed, kind, hops, i), hops, int(a), n_statements, i, seed)
                for i, a in enumerate(answers)]
    answers = balanced_answers(n, COLOURS, _rng(seed, kind, hops, "answers"))
    return [_facts_item(_rng(seed, kind, hops, i), hops, a, n_statements, n_colour_facts, i, seed)
            for i, a in enumerate(answers)]


def generate_examples(kind: str, hops: Sequence[int], n_per_level: int, seed: int = 0, **kwargs: Any) -> list[Example]:
    """:func:`generate` for several hop counts, as data-set examples (``meta["level"]`` = k)."""
    return [item.example() for k in hops for item in generate(kind, k, n_per_level, seed, **kwargs)]


def one_token_answers(tokenizer: Any, examples: Sequence[Example]) -> list[str]:
    """Ids of examples whose answer is *not* exactly one token after the prompt (should be empty)."""
    bad = []
    for e in examples:
        full = tokenizer(e.prompt + e.answer, add_special_tokens=False).input_ids
        head = tokenizer(e.prompt, add_special_tokens=False).input_ids
        if len(full) != len(head) + 1 or full[: len(head)] != head:
            bad.append(e.id)
    return bad


__all__ = ["KINDS", "MAX_HOPS", "COLOURS", "HopItem", "generate", "generate_examples", "one_token_answers",
           "question_phrase", "fictional_names", "balanced_answers"]
