"""Cross-model linear maps (chapter 06): alignment, closed-form ridge from streamed statistics, the run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from lmdepth.analyses import maps as lmaps
from lmdepth.book.pages import maps_page
from lmdepth.data.alignment import align, general_docs, interleave, math_docs, token_ends
from lmdepth.data.corpus import SPLITS, plan_corpus
from lmdepth.errors import ParameterError
from lmdepth.hooks.stack import AdapterStack, boundary_residuals
from lmdepth.metrics.ridge import boundary_layers, error_matrix, fit_maps, ridge_fit


def _splits(n_train: int, n_val: int, n_test: int) -> dict[str, slice]:
    return {"test": slice(0, n_test), "val": slice(n_test, n_test + n_val),
            "train": slice(n_test + n_val, n_test + n_val + n_train)}


# ---- ridge ------------------------------------------------------------------------------------------------------

@pytest.mark.unit
def test_ridge_fit_recovers_exact_affine_map():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 6)) * [1, 10, 0.1, 3, 1, 5] + 7.0
    w, b = rng.normal(size=(6, 4)), rng.normal(size=4) * 5
    y = x @ w + b
    w_hat, b_hat = ridge_fit(x, y, alpha=0.0)
    np.testing.assert_allclose(w_hat, w, atol=1e-9)
    np.testing.assert_allclose(b_hat, b, atol=1e-8)
    w_small, b_small = ridge_fit(x, y, alpha=1e-12)
    np.testing.assert_allclose(w_small, w, atol=1e-6)
    np.testing.assert_allclose(b_small, b, atol=1e-5)


def _synthetic(n: int = 900, d_s: int = 5, d_t: int = 4, seed: int = 0):
    """Source with 3 boundaries; target boundary j (j < 3) = source boundary j · W_j + b_j exactly, boundary 3 noise."""
    rng = np.random.default_rng(seed)
    src = (rng.normal(size=(n, 3, d_s)) + rng.normal(size=(1, 3, d_s)) * 4).astype(np.float32)
    tgt = np.empty((n, 4, d_t), np.float32)
    for j in range(3):
        tgt[:, j] = src[:, j] @ rng.normal(size=(d_s, d_t)) + rng.normal(size=d_t) * 3
    tgt[:, 3] = rng.normal(size=(n, d_t)) + 2
    return src, tgt


@pytest.mark.unit
def test_fit_maps_recovers_exact_maps_on_the_diagonal():
    src, tgt = _synthetic()
    rows = _splits(500, 150, 250)
    fwd, _ = fit_maps(src, tgt, rows, alphas=[1e-10, 1e-3], product_dtype="float64", chunk=64)
    assert fwd.rel_error.shape == (3, 4)
    assert np.all(np.diag(fwd.rel_error[:, :3]) < 1e-5)
    assert np.all(fwd.rel_error[~np.eye(3, 4, dtype=bool)] > 0.05)
    # the noise target cannot be predicted: no better than the training mean, up to overfitting
    np.testing.assert_allclose(fwd.rel_error[:, 3], fwd.baseline[3], rtol=0.05)
    best = lmaps.best_matches(fwd.rel_error[:, :3], [0, 1, 2], [0, 1, 2], 2, 2)
    assert best.best_target_layer.tolist() == [0, 1, 2]
    s = lmaps.diagonal_summary(best)
    assert s["corr"] == pytest.approx(1.0) and s["mean_abs_offset"] == 0
    cols = lmaps.best_sources(fwd.rel_error[:, :3], [0, 1, 2], [0, 1, 2], 2, 2)
    assert cols.best_source_layer.tolist() == [0, 1, 2]


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.unit
def test_streamed_statistics_equal_direct_per_token_errors(shuffle):
    """The ratio-of-sums errors from the statistics equal errors computed token by token from a direct fit."""
    src, tgt = _synthetic(seed=1)
    tgt = tgt + np.random.default_rng(2).normal(size=tgt.shape).astype(np.float32)  # no exact fits
    rows = _splits(400, 100, 300)
    alpha = 1e-2
    fwd, bwd = fit_maps(src, tgt, rows, alphas=[alpha], both_directions=True, product_dtype="float64",
                              chunk=37, shuffle_seed=5 if shuffle else None)

    def perm(k):
        n = rows[k].stop - rows[k].start
        return (np.random.default_rng([5, SPLITS.index(k)]).permutation(n) if shuffle else np.arange(n))

    xs = {k: src[rows[k]][perm(k)].astype(np.float64) for k in SPLITS}
    ys = {k: tgt[rows[k]].astype(np.float64) for k in SPLITS}
    for direction, fit, a, b in (("fwd", fwd, xs, ys), ("bwd", bwd, ys, xs)):
        for i in range(a["train"].shape[1]):
            for j in range(b["train"].shape[1]):
                w, c = ridge_fit(a["train"][:, i], b["train"][:, j], alpha)
                resid = b["test"][:, j] - (a["test"][:, i] @ w + c)
                direct = np.sqrt((resid ** 2).sum() / (b["test"][:, j] ** 2).sum())
                assert fit.rel_error[i, j] == pytest.approx(direct, rel=1e-7), (direction, i, j)
        mean_only = np.sqrt(((b["test"] - b["train"].mean(0)) ** 2).sum((0, 2)) / (b["test"] ** 2).sum((0, 2)))
        np.testing.assert_allclose(fit.baseline, mean_only, rtol=1e-7)


@pytest.mark.unit
def test_memory_bounded_groups_give_the_same_maps():
    src, tgt = _synthetic(seed=4)
    rows = _splits(500, 150, 250)
    kw = dict(alphas=[1e-6, 1e-2], both_directions=True, product_dtype="float64", chunk=128)
    whole = fit_maps(src, tgt, rows, **kw)
    tiny_budget = 3 * 3 * 5 * 4 * 8 * 1.5 / 2**30  # room for one and a half target boundaries: groups of one
    grouped = fit_maps(src, tgt, rows, max_stats_gb=tiny_budget, **kw)
    for a, b in zip(whole, grouped):
        np.testing.assert_allclose(a.rel_error, b.rel_error, rtol=1e-9, atol=1e-7)
        np.testing.assert_allclose(a.baseline, b.baseline, rtol=1e-12)
        assert a.tgt_layers == b.tgt_layers


@pytest.mark.unit
def test_self_map_symmetric_path_equals_general_path():
    src, _ = _synthetic(seed=3)
    rows = _splits(500, 150, 250)
    same, _ = fit_maps(src, src, rows, alphas=[1e-8, 1e-2], product_dtype="float64", chunk=100)
    other, _ = fit_maps(src, src.copy(), rows, alphas=[1e-8, 1e-2], product_dtype="float64", chunk=100)
    np.testing.assert_allclose(same.rel_error, other.rel_error, atol=1e-6)  # cancellation noise at 0
    assert np.all(np.diag(same.rel_error) < 1e-4)


# ---- alignment --------------------------------------------------------------------------------------------------

@pytest.mark.unit
def test_align_rules_on_offsets():
    ends_a = np.array([-1, 3, 5, 9, 9, 12])  # BOS, …, a character split into two pieces ending at 9
    ends_b = np.array([2, 5, 7, 9, 12])  # no BOS: position 0 is the attention sink and is dropped
    offsets, (pa, pb) = align([ends_a, ends_b])
    assert offsets.tolist() == [5, 9, 12]
    assert pa.tolist() == [2, 4, 5] and pb.tolist() == [1, 3, 4]


@pytest.mark.unit
def test_identical_tokenizers_align_to_the_identity(tok):
    text = "Natalia sold 48 clips in April, and half as many in May."
    ids, ends = token_ends(tok, text)
    assert ids[0] == tok.bos_token_id and ends[0] == -1
    offsets, (pa, pb) = align([ends, ends])
    assert pa.tolist() == pb.tolist() == list(range(1, len(ids)))
    assert offsets.tolist() == list(range(1, len(text) + 1))


@pytest.mark.unit
def test_corpus_texts_mix_both_sources():
    g, m = general_docs(800), math_docs("gsm8k", 800)
    assert len(g) > 200 and len(m) > 1000 and all(len(d.text) <= 800 for d in g[:50])
    assert not any("Your response should end" in d.text for d in m[:50])
    mixed = interleave(g, m, 0.5, seed=0)[:200]
    chars = {s: sum(len(d.text) for d in mixed if d.source == s) for s in ("general", "math")}
    assert 0.4 < chars["general"] / sum(chars.values()) < 0.6


# ---- capture and the run on tiny models -------------------------------------------------------------------------

@pytest.mark.integration
def test_boundary_residuals_match_hooked_residuals(tiny_dirs):
    from lmdepth.model.registry import load_model
    from lmdepth.model.taps import hooked_residuals

    lm = load_model(str(tiny_dirs["gemma3"]))
    ids = lm.encode("The cat sat on the mat.")
    h = boundary_residuals(AdapterStack(lm.adapter), ids).float()[:, 0]
    r = hooked_residuals(lm.adapter, ids)
    assert h.shape == (lm.n_layers + 1, ids.shape[1], lm.adapter.d_model)
    torch.testing.assert_close(h[:-1], r["resid_pre"][:, 0])
    torch.testing.assert_close(h[-1], r["resid_post"][-1, 0])
    # right padding with any token changes nothing before it (causal attention)
    padded = torch.cat([ids, torch.full((1, 5), 7, device=ids.device)], 1)
    both = torch.cat([padded, torch.cat([ids[:, :4], torch.full((1, ids.shape[1] + 1), 9)], 1)])
    hb = boundary_residuals(AdapterStack(lm.adapter), both).float()
    torch.testing.assert_close(hb[:, 0, : ids.shape[1]], h, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hb[:, 1, :4], h[:, :4], rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def tiny_run(tiny_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("maps")
    texts = root / "texts.jsonl"
    rng = np.random.default_rng(0)
    words = "the a cat dog sat ran on under mat box and then it was warm cold 12 7 plus minus is".split()
    texts.write_text("\n".join(json.dumps({"text": " ".join(rng.choice(words, 40)) + "."}) for _ in range(80)) + "\n")
    kw = dict(model_name=str(tiny_dirs["llama"]), compare_models=[str(tiny_dirs["gemma3"])],
              self_map_model=str(tiny_dirs["llama"]), dataset=str(texts), general_text="none", general_fraction=0.0,
              n_train_tokens=900, n_val_tokens=200, n_test_tokens=400, max_doc_chars=300, control_stride=2,
              product_dtype="float64", results_dir=root / "results")
    import weakref

    refs, alive_at_load = [], []
    real = lmaps.load_model

    def tracked(*a, **k):
        alive_at_load.append(sum(r() is not None for r in refs))
        lm = real(*a, **k)
        refs.append(weakref.ref(lm))
        return lm

    real_collect, spooled = lmaps.collect, []

    def spy(lm, plan, i, **k):
        out = real_collect(lm, plan, i, **k)
        spooled.append((k.get("spool"), isinstance(out, np.memmap), np.array_equal(out, real_collect(lm, plan, i))))
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lmaps, "load_model", tracked)  # the name maps.run calls
        mp.setattr(lmaps, "collect", spy)
        res = lmaps.run(**kw)
    # one model in memory at a time (the paper profile maps 1.5B ↔ 14B): each earlier model was released first
    assert alive_at_load == [0, 0], alive_at_load
    # residuals were memory-mapped from files under results_dir, equal to in-memory ones, and the files are gone
    assert len(spooled) == 2 and all(mapped and equal for _, mapped, equal in spooled), spooled
    assert all(path.is_relative_to(root / "results") and not path.parent.exists() for path, _, _ in spooled)
    return res, kw


@pytest.mark.integration
def test_run_on_tiny_models(tiny_run):
    res, kw = tiny_run
    meta, table = res.meta, res.table
    corpus = meta["corpus"]
    assert corpus["aligned_tokens"]["test"] >= 400 and corpus["aligned_tokens"]["train"] >= 900
    assert all(c == pytest.approx(1.0) for c in corpus["coverage"].values())  # same character tokenizer
    labels = [l for m in meta["maps"] for l in m["labels"]]
    assert len(labels) == 4 and set(table["map"]) == set(labels)
    n_layers = meta["models"][kw["model_name"]]["n_layers"]
    main = error_matrix(table, labels[0])
    assert main.shape == (n_layers + 1, n_layers + 1) and np.isfinite(main.to_numpy()).all()
    # a model mapped onto itself: the error of a boundary onto itself is ~0, and the best match is the identity
    self_label = next(l for l in labels if "self-map" in l)
    e = error_matrix(table, self_label)
    assert list(e.index) == boundary_layers(n_layers, 2)
    assert np.diag(e.to_numpy()).max() < 1e-4
    s = meta["summaries"][self_label]
    for k in ("row", "col"):
        assert s[f"{k}_corr"] == pytest.approx(1.0) and s[f"{k}_mean_abs_offset"] == 0
    assert set(meta["timings_s"]) >= {"total", "tokenize_and_align"}
    # the typed summary the chapter and the atlas read: every field from the sidecar the run wrote
    run = lmaps.MapsSummary.of(res)
    assert run.labels("self") == [self_label] and run.labels("main") + run.labels("self") + run.labels("shuffled") == labels
    assert run.models[kw["model_name"]].n_layers == n_layers and run.aligned_tokens == corpus["aligned_tokens"]
    assert run.alignments[self_label].col_corr == pytest.approx(1.0) and run.n_test_tokens == kw["n_test_tokens"]
    assert run.timings_s["total"] > 0 and run.cpu_threads >= 1 and run.model == kw["model_name"]


@pytest.mark.integration
def test_all_pairs_maps_every_pair_as_its_own_run_would(tiny_run, tiny_dirs, tmp_path):
    """With three models, all_pairs adds the pair of the two compare models, both directions, wired to the right
    residuals: its errors equal those of a run made for that pair alone. (The tiny models share one character
    tokenizer, so both runs align the same positions; with different tokenizers a trio aligns the positions where all
    three end a token, a subset of the pair's own.)"""
    _, kw = tiny_run
    a, b, c = kw["model_name"], kw["compare_models"][0], str(tiny_dirs["qwen2"])
    common = {**kw, "self_map_model": "", "shuffle_control": False, "results_dir": tmp_path}
    trio = lmaps.run(**{**common, "compare_models": [b, c], "all_pairs": True})
    labels = [l for m in trio.meta["maps"] for l in m["labels"]]
    assert labels == [f"{a} → {b}", f"{b} → {a}", f"{a} → {c}", f"{c} → {a}", f"{b} → {c}", f"{c} → {b}"]
    alone = lmaps.run(**{**common, "model_name": b, "compare_models": [c]})
    for label in (f"{b} → {c}", f"{c} → {b}"):
        np.testing.assert_allclose(error_matrix(trio.table, label).to_numpy(),
                                   error_matrix(alone.table, label).to_numpy(), rtol=1e-9, atol=1e-12)
    without = lmaps.map_specs(a, [b, c], "", False, 2, all_pairs=False)
    assert [(s.source, s.target) for s in without] == [(a, b), (a, c)]


@pytest.mark.integration
def test_run_is_cached(tiny_run):
    res, kw = tiny_run
    again = lmaps.run(**kw)
    assert again.from_cache and again.path == res.path


@pytest.mark.parametrize("bad, msg", [
    (dict(compare_models=[]), "compare_models"),
    (dict(compare_models=["smollm2-135m"], model_name="smollm2-135m"), "compare_models"),
    (dict(general_text="wikipedia"), "general_text"),
    (dict(n_test_tokens=0), "n_test_tokens"),
    (dict(ridge_alphas=[-1.0]), "ridge_alphas"),
    (dict(ridge_alphas=[0.0, 1e-3]), "ridge_alphas"),
    (dict(product_dtype="float16"), "product_dtype"),
    (dict(all_pairs="yes"), "all_pairs"),
])
@pytest.mark.unit
def test_bad_parameters_fail_before_loading(bad, msg, tmp_path):
    with pytest.raises(ParameterError, match=msg):
        lmaps.run(**{"results_dir": tmp_path, **bad})


# ---- what the chapter shows (unit tier: a synthetic tidy table, no model) ----------------------------------------

def _fit(err: np.ndarray, baseline: np.ndarray, src: list[int], tgt: list[int]):
    from lmdepth.metrics.ridge import MapFit

    return MapFit(rel_error=err, fvu=err ** 2, val_rel_error=err, alpha=np.full_like(err, 1e-3), baseline=baseline,
                  src_layers=src, tgt_layers=tgt)


def _synthetic_run(coverage: float = 0.9, shuffled_ratio: float = 1.0):
    """A run of two 4-layer models "a" and "b": the main pair has its lowest errors on the diagonal, the self-map is
    the identity, the shuffled pairs are ``shuffled_ratio`` × the mean-only error everywhere."""
    import pandas as pd

    layers = [0, 1, 2, 3, 4]
    d = np.abs(np.subtract.outer(layers, layers)) / 4.0
    base = np.full(5, 0.8)
    fits = {"a → b": (_fit(0.1 + 0.5 * d, base, layers, layers), "main", "a", "b"),
            "b → a": (_fit(0.1 + 0.5 * d, base, layers, layers), "main", "b", "a"),
            "b → b (self-map)": (_fit(np.where(d == 0, 1e-6, 0.2 + d), base, layers, layers), "self", "b", "b"),
            "a → b (shuffled pairs)": (_fit(np.full((5, 5), 0.8 * shuffled_ratio), base, layers, layers),
                                       "shuffled", "a", "b")}
    table = pd.concat([lmaps.map_table(f, lab, kind, s, t, 4, 4) for lab, (f, kind, s, t) in fits.items()],
                      ignore_index=True)
    from lmdepth.results import RunResult

    specs = lmaps.map_specs("a", ["b"], "b", True, 1)
    meta = {"parameters": {"model_name": "a", "compare_models": ["b"], "n_test_tokens": 100},  # as maps.run writes it
            "models": {m: {"n_layers": 4, "d_model": 8, "family": "tiny"} for m in "ab"},
            "corpus": {"general_text": None, "aligned_tokens": {"train": 300, "val": 100, "test": 100},
                       "texts": {"train": 3, "val": 1, "test": 1}, "texts_by_source": {"gsm8k": 5},
                       "coverage": {"a": coverage, "b": 0.95}},
            "maps": [{"labels": s.labels, "kind": s.kind, "source": s.source, "target": s.target, "stride": s.stride}
                     for s in specs],
            "summaries": {lab: {k: v for k, v in lmaps.summarize_map(table, lab).items() if not k.startswith("best")}
                          for lab in fits},
            "timings_s": {"total": 90.0}, "wall_time_s": 90.0, "cpu_time_s": 120.0,
            "environment": {"cpu_threads": 2, "cuda": None}}
    return table, lmaps.MapsSummary.of(RunResult(table, meta, Path("results/linear_maps/a/0"), from_cache=True))


@pytest.mark.unit
def test_chapter_summaries_of_a_synthetic_run():
    table, run = _synthetic_run()
    assert run.labels("main") == ["a → b", "b → a"]
    assert run.labels("self") == ["b → b (self-map)"]
    summary = maps_page.summary_table(table, run)
    assert list(summary["map"]) == ["a → b", "b → a"]
    assert (summary["per column: corr"] == 1.0).all() and (summary["lowest error"] == 0.1).all()
    np.testing.assert_allclose(lmaps.error_over_baseline(table, "a → b (shuffled pairs)"), 1.0)
    ctrl = maps_page.controls_table(table, run)
    assert list(ctrl.control) == ["self-map", "shuffled pairs", "embeddings only (floor)", "embeddings only (floor)"]
    assert "same boundary in 5/5 rows" in ctrl.measured[0]
    text = maps_page.best_sources_md(table, run)
    assert "over the 2 maps (1 pairs × 2 directions)" in text and "**1.00–1.00**" in text
    maps_page.check_run(table, run)  # nothing to complain about
    assert "**a** (4 layers, d_model 8, tiny)" in maps_page.run_md(run) and "a 90.0%" in maps_page.run_md(run)
    assert maps_page.speed_md(table, run).startswith("Wall time of this run: **90 s** (1.5 min; CPU time of the "
                                                      "process, all threads: 120 s) on 2 CPU threads, for 50 layer-pair")
    assert maps_page.timings_table(run).to_dict("records") == [{"step": "total", "seconds": 90.0}]


@pytest.mark.parametrize("shuffled_ratio, holds", [(1.0, "yes"), (0.9, "NO")])
@pytest.mark.unit
def test_method_checks_of_a_synthetic_run(shuffled_ratio, holds):
    table, run = _synthetic_run(shuffled_ratio=shuffled_ratio)
    df = maps_page.method_checks(table, run)
    assert list(df["passes"]) == ["yes", holds]  # self-map identity; shuffled pairs: no cell below 0.98 × mean-only


@pytest.mark.unit
def test_map_claims_of_a_synthetic_run():
    """Two 4-layer models leave 3 target boundaries (2–4) for the claims: not testable."""
    from lmdepth.claims import maps_claims, report

    table, run = _synthetic_run()
    labels = run.labels("main")
    units, controls = maps_claims.units_of(table, labels)
    v = report.check("maps", units, labels, controls)
    assert len(v) == 2 * len(labels) and set(v.model) == set(labels)
    assert (v.state == "not testable").all() and v.reason.str.contains("at least 10").all()  # 3 boundaries (2–4)


@pytest.mark.unit
def test_chapter_checks_fail_clearly():
    from lmdepth.errors import DataError

    with pytest.raises(ParameterError, match="is not one"):  # NDIF runs hub ids
        lmaps.MapsParams(remote=True)
    assert lmaps.MapsParams(remote="local").remote == "local"  # the strict offline simulation of NDIF
    table, run = _synthetic_run(coverage=0.4)
    with pytest.raises(DataError, match="a 40%"):
        maps_page.check_run(table, run)
    table, run = _synthetic_run()
    table.loc[(table["map"] == "a → b") & (table.metric == "relative_error"), "value"] = 2.0
    with pytest.raises(AssertionError, match="a → b"):
        maps_page.check_run(table, run)


# ---- the packaged tokenizers (packaged tier: three real tokenizers) -----------------------------------------------

@pytest.mark.packaged
def test_packaged_tokenizers_align_on_english_and_word_problems():
    names = ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"]
    toks = {n: lmaps.tokenizer_of(n)[0] for n in names}
    docs = interleave(general_docs(150), math_docs("gsm8k", 150), 0.5, seed=0)  # enough for the 2,200 tokens
    plan = plan_corpus(toks, docs, {"train": 1000, "val": 200, "test": 1000})
    cov = plan.coverage()
    assert all(0.8 < c <= 1.0 for c in cov.values()), cov


@pytest.mark.integration
def test_collection_requests_stay_under_the_result_bound_and_give_the_same_residuals(tiny_dirs):
    """One request brings back at most ``max_result_bytes`` of residuals (the strict server's bound; ~18 aligned
    tokens of a 70B model): a text with more aligned positions is run once per share, with the same values."""
    from lmdepth.data.corpus import CorpusPlan
    from lmdepth.model.registry import load_model

    lm = load_model(str(tiny_dirs["llama"]))
    texts = ["The cat sat on the mat.", "A dog ran under the box and then it was warm.", "12 plus 7 is 19."]
    ids = [[lm.tokenizer(t).input_ids] for t in texts]
    positions = [[np.arange(1, len(i[0]))] for i in ids]
    n = sum(len(p[0]) for p in positions)
    plan = CorpusPlan(["llama"], [], ids, positions, {"test": slice(0, n)}, {"test": 3}, [n])
    row_bytes = 4 * (lm.n_layers + 1) * lm.adapter.d_model
    whole = lmaps.collect(lm, plan, 0)
    for rows in (1, 5, 17):
        batches = lmaps.request_batches(plan, 0, 2048, rows)
        counts = [sum(len(plan.positions[k][0][share]) for k, share in b) for b in batches]
        assert max(counts) <= rows and sum(counts) == n and len(batches) >= n / rows
        assert [(k, i) for b in batches for k, s in b for i in plan.positions[k][0][s]] == [
            (k, i) for k in range(3) for i in plan.positions[k][0]]  # every position once, in row order
        got = lmaps.collect(lm, plan, 0, max_result_bytes=rows * row_bytes)  # other batches: other padding
        np.testing.assert_allclose(got, whole, rtol=1e-5, atol=1e-6)
