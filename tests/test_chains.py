"""The depth score's positive control: pointer-chain questions (its task until 2026-12-03; operation chains since,
tests/test_op_chains.py) checked by an independent solver (answers, hop counts, the design rules of
:mod:`lmdepth.data.chains`), their data keys, and the control's training runs (the curriculum, resuming, snapshots
that leave the trained weights as they would be without them)."""

from __future__ import annotations

import random
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from lmdepth.analyses.scratch import snapshot_curve, snapshot_writer
from lmdepth.data import chains
from lmdepth.data.dm_math import data_key, generate_split
from lmdepth.errors import DataError
from lmdepth.scratch import training as tr

ROOT = Path(__file__).resolve().parents[1]


def solve(question: str) -> tuple[str, int, Counter]:
    """Read only the text: (the queried variable's digit, its number of lookups, the length of the chain ending in
    each line that assigns a digit, keyed by that line's variable)."""
    body, query = re.fullmatch(r"(.*)\. What is ([a-z])\?", question).groups()
    table: dict[str, str] = {}
    for part in body.split(";"):
        lhs, rhs = part.split("=")
        assert lhs not in table, f"{lhs} assigned twice"
        table[lhs] = rhs
    def follow(var: str) -> tuple[str, int]:
        n = 1
        while not table[var].isdigit():
            var, n = table[var], n + 1
        return var, n

    end, n = follow(query)
    lengths = Counter()
    for var in table:
        root, m = follow(var)
        lengths[root] = max(lengths[root], m)
    return table[end], n, lengths


def end_of(body: list[str], k: int, p, line: bool = False) -> str:
    """The variable (or the line) that assigns the digit at the end of the queried chain of ``p``."""
    table = dict(part.split("=") for part in body)
    var = re.search(r"What is ([a-z])\?", p.question).group(1)
    while not table[var].isdigit():
        var = table[var]
    return f"{var}={table[var]}" if line else var


@pytest.mark.unit
def test_every_question_is_solved_by_following_its_chain_and_keeps_the_design_rules():
    rng = random.Random(0)
    for k in range(1, 8):
        digits, first, cue, guess = Counter(), Counter(), 0.0, 0.0
        for _ in range(200):
            p = chains.chain_question(k, rng)
            answer, hops, lengths = solve(p.question)
            assert answer == str(p.answer) and hops == k == chains.hops(p.question)
            body = p.question.split(". What")[0].split(";")
            assert len(body) == chains.STATEMENTS  # the same length whatever k
            defined = set()
            for line in body:  # every variable assigned before it is used
                assert line[2].isdigit() or line[2] in defined, (line, p.question)
                defined.add(line[0])
            ends = [s[-1] for s in body if s[-1].isdigit()]
            once = [d for d in set(ends) if ends.count(d) == 1]
            cue += (answer in once) / max(len(once), 1)  # answering a digit that occurs once: right this often
            guess += 1 / len(set(ends))  # guessing among the digits present
            longest = sorted(lengths.values(), reverse=True)
            assert longest[:2] == [k, k] and (k == 1 or longest[2:3] in ([], [1]))  # a twin of k hops, fillers of 1
            assert len(body) == len(lengths) + 2 * (k - 1)  # two chains of k hops, the rest one-hop lines
            if k > 1:  # the twin ends in another digit (for k = 1 it is one of the fillers' lines)
                twin = next(v for v in body if v[-1].isdigit() and lengths[v[0]] == k and v[0] != end_of(body, k, p))
                assert twin[-1] != answer
                first[body.index(end_of(body, k, p, line=True)) < body.index(twin)] += 1
            digits[answer] += 1
        assert len(digits) == 10  # every digit can be the answer
        assert cue / 200 <= guess / 200 + 0.05, (k, cue, guess)  # how often a digit occurs does not mark the answer
        if k > 1:  # the answer's chain starts first about as often as the twin's (no position cue)
            assert 0.3 < first[True] / 200 < 0.7, (k, first)
    with pytest.raises(DataError):
        chains.chain_question(8, rng)
    assert chains.hops("What is 2 + 3?") is None and chains.hops("a=b;b=a. What is a?") is None  # a cycle


