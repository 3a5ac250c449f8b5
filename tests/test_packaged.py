"""The real packaged model (SmolLM2-135M from PyPI): the packaged tier, slower than the rest, but what the book
actually runs."""

import pytest
import torch

from lmdepth.analyses import residual
from lmdepth.errors import ParameterError
from lmdepth.model.random_init import control_name
from lmdepth.model.registry import PACKAGED, current_weights_id, load_model

pytestmark = pytest.mark.packaged


@pytest.fixture(scope="module")
def smol():
    return load_model("smollm2-135m")


def test_packaged_smollm2_is_the_real_model(smol):
    assert smol.n_layers == 30 and smol.adapter.d_model == 576 and smol.adapter.family.name == "llama"
    assert smol.file_sha256 == PACKAGED["smollm2-135m"].sha256
    ids = smol.encode("The capital of France is")
    with torch.no_grad():
        probs = smol.model(ids).logits[0, -1].softmax(-1)
    top = smol.tokenizer.decode(probs.argmax())
    assert top == " Paris" and probs.max() > 0.5


def test_packaged_model_is_additive_and_lens_matches(smol):
    from lmdepth.model.taps import hooked_residuals

    assert smol.additivity_error < 1e-4
    ids = smol.encode("Natalia sold clips to 48 of her friends.")
    r = hooked_residuals(smol.adapter, ids)
    with torch.no_grad():
        torch.testing.assert_close(smol.adapter.unembed(r["resid_post"][-1]), smol.model(ids).logits, rtol=1e-4, atol=1e-4)


def test_residual_run_on_gsm8k(tmp_path):
    r = residual.run("smollm2-135m", n_examples=2, results_dir=tmp_path, n_boot=20)
    assert r.meta["model"]["file_sha256"] == PACKAGED["smollm2-135m"].sha256
    assert r.meta["data"]["dataset"] == "gsm8k" and len(r.meta["data"]["ids"]) == 2
    att = residual.select(r.table, "relative_contribution", "attention")
    assert len(att) == 30 and att.notna().all() and (att > 0).all()


def test_random_init_control_has_the_architecture_but_not_the_training(smol, tmp_path):
    """``random-init:<name>``: same config and tokenizer, fresh seeded weights, its own cache identity."""
    ctrl = load_model(control_name("smollm2-135m"))
    again = load_model(control_name("smollm2-135m"))
    assert ctrl.n_layers == smol.n_layers and ctrl.adapter.d_model == smol.adapter.d_model
    assert ctrl.additivity_error < 1e-4 and ctrl.source == "random-init" and ctrl.file_sha256 is None
    w = ctrl.model.model.layers[3].mlp.up_proj.weight
    assert torch.equal(w, again.model.model.layers[3].mlp.up_proj.weight)  # seeded: the same control everywhere
    assert not torch.allclose(w, smol.model.model.layers[3].mlp.up_proj.weight)
    assert current_weights_id(control_name("smollm2-135m")) != current_weights_id("smollm2-135m")
    ids = ctrl.encode("The capital of France is")
    with torch.no_grad():
        assert ctrl.tokenizer.decode(ctrl.model(ids).logits[0, -1].argmax()) != " Paris"
    # its per-problem table feeds the claim checks like the real model's
    r = residual.run(control_name("smollm2-135m"), n_examples=2, results_dir=tmp_path, n_boot=20)
    assert r.units is not None and set(r.units.model) == {control_name("smollm2-135m")}
    assert len(r.units) == 2 * 11 * 30
    with pytest.raises(ParameterError, match="local control"):
        load_model(control_name("smollm2-135m"), remote=True)
