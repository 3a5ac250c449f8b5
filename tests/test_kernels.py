"""The kernels (lmdepth.kernels): each formula the traces need is written once, there; the strict server lets that
package, and no other part of the library, travel by value with a request; the kernels' own semantics."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from lmdepth.kernels.logits import softcap, softcap_, top_tokens, unembed
from lmdepth.kernels.outputs import rewrap, unwrap
from lmdepth.kernels.skip_kernels import (
    KINDS,
    edited_output,
    output_change,
    row_changes,
    row_masks,
    variant_kinds,
)

LIB = Path(__file__).resolve().parents[1] / "lib" / "lmdepth"

#: (what, pattern, the one file allowed to write it)
ONE_PLACE = [
    ("the logit soft-cap", re.compile(r"\btanh_?\("), "kernels/logits.py"),
    ("a module output's unwrap", re.compile(r"\]\s+if\s+.*isinstance\(.*\(tuple,\s*list\)\)"), "kernels/outputs.py"),
    ("a relative norm", re.compile(r"norm\(dim=-1\)\s*/"), "kernels/residual_kernels.py"),
    ("a top-k overlap", re.compile(r"\.any\(-1\)\.float\(\)\.mean\(-1\)"), "kernels/lens_kernels.py"),
    ("the lens' KL through buffers", re.compile(r"torch\.sub\(logp"), "kernels/lens_kernels.py"),
    ("an unembedding matmul into a buffer", re.compile(r"torch\.matmul\(.*out="), "kernels/logits.py"),
]


@pytest.mark.unit
@pytest.mark.parametrize("what,pattern,home", ONE_PLACE, ids=[w for w, _, _ in ONE_PLACE])
def test_each_formula_is_written_once_in_the_library(what, pattern, home):
    found = [f"{p.relative_to(LIB)}:{i}" for p in sorted(LIB.rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if pattern.search(line.split("#")[0]) and str(p.relative_to(LIB)) != home]
    assert not found, f"{what} is written outside {home}: {found}"


@pytest.mark.unit
def test_unwrap_and_rewrap():
    x, w = torch.randn(2, 3), torch.randn(2)
    assert unwrap(x) is x and unwrap((x, w)) is x and unwrap([w, x], 1) is x and unwrap((x, w), -1) == (x, w)
    y = torch.zeros(2, 3)
    out = rewrap((x, w), y)
    assert isinstance(out, tuple) and out[0] is y and out[1] is w
    assert rewrap(x, y) is y and rewrap([w, x], y, 1)[1] is y


@pytest.mark.unit
def test_softcap_in_place_equals_softcap_and_caps():
    z = torch.randn(4, 10) * 100
    capped = softcap(z, 30.0)
    assert capped.abs().max() <= 30.0 and torch.equal(softcap_(z.clone(), 30.0), capped)
    assert torch.equal(softcap(z, None), z) and softcap(z.half(), None).dtype == torch.float32


@pytest.mark.unit
def test_unembed_calls_the_modules_and_top_tokens_stack_on_one_device():
    head, norm = torch.nn.Linear(4, 7, bias=False), torch.nn.LayerNorm(4)
    hs = [torch.randn(4) for _ in range(3)]
    z = unembed(head, norm, torch.stack(hs), 5.0)
    assert torch.allclose(z, 5.0 * torch.tanh(head(norm(torch.stack(hs))) / 5.0))
    top = top_tokens(head, norm, hs, 5.0, 2)
    assert torch.equal(top.indices, z.softmax(-1).topk(2).indices)


@pytest.mark.unit
def test_row_masks_touch_positions_one_to_the_cut_of_the_rows_kind():
    names, kinds = variant_kinds(["layer", "attention", "nudge"], local=True)
    assert names == ["layer", "attention", "nudge", "local"] and kinds.shape == (4, len(KINDS))
    masks = row_masks(kinds, start=0, T=6, cut=4)  # [5, B, W]
    assert masks.shape == (5, 4, 6)
    assert masks[0, 0].tolist() == [False, True, True, True, False, False]  # layer row: positions 1..3
    assert not masks[0, 1:].any() and masks[1, 1].any() and masks[4, 2].any() and masks[3, 3].any()
    later = row_masks(kinds, start=4, T=6, cut=None)  # a later pass computes positions 4, 5: all ≥ 1
    assert later.shape == (5, 4, 2) and later[0, 0].all()


@pytest.mark.unit
def test_edited_output_and_row_changes_follow_their_definitions():
    torch.manual_seed(0)
    B, W, D = 3, 5, 4
    out, h_in = torch.randn(B, W, D), torch.randn(B, W, D)
    kinds = torch.zeros(B, len(KINDS), dtype=torch.bool)
    kinds[0, 0] = kinds[1, 3] = kinds[2, 4] = True  # layer, local, nudge
    masks = row_masks(kinds, 0, W, None)
    removed, pinned, u = torch.randn(W, D), torch.randn(W, D), torch.nn.functional.normalize(torch.randn(D), dim=0)
    new = edited_output(out, h_in, masks, True, removed, u, pinned)
    assert torch.equal(new[0, 1:], h_in[0, 1:]) and torch.equal(new[:, 0], out[:, 0])  # position 0 never changes
    assert torch.allclose(new[1, 1:], pinned[1:]) and torch.allclose(
        new[2, 1:] - out[2, 1:], removed[1:].norm(dim=-1, keepdim=True) * u)
    assert edited_output(out, h_in, masks & False, True, removed, u, pinned) is None
    ref = torch.randn(W, D)
    most, mean = row_changes(new, h_in, ref, 2, 1, torch.tensor(0.5), 1e-6)
    dist = (new - h_in - ref).norm(dim=-1)
    assert torch.allclose(most, (dist / ref.norm(dim=-1))[:, 2:].amax(1))
    assert torch.allclose(mean, (dist / ref.norm(dim=-1).clamp_min(0.5))[:, 1:].mean(1))


@pytest.mark.unit
def test_output_change_is_the_max_and_mean_over_measured_positions_whatever_the_chunk():
    torch.manual_seed(1)
    head, norm = torch.nn.Linear(4, 9), torch.nn.Identity()
    T, start, B = 7, 2, 2
    final, probs = torch.randn(B, T - start, 4), torch.softmax(torch.randn(T, 9), -1)
    d = (head(final).softmax(-1) - probs[start:]).norm(dim=-1)  # [B, W]
    for chunk in (1, 2, 64):
        most, mean = output_change(head, norm, final, probs, start, 3, None, True, chunk=chunk)
        assert torch.allclose(most, d[:, 1:].amax(1)) and torch.allclose(mean, d[:, 1:].mean(1))


@pytest.mark.integration
def test_the_strict_server_lets_the_kernels_travel_and_nothing_else_of_the_library():
    import cloudpickle.cloudpickle as cp
    import nnsight
    from nnsight.modeling.transformers import TransformersModel

    from lmdepth.model.families import ModelAdapter
    from lmdepth.testing import tiny_model, tiny_tokenizer
    from lmdepth.traces.residual_metrics import TapPaths, residual_metrics
    from lmdepth.traces.server import NotRemotable

    model = tiny_model("llama")
    nn_model, paths = TransformersModel(model, tokenizer=tiny_tokenizer()), TapPaths.of(ModelAdapter.for_model(model))
    ids = tiny_tokenizer()("12 + 7 = 19", return_tensors="pt").input_ids
    here = residual_metrics(nn_model, paths, ids)
    assert torch.equal(residual_metrics(nn_model, paths, ids, remote="local"), here)
    nnsight.register("lmdepth.metrics")
    try:
        with pytest.raises(NotRemotable, match="lmdepth.metrics would travel by value"):
            residual_metrics(nn_model, paths, ids, remote="local")
    finally:
        cp._PICKLE_BY_VALUE_MODULES.discard("lmdepth.metrics")


@pytest.mark.unit
def test_a_request_shipping_more_than_its_bound_is_refused_before_it_is_sent():
    from lmdepth.errors import ParameterError
    from lmdepth.traces.remote import trace_kwargs
    from lmdepth.traces.server import MAX_SHIPPED

    llama_70b_translators = 80 * 8192**2 * 4  # L·d² fp32 floats
    assert llama_70b_translators > MAX_SHIPPED > 30 * 576**2 * 4  # SmolLM2-135M's travel
    for remote in (True, "local"):
        with pytest.raises(ParameterError, match="tuned_lens=false"):
            trace_kwargs(None, remote, extra_payload=llama_70b_translators)
    assert trace_kwargs(None, False, extra_payload=llama_70b_translators) == {}  # here nothing travels
