"""Chapter 07's analyses of the from-scratch runs (lmdepth.analyses.scratch) and the answer scores of
lmdepth.scratch.training: intervals, gains, erasure layout, depth-score inputs, and a missing run's error. Tiny runs, CPU."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from lmdepth.data import dm_math as dm
from lmdepth.analyses import scratch as sa
from lmdepth.scratch import training as tr
from lmdepth.errors import DataError

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

MODULES = ("add_sub_multiple",)
SMALL = dict(modules=MODULES, n_train_per_module=48, n_eval_per_module=12, steps=4, batch_size=4, ckpt_every=2)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    pytest.importorskip("mathematics_dataset", reason="needs the [scratch] extra (mathematics-dataset)")
    root = tmp_path_factory.mktemp("scratch")
    return sa.trained_runs("smoke", root / "ck", root / "data", progress=False, **SMALL), root


@pytest.mark.unit
def test_missing_run_without_training_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="train=True"):
        sa.trained_runs("smoke", tmp_path / "none", tmp_path / "data", train=False, **SMALL)


@pytest.mark.integration
def test_trained_runs_are_four_and_reloaded_from_checkpoints(runs):
    got, root = runs
    assert set(got) == {f"{a}-{o}" for a in tr.ARCHS for o in tr.OBJECTIVES}
    assert all(r.trained_now for r in got.values())
    again = sa.trained_runs("smoke", root / "ck", root / "data", train=False, **SMALL)  # no training needed now
    assert not any(r.trained_now for r in again.values())
    for name, r in got.items():
        for (k, v), (k2, v2) in zip(r.model.state_dict().items(), again[name].model.state_dict().items()):
            assert k == k2 and torch.equal(v, v2)


@pytest.mark.unit
def test_wilson_interval_known_values():
    lo, hi = sa.wilson_interval(0, 10)
    assert lo == 0 and hi == pytest.approx(0.2775, abs=1e-4)
    lo, hi = sa.wilson_interval(5, 10)
    assert (lo, hi) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert sa.wilson_interval(10, 10)[1] == 1.0


@pytest.mark.integration
def test_answer_scores_match_an_independent_computation(runs):
    got, root = runs
    r = got["transformer-lm"]
    data = tr.load_data(tr.run_config("smoke", "transformer", "lm", **SMALL), root / "data")
    ex = data.interpolate[:5]
    ok, nll = tr.answer_scores(r.model, r.tok, ex, batch_size=2)
    for i, e in enumerate(ex):  # one example at a time, no padding
        ids, a = r.tok.encode_example(e.question, e.answer)
        logits = r.model(torch.tensor([ids])).logits[0, :-1]
        target = torch.tensor(ids[1:])
        ans = slice(a - 1, len(ids) - 1)  # predictions of the answer tokens and the EOS
        assert nll[i] == pytest.approx(F.cross_entropy(logits[ans], target[ans]).item(), rel=1e-4)
        assert ok[i] == bool((logits[ans].argmax(-1) == target[ans]).all())


@pytest.mark.unit
def test_accuracy_summary():
    rows = []
    for arch, obj, k in (("moeut", "lm", 1), ("moeut", "answer_only", 3), ("transformer", "lm", 2),
                         ("transformer", "answer_only", 2)):
        rows += [{"run": f"{arch}-{obj}", "arch": arch, "objective": obj, "split": "extrapolate",
                  "correct": i < k, "answer_nll": float(i)} for i in range(4)]
    s = sa.accuracy_summary(pd.DataFrame(rows))
    assert s.set_index("run").accuracy.to_dict() == {"moeut-lm": 0.25, "moeut-answer_only": 0.75,
                                                      "transformer-lm": 0.5, "transformer-answer_only": 0.5}
    assert (s.answer_nll == 1.5).all()
    assert s.set_index("run").loc["moeut-lm", ["ci_low", "ci_high"]].tolist() == pytest.approx(
        sa.wilson_interval(1, 4))


@pytest.mark.unit
def test_paired_gains_are_paired_differences():
    rows = []
    for i in range(20):  # MoEUT: the answer-only run solves every problem, the all-token run none; Transformer equal
        for run, ok, nll in (("moeut-lm", False, 2.0), ("moeut-answer_only", True, 1.0),
                             ("transformer-lm", i % 2 == 0, 1.5), ("transformer-answer_only", i % 2 == 0, 1.5)):
            rows.append({"run": run, "split": "extrapolate", "correct": ok, "answer_nll": nll})
    g = sa.paired_gains(pd.DataFrame(rows), "extrapolate", n_boot=200).set_index(["metric", "comparison"])
    assert g.loc[("exact match", "moeut")][["gain", "ci_low", "ci_high"]].tolist() == [1.0, 1.0, 1.0]
    assert g.loc[("exact match", "transformer")][["gain", "ci_low", "ci_high"]].tolist() == [0.0, 0.0, 0.0]
    assert g.loc[("answer loss reduction", "moeut − transformer"), "gain"] == 1.0
    assert (g.n == 20).all()


@pytest.mark.integration
def test_probe_erasure_layout(runs):
    got, _ = runs
    r = got["moeut-answer_only"]
    table, info = sa.probe_erasure(r, probes=dm.PROBES[1:3])
    L = r.model.config.n_layers
    for q, a in dm.PROBES[1:3]:
        t = table[table.prompt == q]
        T = info[q]["n_tokens"]
        assert T == len(r.tok.encode_example(q, a, eos=False)[0])
        assert sorted(t.layer.unique()) == list(range(L))  # boundaries 0..L−1: no row for the final output
        assert len(t) == L * T
        assert (t[t.position.isin([0, T - 1])].value == 0).all()  # BOS and the last token are not erased
        assert (t[t.position.between(1, T - 2)].value > 0).any()
        assert t.is_answer.sum() == L * (T - info[q]["a_start"])
        assert info[q]["correct"] == (info[q]["greedy"] == a)


@pytest.mark.unit
def test_erasure_depth_is_the_weighted_mean_boundary():
    rows = [{"model": "m", "prompt": "p", "method": "erasure", "layer": l, "position": p, "is_answer": p == 3,
             "value": v} for l, p, v in ((0, 1, 0.0), (1, 1, 0.0), (2, 1, 1.0), (3, 1, 0.0), (0, 2, 0.0),
                                          (1, 2, 1.0), (2, 2, 0.0), (3, 2, 0.0), (3, 3, 9.0))]
    d = sa.erasure_depth(pd.DataFrame(rows))
    assert d.erasure_depth.item() == pytest.approx(1.5 / 3)  # (2·1 + 1·1) / 2 over 3; the answer token ignored


@pytest.mark.unit
def test_operation_sample_is_seeded_and_capped():
    ex = [dm.MathExample(f"What is {' + '.join(['1'] * (k + 1))}?", str(k + 1), "add_sub_multiple", "interpolate")
          for k in (1, 1, 1, 2, 2, 5) for _ in range(1)]
    ex = [dm.MathExample(e.question + " " * i, e.answer, e.module, e.split) for i, e in enumerate(ex)]
    s = sa.operation_sample(ex, 2, seed=0)
    counts = [e.n_operations for e in s]
    assert counts == sorted(counts) and counts.count(1) == 2 and counts.count(2) == 2 and counts.count(5) == 1
    assert s == sa.operation_sample(ex, 2, seed=0)
    assert [e.n_operations for e in sa.operation_sample(ex, 2, min_count=2)] == [1, 1, 2, 2]


@pytest.mark.integration
def test_depth_inputs_have_the_skip_structure(runs):
    got, root = runs
    r = got["moeut-lm"]
    data = tr.load_data(tr.run_config("smoke", "moeut", "lm", **SMALL), root / "data")
    E, O = sa.depth_by_operations(r, data.interpolate[:3])
    L = r.model.config.n_layers
    assert E.shape == (3, L, L) and O.shape == (3, L)
    assert np.all(np.tril(E, -1) == 0)  # skipping step s changes no earlier step
    # the last step writes nothing that a later position reads: skipping it on the prompt changes no answer
    # (up to float noise: the fast path unembeds the measured positions apart from the clean pass's rows)
    assert np.all(np.abs(O[:, -1]) < 1e-6) and np.all(np.abs(E[:, -1]) < 1e-6)
    assert np.all(O[:, :-1] > 0) and np.all(np.isfinite(E))
