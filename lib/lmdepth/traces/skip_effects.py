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

The block reads only torch, transformers' ``DynamicCache``, the model's envoys (resolved before it) and plain data.
Its reference twins are :func:`lmdepth.hooks.skip_hooks.prompt_effects` (plain hooks, the same algorithm) and
:func:`~lmdepth.hooks.skip_hooks.prompt_effects_naive` (one full forward per intervention), which the tests hold it
to.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lmdepth.traces.remote import trace_kwargs
from lmdepth.traces.residual_metrics import TapPaths

PARTS = ("layer", "attention", "mlp")
LOGIT_CHUNK = 64  # positions unembedded at once: bounds memory at chunk × vocab floats


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
            own unembedding (final norm in the residual's dtype, matmul in the model's dtype, fp32 logits,
            soft-capped by ``config``'s ``final_logit_softcapping``); only [L + 1, k] numbers leave the trace.
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
    run_layers = list(range(L)) if skipped is None else sorted({int(s) for s in skipped})
    if any(not 0 <= s < L for s in run_layers):
        raise ValueError(f"skipped layers must be in 0..{L - 1}, got {list(skipped or [])}")
    lens_at, top_k = (None, 0) if lens is None else (int(lens[0]), int(lens[1]))
    if lens_at is not None and not 0 <= lens_at < T:
        raise ValueError(f"the lens position must be in 0..{T - 1} for this prompt of {T} tokens, got {lens_at}")
    if "nudge" in parts and (directions is None or directions.ndim != 2 or directions.shape[0] != L):
        got = None if directions is None else tuple(directions.shape)
        raise ValueError(f"the nudge needs directions of shape ({L}, d_model) "
                         f"(lmdepth.hooks.skip_hooks.nudge_directions), got {got}")
    u = directions.float() if directions is not None else None
    variants = [(p, False) for p in parts] + ([("layer", True)] if local else [])
    names = ["local" if loc else p for p, loc in variants]
    cuts = sorted({int(t) for t in cuts if t > 1}, reverse=True)  # t ≤ 1 intervenes nowhere: zero effect
    analyses = (["current"] if current else []) + (["future"] if cuts else [])
    # envoys and plain data for the block (it must not read `paths` or `envoys`, library objects)
    envoys = paths.envoys(nn_model)
    layers, attns, mlps, norm, head = envoys.layers, envoys.attn, envoys.mlp, envoys.final_norm, envoys.lm_head
    attn_index, mlp_index = paths.attn_index, paths.mlp_index
    B = len(variants)
    kinds = torch.tensor([[p == "layer" and not loc, p == "attention", p == "mlp", loc, p == "nudge"]
                          for p, loc in variants])
    softcap = getattr(config, "final_logit_softcapping", None) or None  # Gemma: cap·tanh(z/cap) on the logits
    window = getattr(config, "sliding_window", None)
    reuse_prefix = window is None or T < window
    lead_t = None if current else (cuts[0] if cuts else None)
    rest = cuts if current else cuts[1:]
    chunk = LOGIT_CHUNK
    robust = floor is not None
    per_cut = {"current": 1.0, "future": float(len(cuts))}  # the robust means average over cut points
    with torch.no_grad(), nn_model.session(**trace_kwargs(nn_model, remote)):
        from transformers import DynamicCache

        E_all = torch.zeros(len(analyses), B, L, L)
        O_all = torch.zeros(len(analyses), B, L)
        M_all = torch.zeros(len(analyses), B, L, L)
        Q_all = torch.zeros(len(analyses), B, L)
        if analyses or contributions or lens_at is not None:
            # the clean pass: residuals in and out of every layer, keys/values, output distribution (the skip
            # effects' references); the readings of the clean pass asked for, reduced here
            with nn_model.trace(input_ids, **({"use_cache": True} if analyses else {"logits_to_keep": 1})):
                ins, outs, rel, lens_h = [], [], [], []
                for l in range(L):  # in execution order: the layer's input, attention, MLP, the layer's output
                    h = layers[l].input[0]  # [T, D]
                    if analyses:
                        ins.append(h.clone())
                    if lens_at is not None:
                        lens_h.append(h[lens_at].clone())
                    if contributions:
                        a = attns[l].output
                        a = (a[attn_index] if attn_index >= 0 and isinstance(a, (tuple, list)) else a)[0].float()
                        m = mlps[l].output
                        m = (m[mlp_index] if mlp_index >= 0 and isinstance(m, (tuple, list)) else m)[0].float()
                        hf = h.float()
                        h_n = hf.norm(dim=-1).clamp_min(rel_eps)
                        rel.append(torch.stack([a.norm(dim=-1) / h_n,
                                                m.norm(dim=-1) / (hf + a).norm(dim=-1).clamp_min(rel_eps),
                                                (a + m).norm(dim=-1) / h_n]))  # [3, T]
                    o = layers[l].output
                    o = (o[0] if isinstance(o, (tuple, list)) else o)[0]  # [T, D]
                    if analyses:
                        outs.append(o.clone())
                    if lens_at is not None and l == L - 1:
                        lens_h.append(o[lens_at].clone())
                if contributions:
                    clean_contributions = torch.stack(rel).cpu().save()  # [L, 3, T]
                if lens_at is not None:  # the model's unembedding of [L + 1, D] residuals: [L + 1, V] logits at once
                    x = norm(torch.stack(lens_h))
                    weight = head.weight.detach()
                    z = torch.nn.functional.linear(x.to(weight.dtype), weight).float()
                    bias = getattr(head, "bias", None)
                    z = z + bias.detach().float() if bias is not None else z
                    z = torch.tanh(z / softcap) * softcap if softcap else z
                    top = z.softmax(-1).topk(top_k, dim=-1)
                    lens_probs, lens_ids = top.values.cpu().save(), top.indices.cpu().save()
                if analyses:
                    clean_out = nn_model.output
                    probs = clean_out.logits[0].float().softmax(-1)  # [T, V]: the model's own (soft-capped) logits
                    clean_kv = [(c.keys, c.values) for c in clean_out.past_key_values.layers]
        if analyses:
            resid_in, resid_out = torch.stack(ins), torch.stack(outs)  # [L, T, D]
            contrib = resid_out.float() - resid_in.float()
            # [L] the denominators' floor: a stated fraction of each layer's median clean contribution norm
            den_floor = (contrib.norm(dim=-1).median(dim=1).values * (floor if robust else 0.0)).clamp_min(rel_eps)
            for s in run_layers:
                lead_kv = None
                for k, t in enumerate([lead_t, *rest]):
                    start = 0 if (k == 0 or not reuse_prefix) else t
                    positions = torch.arange(start, T)
                    hi = T if t is None else t
                    touched = (positions >= 1) & (positions < hi)  # [W]
                    measured = positions >= (0 if t is None else t)  # [W]
                    averaged = measured & (positions >= 1)  # position 0 cannot change: left out of the means
                    layer_m = touched[None, :] & kinds[:, 0:1]  # [B, W]
                    attn_m = touched[None, :] & kinds[:, 1:2]
                    mlp_m = touched[None, :] & kinds[:, 2:3]
                    local_m = touched[None, :] & kinds[:, 3:4]
                    nudge_m = touched[None, :] & kinds[:, 4:5]
                    cache = None
                    if start > 0:  # positions < start: the lead trace's keys/values (the clean ones below s)
                        prefix = []
                        for j in range(L):
                            kj, vj = clean_kv[j] if j < s else lead_kv[j]
                            if j < s:
                                kj, vj = kj.expand(B, -1, -1, -1), vj.expand(B, -1, -1, -1)
                            prefix.append((kj[:, :, :start].contiguous(), vj[:, :, :start].contiguous()))
                        cache = DynamicCache(ddp_cache_data=prefix, config=config)
                    elif k == 0 and rest and reuse_prefix:
                        cache = DynamicCache(config=config)
                    ids_w = input_ids[:, start:].expand(B, -1).contiguous()
                    h_s = resid_in[s][positions].unsqueeze(0).expand(B, -1, -1).contiguous()
                    removed = contrib[s][positions]  # [W, D]
                    with nn_model.trace(ids_w, past_key_values=cache, use_cache=cache is not None, logits_to_keep=1):
                        for j in range(s):  # cannot change: return the clean residual h_s without computing
                            layers[j].skip(h_s)
                        E = torch.zeros(B, L)
                        M = torch.zeros(B, L)
                        final = None
                        for j in range(s, L):
                            layer = layers[j]
                            h_in = layer.input
                            # attention, then MLP (execution order): that contribution := 0 at the intervened positions
                            for part, index, mask in ((attns[j], attn_index, attn_m), (mlps[j], mlp_index, mlp_m)):
                                if j == s and bool(mask.any()):
                                    y = part.output
                                    packed = index >= 0 and isinstance(y, (tuple, list))
                                    y0 = y[index] if packed else y
                                    y0 = torch.where(mask.unsqueeze(-1), torch.zeros_like(y0), y0)
                                    part.output = tuple(y0 if i == index else v for i, v in enumerate(y)) if packed else y0
                            o = layer.output
                            out = o[0] if isinstance(o, (tuple, list)) else o
                            edited = False
                            if j == s and bool(layer_m.any()):
                                out, edited = torch.where(layer_m.unsqueeze(-1), h_in, out), True
                            if j == s and bool(nudge_m.any()):  # ‖Δ_s‖ per position along u_s
                                step = removed.norm(dim=-1, keepdim=True) * u[s]  # [W, D]
                                nudged = (out.float() + step).to(out.dtype)
                                out, edited = torch.where(nudge_m.unsqueeze(-1), nudged, out), True
                            if bool(local_m.any()):
                                pinned = (resid_out[j][positions].float() - removed).to(out.dtype)
                                out, edited = torch.where(local_m.unsqueeze(-1), pinned.expand(B, -1, -1), out), True
                            if edited:
                                layer.output = (out, *o[1:]) if isinstance(o, (tuple, list)) else out
                            ref = contrib[j][positions]  # [W, D]
                            new = out.float() - h_in.float()
                            dist, ref_norm = (new - ref).norm(dim=-1), ref.norm(dim=-1)  # [B, W], [W]
                            rel = dist / ref_norm.clamp_min(rel_eps)
                            E[:, j] = rel.masked_fill(~measured[None, :], float("-inf")).amax(1).clamp_min(0)
                            if robust:
                                M[:, j] = (dist / torch.maximum(ref_norm, den_floor[j]))[:, averaged].mean(1)
                            if j == L - 1:
                                final = out
                        O, Q = torch.zeros(B), torch.zeros(B)
                        meas_pos = positions[measured]
                        n_avg = int(averaged.sum())
                        for i in range(0, len(meas_pos), chunk):
                            p = meas_pos[i : i + chunk]
                            z = head(norm(final[:, p - start])).float()  # [B, P, V]
                            if softcap:
                                z = torch.tanh(z / softcap) * softcap
                            d = (z.softmax(-1) - probs[p].unsqueeze(0)).norm(dim=-1)  # [B, P]
                            O = torch.maximum(O, d.amax(1))
                            if robust:
                                Q = Q + d[:, p >= 1].sum(1) / n_avg
                        if k == 0 and cache is not None:
                            lead_kv = [(c.keys, c.values) for c in nn_model.output.past_key_values.layers]
                    a_i = 0 if (t is None) else analyses.index("future")
                    E_all[a_i, :, s] = torch.maximum(E_all[a_i, :, s], E)
                    O_all[a_i, :, s] = torch.maximum(O_all[a_i, :, s], O)
                    if robust:
                        M_all[a_i, :, s] += M / per_cut[analyses[a_i]]
                        Q_all[a_i, :, s] += Q / per_cut[analyses[a_i]]
        E_all, O_all = E_all.save(), O_all.save()
        if robust:
            M_all, Q_all = M_all.save(), Q_all.save()
    not_run = [s for s in range(L) if s not in run_layers]
    for values in ((E_all, O_all, M_all, Q_all) if robust else (E_all, O_all)) if not_run else ():
        values[:, :, not_run] = float("nan")  # not run: no value, rather than a zero that reads as "no effect"
    effects = {(a, n): ((E_all[i, b].clone(), O_all[i, b].clone())
                        + ((M_all[i, b].clone(), Q_all[i, b].clone()) if robust else ()))
               for i, a in enumerate(analyses) for b, n in enumerate(names)}
    if contributions:
        effects["clean", "contributions"] = (clean_contributions,)
    if lens_at is not None:
        effects["clean", "lens"] = (lens_probs, lens_ids)
    return effects


def session_forwards(n_layers: int, n_cuts: int, current: bool) -> int:
    """Forward passes of one problem's session: the clean pass, then per skipped layer one for "all tokens" (if
    ``current``) and one per cut point (cut points ≤ 1 intervene nowhere and are not run). One request in all."""
    return 1 + n_layers * (int(current) + n_cuts)


__all__ = ["skip_effects", "session_forwards"]
