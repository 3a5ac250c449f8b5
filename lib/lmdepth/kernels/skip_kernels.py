"""The layer-skipping rows of chapter 03 (the book's Method page, "Layer skipping"): which positions each variant
edits, the edits themselves, and the effects reduced per skipped pass.

One skipped pass is a batch of B rows, one per variant (a part of layer s removed, the whole layer made local, or
the nudge control), over the W positions it computes (``start`` … T − 1; a cut point after the first reuses the
earlier positions' keys/values). Masks are made on the CPU (they steer Python control flow) and moved to the device of
the activation they meet; every reduction is fp32.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from lmdepth.kernels.logits import unembed
from lmdepth.kernels.outputs import rewrap, stack_on, unwrap
from lmdepth.kernels.residual_kernels import contributions as contributions_of

PARTS = ("layer", "attention", "mlp")  # the parts a skip removes (chapter 03's default variants)
KINDS = ("layer", "attention", "mlp", "local", "nudge")  # the columns of :func:`variant_kinds`
LOGIT_CHUNK = 64  # positions unembedded at once: bounds memory at chunk × vocab floats


def variant_kinds(parts: Sequence[str], local: bool) -> tuple[list[str], torch.Tensor]:
    """The rows of a skipped pass: their names (a part, or "local") and [B, 5] bool, the kind of each row in
    :data:`KINDS` order."""
    variants = [(p, False) for p in parts] + ([("layer", True)] if local else [])
    kinds = torch.tensor([[p == "layer" and not loc, p == "attention", p == "mlp", loc, p == "nudge"]
                          for p, loc in variants], dtype=torch.bool).reshape(len(variants), len(KINDS))
    return ["local" if loc else p for p, loc in variants], kinds


def row_masks(kinds: torch.Tensor, start: int, T: int, cut: int | None) -> torch.Tensor:
    """[5, B, W] bool: where each row's kind intervenes — positions 1 … cut − 1 (every position ≥ 1 without a cut)
    of the W = T − start computed ones; position 0 never changes."""
    positions = torch.arange(start, T)
    touched = (positions >= 1) & (positions < (T if cut is None else cut))  # [W]
    return kinds.T[:, :, None] & touched[None, None, :]


def zero_masked(y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, W, D] with the masked rows' positions ([B, W] bool) set to 0 (a part's contribution removed)."""
    return torch.where(mask.to(y.device).unsqueeze(-1), torch.zeros_like(y), y)


def edited_output(out: torch.Tensor, h_in: torch.Tensor, masks: torch.Tensor, at_skip: bool,
                  removed: torch.Tensor, direction: torch.Tensor | None,
                  pinned: torch.Tensor | None) -> torch.Tensor | None:
    """A decoder layer's output [B, W, D] after the skip's edits, or None where no row edits it.

    Args:
        out, h_in: the layer's output and input (the rows' own, [B, W, D]).
        masks: :func:`row_masks`.
        at_skip: this is the skipped layer s (the whole-layer and nudge rows edit it only).
        removed: [W, D] layer s's clean contribution Δ_s at the computed positions.
        direction: [D] the nudge's unit vector u_s (None without a nudge row).
        pinned: [W, D] the local rows' value here: the clean residual minus Δ_s (fp32; None without local rows).
    """
    layer_m, _, _, local_m, nudge_m = (m.to(out.device) for m in masks)
    edited = None
    if at_skip and bool(masks[0].any()):  # the layer's output := its input
        edited = torch.where(layer_m.unsqueeze(-1), h_in, out)
    if at_skip and bool(masks[4].any()):  # ‖Δ_s‖ per position along u_s
        step = removed.norm(dim=-1, keepdim=True) * direction.to(out.device)  # [W, D]
        base = out if edited is None else edited
        edited = torch.where(nudge_m.unsqueeze(-1), (base.float() + step).to(out.dtype), base)
    if bool(masks[3].any()):
        base = out if edited is None else edited
        edited = torch.where(local_m.unsqueeze(-1), pinned.to(out.device, out.dtype).expand_as(out), base)
    return edited


def skipped_pass_layer(layer: Any, attn: Any, mlp: Any, attn_index: int, mlp_index: int, masks: torch.Tensor,
                       at_skip: bool, removed: torch.Tensor, direction: torch.Tensor | None,
                       pinned: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoder layer j ≥ s of a skipped pass, in execution order: its input; at layer s, the attention and MLP
    contributions := 0 at the positions their rows intervene at; its output, edited (:func:`edited_output`).

    Args:
        layer, attn, mlp: the layer's envoys and those of its attention and MLP (``attn_index``/``mlp_index`` pick
            the contribution out of a tuple output).
        masks, at_skip, removed, direction, pinned: as :func:`edited_output` (``pinned`` None without local rows).

    Returns:
        (input, output) of the layer, [B, W, D] each, the output as the next layer receives it.
    """
    h_in = layer.input
    for part, index, mask in ((attn, attn_index, masks[1]), (mlp, mlp_index, masks[2])):
        if at_skip and bool(mask.any()):
            part.output = rewrap(part.output, zero_masked(unwrap(part.output, index), mask), index)
    out = unwrap(layer.output)
    edited = edited_output(out, h_in, masks, at_skip, removed, direction, pinned)
    if edited is None:
        return h_in, out
    layer.output = rewrap(layer.output, edited)
    return h_in, edited


def row_changes(out: torch.Tensor, h_in: torch.Tensor, ref: torch.Tensor, measured_from: int, averaged_from: int,
                den_floor: torch.Tensor | None, rel_eps: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per row, how much layer j's contribution changed: the max over measured columns (≥ ``measured_from``) of
    ||Δ'_j − Δ_j|| / max(||Δ_j||, rel_eps), and with ``den_floor`` the robust mean over the columns ≥
    ``averaged_from`` of ||Δ'_j − Δ_j|| / max(||Δ_j||, den_floor). [B, W, D] rows, [W, D] clean Δ_j → [B], [B]."""
    dist, ref_norm = (out.float() - h_in.float() - ref).norm(dim=-1), ref.norm(dim=-1)  # [B, W], [W]
    most = (dist / ref_norm.clamp_min(rel_eps))[:, measured_from:].amax(1).clamp_min(0)
    if den_floor is None:
        return most, None
    return most, (dist / torch.maximum(ref_norm, den_floor))[:, averaged_from:].mean(1)


