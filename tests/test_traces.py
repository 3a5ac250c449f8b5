"""The remote-ready traces (lmdepth.traces): each survives the strict simulation of the NDIF server and equals its
plain-hook reference; the simulation itself fails where a real server would; ``remote=true`` is checked in seconds.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch

from lmdepth.errors import ParameterError, RemoteUnavailable
from lmdepth.metrics.residual_stats import residual_token_metrics
from lmdepth.model.families import ModelAdapter
from lmdepth.model.taps import hooked_residuals
from lmdepth.testing import FAMILY_CONFIGS, tiny_model, tiny_tokenizer
from lmdepth.traces import server
from lmdepth.traces.residual_metrics import TapPaths, residual_metrics
from lmdepth.traces.server import NotRemotable, StrictServer, foreign_modules, payload_modules

FAMILIES = list(FAMILY_CONFIGS)


def _wrap(model):
    from nnsight.modeling.transformers import TransformersModel

    return TransformersModel(model, tokenizer=tiny_tokenizer())


@pytest.fixture(scope="module")
def ids():
    return tiny_tokenizer()("The cat sat on the mat, 12 + 7 = 19.", return_tensors="pt").input_ids


def _reference(adapter: ModelAdapter, ids: torch.Tensor) -> torch.Tensor:
    r = hooked_residuals(adapter, ids, logits_to_keep=1)
    return torch.stack([residual_token_metrics(r["resid_pre"][l], r["attn_out"][l], r["mlp_out"][l],
                                               r["resid_post"][l]) for l in range(adapter.n_layers)])


# ---- the residual-metrics trace (chapters 01-02) --------------------------------------------------------------------

@pytest.mark.integration
@pytest.mark.parametrize("family", FAMILIES)
def test_residual_trace_survives_the_strict_server_and_equals_the_hook_reference(family, ids):
    model = tiny_model(family)
    adapter = ModelAdapter.for_model(model)
    nn = _wrap(model)
    ref = _reference(adapter, ids)
    here = residual_metrics(nn, TapPaths.of(adapter), ids)
    before = len(server.REQUESTS)
    remote = residual_metrics(nn, TapPaths.of(adapter), ids, remote="local")
    assert here.shape == (adapter.n_layers, 11, 1, ids.shape[1])
    assert (here - ref).abs().max() <= 1e-5 and (remote - ref).abs().max() <= 1e-5
    (record,) = server.REQUESTS[before:]
    assert record.saved == ["values"] and record.payload_bytes < 50_000  # plain data only: no tensors shipped
    assert record.result_bytes < 4 * here.numel() + 4_000  # only [layers × metrics × tokens] comes back
    assert not [m for m in record.modules if m.split(".")[0] == "lmdepth"]


@pytest.mark.integration
def test_residual_analysis_under_the_strict_server_gives_the_local_table(tmp_path, jsonl):
    from lmdepth.analyses import residual
    from lmdepth.testing import save_tiny_model

    texts = jsonl([json.dumps({"text": f"{i} apples and {i + 2} pears are on the table."}) for i in range(3)])
    model_dir = save_tiny_model("gemma3", tmp_path / "model")
    kw = dict(dataset=str(texts), n_examples=3, n_boot=10)
    here = residual.run(str(model_dir), results_dir=tmp_path / "a", **kw)
    before = len(server.REQUESTS)
    sim = residual.run(str(model_dir), results_dir=tmp_path / "b", remote="local", **kw)
    assert len(server.REQUESTS) - before == 3  # one request per problem
    assert sim.meta["parameters"]["remote"] == "local"
    cols = ["value", "ci_low", "ci_high"]
    assert (here.table[cols].fillna(0) - sim.table[cols].fillna(0)).abs().max().max() <= 1e-5


# ---- the simulation fails where a real server would -------------------------------------------------------------------

@pytest.mark.integration
def test_the_strict_server_loses_a_list_made_before_the_trace_as_ndif_does(ids):
    nn = _wrap(tiny_model("llama"))

    def run(**kw):
        out = []
        with nn.trace(ids, **kw):
            out.append(nn.model.layers[0].output.norm(dim=-1).save())
        return out

    assert len(run()) == 1 and len(run(remote="local")) == 1  # here, and nnsight's own simulation: looks fine
    assert run(backend=StrictServer(nn)) == []  # the server sends back only saved names: the list stays empty


@pytest.mark.integration
def test_the_strict_server_refuses_library_code_inside_a_trace(ids):
    nn = _wrap(tiny_model("llama"))
    layer = nn.model.layers[0]
    with pytest.raises(NotRemotable, match=r"lmdepth\.metrics\.residual"):
        with nn.trace(ids, backend=StrictServer(nn)):
            residual_token_metrics(layer.input, layer.self_attn.output[0], layer.mlp.output, layer.output).save()


@pytest.mark.integration
def test_the_strict_server_bounds_the_result_and_a_cloned_slice_fits(ids):
    nn = _wrap(tiny_model("llama"))
    with pytest.raises(NotRemotable, match="a view ships its whole storage"):
        with nn.trace(ids, backend=StrictServer(nn, max_result=2_500)):
            last = nn.lm_head.output[:, -1].save()  # a view of [1, T, vocab]
    with nn.trace(ids, backend=StrictServer(nn, max_result=2_500)):
        last = nn.lm_head.output[:, -1].clone().save()
    assert last.shape == (1, 99)


@pytest.mark.integration
def test_the_strict_server_hides_the_library_while_it_executes(ids):
    nn = _wrap(tiny_model("llama"))
    with pytest.raises(ModuleNotFoundError, match="hidden"):
        with nn.trace(ids, backend=StrictServer(nn)):
            import lmdepth.metrics.residual_stats  # noqa: F401  (an import inside the block, not a pickled reference)
            nn.model.layers[0].output.save()
    import lmdepth.metrics.residual_stats  # noqa: F401  restored afterwards


@pytest.mark.integration
def test_the_loaded_models_wrapper_honours_remote(tmp_path, monkeypatch, ids):
    """``LoadedModel.nn`` is remotable: ``remote=`` reaches a backend instead of being passed to ``forward``."""
    from nnsight.intervention.backends.local import LocalSimulationBackend
    from nnsight.modeling.mixins.remotable import Remotable

    from lmdepth.model.registry import load_model
    from lmdepth.testing import save_tiny_model

    lm = load_model(str(save_tiny_model("llama", tmp_path / "m")))
    assert isinstance(lm.nn, Remotable)
    calls = []
    real = LocalSimulationBackend.__call__
    monkeypatch.setattr(LocalSimulationBackend, "__call__", lambda self, tracer: (calls.append(1), real(self, tracer)))
    nn = lm.nn  # the block reads the wrapper, never the LoadedModel (a library object)
    with nn.trace(ids, remote="local"):
        x = nn.model.layers[0].output.save()
    assert calls == [1] and x.shape[:2] == ids.shape


# ---- the static check -------------------------------------------------------------------------------------------------

@pytest.mark.unit
def test_payload_modules_reads_every_module_without_importing():
    import collections

    blob = pickle.dumps((collections.OrderedDict(a=1), torch.Size([2]), Path("x")), protocol=4)
    assert {"collections", "torch", "pathlib"} <= payload_modules(blob)
    assert foreign_modules(blob) == []
    from lmdepth.results import RunResult

    assert foreign_modules(pickle.dumps(RunResult, protocol=4)) == ["lmdepth.results"]
    import yaml

    assert foreign_modules(pickle.dumps(yaml.SafeLoader, protocol=2)) == ["yaml.loader"]


@pytest.mark.unit
def test_the_nnsight_internals_the_simulation_uses_are_there_and_pinned():
    import nnsight

    from lmdepth.runtime import REPO_ROOT

    server.check_nnsight_internals()
    pins = dict(line.split("==") for line in (REPO_ROOT / "requirements.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    assert nnsight.__version__ == pins["nnsight"] == "0.8.1"
    assert '"nnsight==0.8.1"' in (REPO_ROOT / "pyproject.toml").read_text()


# ---- remote=true: checked in seconds, before anything loads ---------------------------------------------------------

@pytest.mark.unit
@pytest.mark.parametrize("case, message", [
    ("no key", "needs an NDIF API key"),
    ("no hub", "Hugging Face hub"),
    ("no ndif", "cannot be reached"),
    ("not hosted", "does not run"),
    ("versions", "versions differ"),
])
def test_preflight_says_what_is_missing_in_one_line(case, message, monkeypatch):
    from nnsight import ndif
    from nnsight.schema.config import CONFIG

    from lmdepth.model import ndif as pre

    monkeypatch.setattr(CONFIG.API, "APIKEY", None)
    monkeypatch.delenv("NDIF_API_KEY", raising=False)
    if case != "no key":
        monkeypatch.setenv("NDIF_API_KEY", "k")
    monkeypatch.setattr(pre, "_reachable", lambda url, timeout: not ((case == "no hub" and "huggingface" in url)
                                                                      or (case == "no ndif" and "ndif" in url)))
    monkeypatch.setattr(ndif, "is_model_running", lambda name: case != "not hosted")

    class Env:
        packages = {"nnsight": {"local": "0.8.1", "remote": "0.8.2" if case == "versions" else "0.8.1",
                                "match": case != "versions"}}

    monkeypatch.setattr(ndif, "compare", lambda: Env())
    with pytest.raises(RemoteUnavailable, match=message) as e:
        pre.preflight("meta-llama/Llama-3.1-70B")
    assert "\n" not in str(e.value)


@pytest.mark.unit
def test_preflight_names_every_missing_piece_it_can_see_at_once(monkeypatch):
    """No key and no network: one line for each, and NDIF is not asked about hosting or versions."""
    from nnsight import ndif
    from nnsight.schema.config import CONFIG

    from lmdepth.model import ndif as pre

    monkeypatch.setattr(CONFIG.API, "APIKEY", None)
    monkeypatch.delenv("NDIF_API_KEY", raising=False)
    monkeypatch.setattr(pre, "_reachable", lambda url, timeout: False)
    asked = []
    monkeypatch.setattr(ndif, "is_model_running", lambda name: asked.append(name) or True)
    with pytest.raises(RemoteUnavailable) as e:
        pre.preflight("meta-llama/Llama-3.1-70B")
    lines = str(e.value).splitlines()
    assert [("API key" in line, "hub" in line, "NDIF (" in line) for line in lines] == [
        (True, False, False), (False, True, False), (False, False, True)]
    assert asked == []


@pytest.mark.unit
@pytest.mark.parametrize("chapter", ["norms", "explorer"])
def test_remote_true_fails_before_any_kernel_or_model(chapter, monkeypatch, capsys, tmp_path):
    from nnsight.schema.config import CONFIG

    from lmdepth.book import cli
    from lmdepth.model import registry

    monkeypatch.setattr(CONFIG.API, "APIKEY", None)
    monkeypatch.delenv("NDIF_API_KEY", raising=False)
    monkeypatch.setattr(registry, "load_model", lambda *a, **k: pytest.fail("loaded a model"))
    import papermill

    monkeypatch.setattr(papermill, "execute_notebook", lambda *a, **k: pytest.fail("started a kernel"))
    from lmdepth.model import ndif

    argv = ["run", chapter, "--model", "meta-llama/Llama-3.1-70B", "-p", "remote", "true", "--results-dir", str(tmp_path)]
    monkeypatch.setattr(ndif, "_reachable", lambda url, timeout: True)  # the network is there: only the key misses
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "NDIF API key" in err and err.count("error") == 1
    monkeypatch.setattr(ndif, "_reachable", lambda url, timeout: False)  # and without it: one line per missing piece
    assert cli.main(argv) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 3 and all(line.startswith("lmdepth: error: remote=true") for line in errors)


@pytest.mark.unit
@pytest.mark.parametrize("value", ["yes", 1, "remote"])
def test_remote_takes_three_values(value):
    from lmdepth.errors import ParameterError
    from lmdepth.params import CommonParams

    for ok in (False, True, "local"):
        CommonParams(model_name="org/model", remote=ok)
    with pytest.raises(ParameterError, match="'remote'"):
        CommonParams(remote=value)


# ---- the residual collection of chapter 06 --------------------------------------------------------------------------

@pytest.mark.integration
@pytest.mark.parametrize("family", FAMILIES)
def test_boundary_residual_trace_equals_the_hook_reference(family):
    from lmdepth.hooks.stack import AdapterStack, boundary_residuals
    from lmdepth.traces.boundary_residuals import boundary_residuals_at

    model = tiny_model(family)
    adapter = ModelAdapter.for_model(model)
    tok = tiny_tokenizer()
    seqs = [tok(t).input_ids for t in ("A short one.", "A longer sentence, with 3 numbers: 4 5.")]
    width = max(map(len, seqs))
    ids = torch.tensor([q + [0] * (width - len(q)) for q in seqs])  # right-padded, as chapter 06 batches
    rows = torch.tensor([0, 0, 1, 1, 1])
    positions = torch.tensor([1, len(seqs[0]) - 1, 2, 7, len(seqs[1]) - 1])
    ref = boundary_residuals(AdapterStack(adapter), ids).float()[:, rows, positions]  # [L+1, R, d]
    nn = _wrap(model)
    before = len(server.REQUESTS)
    for remote in (False, "local"):
        got = boundary_residuals_at(nn, TapPaths.of(adapter), ids, rows, positions, remote=remote)
        assert got.shape == (adapter.n_layers + 1, 5, adapter.d_model)
        assert (got - ref).abs().max() <= 1e-5, remote
    (record,) = server.REQUESTS[before:]
    assert record.result_bytes < 4 * ref.numel() + 4_000  # the kept rows only, not the whole activations




# ---- layer skipping (chapter 03) -----------------------------------------------------------------------------------

@pytest.mark.integration
@pytest.mark.parametrize("family", FAMILIES)
def test_skip_trace_equals_the_naive_reference_for_every_variant(family):
    from lmdepth.hooks.skip_hooks import prompt_effects_naive
    from lmdepth.traces.skip_effects import skip_effects

    model = tiny_model(family)
    adapter = ModelAdapter.for_model(model)
    ids = tiny_tokenizer()("Natalia sold 48 clips in April and half as many in May.", return_tensors="pt").input_ids
    cuts = [9, 24, 40]
    nn = _wrap(model)
    for current in (True, False):
        # with the robust means (floor 0.1): (E, O, M, Q), each against the naive loop's
        ref = prompt_effects_naive(adapter, ids, cuts=cuts, current=current, floor=0.1)
        got = skip_effects(nn, TapPaths.of(adapter), ids, cuts=cuts, current=current, config=model.config, floor=0.1)
        assert sorted(got) == sorted(ref)
        for k in ref:
            assert len(got[k]) == len(ref[k]) == 4, k
            for g, r in zip(got[k], ref[k]):
                assert (g - r).abs().max() <= 1e-5, k
        assert any(ref[k][0].max() > 0.01 for k in ref)  # the effects are not all zero: the check can fail
        assert any(ref[k][2].max() > 0.01 and ref[k][3].max() > 0 for k in ref)
        # a mean is not a max: the robust statistic is a different number wherever the effect varies over positions
        assert any((ref[k][2] - ref[k][0]).abs().max() > 1e-3 for k in ref)


@pytest.mark.integration
@pytest.mark.parametrize("family", FAMILIES)
def test_one_prompt_of_skipping_is_one_request_to_the_strict_server(family):
    from lmdepth.hooks.skip_hooks import prompt_effects
    from lmdepth.traces.skip_effects import skip_effects

    model = tiny_model(family)
    adapter = ModelAdapter.for_model(model)
    ids = tiny_tokenizer()("Natalia sold 48 clips in April and half as many in May.", return_tensors="pt").input_ids
    ref = prompt_effects(adapter, ids, cuts=[9, 24, 40], current=False)
    local = skip_effects(_wrap(model), TapPaths.of(adapter), ids, cuts=[9, 24, 40], current=False,
                         config=model.config, floor=0.1)
    before = len(server.REQUESTS)
    got = skip_effects(_wrap(model), TapPaths.of(adapter), ids, cuts=[9, 24, 40], current=False, config=model.config,
                       remote="local")
    (record,) = server.REQUESTS[before:]  # the whole prompt: one session, one request
    assert record.saved == ["E_all", "O_all"] and record.payload_bytes < 100_000
    for k in ref:
        assert (got[k][0] - ref[k][0]).abs().max() <= 1e-5 and (got[k][1] - ref[k][1]).abs().max() <= 1e-5, k
    assert any(ref[k][0].max() > 0.01 and ref[k][1].max() > 1e-4 for k in ref)  # not all zero: the check can fail
    # the robust means come back from the server too (two more saved values), equal to the local run's
    robust = skip_effects(_wrap(model), TapPaths.of(adapter), ids, cuts=[9, 24, 40], current=False,
                          config=model.config, remote="local", floor=0.1)
    assert sorted(server.REQUESTS[-1].saved) == ["E_all", "M_all", "O_all", "Q_all"]
    for k in local:
        assert all((g - r).abs().max() <= 1e-6 for g, r in zip(robust[k], local[k])), k


@pytest.mark.integration
@pytest.mark.parametrize("current", [True, False])
def test_the_sessions_forward_count_is_what_the_cost_table_says(current):
    from lmdepth.traces.skip_effects import session_forwards, skip_effects

    model = tiny_model("llama")
    adapter = ModelAdapter.for_model(model)
    ids = tiny_tokenizer()("Natalia sold 48 clips in April and half as many in May.", return_tensors="pt").input_ids
    calls = []
    model.model.register_forward_pre_hook(lambda mod, args: calls.append(1))
    skip_effects(_wrap(model), TapPaths.of(adapter), ids, cuts=[9, 24, 40], current=current, config=model.config)
    assert len(calls) == session_forwards(adapter.n_layers, 3, current)


@pytest.mark.integration
@pytest.mark.parametrize("family", FAMILIES)
def test_the_skip_session_for_chosen_layers_equals_those_rows_of_the_full_session(family):
    """``skipped``: only the chosen skipped layers run (the explorer's one-layer skip effect); their rows equal the
    full session's for every variant, analysis and statistic, here and under the strict server, the others are NaN,
    and the session makes the clean pass plus one pass per (chosen layer, cut point)."""
    from lmdepth.traces.skip_effects import session_forwards, skip_effects

    model = tiny_model(family)
    adapter = ModelAdapter.for_model(model)
    ids = tiny_tokenizer()("Natalia sold 48 clips in April and half as many in May.", return_tensors="pt").input_ids
    nn, paths, L = _wrap(model), TapPaths.of(adapter), adapter.n_layers
    kw = dict(cuts=[9, 24], current=True, config=model.config, floor=0.1)
    full = skip_effects(nn, paths, ids, **kw)
    chosen = [1, L - 1]
    calls = []
    handle = model.model.register_forward_pre_hook(lambda mod, args: calls.append(1))
    here = skip_effects(nn, paths, ids, skipped=chosen, **kw)
    handle.remove()
    assert len(calls) == 1 + len(chosen) * 3  # the clean pass, then per chosen layer: all tokens + 2 cut points
    assert len(calls) < session_forwards(L, 2, True)
    before = len(server.REQUESTS)
    sim = skip_effects(nn, paths, ids, skipped=chosen, remote="local", **kw)
    assert len(server.REQUESTS) - before == 1
    others = [s for s in range(L) if s not in chosen]
    assert sorted(here) == sorted(full) == sorted(sim)
    for k in full:
        for f, h, r in zip(full[k], here[k], sim[k]):  # E [L, L], O [L], M [L, L], Q [L]: row/entry s = layer s
            assert (h[chosen] - f[chosen]).abs().max() <= 1e-6 and (r[chosen] - f[chosen]).abs().max() <= 1e-6, k
            assert h[others].isnan().all() and r[others].isnan().all()
    assert any(full[k][0][chosen].max() > 0.01 for k in full)  # not all zero: the check can fail
    with pytest.raises(ValueError, match="skipped layers must be in"):
        skip_effects(nn, paths, ids, skipped=[L], **kw)


@pytest.mark.integration
@pytest.mark.parametrize("family", FAMILIES)
def test_the_nudge_equals_its_hook_reference_here_and_on_the_strict_server(family):
    """The output change's control: layer s's output + ‖Δ_s‖ · u_s at the intervened positions. The session's nudge
    rows equal the naive plain-hook loop's (all tokens and future tokens, every statistic), one request under the
    strict server with only the [L, d] directions shipped; and the nudge moves the residual by exactly the skip's
    norm: on all tokens its effect on its own layer, ‖Δ′_s − Δ_s‖ / ‖Δ_s‖, is 1 at every position (E[s, s] = 1, as
    for the skip) and its robust mean equals the skip's, though the two change the output differently."""
    from lmdepth.hooks.skip_hooks import nudge_directions, prompt_effects_naive
    from lmdepth.traces.skip_effects import skip_effects

    model = tiny_model(family)
    adapter = ModelAdapter.for_model(model)
    ids = tiny_tokenizer()("Natalia sold 48 clips in April and half as many in May.", return_tensors="pt").input_ids
    nn, paths, L = _wrap(model), TapPaths.of(adapter), adapter.n_layers
    u = nudge_directions(L, adapter.d_model, 0)
    kw = dict(cuts=[9, 24, 40], parts=("layer", "nudge"), local=False, floor=0.1)
    for current in (True, False):
        ref = prompt_effects_naive(adapter, ids, current=current, directions=u, **kw)
        got = skip_effects(nn, paths, ids, current=current, config=model.config, directions=u, **kw)
        assert sorted(got) == sorted(ref) and ("future", "nudge") in got
        for k in ref:
            assert all((g - r).abs().max() <= 1e-5 for g, r in zip(got[k], ref[k])), k
    E, O, M, Q = got_current = skip_effects(nn, paths, ids, current=True, config=model.config, directions=u,
                                            **kw)["current", "nudge"]
    skip = skip_effects(nn, paths, ids, current=True, config=model.config, **{**kw, "parts": ("layer",)})
    assert (E.diagonal() - 1).abs().max() <= 1e-5  # ‖Δ_s + ‖Δ_s‖u_s − Δ_s‖ = ‖Δ_s‖ everywhere
    assert (M.diagonal() - skip["current", "layer"][2].diagonal()).abs().max() <= 1e-5
    assert Q.min() > 0 and (Q - skip["current", "layer"][3]).abs().max() > 1e-4  # a change, not the skip's
    before = len(server.REQUESTS)
    sim = skip_effects(nn, paths, ids, current=True, config=model.config, directions=u, remote="local",
                       **{**kw, "parts": ("nudge",)})
    (record,) = server.REQUESTS[before:]
    assert record.payload_bytes < 4 * u.numel() + 100_000  # the directions, never an [L, T, d] tensor
    assert all((a - b).abs().max() <= 1e-6 for a, b in zip(sim["current", "nudge"], got_current))
    with pytest.raises(ValueError, match="the nudge needs directions"):
        skip_effects(nn, paths, ids, parts=("nudge",), config=model.config)


@pytest.mark.integration
@pytest.mark.parametrize("family", FAMILIES)
def test_the_skip_sessions_clean_readings_equal_their_references_and_cost_no_pass(family, ids):
    """``contributions`` and ``lens``: the clean pass of the skip session also reduces the relative contributions
    (= the first three rows of the residual-metrics trace) and the logit lens' top-k (= the adapter's unembedding of
    plain-hook residuals), here and under the strict server; the skip effects stay bit-identical and the session
    makes no extra forward pass (the clean one, then the skipped one: the explorer's explore). Alone, the readings
    are one pass."""
    from lmdepth.hooks.skip_hooks import clean_pass
    from lmdepth.traces.skip_effects import skip_effects

    model = tiny_model(family)
    adapter = ModelAdapter.for_model(model)
    nn, paths, L, T = _wrap(model), TapPaths.of(adapter), adapter.n_layers, ids.shape[1]
    pos, k, s = T - 3, 4, 1
    ref_contrib = residual_metrics(nn, paths, ids)[:, :3, 0]  # [L, 3, T]
    clean = clean_pass(adapter, ids)
    with torch.no_grad():
        ref = adapter.unembed(torch.cat([clean.resid_in[:, pos], clean.resid_out[-1:, pos]])).float().softmax(-1)
    ref_top = ref.topk(k, dim=-1)
    kw = dict(parts=("layer",), local=False, current=True, config=model.config, skipped=[s])
    plain = skip_effects(nn, paths, ids, **kw)
    calls = []
    model.model.register_forward_pre_hook(lambda mod, args: calls.append(1))
    for remote in (False, "local"):
        calls.clear()
        before = len(server.REQUESTS)
        got = skip_effects(nn, paths, ids, contributions=True, lens=(pos, k), remote=remote, **kw)
        assert len(calls) == 2 and len(server.REQUESTS) - before == (remote == "local")
        assert sorted(got) == sorted([*plain, ("clean", "contributions"), ("clean", "lens")])
        for key in plain:
            assert all(a.nan_to_num(-1.0).equal(b.nan_to_num(-1.0)) for a, b in zip(got[key], plain[key])), key
        assert plain["current", "layer"][0][s].max() > 0.01  # not all zero: the check can fail
        (contrib,) = got["clean", "contributions"]
        assert contrib.shape == (L, 3, T) and (contrib - ref_contrib).abs().max() <= 1e-6, remote
        probs, top = got["clean", "lens"]
        assert top.equal(ref_top.indices) and (probs - ref_top.values).abs().max() <= 1e-6, remote
    calls.clear()
    alone = skip_effects(nn, paths, ids, current=False, contributions=True, lens=(pos, k))
    assert len(calls) == 1 and sorted(alone) == [("clean", "contributions"), ("clean", "lens")]
    assert alone["clean", "lens"][1].equal(ref_top.indices)
    with pytest.raises(ValueError, match="lens position must be in"):
        skip_effects(nn, paths, ids, lens=(T, k), **kw)


@pytest.mark.integration
@pytest.mark.parametrize("family", FAMILIES)
def test_every_trace_reaches_the_families_modules_through_envoys_resolved_before_the_block(family, ids):
    """:meth:`TapPaths.envoys` is every trace's one way to its modules: the envoys wrap the adapter's own modules,
    and one read inside a block survives the strict round trip by reference (the model is not in the payload)."""
    model = tiny_model(family)
    adapter = ModelAdapter.for_model(model)
    nn = _wrap(model)
    envoys = TapPaths.of(adapter).envoys(nn)
    fam = adapter.family
    assert len(envoys.layers) == len(envoys.attn) == len(envoys.mlp) == adapter.n_layers
    for l, layer in enumerate(adapter.layers):
        assert envoys.layers[l]._module is layer
        assert envoys.attn[l]._module is getattr(layer, fam.attn_contrib[0])
        assert envoys.mlp[l]._module is getattr(layer, fam.mlp_contrib[0])
    assert envoys.final_norm._module is adapter.final_norm and envoys.lm_head._module is adapter.lm_head
    mlp = envoys.mlp[0]  # resolved out here, read in there
    with torch.no_grad(), nn.trace(ids, backend=StrictServer(nn, max_payload=50_000)):
        out = mlp.output
        got = (out[0] if isinstance(out, tuple) else out).float().norm(dim=-1).cpu().save()
    ref = hooked_residuals(adapter, ids)["mlp_out"][0].float().norm(dim=-1)
    assert (got - ref).abs().max() <= 1e-5


# ---- the logit and tuned lens (chapter 04) --------------------------------------------------------------------------

def _random_translators(adapter: ModelAdapter, seed: int = 0):
    """Translators far from the identity, so the tuned lens differs from the logit lens (the check can fail)."""
    from lmdepth.model.translators import Translators

    g = torch.Generator().manual_seed(seed)
    tr = Translators(adapter.n_layers, adapter.d_model, scale=torch.rand(adapter.n_layers, generator=g) + 0.5)
    with torch.no_grad():
        tr.A.copy_(0.05 * torch.randn(tr.A.shape, generator=g))
        tr.b.copy_(0.3 * torch.randn(tr.b.shape, generator=g))
    return tr


def _lens_case(model, ids, positions, lens_dtype, translators, remote):
    """The trace and its reference (:func:`lmdepth.hooks.lens_hooks.prompt_lens`) on one model."""
    from lmdepth.hooks.lens_hooks import prompt_lens
    from lmdepth.model.registry import LoadedModel
    from lmdepth.model.unembed import Unembedding
    from lmdepth.traces.lens_trace import lens_readings

    adapter = ModelAdapter.for_model(model)
    lm = LoadedModel("tiny", model, tiny_tokenizer(), adapter, "local")
    ref, ref_check = prompt_lens(lm, ids, positions, Unembedding.of(lm, lens_dtype), translators)
    tensors = None if translators is None else (translators.A.detach(), translators.b.detach(), translators.scale)
    softcap = getattr(model.config, "final_logit_softcapping", None) or None
    got, check = lens_readings(lm.nn, TapPaths.of(adapter), ids, positions, lens_dtype, softcap, tensors,
                               remote=remote)
    return ref, ref_check, got, check


@pytest.mark.integration
@pytest.mark.parametrize("family", FAMILIES + ["gemma3-softcap"])
def test_lens_trace_equals_the_reference_here_and_under_the_strict_server(family, ids):
    model = tiny_model(family.removesuffix("-softcap"))
    if family.endswith("softcap"):  # Gemma 2's logit soft-capping: the model's output and the lens both cap
        model.config.final_logit_softcapping = 3.0
    adapter = ModelAdapter.for_model(model)
    tr = _random_translators(adapter)
    positions = torch.tensor([0, 3, 7, ids.shape[1] - 1])
    for lens_dtype in ("float32", "bfloat16"):
        for remote in (False, "local"):
            before = len(server.REQUESTS)
            if lens_dtype == "bfloat16" and remote:  # another dtype than the fp32 head's needs its weight read
                with pytest.raises(ParameterError, match="^lens_dtype bfloat16 differs from the hosted model's head "
                                                         r"\(float32\).*pass lens_dtype float32$"):
                    _lens_case(model, ids, positions, lens_dtype, tr, remote)
                assert len(server.REQUESTS) == before  # refused before anything was sent
                continue
            ref, ref_check, got, check = _lens_case(model, ids, positions, lens_dtype, tr, remote)
            assert got.shape == (2, 3, adapter.n_layers, 4)
            assert (got - ref).abs().max() <= 1e-5, (lens_dtype, remote)
            assert abs(check - ref_check) <= 1e-6 and abs(check) < (1e-5 if lens_dtype == "float32" else 1e-2)
            if remote == "local":
                (record,) = server.REQUESTS[before:]
                shipped = sum(t.numel() * 4 for t in (tr.A, tr.b, tr.scale))
                assert record.saved == ["check", "values"]
                assert record.payload_bytes < shipped + 50_000  # the translators and plain data, nothing else
                assert record.result_bytes < 4 * got.numel() + 4_000
                assert not [m for m in record.modules if m.split(".")[0] == "lmdepth"]
    assert (got[1] - got[0]).abs().max() > 1e-3  # the translators change the reading: the comparison can fail


class _HiddenHead(torch.nn.Module):
    """A head whose weight cannot be read as ``.weight`` (as on a server that proxies module calls only)."""

    def __init__(self, head: torch.nn.Linear):
        super().__init__()
        self.hidden = torch.nn.Parameter(head.weight.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.hidden)


@pytest.mark.integration
def test_the_lens_in_the_heads_own_dtype_calls_the_head_and_never_reads_its_weight(ids):
    """The logit and tuned lens through a head that has no ``weight`` attribute: equal to the reference read through
    the real head, here and under the strict server; a lens dtype that needs the weight fails on it."""
    model = tiny_model("llama")
    adapter = ModelAdapter.for_model(model)
    tr = _random_translators(adapter)
    positions = torch.tensor([0, 3, ids.shape[1] - 1])
    ref, ref_check, _, _ = _lens_case(model, ids, positions, "float32", tr, False)
    model.lm_head = _HiddenHead(model.lm_head)
    assert not hasattr(model.lm_head, "weight")
    from lmdepth.model.registry import LoadedModel
    from lmdepth.traces.lens_trace import lens_readings

    lm = LoadedModel("tiny", model, tiny_tokenizer(), adapter, "local")
    tensors = (tr.A.detach(), tr.b.detach(), tr.scale)
    for remote in (False, "local"):
        got, check = lens_readings(lm.nn, TapPaths.of(adapter), ids, positions, "float32", None, tensors,
                                   remote=remote)
        assert (got - ref).abs().max() <= 1e-5 and abs(check - ref_check) <= 1e-6
    with pytest.raises(Exception, match="weight"):  # the lens' own bf16 copy needs the weight: it is read
        lens_readings(lm.nn, TapPaths.of(adapter), ids, positions, "bfloat16", None, None)


@pytest.mark.integration
def test_the_lens_trace_without_translators_ships_no_tensor_and_the_bound_grows_by_the_translators_only(ids,
                                                                                                     monkeypatch):
    from lmdepth.traces.remote import trace_kwargs

    model = tiny_model("qwen3")
    adapter = ModelAdapter.for_model(model)
    ref, _, got, _ = _lens_case(model, ids, torch.arange(ids.shape[1]), "float32", None, "local")
    assert got.shape == (1, 3, adapter.n_layers, ids.shape[1]) and (got - ref).abs().max() <= 1e-5
    plain = server.REQUESTS[-1].payload_bytes
    assert plain < 50_000
    # a bound just above the plain request: the translators pass because their bytes are declared ...
    monkeypatch.setattr(server, "MAX_PAYLOAD", plain + 2_000)
    tr = _random_translators(adapter)
    _lens_case(model, ids, torch.arange(ids.shape[1]), "float32", tr, "local")
    nn = _wrap(model)
    assert trace_kwargs(nn, "local", extra_payload=123)["backend"].max_payload == plain + 2_123
    # ... while the same tensors read by a block that does not declare them exceed it
    A = tr.A.detach().clone()
    with pytest.raises(NotRemotable, match="ships client-side tensors"):
        with torch.no_grad(), nn.trace(ids, **trace_kwargs(nn, "local")):
            (nn.model.layers[0].output[0] @ A[0]).sum().save()


@pytest.mark.integration
def test_lens_analysis_under_the_strict_server_gives_the_local_table(tmp_path, jsonl, monkeypatch):
    """Chapter 04 with remote='local': the translators are trained here (remote=false), then applied in the trace."""
    import shutil

    from lmdepth.analyses import lens
    from lmdepth.errors import ParameterError
    from lmdepth.model import registry
    from lmdepth.testing import save_tiny_model

    texts = jsonl([json.dumps({"text": f"Problem {i}: {i} apples plus {i + 1} pears make {2 * i + 1} fruits."})
                   for i in range(3)])
    model_dir = str(save_tiny_model("gemma3", tmp_path / "model"))
    kw = dict(dataset=str(texts), n_examples=3, selection="first", n_boot=10, positions_per_example=0,
              n_train_tokens=128, train_epochs=1)
    here = lens.run(model_dir, results_dir=tmp_path / "a", **kw)
    # training does not go remote: one line, before the model loads
    real_load = registry.load_model
    monkeypatch.setattr(lens, "load_model", lambda *a, **k: pytest.fail("loaded the model"))
    with pytest.raises(ParameterError, match="the tuned lens is trained here") as e:
        lens.run(model_dir, results_dir=tmp_path / "b", remote="local", **kw)
    assert "\n" not in str(e.value)
    monkeypatch.setattr(lens, "load_model", real_load)
    shutil.copytree(tmp_path / "a" / "tuned_lens", tmp_path / "b" / "tuned_lens")  # trained here, applied "there"
    before = len(server.REQUESTS)
    sim = lens.run(model_dir, results_dir=tmp_path / "b", remote="local", **kw)
    assert len(server.REQUESTS) - before == 3  # one request per problem
    assert sim.meta["parameters"]["remote"] == "local" and sim.meta["tuned_lens"]["from_cache"]
    cols = ["value", "ci_low", "ci_high"]
    assert set(here.table.component) == {"logit_lens", "tuned_lens"}
    assert (here.table[cols] - sim.table[cols]).abs().max().max() <= 1e-5
    assert sim.meta["last_layer_check_kl_max"] < 1e-5


@pytest.mark.integration
def test_the_bigram_reference_of_chapter_04_is_computed_under_the_strict_server_as_here(tmp_path, jsonl, monkeypatch):
    """remote='local' keeps the weights here: chapter 04's count-bigram reference is the local run's; remote=True
    (weights on NDIF) skips it without loading anything."""
    from lmdepth.analyses import bigram, lens
    from lmdepth.testing import save_tiny_model

    texts = jsonl([json.dumps({"text": f"Problem {i}: {i} apples plus {i + 1} pears make {2 * i + 1} fruits."})
                   for i in range(3)])
    model_dir = str(save_tiny_model("qwen2", tmp_path / "model"))
    kw = dict(dataset=str(texts), n_examples=3, selection="first", n_boot=10, positions_per_example=0,
              n_train_tokens=128, tuned_lens=False)
    units = {}
    for remote, where in ((False, "a"), ("local", "b")):
        run_kw = dict(kw, remote=remote, results_dir=tmp_path / where)
        units[remote] = bigram.with_baseline(lens.run_units([model_dir], **run_kw), [model_dir], **run_kw)
    here, sim = (units[r][units[r].lens == "bigram"].reset_index(drop=True) for r in (False, "local"))
    assert len(here) == 3 * 3 * ModelAdapter.for_model(tiny_model("qwen2")).n_layers  # problems x metrics x layers
    assert here[["unit", "metric", "layer"]].equals(sim[["unit", "metric", "layer"]])
    assert (here["value"] - sim["value"]).abs().max() <= 1e-6
    assert (tmp_path / "b" / bigram.ANALYSIS).is_dir()  # computed in the simulated run's own results, not borrowed
    monkeypatch.setattr(bigram, "load_model", lambda *a, **k: pytest.fail("loaded the model"))
    lens_only = units["local"][units["local"].lens != "bigram"]
    with pytest.warns(UserWarning, match="No bigram baseline on NDIF"):
        assert bigram.with_baseline(lens_only, [model_dir], **dict(kw, remote=True)) is lens_only


@pytest.mark.unit
@pytest.mark.parametrize("remote", [True, "local"])
def test_tuned_lens_training_refuses_remote_in_one_line(remote):
    from lmdepth.analyses.lens import LensParams
    from lmdepth.analyses.tuned_lens import refuse_remote_training
    from lmdepth.errors import ParameterError

    assert LensParams(model_name="org/model", remote=remote).remote == remote  # the lens itself goes remote
    with pytest.raises(ParameterError, match="trained here, not on NDIF") as e:
        refuse_remote_training(remote)
    assert "\n" not in str(e.value)
    refuse_remote_training(False)


@pytest.mark.integration
@pytest.mark.parametrize("family", FAMILIES)
def test_tuned_lens_training_residuals_trace_equals_the_hook_reference(family):
    """The translators' training residuals through the trace (one request per text under the strict server, only
    [L + 1, T, d] back) equal the plain-hook collection exactly: stored translators stay valid."""
    from lmdepth.analyses.tuned_lens import collect_residuals
    from lmdepth.data.datasets import Example
    from lmdepth.hooks.lens_hooks import collect_residuals_hooked
    from lmdepth.model.registry import LoadedModel

    model = tiny_model(family)
    adapter = ModelAdapter.for_model(model)
    lm = LoadedModel("tiny", model, tiny_tokenizer(), adapter, "local")
    texts = ["Natalia sold 48 clips in April.", "Then she sold half as many clips in May, 24 in all.",
             "How many did she sell?"]
    exs = [Example(id=f"t/{i}", prompt=t) for i, t in enumerate(texts)]
    n = sum(len(tiny_tokenizer()(t).input_ids) for t in texts[:2]) + 3  # cut inside the third text
    ref = collect_residuals_hooked(lm, exs, n)
    assert ref.shape == (n, adapter.n_layers + 1, adapter.d_model)
    assert ref.abs().max() > 0 and (ref[:, 1:] - ref[:, :-1]).abs().max() > 1e-3  # the layers do change h
    before = len(server.REQUESTS)
    for remote in (False, "local"):
        got = collect_residuals(lm, exs, n, remote=remote)
        assert got.shape == ref.shape and got.dtype == torch.float32
        assert (got - ref).abs().max() == 0, remote
    records = server.REQUESTS[before:]
    assert len(records) == 3  # one request per text
    for record, t in zip(records, texts):
        t_len = len(tiny_tokenizer()(t).input_ids)
        assert record.saved == ["values"] and record.payload_bytes < 50_000
        assert record.result_bytes < 4 * (adapter.n_layers + 1) * t_len * adapter.d_model + 4_000
        assert not [m for m in record.modules if m.split(".")[0] == "lmdepth"]


@pytest.mark.packaged
def test_lens_trace_on_the_packaged_smollm2_equals_the_reference():
    from lmdepth.model.registry import load_model

    lm = load_model("smollm2-135m")
    ids = lm.encode("Natalia sold clips to 48 of her friends in April, and then she sold half as many in May.")
    positions = torch.tensor([0, 4, 9, 15, ids.shape[1] - 1])
    tr = _random_translators(lm.adapter)
    from lmdepth.hooks.lens_hooks import prompt_lens
    from lmdepth.model.unembed import Unembedding
    from lmdepth.traces.lens_trace import lens_readings

    ref, _ = prompt_lens(lm, ids, positions, Unembedding.of(lm, "float32"), tr)
    before = len(server.REQUESTS)
    got, check = lens_readings(lm.nn, TapPaths.of(lm.adapter), ids, positions, "float32", None,
                               (tr.A.detach(), tr.b.detach(), tr.scale), remote="local")
    assert (got - ref).abs().max() <= 1e-5 and check < 1e-5
    (record,) = server.REQUESTS[before:]
    assert record.payload_bytes < 4 * tr.A.numel() * 1.01 + 100_000  # SmolLM2's translators: 40 MB, and no more
    assert record.result_bytes < 4 * got.numel() + 4_000


# ---- chapter 05: depth score, correctness check, erasure ------------------------------------------------------------

@pytest.mark.integration
@pytest.mark.parametrize("family", FAMILIES)
def test_correctness_traces_equal_the_plain_reference(family):
    from lmdepth.model.generate import generate_greedy, teacher_forced_correct
    from lmdepth.model.registry import LoadedModel
    from lmdepth.traces.generation import greedy_matches, greedy_texts

    model, tok = tiny_model(family), tiny_tokenizer()
    lm = LoadedModel("tiny", model, tok, ModelAdapter.for_model(model), "local")
    prompts = ["Problem: 1+1=", "Problem: what is 12 times 3?\nSolution:", "abc"]
    ref = generate_greedy(lm, prompts, 12)
    ids = tok("12+7=19", return_tensors="pt").input_ids
    with torch.no_grad():  # an answer the model does produce greedily, so a match can be found
        greedy = model(ids[:, :5]).logits[0, -1].argmax()
    own = torch.cat([ids[:, :5], greedy.view(1, 1)], 1)
    for remote in (False, "local"):
        before = len(server.REQUESTS)
        assert greedy_texts(lm.nn, tok, prompts, 12, remote=remote, batch_size=2) == ref  # two batches
        for x, a in ((ids, 5), (own, 5)):
            assert greedy_matches(lm.nn, x, a, remote) == teacher_forced_correct(lm, x, a)
        if remote == "local":
            records = server.REQUESTS[before:]
            assert len(records) == 4 and records[0].saved == ["new"] and records[2].saved == ["match"]
            assert all(r.payload_bytes < 50_000 and r.result_bytes < 4_000 for r in records)
    assert greedy_matches(lm.nn, own, 5) and not greedy_matches(lm.nn, ids, 5)  # both outcomes are exercised


@pytest.mark.integration
@pytest.mark.parametrize("family", FAMILIES)
def test_erasure_session_and_means_equal_the_hook_reference(family):
    from lmdepth.hooks.stack import AdapterStack, erasure_map, mean_residuals
    from lmdepth.traces.erasure_trace import boundary_sums, erasure_effects

    model, tok = tiny_model(family), tiny_tokenizer()
    adapter = ModelAdapter.for_model(model)
    stack, paths, nn = AdapterStack(adapter), TapPaths.of(adapter), _wrap(model)
    texts = [tok(t, return_tensors="pt").input_ids for t in ("One text here.", "Another, longer text: 12 + 7.")]
    mu = mean_residuals(stack, texts)
    got_mu = sum(boundary_sums(nn, paths, t, remote="local") for t in texts) / sum(t.shape[1] for t in texts)
    assert (got_mu - mu).abs().max() <= 1e-5
    ids = tok("a=3\nb=a+2\nc=b-4\nd=6", return_tensors="pt").input_ids
    a = ids.shape[1] - 1
    ref = erasure_map(stack, ids, a, mu, batch_size=8)
    assert ref.max() > 1e-3  # erasing moves the answer: the comparison can fail
    for remote in (False, "local"):
        before = len(server.REQUESTS)
        got = erasure_effects(nn, paths, ids, a, mu, batch_size=8, remote=remote)
        assert got.shape == (adapter.n_layers + 1, ids.shape[1]) and (got - ref).abs().max() <= 1e-5, remote
        if remote == "local":
            (record,) = server.REQUESTS[before:]  # the whole prompt: one session, one request
            assert record.saved == ["effects"] and record.payload_bytes < 100_000
            assert record.result_bytes < 4 * ref.numel() + 4_000


@pytest.mark.integration
def test_chapter_05_runs_under_the_strict_server_give_the_local_tables(tiny_dirs, tmp_path):
    from lmdepth.analyses import complexity, erasure

    model = str(tiny_dirs["qwen2"])
    kw = dict(source="vars", n_per_level=2, levels=[1, 2], n_boot=20)
    here = complexity.run(model, results_dir=tmp_path / "a", **kw)
    before = len(server.REQUESTS)
    sim = complexity.run(model, results_dir=tmp_path / "b", remote="local", **kw)
    assert len(server.REQUESTS) - before == 2 * 4  # per item: the correctness check and the skip session
    assert sim.meta["parameters"]["remote"] == "local"
    assert (here.table["value"] - sim.table["value"]).abs().max() <= 1e-5
    assert here.table.drop(columns="value").equals(sim.table.drop(columns="value"))
    ekw = dict(n_case_studies=2, n_mean_examples=2, ig_steps=0, erasure_batch=16)
    here = erasure.run(model, results_dir=tmp_path / "a", **ekw)
    sim = erasure.run(model, results_dir=tmp_path / "b", remote="local", **ekw)
    assert (here.table["value"] - sim.table["value"]).abs().max() <= 1e-5
    assert here.meta["summary"] == sim.meta["summary"]


@pytest.mark.unit
@pytest.mark.parametrize("remote", [True, "local"])
def test_integrated_gradients_refuse_remote_in_one_line(remote):
    from lmdepth.analyses.complexity import ComplexityParams
    from lmdepth.analyses.erasure import ErasureParams
    from lmdepth.errors import ParameterError

    with pytest.raises(ParameterError, match="integrated gradients run here only") as e:
        ErasureParams(model_name="org/model", remote=remote)
    assert "\n" not in str(e.value)
    assert ErasureParams(model_name="org/model", remote=remote, ig_steps=0).remote == remote
    assert ErasureParams(model_name="org/model", remote=remote, ig_prompts=0).remote == remote
    assert ComplexityParams(model_name="org/model", remote=remote).remote == remote


# ---- one packaged model: every trace under the strict server --------------------------------------------------------

def _naive_skip_rows(adapter: ModelAdapter, ids: torch.Tensor, skipped: list[int], cuts: list[int], current: bool,
                     floor: float, parts=("layer", "attention", "mlp"), local: bool = True):
    """:func:`lmdepth.hooks.skip_hooks.prompt_effects_naive` for the ``skipped`` layers only (one full plain-hook
    forward per intervention; max over the cut points for E and O, mean for M and Q): ``{key: (E, O, M, Q)}`` with
    the other layers' rows NaN, as the session returns them."""
    from lmdepth.hooks.skip_hooks import Row, clean_pass, naive_effect, variants

    L = adapter.n_layers
    clean = clean_pass(adapter, ids, with_probs=True)
    out = {}
    for v in variants(parts, local):
        for analysis, ts in ((("current", [None]),) if current else ()) + ((("future", cuts),) if cuts else ()):
            E, O, M, Q = (torch.full(shape, float("nan")) for shape in ((L, L), (L,), (L, L), (L,)))
            for s in skipped:
                rs = [naive_effect(adapter, ids, clean, Row(s, v.part, t, v.local), floor) for t in ts]
                E[s] = torch.stack([r[0] for r in rs]).amax(0)
                O[s] = max(r[1] for r in rs)
                M[s] = torch.stack([r[2] for r in rs]).mean(0)
                Q[s] = sum(r[3] for r in rs) / len(rs)
            out[analysis, v.name] = (E, O, M, Q)
    return out


@pytest.mark.packaged
def test_every_trace_on_the_packaged_smollm2_under_the_strict_server_equals_its_reference():
    """Issue 35's packaged-model proof for the traces of chapters 01-03, 05 and 06 (the lens: the test above): on
    SmolLM2-135M (30 layers) and one short arithmetic prompt, each trace runs through the strict simulation of the
    NDIF server and equals its plain-hook reference to 1e-5: the residual metrics, the skip session (the first and
    last layer, all tokens and one cut point, every part and the local variant, with the robust means), the boundary
    residuals and the tuned lens' token residuals, the erasure session and its means, and the correctness check
    (both outcomes) and greedy generation. Every reference is checked to be non-trivial, so each comparison can fail."""
    from lmdepth.analyses.tuned_lens import collect_residuals
    from lmdepth.data.datasets import Example
    from lmdepth.hooks.lens_hooks import collect_residuals_hooked
    from lmdepth.hooks.stack import AdapterStack, boundary_residuals, erasure_map, mean_residuals
    from lmdepth.model.generate import generate_greedy, teacher_forced_correct
    from lmdepth.model.registry import load_model
    from lmdepth.traces.boundary_residuals import boundary_residuals_at
    from lmdepth.traces.erasure_trace import boundary_sums, erasure_effects
    from lmdepth.traces.generation import greedy_matches, greedy_texts
    from lmdepth.traces.skip_effects import skip_effects

    lm = load_model("smollm2-135m")
    adapter, nn, paths, L = lm.adapter, lm.nn, TapPaths.of(lm.adapter), lm.n_layers
    prompt = "Question: 12 + 7 = 19"
    ids = lm.encode(prompt)  # 12 tokens; the answer " 19" is tokens 9..11, and SmolLM2 produces it greedily
    wrong = lm.encode("Question: 12 + 7 = 18")
    T, a = ids.shape[1], 9
    assert T == wrong.shape[1] == 12 and lm.tokenizer.decode(ids[0, a:]) == " 19"
    before = len(server.REQUESTS)

    def sent(n: int = 1):
        """The requests since the last call: ``n`` of them, no library module in any payload."""
        nonlocal before
        records, before = server.REQUESTS[before:], len(server.REQUESTS)
        assert len(records) == n and not [m for r in records for m in r.modules if m.split(".")[0] == "lmdepth"]
        return records

    # chapters 01-02: the residual metrics
    ref = _reference(adapter, ids)
    got = residual_metrics(nn, paths, ids, remote="local")
    (record,) = sent()
    assert got.shape == ref.shape == (L, 11, 1, T) and (got - ref).abs().max() <= 1e-5
    assert ref.nan_to_num().abs().max() > 1e-3 and record.result_bytes < 4 * got.numel() + 4_000

    # chapter 03: the skip session, the first and last layer only (the naive reference costs a forward per row)
    chosen, cuts = [0, L - 1], [6]
    ref = _naive_skip_rows(adapter, ids, chosen, cuts, current=True, floor=0.1)
    got = skip_effects(nn, paths, ids, cuts=cuts, current=True, config=lm.model.config, floor=0.1, skipped=chosen,
                       remote="local")
    (record,) = sent()  # the whole prompt: one session, one request
    assert record.payload_bytes < 100_000
    assert sorted(got) == sorted(ref) == sorted((an, v) for an in ("current", "future")
                                               for v in ("layer", "attention", "mlp", "local"))
    for k in ref:
        assert len(got[k]) == 4, k
        for g, r in zip(got[k], ref[k]):  # E [L, L], O [L], M [L, L], Q [L]
            # relative changes divide by a layer's contribution, which can be tiny (values up to ~270 here), so the
            # two code paths' float32 rounding differs by up to 4.7e-5 of the value on some CPUs (≤ 1e-5 in all on others)
            torch.testing.assert_close(g[chosen], r[chosen], rtol=2e-4, atol=1e-5, msg=str(k))
            assert g[[s for s in range(L) if s not in chosen]].isnan().all(), k
        assert ref[k][0][chosen].max() > 0.01 and ref[k][1][chosen].max() > 1e-3, k  # not zero: can fail

    # chapter 06 (and the tuned lens' training): the boundary residuals of a batch, and of every token of one text
    batch = torch.cat([ids, wrong])
    rows, positions = torch.tensor([0, 0, 1, 1]), torch.tensor([0, 5, 3, T - 1])
    ref = boundary_residuals(AdapterStack(adapter), batch).float()[:, rows, positions]  # [L + 1, R, d]
    got = boundary_residuals_at(nn, paths, batch, rows, positions, remote="local")
    (record,) = sent()
    assert got.shape == ref.shape == (L + 1, 4, adapter.d_model) and (got - ref).abs().max() <= 1e-5
    assert record.result_bytes < 4 * ref.numel() + 4_000  # the kept rows only, not the whole activations
    assert (ref[1:] - ref[:-1]).abs().max() > 1e-3
    exs = [Example(id="p/0", prompt=prompt)]
    ref = collect_residuals_hooked(lm, exs, T)
    got = collect_residuals(lm, exs, T, remote="local")
    sent()
    assert got.shape == ref.shape == (T, L + 1, adapter.d_model) and (got - ref).abs().max() <= 1e-5

    # chapter 05: the erasure means and session (the whole prompt: one request, 31 batched traces)
    stack = AdapterStack(adapter)
    mu = mean_residuals(stack, [ids, wrong])
    got_mu = (boundary_sums(nn, paths, ids, remote="local") + boundary_sums(nn, paths, wrong, remote="local")) / (2 * T)
    sent(2)
    assert (got_mu - mu).abs().max() <= 1e-5
    ref = erasure_map(stack, ids, a, mu, batch_size=T + 1)
    got = erasure_effects(nn, paths, ids, a, mu, batch_size=T + 1, remote="local")
    (record,) = sent()
    assert got.shape == ref.shape == (L + 1, T) and (got - ref).abs().max() <= 1e-5
    assert ref.max() > 1e-3 and record.result_bytes < 4 * ref.numel() + 4_000  # erasing moves the answer

    # chapter 05: the correctness check (right and wrong answer) and greedy generation
    for x, right in ((ids, True), (wrong, False)):
        assert greedy_matches(nn, x, a, remote="local") is teacher_forced_correct(lm, x, a) is right
    sent(2)
    prompts = ["Question: 12 + 7 =", "Question: what is 3 times 4?\nAnswer:"]
    texts = greedy_texts(nn, lm.tokenizer, prompts, 4, remote="local")
    sent()
    assert texts == generate_greedy(lm, prompts, 4) and texts[0].strip().startswith("19")
