"""The residual-stream trace of chapters 01–02: every layer's per-token norms, relative contributions and cosines,
reduced inside one nnsight trace so that only [layers × metrics × tokens] numbers leave it (here or on NDIF).

The block reads only torch, the model's envoys and plain data (module paths as strings, indices as ints) — no
library function or object — and creates and saves its result inside, so the same code runs locally, under the
strict simulation (``remote="local"``) and on NDIF. Its metrics are those of
:func:`lmdepth.metrics.residual.residual_token_metrics` (rows in :data:`~lmdepth.metrics.residual.RESIDUAL_METRICS`
order), written out with torch inside the block; that function applied to plain-hook captures
(:func:`lmdepth.model.taps.hooked_residuals`) is the reference twin the tests hold it to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from lmdepth.model.families import ModelAdapter
from lmdepth.traces.remote import trace_kwargs


@dataclass(frozen=True)
class TapPaths:
    """Where a family's residual taps live, as the plain data a trace block may read.

    Attributes:
        n_layers: number of decoder layers L.
        layers: attribute path of the decoder-layer list from the model root (e.g. ``("model", "layers")``).
        attn, attn_index: path inside a layer of the module whose output is a_l, and the index of a_l in its
            output when that is a tuple (−1: the output itself).
        mlp, mlp_index: the same for m_l.
        final_norm, lm_head: attribute paths from the model root.
    """

    n_layers: int
    layers: tuple[str, ...]
    attn: tuple[str, ...]
    attn_index: int
    mlp: tuple[str, ...]
    mlp_index: int
    final_norm: tuple[str, ...]
    lm_head: tuple[str, ...]

    @classmethod
    def of(cls, adapter: ModelAdapter) -> "TapPaths":
        fam = adapter.family
        split = lambda p: tuple(p.split("."))  # noqa: E731
        return cls(adapter.n_layers, split(fam.layers), split(fam.attn_contrib[0]),
                   -1 if fam.attn_contrib[1] is None else fam.attn_contrib[1], split(fam.mlp_contrib[0]),
                   -1 if fam.mlp_contrib[1] is None else fam.mlp_contrib[1], split(fam.final_norm), split(fam.lm_head))


def residual_metrics(nn_model: Any, paths: TapPaths, input_ids: torch.Tensor, remote: bool | str = False,
                     rel_eps: float = 1e-6, cos_eps: float = 1e-8) -> torch.Tensor:
    """One traced forward pass → the 11 residual metrics of every layer and token.

    Args:
        nn_model: the remotable nnsight wrapper of the model (``LoadedModel.nn``).
        paths: the family's taps (:meth:`TapPaths.of`).
        input_ids: [batch, tokens] token ids.
        remote: ``False`` (here), ``True`` (NDIF) or ``"local"`` (strict simulation).
        rel_eps, cos_eps: the denominators' floors (:data:`~lmdepth.metrics.residual.REL_EPS`, ``COS_EPS``).

    Returns:
        [layers, 11, batch, tokens] fp32, on CPU.
    """
    # plain data for the block (it must not read `paths`, a library object)
    n_layers, layers_path = paths.n_layers, paths.layers
    attn_path, attn_index, mlp_path, mlp_index = paths.attn, paths.attn_index, paths.mlp, paths.mlp_index
    with torch.no_grad(), nn_model.trace(input_ids, logits_to_keep=1, **trace_kwargs(nn_model, remote)):
        layers = nn_model
        for name in layers_path:
            layers = getattr(layers, name)
        rows = []
        for l in range(n_layers):
            layer = layers[l]
            attn, mlp = layer, layer
            for name in attn_path:
                attn = getattr(attn, name)
            for name in mlp_path:
                mlp = getattr(mlp, name)
            # visit in execution order: the layer's input, attention, MLP, the layer's output
            h = layer.input.float()
            a = attn.output
            a = (a[attn_index] if attn_index >= 0 and isinstance(a, (tuple, list)) else a).float()
            m = mlp.output
            m = (m[mlp_index] if mlp_index >= 0 and isinstance(m, (tuple, list)) else m).float()
            o = layer.output
            o = (o[0] if isinstance(o, (tuple, list)) else o).float()
            mid, delta = h + a, a + m
            h_n, a_n, m_n, d_n = h.norm(dim=-1), a.norm(dim=-1), m.norm(dim=-1), delta.norm(dim=-1)
            cos = torch.nn.functional.cosine_similarity
            rows.append(torch.stack([
                a_n / h_n.clamp_min(rel_eps),
                m_n / mid.norm(dim=-1).clamp_min(rel_eps),
                d_n / h_n.clamp_min(rel_eps),
                cos(a, h, dim=-1, eps=cos_eps),
                cos(m, mid, dim=-1, eps=cos_eps),
                cos(delta, h, dim=-1, eps=cos_eps),
                cos(o, h, dim=-1, eps=cos_eps),
                h_n, a_n, m_n, d_n,
            ]))
        values = torch.stack(rows).cpu().save()
    return values


__all__ = ["TapPaths", "residual_metrics"]
