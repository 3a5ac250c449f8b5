"""The residual-erasure session of chapter 05: the effect of replacing the residual at each (boundary, token) with its
mean on the answer predictions, for one prompt in one nnsight session (one request on NDIF).

The session holds one clean trace (the residual at every boundary stays where the model runs), then per boundary b
and group of erased positions one batched trace: row 0 the clean residual, each other row the clean residual with
one position replaced by the mean μ_b; layers before b return that residual without computing (b = 0: it replaces
the embeddings). The effect ``max_p ||P_p − P'_p||₂`` over the answer-predicting positions is reduced inside, so
only [L + 1, T] numbers leave it. The block reads only torch, the kernels (:mod:`lmdepth.kernels`), the model's
envoys (resolved before it) and plain data (the means are a [L + 1, d] tensor). Its reference twin is :func:`lmdepth.hooks.stack.erasure_map` (plain hooks),
which the tests hold it to; :func:`boundary_sums` (divided by the token count) is that of
:func:`lmdepth.hooks.stack.mean_residuals`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lmdepth.kernels.logits import unembed
from lmdepth.kernels.outputs import stack_on, unwrap
from lmdepth.traces.remote import trace_kwargs
from lmdepth.traces.residual_metrics import TapPaths


def boundary_sums(nn_model: Any, paths: TapPaths, input_ids: torch.Tensor, remote: bool | str = False) -> torch.Tensor:
    """One traced forward pass → the sum over every position of the residual at each boundary.

    Args:
        input_ids: [1, T] token ids.

    Returns:
        [L + 1, d] fp32 sums (divide by the token count for :func:`lmdepth.hooks.stack.mean_residuals`' means).
    """
    layers, n_layers = paths.envoys(nn_model).layers, paths.n_layers  # envoys and plain data for the block
    with torch.no_grad(), nn_model.trace(input_ids, use_cache=False, logits_to_keep=1,
                                         **trace_kwargs(nn_model, remote)):
        kept = [layers[0].input]
        for l in range(n_layers):
            kept.append(unwrap(layers[l].output))
        # [B, T, d] each, on its layer's device → [L+1, d]
        sums = stack_on([k.float().sum(dim=(0, 1)) for k in kept]).save()
    return sums


def erasure_effects(nn_model: Any, paths: TapPaths, input_ids: torch.Tensor, a_start: int, means: torch.Tensor,
                    batch_size: int = 32, softcap: float | None = None, remote: bool | str = False,
                    positions: Sequence[int] | None = None) -> torch.Tensor:
    """Effect of erasing the residual at each (boundary, token) on the answer predictions.

    Args:
        nn_model: the remotable nnsight wrapper (``LoadedModel.nn``).
        paths: the family's taps.
        input_ids: [1, T] prompt + answer; a_start: index of the first answer token.
        means: [L + 1, d] the replacement residual per boundary.
        batch_size: rows per trace (the clean copy plus ``batch_size − 1`` erased positions).
        softcap: the model's ``final_logit_softcapping`` (Gemma) or None.
        remote: ``False`` (here), ``True`` (NDIF) or ``"local"`` (strict simulation).
        positions: the token positions erased (None: every one, BOS included, as the authors' code for the
            pretrained models; chapter 07's models erase 1 … T − 2, as the authors' script for them).

    Returns:
        [L + 1, T] fp32: row 0 = embeddings, row b = output of block b − 1 (0 at a position not erased).
    """
    if batch_size < 2:
        raise ValueError("batch_size must be at least 2 (the clean copy plus one erased position)")
    L, T = paths.n_layers, int(input_ids.shape[1])
    envoys = paths.envoys(nn_model)  # envoys for the block (it must not read `envoys`, a library object)
    layers, norm, head = envoys.layers, envoys.final_norm, envoys.lm_head
    erased = list(range(T)) if positions is None else [int(p) for p in positions]
    if any(not 0 <= p < T for p in erased):
        raise ValueError(f"erased positions must be in 0..{T - 1} for this prompt of {T} tokens")
    groups = [erased[i:i + batch_size - 1] for i in range(0, len(erased), batch_size - 1)]
    pred = torch.arange(a_start - 1, T - 1)  # the positions whose next token is an answer token
    means = means.detach().cpu()
    with torch.no_grad(), nn_model.session(**trace_kwargs(nn_model, remote,
                                                          extra_payload=means.numel() * means.element_size())):
        effects = torch.zeros(L + 1, T)
        with nn_model.trace(input_ids, use_cache=False, logits_to_keep=1):
            kept = [layers[0].input[0].clone()]
            for l in range(L):
                kept.append(unwrap(layers[l].output)[0].clone())
        for b in range(L + 1):  # kept[b]: [T, d] on its layer's device
            for ts in groups:
                B = len(ts) + 1
                h = kept[b].unsqueeze(0).repeat(B, 1, 1)
                h[torch.arange(1, B), torch.tensor(ts)] = means[b].to(h.device, h.dtype)
                with nn_model.trace(input_ids.expand(B, -1), use_cache=False, logits_to_keep=1):
                    if b == 0:
                        layers[0].input = h
                    for j in range(b):  # they return h without computing: only the last one's value is used
                        layers[j].skip(h)
                    final = unwrap(layers[L - 1].output)
                    p = unembed(head, norm, final[:, pred], softcap).softmax(-1)  # [B, n_pred, V]
                    effects[b, ts] = (p[1:] - p[:1]).norm(dim=-1).amax(-1).cpu()
        effects.save()
    return effects


__all__ = ["boundary_sums", "erasure_effects"]
