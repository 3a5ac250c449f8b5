"""Integration tests on tiny random-init models of every supported family."""

import dataclasses

import pytest
import torch
from nnsight.modeling.transformers import TransformersModel

from lmdepth.errors import UnsupportedArchitectureError
from lmdepth.metrics.residual_stats import residual_token_metrics
from lmdepth.model.families import ModelAdapter, family_for
from lmdepth.model.taps import additivity_error, check_additivity, hooked_residuals
from lmdepth.testing import FAMILY_CONFIGS, tiny_model, tiny_tokenizer
from lmdepth.traces.residual_metrics import TapPaths, residual_metrics

FAMILIES = list(FAMILY_CONFIGS)


@pytest.fixture(scope="module")
def ids(tok):
    return tok("Natalia sold 48 clips in April.", return_tensors="pt").input_ids


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.integration
def test_residual_is_additive(family, ids):
    adapter = ModelAdapter.for_model(tiny_model(family))
    assert additivity_error(adapter, ids) < 1e-5


@pytest.mark.parametrize("family", ["gemma3", "olmo2"])
@pytest.mark.integration
def test_raw_sublayer_outputs_are_wrong_for_sandwich_norms(family, ids):
    """Why the adapter must know the family: Llama-style taps on a sandwich-norm model break additivity."""
    model = tiny_model(family)
    wrong = dataclasses.replace(family_for("llama"), model_types=(model.config.model_type,))
    assert additivity_error(ModelAdapter(model, wrong), ids) > 0.05


@pytest.mark.integration
def test_post_ln_model_is_refused(ids):
    model = tiny_model("llama")
    for layer in model.model.layers:  # turn every layer into post-LN: h_{l+1} = LN(h_l + a_l + m_l)
        layer.register_forward_hook(lambda mod, args, out: torch.nn.functional.layer_norm(out, out.shape[-1:]))
    with pytest.raises(UnsupportedArchitectureError, match="not additive"):
        check_additivity(ModelAdapter.for_model(model), ids)


@pytest.mark.unit
def test_unknown_architecture_names_supported_ones():
    with pytest.raises(UnsupportedArchitectureError, match="Supported: .*llama"):
        family_for("gpt2")


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.integration
def test_last_layer_logit_lens_equals_logits(family, ids):
    model = tiny_model(family)
    adapter = ModelAdapter.for_model(model)
    resid = hooked_residuals(adapter, ids)["resid_post"][-1]
    with torch.no_grad():
        torch.testing.assert_close(adapter.unembed(resid), model(ids).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.integration
def test_nnsight_trace_equals_plain_hooks(family, ids):
    model = tiny_model(family)
    adapter = ModelAdapter.for_model(model)
    traced = residual_metrics(TransformersModel(model, tokenizer=tiny_tokenizer()), TapPaths.of(adapter), ids)
    r = hooked_residuals(adapter, ids)
    ref = torch.stack([residual_token_metrics(r["resid_pre"][l], r["attn_out"][l], r["mlp_out"][l], r["resid_post"][l])
                       for l in range(adapter.n_layers)])
    torch.testing.assert_close(traced, ref)
    # and the trace left no hooks behind: a plain forward still gives the same logits
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, tiny_model(family)(ids).logits)


@pytest.mark.integration
def test_hooks_are_removed_after_capture(ids):
    model = tiny_model("llama")
    hooked_residuals(ModelAdapter.for_model(model), ids)
    assert all(not m._forward_hooks for m in model.modules())