def output_change(head: Callable[[torch.Tensor], torch.Tensor], norm: Callable[[torch.Tensor], torch.Tensor],
                  final: torch.Tensor, probs: torch.Tensor, start: int, measured_from: int, cap: float | None,
                  robust: bool, chunk: int = LOGIT_CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """The output change of each row: the max over measured positions p ≥ ``measured_from`` of ||P'_p − P_p||₂
    and (``robust``) its mean over those ≥ 1, unembedding ``chunk`` positions at a time.

    Args:
        head, norm: the model's head and final norm (envoys in a trace).
        final: [B, W, D] the last layer's output of the rows (positions ``start`` …).
        probs: [T, V] the clean output distribution.
        cap: the model's logit soft-cap or None.

    Returns:
        ([B], [B]) fp32 on the CPU (zeros where nothing is measured or not ``robust``).
    """
    T, B = int(probs.shape[0]), int(final.shape[0])
    most, total = torch.zeros(B), torch.zeros(B)
    n_avg = T - max(measured_from, 1)
    for p0 in range(measured_from, T, chunk):  # positions p0 … p1 − 1
        p1 = min(p0 + chunk, T)
        z = unembed(head, norm, final[:, p0 - start:p1 - start], cap)  # [B, P, V]
        d = (z.softmax(-1) - probs[p0:p1].to(z.device).unsqueeze(0)).norm(dim=-1)  # [B, P]
        most = torch.maximum(most.to(d.device), d.amax(1))
        if robust:
            total = total.to(d.device) + d[:, max(0, 1 - p0):].sum(1) / n_avg
    return most.cpu(), total.cpu()


def clean_pass_layers(layers: Sequence[Any], attns: Sequence[Any], mlps: Sequence[Any], attn_index: int,
                      mlp_index: int, contributions: bool, rel_eps: float) -> tuple[list, list, list]:
    """The clean pass of one prompt (batch row 0), layer by layer in execution order: each layer's input h_l and
    output h_{l+1} ([T, D] copies, on that layer's device) and, with ``contributions``, its [3, T] relative
    contributions (:func:`lmdepth.kernels.residual_kernels.contributions`) (on that device too)."""
    ins, outs, rel = [], [], []
    for layer, attn, mlp in zip(layers, attns, mlps):
        ins.append(layer.input[0].clone())
        if contributions:
            a, m = unwrap(attn.output, attn_index)[0], unwrap(mlp.output, mlp_index)[0]
            rel.append(contributions_of(ins[-1], a, m, rel_eps))
        outs.append(unwrap(layer.output)[0].clone())
    return ins, outs, rel


def accumulate(totals: tuple[torch.Tensor, ...], analysis: int, s: int, changes: list, O: torch.Tensor,
               Q: torch.Tensor, n_cut: int) -> None:
    """Fold one pass's reductions into the session's totals ``(E, O[, M, Q])`` ([analyses, B, L, L] and
    [analyses, B, L] on the CPU) at skipped layer s, in place: E and O take the max over passes (cut points), M and
    Q the mean (``n_cut`` passes). ``changes``: :func:`row_changes` per layer j ≥ s."""
    E_all, O_all = totals[:2]
    E_all[analysis, :, s, s:] = torch.maximum(E_all[analysis, :, s, s:], stack_on([e for e, _ in changes], dim=1))
    O_all[analysis, :, s] = torch.maximum(O_all[analysis, :, s], O)
    if len(totals) == 4:
        totals[2][analysis, :, s, s:] += stack_on([m for _, m in changes], dim=1) / n_cut
        totals[3][analysis, :, s] += Q / n_cut


def prefix_cache_data(clean_kv: list, lead_kv: list, s: int, start: int, rows: int) -> list:
    """The keys/values of positions < ``start`` for a cut point's pass: layers below s keep their clean ones
    (expanded to the ``rows``), layers from s on the lead pass's. [(keys, values)] per layer, [rows, H, start, d]."""
    prefix = []
    for j, (clean, lead) in enumerate(zip(clean_kv, lead_kv)):
        kj, vj = (c.expand(rows, -1, -1, -1) for c in clean) if j < s else lead
        prefix.append((kj[:, :, :start].contiguous(), vj[:, :, :start].contiguous()))
    return prefix


__all__ = ["PARTS", "KINDS", "LOGIT_CHUNK", "variant_kinds", "row_masks", "zero_masked", "edited_output",
           "skipped_pass_layer", "row_changes", "output_change", "clean_pass_layers", "accumulate", "prefix_cache_data"]
