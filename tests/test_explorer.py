"""The live explorer's compute functions, checked against independent computations on tiny models."""

from __future__ import annotations

import pytest
import torch

from lmdepth.book import explorer
from lmdepth.charts.explorer_charts import exploration_charts
from lmdepth.model.registry import load_model

FAMILIES = ["llama", "gemma3"]
TEXT = "ab cd ef gh ij"

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=FAMILIES)
def lm(request, tiny_dirs):
    return load_model(str(tiny_dirs[request.param]))


def test_contributions_match_direct_norms(lm):
    ids = lm.encode(TEXT)
    got = explorer.contributions(lm, ids)
    assert set(got.component) == {"attention", "mlp", "layer"} and len(got) == 3 * lm.adapter.n_layers
    # independent: whole-layer contribution from the residuals entering and leaving each layer
    with torch.no_grad():
        hs = lm.model(ids, output_hidden_states=True).hidden_states  # embeddings, then every layer output
    for l in range(lm.adapter.n_layers - 1):  # the last hidden state is after the final norm in HF: skip it
        h, o = hs[l][0].float(), hs[l + 1][0].float()
        want = ((o - h).norm(dim=-1) / h.norm(dim=-1).clamp_min(1e-6)).mean().item()
        val = got[(got.layer == l) & (got.component == "layer")]["value"].item()
        assert val == pytest.approx(want, rel=1e-4)
    # attention and MLP parts, from independently hooked sublayer outputs (catches a swap of the two)
    from lmdepth.model.taps import hooked_residuals

    taps = {k: v[:, 0].float() for k, v in hooked_residuals(lm.adapter, ids).items()}
    h, a, m = taps["resid_pre"], taps["attn_out"], taps["mlp_out"]
    att = (a.norm(dim=-1) / h.norm(dim=-1)).mean(-1)
    mlp = (m.norm(dim=-1) / (h + a).norm(dim=-1)).mean(-1)
    for l in range(lm.adapter.n_layers):
        assert got[(got.layer == l) & (got.component == "attention")]["value"].item() == pytest.approx(att[l].item(), rel=1e-4)
        assert got[(got.layer == l) & (got.component == "mlp")]["value"].item() == pytest.approx(mlp[l].item(), rel=1e-4)


def test_lens_at_output_is_the_models_prediction(lm):
    ids = lm.encode(TEXT)
    lens = explorer.lens_top_tokens(lm, ids, position=-1, k=3)
    L = lm.adapter.n_layers
    assert sorted(set(lens.layer)) == list(range(L + 1))
    with torch.no_grad():
        probs = lm.model(ids).logits[0, -1].float().softmax(-1)
    top = probs.topk(3)
    out = lens[lens.layer == L].sort_values("rank")
    assert out.token_id.tolist() == top.indices.tolist()
    assert out.prob.to_numpy() == pytest.approx(top.values.numpy(), abs=1e-5)
    # layer 0 reads the embeddings (Gemma's embedding module applies its own scale) through the final norm
    with torch.no_grad():
        emb = lm.model.get_input_embeddings()(ids)[0, -1]
    first = lm.adapter.unembed(emb).float().softmax(-1).topk(3)
    assert lens[lens.layer == 0].sort_values("rank").token_id.tolist() == first.indices.tolist()


def test_skip_effect_structure(lm):
    ids = lm.encode(TEXT)
    s = 1
    eff, out = explorer.skip_effect(lm, ids, s)
    e = eff.relative_change.to_numpy()
    assert (e[:s] == 0).all()  # earlier layers cannot change
    assert e[s] == pytest.approx(1.0, abs=1e-6)  # the skipped layer's own contribution is removed entirely
    assert out > 0
    with pytest.raises(ValueError, match="layer must be in"):
        explorer.skip_effect(lm, ids, lm.adapter.n_layers)


