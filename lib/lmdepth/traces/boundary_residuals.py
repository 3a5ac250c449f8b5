"""The residual-collection trace of chapter 06: the residual at every layer boundary, at chosen positions only.

Boundary b = 0 is the input of layer 0 (the embeddings), b ≥ 1 the output of layer b − 1 (b = L: the final
residual, before the final norm). Only the requested (sequence, position) rows leave the trace — [L + 1, rows, d]
— here, under the strict simulation (``remote="local"``) and on NDIF. The block reads only torch, the kernels
(:mod:`lmdepth.kernels`), the model's envoys and plain data. Its reference twin is :func:`lmdepth.hooks.stack.boundary_residuals` (plain hooks, every
position), which the tests hold it to.

:func:`token_residuals` is the same trace for one sequence and every position, laid out as the tuned lens' training
residuals (chapter 04, :func:`lmdepth.analyses.tuned_lens.collect_residuals`); its reference twin is
:func:`lmdepth.hooks.lens_hooks.hooked_token_residuals`.
"""

from __future__ import annotations

from typing import Any

import torch

from lmdepth.kernels.outputs import stack_on, unwrap
from lmdepth.traces.remote import trace_kwargs
from lmdepth.traces.residual_metrics import TapPaths


def boundary_residuals_at(nn_model: Any, paths: TapPaths, input_ids: torch.Tensor, rows: torch.Tensor,
                          positions: torch.Tensor, remote: bool | str = False) -> torch.Tensor:
    """One traced forward pass → the residual at every boundary for the given (row, position) pairs.

    Args:
        nn_model: the remotable nnsight wrapper of the model (``LoadedModel.nn``).
        paths: the family's taps (:meth:`TapPaths.of`).
        input_ids: [batch, tokens] token ids (right-padded sequences: attention is causal, so padding changes no
            earlier position).
        rows, positions: [R] int64, the batch row and position of each residual to keep.
        remote: ``False`` (here), ``True`` (NDIF) or ``"local"`` (strict simulation).

    Returns:
        [L + 1, R, d_model] float32, on CPU.
    """
    layers, n_layers = paths.envoys(nn_model).layers, paths.n_layers  # envoys and plain data for the block
    with torch.no_grad(), nn_model.trace(input_ids, logits_to_keep=1, **trace_kwargs(nn_model, remote)):
        kept = []
        for l in range(n_layers):
            kept.append(layers[l].input[rows, positions].float())
        kept.append(unwrap(layers[n_layers - 1].output)[rows, positions].float())
        # a gather copies: no view of the whole activation ships; each is on its layer's device until moved
        values = stack_on(kept).save()
    return values


def token_residuals(nn_model: Any, paths: TapPaths, input_ids: torch.Tensor,
                    remote: bool | str = False) -> torch.Tensor:
    """One traced forward pass of one sequence → h_0..h_L at every position: the residuals the tuned lens'
    translators are trained on (:func:`boundary_residuals_at` with every position of row 0; the gather copies, so
    [L + 1, T, d] floats come back and nothing more).

    Args:
        nn_model: the remotable nnsight wrapper of the model (``LoadedModel.nn``).
        paths: the family's taps (:meth:`TapPaths.of`).
        input_ids: [1, tokens] token ids.
        remote: ``False`` (here), ``True`` (NDIF) or ``"local"`` (strict simulation).

    Returns:
        [tokens, L + 1, d_model] float32 on CPU (a transposed view; row L is the last layer's output h_L).
    """
    n = int(input_ids.shape[1])
    rows, positions = torch.zeros(n, dtype=torch.long), torch.arange(n)
    return boundary_residuals_at(nn_model, paths, input_ids, rows, positions, remote=remote).transpose(0, 1)


__all__ = ["boundary_residuals_at", "token_residuals"]
