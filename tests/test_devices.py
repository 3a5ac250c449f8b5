"""Every trace runs where the model's weights are not on the CPU: on one accelerator, or spread over two by a device
map (layer by layer, as a large model is on a GPU machine or on NDIF). No GPU is needed: the weights go to the
``meta`` device, where torch checks devices as CUDA does (:func:`lmdepth.testing.place_on_meta`), so a tensor made
in a block on the CPU that meets an activation fails here as it would there, and so does combining values of two
layers that live on different devices.
"""

from __future__ import annotations

import pytest
import torch

from lmdepth.model.families import ModelAdapter
from lmdepth.testing import MetaValues, place_on_meta, tiny_model, tiny_tokenizer
from lmdepth.traces.boundary_residuals import boundary_residuals_at
from lmdepth.traces.erasure_trace import boundary_sums, erasure_effects
from lmdepth.traces.generation import greedy_matches
from lmdepth.traces.lens_trace import lens_readings
from lmdepth.traces.residual_metrics import TapPaths, residual_metrics
from lmdepth.traces.skip_effects import skip_effects

L, D = 4, 32
PLACEMENTS = {"one device": 0, "two devices": L // 2}  # the first decoder layer placed on `meta`


def _placed(family: str, first_layer: int):
    """(nnsight wrapper, taps, config) of a tiny model whose layers ≥ first_layer sit on `meta`."""
    from nnsight.modeling.transformers import TransformersModel

    model = tiny_model(family, n_layers=L)
    paths = TapPaths.of(ModelAdapter.for_model(model))
    nn_model = TransformersModel(model, tokenizer=tiny_tokenizer())
    place_on_meta(model, first_layer)
    return nn_model, paths, model.config


def _ids(first_layer: int) -> torch.Tensor:
    ids = tiny_tokenizer()("The cat sat on the mat, 12 + 7 = 19.", return_tensors="pt").input_ids
    return ids.to("meta") if first_layer == 0 else ids  # the caller moves the ids to the embedding's device


TRACES = {
    "residual metrics": lambda nn, p, cfg, ids: residual_metrics(nn, p, ids).shape == (L, 11, 1, ids.shape[1]),
    "skip effects": lambda nn, p, cfg, ids: len(skip_effects(
        nn, p, ids, cuts=(5, 9), parts=("layer", "attention", "mlp", "nudge"), config=cfg, floor=0.1,
        contributions=True, lens=(3, 5), directions=torch.nn.functional.normalize(torch.randn(L, D), dim=-1))) == 12,
    "lens readings": lambda nn, p, cfg, ids: lens_readings(
        nn, p, ids, torch.arange(1, ids.shape[1]).to(ids.device), "float32", None,
        (torch.zeros(L, D, D), torch.zeros(L, D), torch.ones(L)), 5)[0].shape == (2, 3, L, ids.shape[1] - 1),
    "boundary sums": lambda nn, p, cfg, ids: boundary_sums(nn, p, ids).shape == (L + 1, D),
    "erasure": lambda nn, p, cfg, ids: erasure_effects(nn, p, ids, ids.shape[1] - 3, torch.zeros(L + 1, D),
                                                       batch_size=8).shape == (L + 1, ids.shape[1]),
    "boundary residuals": lambda nn, p, cfg, ids: boundary_residuals_at(
        nn, p, ids, torch.zeros(3, dtype=torch.long), torch.arange(3)).shape == (L + 1, 3, D),
    "greedy match": lambda nn, p, cfg, ids: greedy_matches(nn, ids, ids.shape[1] - 3) in (True, False),
}


@pytest.mark.integration
@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("placement", list(PLACEMENTS))
@pytest.mark.parametrize("trace", list(TRACES))
def test_every_trace_runs_with_the_weights_off_the_cpu(trace, placement, family):
    first = PLACEMENTS[placement]
    nn_model, paths, config = _placed(family, first)
    with MetaValues():
        assert TRACES[trace](nn_model, paths, config, _ids(first))


@pytest.mark.integration
@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_the_proxy_fails_where_a_gpu_would(placement):
    """A mask made on the CPU meeting an activation, and (two devices) two layers' values stacked unmoved."""
    first = PLACEMENTS[placement]
    nn_model, paths, _ = _placed("llama", first)
    layers = paths.envoys(nn_model).layers
    with MetaValues(), pytest.raises(RuntimeError, match="device"):
        with nn_model.trace(_ids(first)):
            h = layers[L - 1].input
            torch.where(torch.ones(h.shape[-1], dtype=torch.bool), h, 0.0).cpu().save()
    if first:
        with MetaValues(), pytest.raises(RuntimeError, match="device"):
            with nn_model.trace(_ids(first)):
                torch.stack([layers[0].input, layers[L - 1].input]).cpu().save()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here: the meta-device proxy above stands in")
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_the_traces_on_a_gpu_equal_the_cpu(family):
    """Where a GPU exists: the residual metrics, the skip session (every variant, the robust statistics, the clean
    pass's readings) and the lens readings on CUDA equal the CPU's (fp32; kernels may order sums differently)."""
    from nnsight.modeling.transformers import TransformersModel

    ids = _ids(1)
    out = {}
    for device in ("cpu", "cuda"):
        model = tiny_model(family, n_layers=L).to(device)
        nn_model, paths = TransformersModel(model, tokenizer=tiny_tokenizer()), TapPaths.of(ModelAdapter.for_model(model))
        x = ids.to(device)
        skip = skip_effects(nn_model, paths, x, cuts=(5, 9), parts=("layer", "attention", "mlp", "nudge"),
                            config=model.config, floor=0.1, contributions=True, lens=(3, 5),
                            directions=torch.nn.functional.normalize(torch.randn(L, D, generator=torch.Generator()
                                                                                 .manual_seed(0)), dim=-1))
        lens = lens_readings(nn_model, paths, x, torch.arange(1, x.shape[1], device=device), "float32", None, None, 5)
        out[device] = [residual_metrics(nn_model, paths, x).cpu(), lens[0].cpu()] + [
            v.cpu().float() for k in sorted(skip) for v in skip[k] if k != ("clean", "lens")]
    for here, there in zip(out["cpu"], out["cuda"]):
        torch.testing.assert_close(there, here, rtol=1e-4, atol=1e-5, equal_nan=True)


@pytest.mark.integration
def test_chapter_07s_traces_run_its_transformer_with_the_weights_off_the_cpu():
    """Chapter 07's depth traces (skip session with every part, the erasure value, the erasure map) on its
    from-scratch Transformer behind the generic NNsight wrapper, weights on ``meta``. (MoEUT's expert routing counts
    tokens per expert with ``bincount``, whose output shape depends on the values: PyTorch has no ``meta`` kernel for
    it, so the proxy cannot run MoEUT at all.)"""
    from lmdepth.analyses.scratch import traced
    from lmdepth.scratch.models import DenseConfig, build_model
    from lmdepth.traces.erasure_trace import boundary_sums, erasure_effects

    model = build_model(DenseConfig(vocab_size=99, d_model=D, n_layers=L, n_heads=2, d_head=16, d_ff=64)).eval()
    nn_model, paths = traced(model)
    model.to("meta")
    x = torch.randint(4, 99, (1, 12), generator=torch.Generator().manual_seed(0)).to("meta")
    with MetaValues():
        effects = skip_effects(nn_model, paths, x, cuts=(6, 9), parts=("layer", "attention", "mlp"), config=model.config)
        assert len(effects) == 8 and boundary_sums(nn_model, paths, x).shape == (L + 1, D)
        assert erasure_effects(nn_model, paths, x, 8, torch.zeros(L + 1, D), batch_size=4,
                               positions=range(1, 11)).shape == (L + 1, 12)