def test_explore_and_charts(lm):
    x = explorer.explore(lm, TEXT, layer=0, position=2)
    assert x.position == 2 and len(x.tokens) == lm.encode(TEXT).shape[1]
    spec = exploration_charts(x).to_dict()
    assert len(spec["concat"]) == 3 and spec["columns"] == 2  # fits the text column
    table = explorer.lens_token_table(x)
    assert list(table.columns[:2]) == ["layer", "top 1"] and len(table) == lm.adapter.n_layers + 1


def test_widget_runs_and_reports_bad_input(tiny_dirs, capsys):
    pytest.importorskip("ipywidgets", reason="the explorer widget needs ipywidgets")
    w = explorer.explorer_widget([str(tiny_dirs["llama"])], "ab cd ef", 1)
    text, row, out = w.children
    model, layer, position, run = row.children
    assert layer.max == load_model(str(tiny_dirs["llama"])).adapter.n_layers - 1
    run.click()  # outside a kernel, displayed objects are printed
    assert "ConcatChart" in capsys.readouterr().out
    text.value = "   "  # bad input: the error is shown in the output area, the widget survives
    run.click()
    assert "ValueError: The prompt is empty" in capsys.readouterr().out
    text.value, position.value = "ab", 99
    run.click()
    assert "position must be in" in capsys.readouterr().out


def test_a_typed_lone_surrogate_is_one_line_in_the_app_not_the_last_output(tiny_dirs, capsys, monkeypatch):
    """A browser sends half of an emoji as a lone surrogate. ipywidgets echoes every value it receives before setting
    it, and the kernel's session cannot encode that echo (UTF-8): the value was dropped (the kernel logs the error),
    so Run drew the previous prompt's output again and said nothing."""
    import contextlib

    ipywidgets = pytest.importorskip("ipywidgets", reason="the explorer widget needs ipywidgets")
    from jupyter_client.session import json_packer

    # every message a widget sends is packed as a kernel's session packs it
    monkeypatch.setattr(ipywidgets.Widget, "_send", lambda self, msg, buffers=None: json_packer(msg))
    text, row, _ = explorer.explorer_widget([str(tiny_dirs["llama"])], "ab cd ef", 1).children
    run = row.children[3]
    run.click()
    assert "ConcatChart" in capsys.readouterr().out  # the first prompt's output
    with contextlib.suppress(UnicodeEncodeError):  # a kernel logs an error of a comm message and goes on
        text.set_state({"value": "ab \ud83d"})  # the browser's update of the prompt box
    run.click()
    out = capsys.readouterr().out
    assert "\x1b[2K" in out  # the output area cleared (outside a kernel, clear_output writes this) …
    shown = [line for line in out.replace("\x1b[2K", "").splitlines() if line.strip()]
    assert len(shown) == 1 and shown[0].startswith("DataError: prompt holds \\ud83d, half of a UTF-16"), shown  # … one line


