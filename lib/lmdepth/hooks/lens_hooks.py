"""Both lenses of chapter 04 on library objects (:class:`~lmdepth.model.unembed.Unembedding`,
:class:`~lmdepth.model.translators.Translators`, :func:`~lmdepth.metrics.distributions.lens_metrics`): the reference
twin that the remote-ready lens trace (:func:`lmdepth.traces.lens_trace.lens_readings`, what the chapter runs) is held to
in the tests. It calls library code inside its trace, so it cannot run on NDIF. Also the plain-hook reference of the
tuned lens' training residuals (:func:`hooked_token_residuals`, :func:`collect_residuals_hooked`), the twin of
:func:`lmdepth.analyses.tuned_lens.collect_residuals`."""

from __future__ import annotations

from typing import Any

import torch

from lmdepth.data.datasets import Example
from lmdepth.metrics.distributions import (
    LENS_METRICS,
    TOP_K,
    FinalDistribution,
    Scratch,
    kl_divergence,
    lens_metrics,
)
from lmdepth.model.paths import resolve
from lmdepth.model.registry import LoadedModel
from lmdepth.model.taps import hooked_residuals, layer_output
from lmdepth.model.translators import Translators, residuals_until
from lmdepth.model.unembed import Unembedding


def lens_stats(
    hs: list[torch.Tensor],
    unembed: Unembedding,
    translators: Translators | None = None,
    k: int = TOP_K,
    max_logits: int = 1 << 23,
) -> torch.Tensor:
    """Both lenses on the residuals of one problem, reduced block by block.

    A block is as many (lens, layer) readings of a group of positions as fit in ``max_logits`` logits; it goes
    through one unembedding matmul and is reduced to per-token metrics at once. Memory is O(max_logits)
    (≈ 5 × 32 MB by default) whatever the number of layers, and small vocabularies get few, large operations.

    Args:
        hs: L+1 tensors [positions, d]: h_0..h_{L-1} (layer inputs) and h_L (the last layer's output).
        unembed: final norm + unembedding.
        translators: tuned-lens translators; None computes the logit lens only.
        k: top-k of the overlap.
        max_logits: logits per block.

    Returns:
        [lenses, metrics, layers, positions] fp32 (lenses: logit, then tuned if given).
    """
    n_layers, n_pos, vocab = len(hs) - 1, hs[0].shape[0], unembed.vocab
    lenses = 1 if translators is None else 2
    readings = [(l, i) for l in range(n_layers) for i in range(lenses)]  # (layer, lens)
    pos_chunk = max(1, min(n_pos, max_logits // vocab))
    per_block = max(1, max_logits // (pos_chunk * vocab))
    scratch = Scratch(per_block * pos_chunk, vocab, unembed.dtype) if unembed.weight is not None else None
    out = torch.zeros(lenses, len(LENS_METRICS), n_layers, n_pos)
    for s in range(0, n_pos, pos_chunk):
        rows = slice(s, s + pos_chunk)
        final = FinalDistribution.from_logits(unembed(hs[-1][rows]), k)
        for b in range(0, len(readings), per_block):
            block = readings[b : b + per_block]
            # [G, P, d]: the residuals themselves (logit lens) or translated (tuned lens)
            x = torch.stack([hs[l][rows].float() if i == 0 else translators(hs[l][rows], l) for l, i in block])
            z = unembed(x.flatten(0, 1), scratch).view(*x.shape[:2], -1)
            m = lens_metrics(z, final, scratch)  # [3, G, P]
            for j, (l, i) in enumerate(block):
                out[i, :, l, rows] = m[:, j]
    return out


@torch.no_grad()
def prompt_lens(
    lm: LoadedModel,
    ids: torch.Tensor,
    positions: torch.Tensor,
    unembed: Unembedding,
    translators: Translators | None = None,
    k: int = TOP_K,
) -> tuple[torch.Tensor, float]:
    """One traced forward pass → lens metrics at the chosen positions, computed inside the trace with library code
    (the reference of :func:`lmdepth.traces.lens_trace.lens_readings`).

    Args:
        lm: loaded model.
        ids: [1, tokens] token ids.
        positions: [P] positions to evaluate.
        unembed: built with ``traced=True`` (its final norm is the nnsight envoy).
        translators: tuned-lens translators or None.

    Returns:
        ([lenses, metrics, layers, P] fp32, KL(lens on h_L ‖ model output) at the last position — a self-check
        that the lens at the last layer reproduces the model's logits; ≈0, bf16 rounding when lens_dtype is bf16).
    """
    nn_model, adapter = lm.nn, lm.adapter
    saved: list[Any] = []  # created before the trace: nnsight requirement
    with nn_model.trace(ids, remote=lm.remote, logits_to_keep=1):
        hs = [resolve(nn_model, adapter.layer_path(l)).input[0, positions] for l in range(adapter.n_layers)]
        h_last = layer_output(resolve(nn_model, adapter.layer_path(adapter.n_layers - 1)).output)[0]
        hs.append(h_last[positions])
        model_logits = resolve(nn_model, adapter.family.lm_head).output[0, -1:]
        check = kl_divergence(torch.log_softmax(unembed(h_last[-1:]), -1),
                              torch.log_softmax(unembed.softcapped(model_logits), -1))
        saved.append(lens_stats(hs, unembed, translators, k).save())
        saved.append(check.save())
    return torch.as_tensor(saved[0]).cpu(), float(torch.as_tensor(saved[1]).max())


@torch.no_grad()
def hooked_token_residuals(lm: LoadedModel, ids: torch.Tensor) -> torch.Tensor:
    """h_0..h_L at every position of one sequence, captured with plain forward hooks: the reference twin of
    :func:`lmdepth.traces.boundary_residuals.token_residuals` (what the tuned lens' training collection runs), kept
    for the tests only; it cannot run on NDIF.

    Args:
        lm: loaded model.
        ids: [1, tokens] token ids.

    Returns:
        [tokens, L + 1, d_model] fp32 on the model's device (row L is the last layer's output h_L).
    """
    r = hooked_residuals(lm.adapter, ids, logits_to_keep=1)
    return torch.cat([r["resid_pre"][:, 0], r["resid_post"][-1:, 0]]).transpose(0, 1).float()


@torch.no_grad()
def collect_residuals_hooked(lm: LoadedModel, examples: list[Example], n_tokens: int) -> torch.Tensor:
    """:func:`lmdepth.analyses.tuned_lens.collect_residuals` with plain forward hooks (:func:`hooked_token_residuals`):
    the reference twin the tests hold the trace to; no run uses it.

    Returns:
        [n_tokens, L + 1, d_model] fp32 on the model's device.
    """
    return residuals_until(lm, examples, n_tokens, lambda ids: hooked_token_residuals(lm, ids))