@pytest.mark.unit
def test_the_splits_draw_their_hop_counts_and_are_reproducible():
    interp = generate_split("interpolate", ("pointer_chain",), 600, seed=0)
    extra = generate_split("extrapolate", ("pointer_chain",), 100, seed=0)
    assert set(e.n_operations for e in interp) == {1, 2, 3, 4, 5, 6}
    assert set(e.n_operations for e in extra) == {7} and {e.module for e in extra} == {"pointer_chain_longer"}
    assert all(solve(e.question)[0] == e.answer for e in interp + extra)
    assert [e.question for e in generate_split("interpolate", ("pointer_chain",), 600, seed=0)] == \
        [e.question for e in interp]
    assert data_key(("pointer_chain",), 10, 10, 0) != data_key(("add_sub_multiple_small",), 10, 10, 0)
    with pytest.raises(DataError, match="cannot be mixed"):
        generate_split("interpolate", ("pointer_chain", "add_sub_multiple_small"), 2, seed=0)


@pytest.mark.unit
def test_the_positive_control_runs_are_the_comparison_recipe_on_chains():
    configs = tr.chain_configs("default")
    assert [c.seed for c in configs] == list(tr.CHAIN_SEEDS) and len(configs) == 5
    ref = tr.run_config("default", "transformer", "answer_only", lr=tr.MATCHED_LR)
    for c in configs:
        assert (c.arch, c.objective, c.lr, c.model, c.modules) == (ref.arch, ref.objective, ref.lr, ref.model,
                                                                     ("op_chain",))
        assert (c.steps, c.batch_size, c.n_train_per_module, c.curriculum_gate, c.curriculum_every) == \
            (16_000, 128, 1_000_000, 0.9, 250)  # the recipe of 2026-12-03 (the chain claim's history)
    assert tr.chain_configs("paper") == []
    assert len({tr.run_dir(c, "x").name for c in configs}) == 5


@pytest.mark.integration
def test_snapshots_leave_the_trained_weights_as_they_would_be_without_them(tmp_path):
    """A chain run trained with a snapshot every 3 steps, interrupted once, ends with the weights of the same run
    trained straight through without snapshots; its snapshots are read back as the depth over training."""
    cfg = tr.chain_configs("smoke")[0]
    plain = tr.train_run(cfg, tmp_path / "plain", data_dir=tmp_path / "data", progress=False)
    rd = tr.run_dir(cfg, tmp_path / "snap")
    write = snapshot_writer(rd, tr.load_data(cfg, tmp_path / "data"))
    assert tr.train_run(cfg, tmp_path / "snap", data_dir=tmp_path / "data", progress=False, stop_after=10,
                        on_snapshot=write, snapshot_every=3) is None
    snapped = tr.train_run(cfg, tmp_path / "snap", data_dir=tmp_path / "data", progress=False, on_snapshot=write,
                           snapshot_every=3)
    a, b = torch.load(plain, weights_only=False), torch.load(snapped, weights_only=False)
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])
    steps = sorted(int(f.stem.split("-")[1]) for f in rd.glob("snapshot-*.npz"))
    assert steps == list(range(0, cfg.steps + 1, 3))
    curve = snapshot_curve([(cfg.seed, rd)])
    assert list(curve.step) == steps and curve["interpolate"].between(0, 1).all()
    with np.load(rd / "snapshot-00000.npz") as z:
        assert set(z["n_operations"]) == {1, 2, 3, 4, 5, 6, 7, 8} and z["E"].shape[1:] == (4, 4)