def test_widget_in_a_live_kernel(tiny_dirs):
    """The explorer in a real Jupyter kernel: Run fills the Output widget with the charts and the token table, and
    bad input appears there as a message. nbclient acts as the front end and syncs the Output widget's state back
    to the kernel, so a later cell can read what the user would see."""
    pytest.importorskip("ipywidgets", reason="the explorer widget needs ipywidgets")
    nbformat = pytest.importorskip("nbformat", reason="a live kernel needs nbformat")
    nbclient = pytest.importorskip("nbclient", reason="a live kernel needs nbclient")
    src = [
        "from lmdepth.book.explorer import explorer_widget\n"
        f"w = explorer_widget([{str(tiny_dirs['llama'])!r}], 'ab cd ef', 1)\n"
        "text, row, out = w.children\nrun = row.children[3]\nw",
        "run.click()",
        "print('OUTPUTS', sorted({k for o in out.outputs for k in o.get('data', {})}))",
        "text.value = '   '\nrun.click()",
        "print('ERROR', [o.get('text', '') for o in out.outputs])",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in src])
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", store_widget_state=True).execute()
    printed = "".join(o.get("text", "") for c in nb.cells for o in c.outputs if o.output_type == "stream")
    assert "text/html" in printed.split("OUTPUTS")[1].split("\n")[0]  # the rendered chart and the token table
    assert "The prompt is empty" in printed.split("ERROR")[1]
    assert not [o for c in nb.cells for o in c.outputs if o.output_type == "error"]


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "gemma3", "olmo2"])
def test_explorer_traces_equal_the_plain_hook_reference_here_and_under_the_strict_server(family):
    """The explorer runs chapter 03's remote-ready skip session; the plain-hook code it ran before is the reference
    (contributions: hooked taps; lens: a clean hooked pass through the adapter's unembedding; skip: chapter 03's
    fast path). Each panel alone is one request; an explore is one request and two forward passes (the clean pass
    shared by the three panels, then the skipped pass; it was four in three requests), counted by a hook. Under
    remote='local' every request survives the strict server."""
    from lmdepth.hooks.skip_hooks import Row, clean_pass, run_rows
    from lmdepth.metrics.residual_stats import RESIDUAL_METRICS, residual_token_metrics
    from lmdepth.model.families import ModelAdapter
    from lmdepth.model.registry import LoadedModel
    from lmdepth.model.taps import hooked_residuals
    from lmdepth.testing import tiny_model, tiny_tokenizer
    from lmdepth.traces import server

    model = tiny_model(family)
    adapter = ModelAdapter.for_model(model)
    text = "Natalia sold 48 clips in April."
    ids = LoadedModel("tiny", model, tiny_tokenizer(), adapter, "local").encode(text)
    L, layer, pos, k = adapter.n_layers, 1, 5, 4
    taps = hooked_residuals(adapter, ids, logits_to_keep=1)
    names = [c for m, c in RESIDUAL_METRICS if m == "relative_contribution"]
    ref_contrib = residual_token_metrics(taps["resid_pre"][:, 0], taps["attn_out"][:, 0], taps["mlp_out"][:, 0],
                                         taps["resid_post"][:, 0])[: len(names)].mean(-1)  # [3, L]
    clean = clean_pass(adapter, ids, with_probs=True)
    with torch.no_grad():
        probs = adapter.unembed(torch.cat([clean.resid_in[:, pos], clean.resid_out[-1:, pos]])).float().softmax(-1)
    ref_top = probs.topk(k, dim=-1)
    E, O, _ = run_rows(adapter, ids, clean, [Row(s=layer)])
    forwards = []
    model.model.register_forward_pre_hook(lambda mod, args: forwards.append(1))

    def check(c, lens, eff, out, remote):
        for i, n in enumerate(names):
            got = c[c.component == n].sort_values("layer")["value"].to_numpy()
            assert got == pytest.approx(ref_contrib[i].numpy(), abs=1e-6), (remote, n)
        for l in range(L + 1):
            row = lens[lens.layer == l].sort_values("rank")
            assert row.token_id.tolist() == ref_top.indices[l].tolist(), (remote, l)
            assert row.prob.to_numpy() == pytest.approx(ref_top.values[l].numpy(), abs=1e-6)
        assert eff.relative_change.to_numpy() == pytest.approx(E[0].numpy(), abs=1e-5), remote
        assert out == pytest.approx(float(O[0]), abs=1e-5) and out > 0

    for remote in (False, "local"):
        lm = LoadedModel("tiny", model, tiny_tokenizer(), adapter, "local", remote_mode=remote)
        before = len(server.REQUESTS)
        forwards.clear()
        check(explorer.contributions(lm, ids), explorer.lens_top_tokens(lm, ids, position=pos, k=k),
              *explorer.skip_effect(lm, ids, layer), remote)
        assert len(forwards) == 4  # each panel alone: its own clean pass (the skip: + the skipped pass)
        panels = len(server.REQUESTS) - before
        forwards.clear()
        x = explorer.explore(lm, text, layer, position=pos, k=k)
        assert len(forwards) == explorer.EXPLORE_FORWARDS == 2, remote  # the clean pass once, the skipped pass
        check(x.contributions, x.lens, x.skip, x.output_change, remote)
        records = server.REQUESTS[before:]
        if remote == "local":
            assert panels == 3 and len(records) - panels == explorer.EXPLORE_REQUESTS == 1  # one session
            assert all(r.payload_bytes < 50_000 for r in records)
            assert not [m for r in records for m in r.modules if m.split(".")[0] == "lmdepth"]
        else:
            assert not records


