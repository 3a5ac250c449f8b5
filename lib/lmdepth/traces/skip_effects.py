"""The layer-skipping trace of chapter 03: every skip effect of one prompt in one nnsight session.

The session holds one clean trace (residuals, keys/values, the output distribution — they stay where the model
runs) and, per skipped layer s, one batched trace per cut point with one row per variant (whole layer, attention,
MLP, local; or the nudge control, which moves the residual after layer s by the skip's norm in a random direction).
Layers before s are skipped with the clean residual h_s (they cannot change); a cut point after the
first reuses the lead trace's keys/values as its prefix, so it computes only positions ≥ t. Effects are reduced
inside each trace — E[b, j] the max relative change of layer j's contribution, O[b] the output change — so only
[variants × layers] numbers leave it: here, under the strict simulation (``remote="local"``) and on NDIF, one
request per prompt.

The clean trace can also reduce readings of the clean pass itself: the relative contributions of every layer and
token and the logit lens' top-k tokens at one position (``contributions``, ``lens``). They live here because an
nnsight session ships the source of one block, so what shares the clean pass with the skipped passes — the
explorer's one explore: one request, the clean pass plus one pass for the chosen layer — must be written in it.

The block reads only torch, transformers' ``DynamicCache``, the kernels (:mod:`lmdepth.kernels`, shipped by value
with a remote request), the model's envoys (resolved before it) and plain data. Every tensor it makes meets
activations on their device, and per-layer values are moved to one device before they are combined (a device map
spreads a large model's layers over GPUs; ``tests/test_devices.py`` holds every trace to it).
Its reference twins are :func:`lmdepth.hooks.skip_hooks.prompt_effects` (plain hooks, the same algorithm) and
:func:`~lmdepth.hooks.skip_hooks.prompt_effects_naive` (one full forward per intervention), which the tests hold it
to.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lmdepth.kernels.logits import top_tokens
from lmdepth.kernels.outputs import stack_on
from lmdepth.kernels.skip_kernels import (
    PARTS,
    accumulate,
    clean_pass_layers,
    output_change,
    prefix_cache_data,
    row_changes,
    row_masks,
    skipped_pass_layer,
    variant_kinds,
)
from lmdepth.traces.remote import trace_kwargs
from lmdepth.traces.residual_metrics import TapPaths


def skip_effects(nn_model: Any, paths: TapPaths, input_ids: torch.Tensor, cuts: Sequence[int] = (),
                 parts: Sequence[str] = PARTS, local: bool = True, current: bool = True, config: Any = None,
                 remote: bool | str = False, floor: float | None = None, skipped: Sequence[int] | None = None,
                 rel_eps: float = 1e-6, contributions: bool = False,
                 lens: tuple[int, int] | None = None, directions: torch.Tensor | None = None) -> dict[tuple[str, str], tuple[torch.Tensor, ...]]:
    """All skip effects of one prompt (the semantics of :func:`lmdepth.hooks.skip_hooks.prompt_effects`).

    Args:
        nn_model: the remotable nnsight wrapper (``LoadedModel.nn``).
        paths: the family's taps.
        input_ids: [1, T] the prompt.
        cuts: cut points t of the "future" analysis (intervene at 1..t−1, measure at ≥ t; max over cuts).
        parts, local: the variants (a part skipped at the intervened positions; ``local``: the whole layer removed
            with every later residual pinned to its clean value minus layer s's clean contribution there). A part
            "nudge" is the output change's control, not a skip: layer s's output + ‖Δ_s‖ · u_s at the intervened
            positions (Δ_s its clean contribution there, u_s row s of ``directions``), so the residual moves by
            the skip's norm in a direction unrelated to what the layer wrote.
        current: also the "all tokens" analysis (intervene at every position ≥ 1, measure everywhere).
        config: the model's config (the keys/values cache of the cut points; a sliding window shorter than the
            prompt turns the prefix reuse off, as its cache has already dropped positions).
        remote: ``False``, ``True`` (NDIF) or ``"local"`` (strict simulation).
        floor: also the robust statistics (book/method.md#method-skipping): per skipped layer, the *mean* over
            measured positions ≥ 1 of ``||Δ_j − Δ'_j|| / max(||Δ_j||, floor · median_p ||Δ_j||)`` (the median over
            the prompt's positions of layer j's clean contribution norm) and of the output change; for the future
            analysis averaged over the cut points. None: the paper's max only.
        skipped: the skipped layers s to run (None: every layer). Each costs its own traces (one per cut point and
            analysis) and nothing else, so one layer costs the clean pass plus those (the explorer's skip effect);
            its rows equal the full session's.
        rel_eps: the relative changes' (and contributions') denominator floor.
        contributions: also, from the clean pass, ‖a_l‖/‖h_l‖, ‖m_l‖/‖h_l + a_l‖ and ‖a_l + m_l‖/‖h_l‖ of every
            layer and token (the first three of chapter 01's residual metrics,
            :data:`~lmdepth.metrics.residual_stats.RESIDUAL_METRICS`, as :func:`lmdepth.traces.residual_metrics
            .residual_metrics` computes them).
        lens: ``(position, k)``: also, from the clean pass, the logit lens' top-k tokens at that position (0 ≤
            position < T) for the residual entering every layer and for the last layer's output, through the model's
            own final norm and head, called (no weight is read: a hosted model's are not readable), fp32 logits
            soft-capped by ``config``'s ``final_logit_softcapping``; only [L + 1, k] numbers leave the trace.
        directions: [L, D] unit vectors of the "nudge" part
            (:func:`lmdepth.hooks.skip_hooks.nudge_directions`): plain data shipped with the block.

    Returns:
        ``{(analysis, variant): (E [L, L], O [L])}``: analysis "current" or "future", variant a part or "local";
        with ``floor``, ``(E, O, M [L, L], Q [L])``, M and Q the robust means. Row s of E (and M), entry s of O (and
        Q) belong to skipped layer s; those of layers not in ``skipped`` are NaN. With ``contributions``, also
        ``("clean", "contributions"): (C [L, 3, T],)``; with ``lens``, ``("clean", "lens"): (probabilities [L + 1, k]
        fp32, token ids [L + 1, k] int64)``, best first.
    """
    L, T = paths.n_layers, int(input_ids.shape[1])
    run_layers = _checked(L, T, skipped, lens, parts, directions)
    lens_at, top_k = (None, 0) if lens is None else (int(lens[0]), int(lens[1]))
    u = directions.float() if directions is not None else None
    names, kinds = variant_kinds(parts, local)
    B, robust = len(names), floor is not None
    cuts, analyses, passes = _passes(cuts, current)
    window = getattr(config, "sliding_window", None)
    reuse = window is None or T < window  # a sliding window shorter than the prompt has dropped the prefix
    softcap = getattr(config, "final_logit_softcapping", None) or None  # Gemma: cap·tanh(z/cap) on the logits
    # envoys and plain data for the block (it must not read `paths` or `envoys`, library objects)
    envoys = paths.envoys(nn_model)
    layers, attns, mlps, norm, head = envoys.layers, envoys.attn, envoys.mlp, envoys.final_norm, envoys.lm_head
    attn_index, mlp_index = paths.attn_index, paths.mlp_index
    shipped = 0 if u is None else u.numel() * u.element_size()  # the nudge's directions travel with the request
    with torch.no_grad(), nn_model.session(**trace_kwargs(nn_model, remote, extra_payload=shipped)):
        from transformers import DynamicCache

        A = len(analyses)
        totals = (torch.zeros(A, B, L, L), torch.zeros(A, B, L)) + ((torch.zeros(A, B, L, L), torch.zeros(A, B, L))
                                                                  if robust else ())  # E, O[, M, Q]
        # the clean pass: residuals in and out of every layer (on their layers' devices), keys/values, the output
        # distribution (the skip effects' references), and the readings of the clean pass asked for
        with nn_model.trace(input_ids, **({"use_cache": True} if analyses else {"logits_to_keep": 1})):
            ins, outs, rel = clean_pass_layers(layers, attns, mlps, attn_index, mlp_index, contributions, rel_eps)
            if contributions:
                clean_contributions = stack_on(rel).save()  # [L, 3, T] on the CPU
            if lens_at is not None:  # the model's unembedding of [L + 1, D] residuals: [L + 1, V] logits at once
                top = top_tokens(head, norm, [h[lens_at] for h in ins] + [outs[-1][lens_at]], softcap, top_k)
                lens_probs, lens_ids = top.values.cpu().save(), top.indices.cpu().save()
            if analyses:
                probs = nn_model.output.logits[0].float().softmax(-1)  # [T, V]: the model's own (soft-capped)
                clean_kv = [(c.keys, c.values) for c in nn_model.output.past_key_values.layers]
        contrib = [o.float() - h.float() for h, o in zip(ins, outs)] if analyses else []  # [T, D] per layer
        # the denominators' floor: a stated fraction of each layer's median clean contribution norm
        den_floor = [(c.norm(dim=-1).median() * (floor or 0.0)).clamp_min(rel_eps) for c in contrib]
        for s in run_layers if analyses else ():
            lead_kv = None
            for k, t in enumerate(passes):
                start = t if (k > 0 and reuse) else 0  # a later cut point computes only positions ≥ t
                m0 = 0 if t is None else t  # measured: positions ≥ m0, the columns m0 − start on
                masks = row_masks(kinds, start, T, t)  # [5, B, W]
                cache = (DynamicCache(ddp_cache_data=prefix_cache_data(clean_kv, lead_kv, s, start, B), config=config)
                         if start > 0 else DynamicCache(config=config) if (k == 0 and len(passes) > 1 and reuse)
                         else None)
                h_s = ins[s][start:].unsqueeze(0).expand(B, -1, -1).contiguous()
                with nn_model.trace(input_ids[:, start:].expand(B, -1).contiguous(), past_key_values=cache,
                                    use_cache=cache is not None, logits_to_keep=1):
                    for j in range(s):  # cannot change: return the clean residual h_s without computing
                        layers[j].skip(h_s)
                    changes = []  # per layer j ≥ s: ([B], [B] or None) on layer j's device
                    for j in range(s, L):
                        pinned = outs[j][start:].float() - contrib[s][start:].to(outs[j].device) if local else None
                        h_in, out = skipped_pass_layer(layers[j], attns[j], mlps[j], attn_index, mlp_index, masks,
                                                       j == s, contrib[s][start:], None if u is None else u[s], pinned)
                        changes.append(row_changes(out, h_in, contrib[j][start:], m0 - start, max(m0, 1) - start,
                                                   den_floor[j] if robust else None, rel_eps))
                    O, Q = output_change(head, norm, out, probs, start, m0, softcap, robust)
                    if k == 0 and cache is not None:
                        lead_kv = [(c.keys, c.values) for c in nn_model.output.past_key_values.layers]
                accumulate(totals, 0 if t is None else analyses.index("future"), s, changes, O, Q,
                           1 if t is None else len(cuts))
        E_all, O_all = totals[0].save(), totals[1].save()
        if robust:  # only what was asked for comes back
            M_all, Q_all = totals[2].save(), totals[3].save()
    return _effects(analyses, names, run_layers, (E_all, O_all) + ((M_all, Q_all) if robust else ()),
                    clean_contributions if contributions else None,
                    (lens_probs, lens_ids) if lens_at is not None else None)


def _passes(cuts: Sequence[int], current: bool) -> tuple[list[int], list[str], list[int | None]]:
    """The cut points run (> 1, latest first: t ≤ 1 intervenes nowhere), the analyses, and the passes per skipped
    layer in order (None: "all tokens"); the first pass is the lead whose keys/values the later ones reuse."""
    cuts = sorted({int(t) for t in cuts if t > 1}, reverse=True)
    analyses = (["current"] if current else []) + (["future"] if cuts else [])
    return cuts, analyses, ([None] if current else []) + cuts


def _checked(L: int, T: int, skipped: Sequence[int] | None, lens: tuple[int, int] | None, parts: Sequence[str],
             directions: torch.Tensor | None) -> list[int]:
    """The skipped layers to run, sorted; one clear line for a layer, lens position or nudge direction out of range."""
    run_layers = list(range(L)) if skipped is None else sorted({int(s) for s in skipped})
    if any(not 0 <= s < L for s in run_layers):
        raise ValueError(f"skipped layers must be in 0..{L - 1}, got {list(skipped or [])}")
    if lens is not None and not 0 <= int(lens[0]) < T:
        raise ValueError(f"the lens position must be in 0..{T - 1} for this prompt of {T} tokens, got {lens[0]}")
    if "nudge" in parts and (directions is None or directions.ndim != 2 or directions.shape[0] != L):
        got = None if directions is None else tuple(directions.shape)
        raise ValueError(f"the nudge needs directions of shape ({L}, d_model) "
                         f"(lmdepth.hooks.skip_hooks.nudge_directions), got {got}")
    return run_layers


def _effects(analyses: list[str], names: list[str], run_layers: list[int], values: tuple[torch.Tensor, ...],
             contributions: torch.Tensor | None, lens: tuple[torch.Tensor, torch.Tensor] | None) -> dict:
    """The session's saved values as :func:`skip_effects` returns them; the layers not run are NaN."""
    not_run = [s for s in range(values[0].shape[2]) if s not in run_layers]
    for v in values if not_run else ():
        v[:, :, not_run] = float("nan")  # not run: no value, rather than a zero that reads as "no effect"
    effects = {(a, n): tuple(v[i, b].clone() for v in values) for i, a in enumerate(analyses)
               for b, n in enumerate(names)}
    if contributions is not None:
        effects["clean", "contributions"] = (contributions,)
    if lens is not None:
        effects["clean", "lens"] = lens
    return effects


def session_forwards(n_layers: int, n_cuts: int, current: bool) -> int:
    """Forward passes of one problem's session: the clean pass, then per skipped layer one for "all tokens" (if
    ``current``) and one per cut point (cut points ≤ 1 intervene nowhere and are not run). One request in all."""
    return 1 + n_layers * (int(current) + n_cuts)


__all__ = ["skip_effects", "session_forwards"]
