"""Chapter 07's analyses of the from-scratch runs (lmdepth.analyses.scratch) and the answer scores of
lmdepth.scratch.training: intervals, gains, erasure layout, depth-score inputs, and a missing run's error. Tiny runs, CPU."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from lmdepth.analyses import scratch as sa
from lmdepth.book.pages import scratch_page
from lmdepth.claims.scratch_claims import RUNS
from lmdepth.data import dm_math as dm
from lmdepth.errors import DataError
from lmdepth.metrics.intervals import constant_answer_rate, wilson_interval
from lmdepth.scratch import evaluate as ev
from lmdepth.scratch import training as tr

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

MODULES = ("add_sub_multiple",)
SMALL = dict(modules=MODULES, n_train_per_module=48, n_eval_per_module=12, steps=4, batch_size=4, ckpt_every=2)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("scratch")
    return sa.trained_runs("smoke", root / "ck", root / "data", progress=False, **SMALL), root


@pytest.mark.unit
def test_missing_run_without_training_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="train=True"):
        sa.trained_runs("smoke", tmp_path / "none", tmp_path / "data", train=False, **SMALL)


@pytest.mark.unit
def test_a_finished_run_is_found_in_checkpoint_dir_first_then_among_the_shipped_runs(tmp_path, monkeypatch):
    from lmdepth.scratch import shipped

    mine, wheel = tmp_path / "mine", tmp_path / "wheel"
    monkeypatch.setattr(shipped, "SHIPPED_DIRS", (wheel,))
    folder = "moeut-lm-0123456789ab"
    assert shipped.finished_model(folder, mine) is None
    (wheel / folder).mkdir(parents=True)
    (wheel / folder / "model.pt").write_bytes(b"w")
    assert shipped.finished_model(folder, mine) is None  # no meta.json: not a finished run
    (wheel / folder / "meta.json").write_text("{}")
    assert shipped.finished_model(folder, mine) == wheel / folder / "model.pt"
    (mine / folder).mkdir(parents=True)
    (mine / folder / "ckpt.pt").write_bytes(b"r")  # an unfinished training of the reader's own
    assert shipped.finished_model(folder, mine) == wheel / folder / "model.pt"
    (mine / folder / "model.pt").write_bytes(b"m")
    (mine / folder / "meta.json").write_text("{}")
    assert shipped.finished_model(folder, mine) == mine / folder / "model.pt"


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
def test_the_comparison_runs_share_one_rate_three_seeds_and_moeuts_seed_0_is_the_chapters_run():
    configs = tr.matched_configs("default")
    assert {c.lr for c in configs} == {tr.MATCHED_LR}
    assert sorted((c.arch, c.objective, c.seed) for c in configs) == sorted(
        (a, o, s) for a in tr.ARCHS for o in tr.OBJECTIVES for s in tr.SEEDS_OF[o])
    for objective in tr.OBJECTIVES:  # the chapter's text: "MoEUT's seed-0 runs are the runs above"
        own = tr.run_dir(tr.run_config("default", "moeut", objective), "x").name
        assert own in {tr.run_dir(c, "x").name for c in configs}
        assert tr.run_dir(tr.run_config("default", "transformer", objective), "x").name not in {
            tr.run_dir(c, "x").name for c in configs}  # the Transformer's own runs train at another rate


@pytest.mark.integration
def test_matched_runs_read_finished_comparison_runs_and_report_the_rest(tmp_path, monkeypatch):
    from lmdepth.claims.scratch_claims import RUNS, SUBJECT, comparable, units_of

    configs = [tr.run_config("smoke", "transformer", "answer_only", lr=tr.MATCHED_LR, seed=s, **SMALL)
               for s in (0, 1, 2)]
    monkeypatch.setattr(sa, "matched_configs", lambda profile: configs)
    ck, data_dir = tmp_path / "ck", tmp_path / "data"
    tr.train_run(configs[0], ck, data_dir=data_dir, progress=False)
    assert tr.train_run(configs[1], ck, data_dir=data_dir, stop_after=2, progress=False) is None  # interrupted
    runs, states = sa.matched_runs("smoke", ck)
    assert list(runs) == ["transformer-answer_only seed 0"] and runs["transformer-answer_only seed 0"].name == RUNS[3]
    assert states.state.tolist() == ["finished", "training", "not trained"]
    assert states.steps.tolist() == ["4 of 4", "2 of 4", "0 of 4"]
    splits = sa.evaluation_splits(tr.load_data(configs[0], data_dir))
    per_example = sa.evaluate_runs(runs, splits)
    assert set(per_example.run) == {RUNS[3]} and set(per_example.train_seed) == {0}
    table = scratch_page.matched_table(states, per_example)
    interpolate = per_example[per_example.split == "interpolate"].correct.mean()
    assert table["exact match, interpolate"].tolist() == [f"{interpolate:.1%}", "—", "—"]
    assert table.state.tolist() == ["finished", "training: step 2 of 4", "not trained"]
    ok, why = comparable(RUNS[3:])(units_of(per_example), SUBJECT)
    assert not ok and "1 training seed, at least 3 needed" in why
    seen = sa.evaluate_runs(runs, splits, known=per_example.assign(correct=-1))  # taken from `known` by path …
    assert (seen.correct == -1).all() and len(seen) == len(per_example)
    other = sa.evaluate_runs(runs, splits, known=per_example.assign(path="elsewhere"))  # … and only by path
    pd.testing.assert_frame_equal(other, per_example)
    again, _ = sa.matched_runs("smoke", ck, loaded={"mine": runs["transformer-answer_only seed 0"]})
    assert again["transformer-answer_only seed 0"] is runs["transformer-answer_only seed 0"]  # not loaded twice
    empty = sa.evaluate_runs({}, splits)  # nothing finished: an empty table of the same columns
    assert empty.empty and list(empty.columns) == list(sa.EVALUATION_COLUMNS)
    assert scratch_page.matched_table(states.iloc[1:], empty)["exact match, extrapolate"].tolist() == ["—", "—"]


@pytest.mark.unit
def test_wilson_interval_known_values():
    lo, hi = wilson_interval(0, 10)
    assert lo == 0 and hi == pytest.approx(0.2775, abs=1e-4)
    lo, hi = wilson_interval(5, 10)
    assert (lo, hi) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson_interval(10, 10)[1] == 1.0


@pytest.mark.unit
def test_constant_answer_rate_is_the_most_common_answers_share():
    assert constant_answer_rate(["-1", "2", -1, "-1", "7"]) == 0.6  # 3 of 5, numbers compared as text
    assert constant_answer_rate([str(i) for i in range(99)]) == pytest.approx(1 / 99)
    assert np.isnan(constant_answer_rate([]))


@pytest.mark.integration
def test_answer_scores_match_an_independent_computation(runs):
    got, root = runs
    r = got["transformer-lm"]
    data = tr.load_data(tr.run_config("smoke", "transformer", "lm", **SMALL), root / "data")
    ex = data.interpolate[:5]
    ok, nll = ev.answer_scores(r.model, r.tok, ex, batch_size=2)
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
                  "correct": i < k, "answer_nll": float(i), "answer": "-1" if i < 3 else "7"} for i in range(4)]
    s = sa.accuracy_summary(pd.DataFrame(rows))
    assert (s.baseline == 0.75).all()  # always answering "-1" gets 3 of 4
    assert s.set_index("run").accuracy.to_dict() == {"moeut-lm": 0.25, "moeut-answer_only": 0.75,
                                                      "transformer-lm": 0.5, "transformer-answer_only": 0.5}
    assert (s.answer_nll == 1.5).all()
    assert s.set_index("run").loc["moeut-lm", ["ci_low", "ci_high"]].tolist() == pytest.approx(
        wilson_interval(1, 4))


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
    # the same problems compared across architectures: question modelled, MoEUT solves none and the Transformer
    # half (−50 points, an interval below 0); not modelled, MoEUT solves all (+50 points)
    gaps = sa.architecture_gaps(pd.DataFrame(rows), ["extrapolate"], n_boot=200).set_index(["metric", "comparison"])
    lm, ao = gaps.loc[("exact match", "question modelled")], gaps.loc[("exact match", "question not modelled")]
    assert lm.gain == -0.5 and lm.ci_high < 0 and ao.gain == 0.5 and ao.ci_low > 0
    assert gaps.loc[("answer loss reduction", "question modelled"), "gain"] == -0.5  # 1.5 − 2.0 nats
    text = scratch_page.gaps_md(gaps.reset_index())
    assert "question modelled, extrapolate: the Transformer better" in text
    assert "question not modelled, extrapolate: MoEUT better" in text
    tie = pd.DataFrame(rows).assign(correct=False)  # nobody solves anything: no difference beyond noise
    assert "do not differ beyond noise on extrapolate" in scratch_page.gaps_md(
        sa.architecture_gaps(tie, ["extrapolate"], n_boot=200))


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


# ---- what chapter 07 shows (unit tier: synthetic tables, no model) -----------------------------------------------

@pytest.mark.parametrize("bad, msg", [
    (dict(profile="huge"), "profile"),
    (dict(train="yes"), "train"),
    (dict(n_per_operations=0), "n_per_operations"),
    (dict(n_boot=5), "n_boot"),
    (dict(n_boot=1.5), "n_boot"),
])
@pytest.mark.unit
def test_scratch_params_are_checked(bad, msg):
    from lmdepth.errors import ParameterError

    with pytest.raises(ParameterError, match=msg):
        sa.ScratchParams(**bad)


@pytest.mark.unit
def test_scratch_params_paths(tmp_path):
    p = sa.ScratchParams(checkpoint_dir="", results_dir=str(tmp_path))
    assert p.runs_dir == tmp_path / "dm_math_runs" and p.data_dir == tmp_path / "dm_math_data"
    assert sa.ScratchParams(checkpoint_dir="ck").runs_dir.name == "ck"


def _gains(moeut: tuple[float, float, float], diff: tuple[float, float, float]) -> pd.DataFrame:
    rows = []
    for split in ("interpolate", "extrapolate"):
        for metric in ("exact match", "answer loss reduction"):
            for comp, (g, lo, hi) in (("moeut", moeut), ("transformer", (0.0, -0.1, 0.1)), ("moeut − transformer", diff)):
                rows.append({"split": split, "metric": metric, "comparison": comp, "gain": g, "ci_low": lo,
                             "ci_high": hi, "n": 10})
    return pd.DataFrame(rows)


def _rises(mo: tuple[float, float, float], tf: tuple[float, float, float]) -> pd.DataFrame:
    """overall_rises of a synthetic depth score over 1–3 operations on 5-step models (L − 1 = 4)."""
    rows = [{"aggregation": agg, "metric": m, "slope": s, "ci_low": lo, "ci_high": hi, "n_levels": 3, "run": run}
            for run, (s, lo, hi) in (("moeut-answer_only", mo), ("transformer-answer_only", tf),
                                     ("moeut-lm", (0, 0, 0)), ("transformer-lm", (0, 0, 0)))
            for agg in ("mean", "max") for m in ("layer_effect", "logit_effect")]
    sl = pd.DataFrame(rows)
    sl["rel_slope"], sl["rel_ci_low"], sl["rel_ci_high"] = sl.slope / 4, sl.ci_low / 4, sl.ci_high / 4
    depth = sa.DepthByOperations(sample=[], n_ops=np.array([1, 2, 3]), levels=pd.DataFrame(), slopes=sl,
                                 split_rises=pd.DataFrame(), solved_groups=pd.DataFrame())
    return sa.overall_rises(depth)


@pytest.mark.unit
def test_overall_rises_span_the_operation_counts():
    r = _rises((0.4, 0.2, 0.6), (0.0, -0.2, 0.2))
    assert set(r.aggregation) == {"mean"} and len(r) == 8
    mo = r[(r.run == "moeut-answer_only") & (r.metric == "layer_effect")].iloc[0]
    assert mo[sa.RISE] == pytest.approx(0.2)  # slope 0.4 / (L − 1) × (3 − 1) operations
    assert mo["95% CI"] == "+0.100 … +0.300"
    assert list(scratch_page.rise_table(r).columns) == ["run", "metric", sa.RISE, "95% CI"]


@pytest.mark.unit
def test_interval_verdict_and_findings():
    above, below, across = (pd.Series({"ci_low": lo, "ci_high": hi}) for lo, hi in ((0.1, 0.2), (-0.2, -0.1), (-0.1, 0.1)))
    assert scratch_page.interval_verdict(above, "better") == "better"
    assert scratch_page.interval_verdict(below, "better") == "the opposite of better"
    assert scratch_page.interval_verdict(across, "better") == "no clear difference"
    summary = pd.DataFrame({"run": ["a", "b"], "split": ["interpolate", "extrapolate"], "accuracy": [0.02, 0.05]})
    edepth = pd.DataFrame({"run": ["a", "a", "b"], "prompt": ["p", "q", "p"], "erasure_depth": [0.2, 0.4, 0.5]})
    evaluated = pd.DataFrame([dict(run=run, split=split, answer=f"{split}{i}", correct=1, answer_nll=1.0,
                                   train_seed=sd, lr=1e-3) for run in RUNS for sd in (0, 1, 2)
                              for split in ("interpolate", "extrapolate") for i in range(20)])
    text = scratch_page.findings_md(summary, _gains((0.2, 0.1, 0.3), (0.0, -0.1, 0.1)), _rises((0.4, 0.2, 0.6), (0, 0, 0)),
                                    edepth, evaluated)
    assert "b on extrapolate, 5.0% — too low" in text and "(no clear difference)" in text
    assert text.endswith("probes is a 0.30, b 0.50.")
    apart = scratch_page.findings_md(summary, _gains((0.2, 0.1, 0.3), (0.0, -0.1, 0.1)), _rises((0.4, 0.2, 0.6), (0, 0, 0)),
                                     edepth, evaluated[evaluated.train_seed == 0])  # one seed each, as the four runs
    assert "direction the paper reports" not in apart and "descriptive only" in apart
    assert "moeut-lm: 1 training seed" in apart


@pytest.mark.unit
def test_the_comparison_paragraph_reads_each_verdict_row_in_its_own_unit():
    """Exact-match rows read in points, answer-loss rows in nats; a row counted as something other than its state
    says both, and a row that is not testable gives its reason instead of numbers."""
    rows = pd.DataFrame({
        "claim_id": ["moeut.exact_match_gain", "moeut.answer_loss_gain", "moeut.answer_loss_gain_vs_transformer"],
        "claim": ["em gain", "loss gain", "loss vs"], "state": ["agrees", "inconclusive", "not testable"],
        "counted_as": ["agrees", "not discriminating", "not testable"],
        "side": ["outside its permutation null", "inside its permutation null", ""],
        "reason": ["", "", "runs not comparable: r: 2 training seeds"],
        "estimate": [0.103, 0.018, np.nan], "ci_low": [0.02, -0.085, np.nan], "ci_high": [0.184, 0.113, np.nan]})
    text = scratch_page.comparison_md(rows)
    assert "*em gain*: +10.3 points [+2.0, +18.4] (agrees)" in text, text
    assert ("*loss gain*: +0.018 nats per answer token [-0.085, +0.113] (inconclusive, inside its permutation null: "
            "counted as not discriminating)") in text, text
    assert "*loss vs*: not testable (runs not comparable: r: 2 training seeds)" in text and "nan" not in text, text
    assert "own gain" not in text  # its MoEUT row is testable, but the difference is not
    assert scratch_page.comparison_md(rows.iloc[:0]) == ""
    rows.loc[2, ["state", "counted_as", "estimate", "ci_low", "ci_high"]] = ["agrees", "agrees", 0.16, 0.01, 0.3]
    assert "(agrees), so the Transformer's own gain is -0.142 nats per answer token (a point estimate)" in scratch_page.comparison_md(rows)


@pytest.mark.unit
def test_solved_table_marks_empty_and_small_groups():
    sg = pd.DataFrame([{"group": g, "metric": "layer_effect", "depth_score": d, "ci_low": 0.5, "ci_high": 1.5, "n": n,
                        "run": "r", "n_layers": 5} for g, d, n in (("solved", 2.0, 3), ("unsolved", 1.0, 2))]
                      + [{"group": "solved", "metric": "layer_effect", "depth_score": np.nan, "ci_low": np.nan,
                          "ci_high": np.nan, "n": 0, "run": "s", "n_layers": 5},
                         {"group": "unsolved", "metric": "layer_effect", "depth_score": 1.0, "ci_low": 0.5,
                          "ci_high": 1.5, "n": 5, "run": "s", "n_layers": 5}])
    t = scratch_page.solved_table(sg).set_index("run")
    assert t.loc["r", "solved"] == "0.500 [0.125, 0.375]" and t.loc["r", "unsolved"] == "0.250 (n/a)"
    assert t.loc["s", "solved"] == "–" and t.loc["s", "n solved"] == 0


@pytest.mark.unit
def test_display_tables_of_accuracy_and_gains():
    s = pd.DataFrame([{"run": r, "split": sp, "accuracy": 0.5, "ci_low": 0.25, "ci_high": 0.75, "answer_nll": 1.23456,
                       "baseline": 0.02 if sp == "interpolate" else 0.04}
                      for r in ("a", "b") for sp in ("interpolate", "extrapolate")])
    t = scratch_page.accuracy_table(s)
    assert list(t.columns) == ["run", "extrapolate", "interpolate", "answer loss extrapolate", "answer loss interpolate"]
    assert t.extrapolate[0] == "50.0% [25.0%, 75.0%]" and t["answer loss interpolate"][0] == 1.235
    const = t.iloc[-1]
    assert const["run"] == "always the most common answer" and (const["interpolate"], const["extrapolate"]) == ("2.0%", "4.0%")
    g = scratch_page.gains_table(_gains((0.2, 0.1, 0.3), (0.0, -0.1, 0.1))).set_index(["split", "metric"])
    assert g.loc[("extrapolate", "exact match"), "moeut"] == "+20.0% [+10.0%, +30.0%]"
    assert g.loc[("extrapolate", "answer loss reduction"), "moeut"] == "+0.200 [+0.100, +0.300]"


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


@pytest.mark.integration
def test_training_charts_read_the_typed_summary(runs):
    """The loss and learning-curve charts draw what the run's typed summary holds (its history and curve)."""
    import dataclasses

    from lmdepth.charts.scratch_charts import learning_curve_chart, loss_chart

    got, _ = runs
    name, run = next(iter(got.items()))
    d = loss_chart({name: run}, window=1).data
    assert d.step.tolist() == [s for s, _ in run.summary.history]
    assert np.allclose(d.loss, [round(v, 4) for _, v in run.summary.history])
    assert learning_curve_chart({name: run}) is None  # trained without a curve
    with_curve = dataclasses.replace(run, meta={**run.meta, "curve": [[2, 0.25, 0.5], [4, 0.75, 1.0]]})
    assert with_curve.summary.curve == ((2, 0.25, 0.5), (4, 0.75, 1.0))
    rows = learning_curve_chart({name: with_curve}).data
    assert sorted(zip(rows.step, rows.split, rows["exact match"])) == [
        (2, "extrapolate", 0.5), (2, "interpolate", 0.25), (4, "extrapolate", 1.0), (4, "interpolate", 0.75)]