def test_explore_under_the_strict_server_equals_the_local_explore(tiny_dirs):
    """``remote='local'`` (the chapter's and the widget's parameter, through :func:`explorer.load`): every panel of an
    explore equals the local one, in one request that survives the strict server."""
    from lmdepth.traces import server

    here = explorer.explore(explorer.load(str(tiny_dirs["qwen2"])), TEXT, layer=1, position=2)
    sim_lm = explorer.load(str(tiny_dirs["qwen2"]), remote="local")
    assert sim_lm.remote_mode == "local"
    before = len(server.REQUESTS)
    sim = explorer.explore(sim_lm, TEXT, layer=1, position=2)
    records = server.REQUESTS[before:]
    assert len(records) == explorer.EXPLORE_REQUESTS == 1
    assert not [m for r in records for m in r.modules if m.split(".")[0] == "lmdepth"]
    assert sorted(records[0].saved) == ["E_all", "O_all", "clean_contributions", "lens_ids", "lens_probs"]
    assert sim.tokens == here.tokens and sim.lens[["layer", "rank", "token_id"]].equals(here.lens[["layer", "rank", "token_id"]])
    assert (sim.lens.prob - here.lens.prob).abs().max() <= 1e-5
    assert (sim.contributions.value - here.contributions.value).abs().max() <= 1e-5
    assert (sim.skip.relative_change - here.skip.relative_change).abs().max() <= 1e-5
    assert here.skip.relative_change.max() > 0.01 and abs(sim.output_change - here.output_change) <= 1e-5


def test_remote_true_is_checked_in_one_line_before_anything_loads(tiny_dirs, monkeypatch):
    """The widget and the chapter with ``remote=True``: a local model is refused by name, and a hub id without an
    NDIF key stops at the preflight; one line each, and no model is loaded."""
    from nnsight.schema.config import CONFIG

    from lmdepth.errors import ParameterError, RemoteUnavailable
    from lmdepth.model import registry

    monkeypatch.setattr(CONFIG.API, "APIKEY", None)
    monkeypatch.delenv("NDIF_API_KEY", raising=False)
    monkeypatch.setattr(explorer, "load_model", lambda *a, **k: pytest.fail("loaded a model"))
    with pytest.raises(ParameterError, match="remote=True runs a Hugging Face hub id") as e:
        explorer.load(str(tiny_dirs["llama"]), remote=True)
    assert "\n" not in str(e.value)
    monkeypatch.setattr(explorer, "load_model", registry.load_model)
    monkeypatch.setattr("nnsight.LanguageModel", lambda *a, **k: pytest.fail("asked the hub for a model"))
    monkeypatch.setattr("lmdepth.model.ndif._reachable", lambda url, timeout: True)  # network there, key not
    with pytest.raises(RemoteUnavailable, match="NDIF API key") as e:
        explorer.load("meta-llama/Llama-3.1-70B", remote=True)
    assert "\n" not in str(e.value)
    pytest.importorskip("ipywidgets", reason="the explorer widget needs ipywidgets")
    with pytest.raises(ParameterError, match="is not one"):
        explorer.explorer_widget(["meta-llama/Llama-3.1-70B", str(tiny_dirs["llama"])], "ab cd", 0, remote=True)


def test_the_widget_runs_under_the_strict_server(tiny_dirs, capsys):
    pytest.importorskip("ipywidgets", reason="the explorer widget needs ipywidgets")
    from lmdepth.traces import server

    w = explorer.explorer_widget([str(tiny_dirs["gemma3"])], "ab cd ef", 1, remote="local")
    before = len(server.REQUESTS)
    w.children[1].children[3].click()
    assert "ConcatChart" in capsys.readouterr().out and len(server.REQUESTS) - before == 1