@pytest.mark.unit
def test_the_training_script_lists_the_positive_control_queue():
    out = subprocess.run([sys.executable, "scripts/train_matched_runs.py", "--task", "chains", "--list",
                          "--checkpoint-dir", "/nonexistent"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.count("transformer-answer_only seed") == 5 and "of 16,000" in out.stdout


@pytest.mark.integration
def test_the_curriculum_admits_the_next_length_only_past_its_gate(tmp_path, monkeypatch):
    """Stage 1 draws only one-hop problems; the held-out check set of each length is never drawn; a check below the
    gate admits nothing, one at the gate admits the next length from that step on; checks stop at the longest."""
    from dataclasses import replace

    from lmdepth.scratch import curriculum

    cfg = replace(tr.chain_configs("smoke")[0], n_train_per_module=9000)  # ~1,500 of each length: 100 held out
    train = tr.load_data(cfg, tmp_path / "data").train
    course = curriculum.Curriculum.build(train, 0.9)
    length = [ex.n_operations for ex in train]
    held = {id(e) for c in course.checks.values() for e in c}
    assert course.lengths == [1, 2, 3, 4, 5, 6] and course.stages == [(0, 1)]
    assert all(len(c) == curriculum.CHECK_PER_LENGTH and {e.n_operations for e in c} == {n}
               for n, c in course.checks.items())
    for n, pool in course.pools.items():
        assert {length[i] for i in pool.tolist()} == set(range(1, n + 1))
        assert not held & {id(train[i]) for i in pool.tolist()}
    scores = iter([0.85, 0.9])
    monkeypatch.setattr(curriculum, "exact_match", lambda *a, **k: np.array([next(scores)]))
    model = torch.nn.Linear(1, 1)
    assert course.check_due(7, 5, 30, model, None) is None  # not a multiple of the check interval: nothing evaluated
    assert course.check_due(5, 5, 30, model, None) == 0.85 and course.stages == [(0, 1)]
    assert course.check_due(10, 5, 30, model, None) == 0.9 and course.stages == [(0, 1), (10, 2)] and model.training
    assert course.check_due(30, 5, 30, model, None) is None  # none at the last step: it could change nothing
    assert course.stage_of(9)[0] == 0 and {length[i] for i in course.stage_of(9)[1].tolist()} == {1}
    assert course.stage_of(10)[0] == 10 and {length[i] for i in course.stage_of(12)[1].tolist()} == {1, 2}
    done = curriculum.Curriculum.build(train, 0.9, [[0, 1], [4, 6]])  # as a checkpoint stores them
    assert done.stages == [(0, 1), (4, 6)] and done.check_due(5, 5, 30, model, None) is None
    small = curriculum.Curriculum.build(train[:300], 0.9)  # about 50 of each length: a tenth held out
    assert all(len(c) == sum(e.n_operations == n for e in train[:300]) // 10 for n, c in small.checks.items())
    with pytest.raises(DataError, match="at least 10 of each length"):
        curriculum.Curriculum.build(train[:30], 0.9)


@pytest.mark.integration
def test_a_curriculum_run_resumes_bit_identically_and_records_its_stages(tmp_path):
    """With a gate every check passes (0), the stages advance at every check (every 3 steps; checkpoints every 5);
    a run stopped once at a checkpoint and once by a crash between a check that admitted a length and the next
    checkpoint ends with the weights, stages and check scores of the run trained straight through."""
    from dataclasses import replace

    cfg = replace(tr.chain_configs("smoke")[0], n_train_per_module=1200, curriculum_gate=0.0, ckpt_every=5,
                  curriculum_every=3)
    assert cfg.key() != tr.chain_configs("smoke")[0].key() != replace(cfg, curriculum_every=5).key()
    plain = tr.train_run(cfg, tmp_path / "plain", data_dir=tmp_path / "data", progress=False)
    assert tr.train_run(cfg, tmp_path / "cut", data_dir=tmp_path / "data", progress=False, stop_after=4) is None

    def crash(step, model, tok):  # called after the check at step 12 (which admits a length), before a checkpoint
        if step == 12:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tr.train_run(cfg, tmp_path / "cut", data_dir=tmp_path / "data", progress=False, on_snapshot=crash,
                     snapshot_every=12)
    ckpt = torch.load(tr.run_dir(cfg, tmp_path / "cut") / "ckpt.pt", weights_only=False)
    assert ckpt["step"] == 10 and [tuple(s) for s in ckpt["curriculum"]][-1] == (9, 4)  # the stage of step 12 lost
    cut = tr.train_run(cfg, tmp_path / "cut", data_dir=tmp_path / "data", progress=False)
    a, b = torch.load(plain, weights_only=False), torch.load(cut, weights_only=False)
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])
    stages = [(0, 1), (3, 2), (6, 3), (9, 4), (12, 5), (15, 6)]
    assert [tuple(s) for s in a["meta"]["curriculum"]] == stages == [tuple(s) for s in b["meta"]["curriculum"]]
    checks = [tuple(c) for c in a["meta"]["curriculum_checks"]]
    assert [c[:2] for c in checks] == [(3, 1), (6, 2), (9, 3), (12, 4), (15, 5)]  # none once every length is in
    assert checks == [tuple(c) for c in b["meta"]["curriculum_checks"]] and all(0 <= c[2] <= 1 for c in checks)
    off = tr.train_run(replace(cfg, curriculum_gate=None), tmp_path / "off", data_dir=tmp_path / "data", progress=False)
    c = torch.load(off, weights_only=False)
    assert not all(torch.equal(a["state_dict"][k], c["state_dict"][k]) for k in a["state_dict"])
    assert "curriculum" not in c["meta"] and "curriculum_checks" not in c["meta"]


@pytest.mark.integration
def test_a_curriculum_check_leaves_every_rng_untouched(tmp_path):
    """The check evaluates a real model: the torch, Python and NumPy generators are where they were."""
    from lmdepth.data.dm_tokens import CharTokenizer
    from lmdepth.scratch import curriculum
    from lmdepth.scratch.models import build_model

    cfg = tr.chain_configs("smoke")[0]
    train = tr.load_data(cfg, tmp_path / "data").train
    course = curriculum.Curriculum.build(train, 0.0)
    tok = CharTokenizer()
    model = build_model(cfg.model_config(tok.vocab_size), seed=0).train()
    before = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    assert course.check_due(5, 5, 30, model, tok) is not None and model.training
    assert torch.equal(before[0], torch.get_rng_state()) and before[1] == random.getstate()
    assert np.array_equal(before[2], np.random.get_state()[1])


@pytest.mark.unit
def test_runs_without_a_curriculum_keep_their_keys():
    """The comparison runs' folders (committed) are named by keys that the curriculum's fields must not change."""
    runs = {(c.arch, c.objective, c.seed): tr.run_dir(c, "x").name for c in tr.matched_configs("default")}
    assert runs["transformer", "lm", 3] == "transformer-lm-3bed7956c71a"
    assert runs["moeut", "lm", 3] == "moeut-lm-0fe8e26b0e59"


@pytest.mark.unit
def test_the_control_below_delta_reads_as_a_small_rise_only_where_every_seed_rose():
    import pandas as pd

    from lmdepth.book.pages import scratch_page as sp

    row = pd.read_csv(Path(__file__).parents[1] / "results/book/default/moeut/verdicts/Transformer_operation_chains.csv")
    row = row.assign(state="disagrees", counted_as="disagrees", reason="", ci_low=0.011, control_ci_low=0.0107)
    states = pd.DataFrame([dict(seed=s, state="finished", steps=16000) for s in range(5)])
    small = sp.chain_md(states, row)
    assert "does rise" in small and "does not see sequential depth" not in small
    flat = sp.chain_md(states, row.assign(ci_low=-0.003))  # an interval reaching 0: the score did not see it
    assert "does not see sequential depth" in flat and "does rise" not in flat
    assert "does not see" in sp.chain_md(states, row.assign(control_ci_low=-0.001))  # one seed fell
