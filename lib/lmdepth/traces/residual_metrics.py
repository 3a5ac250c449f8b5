"""The residual-stream trace of chapters 01–02: every layer's per-token norms, relative contributions and cosines,
reduced inside one nnsight trace so that only [layers × metrics × tokens] numbers leave it (here or on NDIF).

The block reads only torch, the kernels (:mod:`lmdepth.kernels`, shipped by value with a remote request), the
model's envoys (resolved before it by :meth:`TapPaths.envoys`, as in every trace) and plain data (indices as ints) —
no other library function or object — and creates and saves its result inside, so the same code runs locally, under
the strict simulation (``remote="local"``) and on NDIF. Its metrics are
:func:`lmdepth.kernels.residual_kernels.token_metrics` (rows in :data:`~lmdepth.metrics.residual_stats.RESIDUAL_METRICS` order); the same function applied to plain-hook
captures (:func:`lmdepth.model.taps.hooked_residuals`) is the reference twin the tests hold it to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from lmdepth.kernels.outputs import stack_on, unwrap
from lmdepth.kernels.residual_kernels import token_metrics
from lmdepth.model.families import ModelAdapter
from lmdepth.model.paths import resolve
from lmdepth.traces.remote import trace_kwargs


@dataclass(frozen=True)
class TapPaths:
    """Where a family's residual taps live (dotted module paths, :func:`lmdepth.model.paths.resolve`'s syntax).

    Attributes:
        n_layers: number of decoder layers L.
        layers: path of the decoder-layer list from the model root (e.g. ``"model.layers"``).
        attn, attn_index: path inside a layer of the module whose output is a_l, and the index of a_l in its
            output when that is a tuple (−1: the output itself).
        mlp, mlp_index: the same for m_l.
        final_norm, lm_head: paths from the model root.
    """

    n_layers: int
    layers: str
    attn: str
    attn_index: int
    mlp: str
    mlp_index: int
    final_norm: str
    lm_head: str

    @classmethod
    def of(cls, adapter: ModelAdapter) -> "TapPaths":
        fam = adapter.family
        return cls(adapter.n_layers, fam.layers, fam.attn_contrib[0],
                   -1 if fam.attn_contrib[1] is None else fam.attn_contrib[1], fam.mlp_contrib[0],
                   -1 if fam.mlp_contrib[1] is None else fam.mlp_contrib[1], fam.final_norm, fam.lm_head)

    def envoys(self, nn_model: Any) -> "TapEnvoys":
        """The model's envoys at these taps, resolved before a trace: every trace's one way to reach its modules."""
        layers = resolve(nn_model, self.layers)
        per_layer = [layers[l] for l in range(self.n_layers)]
        return TapEnvoys(per_layer, [resolve(x, self.attn) for x in per_layer],
                         [resolve(x, self.mlp) for x in per_layer], resolve(nn_model, self.final_norm),
                         resolve(nn_model, self.lm_head))


@dataclass(frozen=True)
class TapEnvoys:
    """One nnsight wrapper's envoys at a family's taps (:meth:`TapPaths.envoys`).

    A trace block may read the envoys themselves — nnsight pickles an envoy with its module and interleaver as
    persistent ids, so the server resolves them to its own model's modules — but not this object (a class of
    this library, which the server cannot import): unpack the fields into locals before the block.

    Attributes:
        layers: [L] the decoder layers' envoys.
        attn, mlp: [L] the envoys whose outputs are a_l and m_l (``TapPaths.attn_index`` / ``mlp_index`` pick
            them out of a tuple output).
        final_norm, lm_head: the final norm's and the unembedding's envoys.
    """

    layers: list[Any]
    attn: list[Any]
    mlp: list[Any]
    final_norm: Any
    lm_head: Any


def residual_metrics(nn_model: Any, paths: TapPaths, input_ids: torch.Tensor, remote: bool | str = False,
                     rel_eps: float = 1e-6, cos_eps: float = 1e-8) -> torch.Tensor:
    """One traced forward pass → the 11 residual metrics of every layer and token.

    Args:
        nn_model: the remotable nnsight wrapper of the model (``LoadedModel.nn``).
        paths: the family's taps (:meth:`TapPaths.of`).
        input_ids: [batch, tokens] token ids.
        remote: ``False`` (here), ``True`` (NDIF) or ``"local"`` (strict simulation).
        rel_eps, cos_eps: the denominators' floors (:data:`~lmdepth.metrics.residual_stats.REL_EPS`, ``COS_EPS``).

    Returns:
        [layers, 11, batch, tokens] fp32, on CPU.
    """
    # envoys and plain data for the block (it must not read `paths` or `envoys`, library objects)
    envoys = paths.envoys(nn_model)
    layers, attns, mlps = envoys.layers, envoys.attn, envoys.mlp
    n_layers, attn_index, mlp_index = paths.n_layers, paths.attn_index, paths.mlp_index
    with torch.no_grad(), nn_model.trace(input_ids, logits_to_keep=1, **trace_kwargs(nn_model, remote)):
        rows = []
        for l in range(n_layers):  # in execution order: the layer's input, attention, MLP, the layer's output
            h = layers[l].input
            a = unwrap(attns[l].output, attn_index)
            m = unwrap(mlps[l].output, mlp_index)
            rows.append(token_metrics(h, a, m, unwrap(layers[l].output), rel_eps, cos_eps))
        values = stack_on(rows).save()  # each on its layer's device (a device map's GPU)
    return values


__all__ = ["TapPaths", "TapEnvoys", "residual_metrics"]
