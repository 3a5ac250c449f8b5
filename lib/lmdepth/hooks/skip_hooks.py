"""Layer skipping (paper Fig. 3; book/method.md#method-skipping): how much does removing one layer change later layers and the output?

Introduced in chapter 03. For a skipped layer s and a cut point t, the intervention acts at positions 1..t−1
(never position 0, the BOS / attention sink) and the effect is measured at positions ≥ t:

* ``part="layer"``: the layer's output := its input; ``"attention"`` / ``"mlp"``: that contribution := 0;
* ``local=True`` (the paper's appendix; book/method.md#method-skipping; part "layer" only): at the intervened positions every later residual is pinned to
  its clean value minus layer s's clean contribution, so the removal is not propagated through later layers there;
* ``part="nudge"`` (the control of the output change, not a skip): the layer's output := its output +
  ‖Δ_s‖ · u_s at each intervened position, u_s a random unit vector of layer s, drawn per problem
  (:func:`nudge_directions`): the residual moves by exactly as much as when the layer is skipped, in a direction
  unrelated to what the layer wrote;
* effect on layer j: ``e[s, j] = max_p ||Δ_j − Δ'_j|| / max(||Δ_j||, 1e-6)`` over measured positions, with
  Δ_j = h_{j+1} − h_j; effect on the output: ``o[s] = max_p ||P − P'||₂`` (probability vectors).

``t=None`` is the "all tokens" variant: intervene at every position ≥ 1, measure at every position.

Two plain-hook implementations with identical semantics, the reference twins of the trace every chapter runs
(:func:`lmdepth.traces.skip_effects.skip_effects`; chapters 03, 05, 07 and the explorer):

* :func:`naive_effect` — one full forward pass per (prompt, cut point, skipped layer, part), full logits, as
  the authors' code does. The baseline for the benchmark and the reference in the tests.
* :func:`prompt_effects` (fast) — per skipped layer s, batches the parts together; never recomputes layers < s
  (they return the cached clean residual); runs the "lead" intervention (all tokens, or the last cut point) once,
  then reuses its keys/values as the prefix of every other cut point, so a cut at t only computes positions ≥ t;
  unembeds only measured positions, chunked. Memory stays bounded: nothing of size [layers × tokens × vocab].
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property

import torch

from lmdepth.kernels.residual_kernels import REL_EPS, relative_norm
from lmdepth.kernels.skip_kernels import LOGIT_CHUNK, PARTS
from lmdepth.model.families import ModelAdapter
from lmdepth.model.paths import resolve, take
from lmdepth.model.taps import forward_hooks, layer_output

NUDGE = "nudge"  # the control variant: a random direction of the skip's size (not a part of the layer)


@dataclass(frozen=True)
class Row:
    """One intervention: skip ``part`` of layer ``s`` at positions 1..t−1 (``t=None``: all positions ≥ 1)."""

    s: int
    part: str = "layer"
    t: int | None = None
    local: bool = False

    def intervened(self, positions: torch.Tensor) -> torch.Tensor:
        """Bool mask of the given absolute positions that the intervention touches."""
        hi = positions.max().item() + 1 if self.t is None else self.t
        return (positions >= 1) & (positions < hi)

    def measured(self, positions: torch.Tensor) -> torch.Tensor:
        return positions >= (0 if self.t is None else self.t)


@dataclass
class CleanPass:
    """Everything an intervention is compared against, from one clean forward pass of one prompt.

    Attributes:
        resid_in: [L, T, D] h_l, the input of every layer.
        resid_out: [L, T, D] h_{l+1}.
        kv: per layer (keys, values), each [1, heads, T, head_dim].
        probs: [T, V] fp32 output distribution, or None (computed lazily in chunks by the fast path).
    """

    resid_in: torch.Tensor
    resid_out: torch.Tensor
    kv: list[tuple[torch.Tensor, torch.Tensor]]
    probs: torch.Tensor | None = None

    @cached_property
    def contrib(self) -> torch.Tensor:
        """[L, T, D] fp32 layer contributions Δ_l = h_{l+1} − h_l."""
        return self.resid_out.float() - self.resid_in.float()


@torch.no_grad()
def clean_pass(adapter: ModelAdapter, ids: torch.Tensor, with_probs: bool = False) -> CleanPass:
    """Run the clean model once, keeping residuals, keys/values and (optionally) the output distribution."""
    ins: list[torch.Tensor] = [None] * adapter.n_layers  # type: ignore[list-item]
    outs: list[torch.Tensor] = [None] * adapter.n_layers  # type: ignore[list-item]

    def grab(l: int) -> Callable:
        def hook(mod, args, out):
            ins[l], outs[l] = args[0][0], layer_output(out)[0]
        return hook

    with forward_hooks([(layer, grab(l)) for l, layer in enumerate(adapter.layers)]):
        out = adapter.model(ids, use_cache=True, logits_to_keep=0 if with_probs else 1)
    kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
    probs = out.logits[0].float().softmax(-1) if with_probs else None
    return CleanPass(torch.stack(ins), torch.stack(outs), kv, probs)


def nudge_directions(n_layers: int, d_model: int, seed: int, key: str | None = None) -> torch.Tensor:
    """[L, D] fp32 the nudge control's directions u_l: standard normal draws of a generator seeded with ``seed`` (CPU,
    drawn in one call, so the same on every machine), each row scaled to unit norm. With ``key`` (a problem's id) the
    generator is seeded per (seed, key), as :func:`draw_cuts` is: a fresh draw for every problem, the same in every
    run, so the spread between draws is part of the control's per-problem values and of their interval."""
    if key is not None:
        seed = int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:8], "little") >> 1
    u = torch.randn(n_layers, d_model, generator=torch.Generator().manual_seed(int(seed)), dtype=torch.float32)
    return u / u.norm(dim=-1, keepdim=True)


# ---- interventions as hooks (shared by both implementations) ------------------------------------------------

def _set_rows(x: torch.Tensor, masks: torch.Tensor, values: torch.Tensor | float) -> torch.Tensor:
    """x: [B, W, D]; masks: [B, W] bool; values: [B, W, D] or scalar. Returns a copy with masked entries set."""
    m = masks.unsqueeze(-1)
    return torch.where(m, values if torch.is_tensor(values) else torch.zeros_like(x), x)


def intervention_hooks(
    adapter: ModelAdapter, clean: CleanPass, rows: Sequence[Row], positions: torch.Tensor,
    directions: torch.Tensor | None = None,
) -> list[tuple[torch.nn.Module, Callable]]:
    """Hooks that apply every row's intervention to its batch element.

    Args:
        adapter: model adapter.
        clean: clean pass (for the pinned values of local rows and the size of a nudge).
        rows: one intervention per batch element; all rows share the same skipped layer s.
        positions: [W] absolute positions of the tokens in this forward pass.
        directions: [L, D] unit vectors of the nudge rows (:func:`nudge_directions`); needed only by them.
    """
    s = rows[0].s
    fam = adapter.family
    masks = torch.stack([r.intervened(positions) for r in rows])  # [B, W]

    def part_mask(part: str) -> torch.Tensor:
        return masks & torch.tensor([r.part == part and not r.local for r in rows]).unsqueeze(1)

    hooks: list[tuple[torch.nn.Module, Callable]] = []
    layer_m, attn_m, mlp_m = part_mask("layer"), part_mask("attention"), part_mask("mlp")
    local_m = masks & torch.tensor([r.local for r in rows]).unsqueeze(1)
    nudge_m = part_mask(NUDGE)

    if nudge_m.any():
        if directions is None:
            raise ValueError("a nudge row needs the nudge directions: pass directions=nudge_directions(L, D, seed)")
        # ‖Δ_s‖ per position along u_s: the residual after layer s moves by the skip's norm, not its direction
        step = clean.contrib[s][positions].norm(dim=-1, keepdim=True) * directions[s].float()  # [W, D]

        def nudge(mod, args, out):
            y = layer_output(out)
            return _set_rows(y, nudge_m, (y.float() + step).to(y.dtype))
        hooks.append((adapter.layers[s], nudge))
    if layer_m.any():
        def skip_layer(mod, args, out):
            return _set_rows(layer_output(out), layer_m, args[0])
        hooks.append((adapter.layers[s], skip_layer))
    for m, (path, idx) in ((attn_m, fam.attn_contrib), (mlp_m, fam.mlp_contrib)):
        if m.any():
            def zero(mod, args, out, m=m, idx=idx):
                y = _set_rows(take(out, idx), m, 0.0)
                return (y, *out[1:]) if idx is not None and isinstance(out, tuple) else y
            hooks.append((resolve(adapter.layers[s], path), zero))
    if local_m.any():
        removed = clean.contrib[s][positions]  # [W, D] layer s's clean contribution
        for j in range(s, adapter.n_layers):
            pinned = (clean.resid_out[j][positions].float() - removed).to(clean.resid_out.dtype)

            def pin(mod, args, out, pinned=pinned):
                return _set_rows(layer_output(out), local_m, pinned.expand(len(rows), -1, -1))
            hooks.append((adapter.layers[j], pin))
    return hooks


# ---- the naive baseline ---------------------------------------------------------------------------------------

def robust_floor(clean: CleanPass, floor: float) -> torch.Tensor:
    """[L] the robust statistic's denominator floor: ``floor`` × the median over the prompt's positions of each
    layer's clean contribution norm (never below 1e-6)."""
    return (clean.contrib.norm(dim=-1).median(dim=1).values * floor).clamp_min(REL_EPS)


@torch.no_grad()
def naive_effect(adapter: ModelAdapter, ids: torch.Tensor, clean: CleanPass, row: Row, floor: float | None = None,
                 directions: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """One full forward pass for one intervention, all layers, full logits (the authors' approach).

    Args:
        floor: also the robust means (see :func:`lmdepth.traces.skip_effects.skip_effects`), the reference of the
            production trace's.
        directions: [L, D] the nudge directions (a nudge row only).

    Returns:
        e: [L] max relative change of each layer's contribution at measured positions; o: output change; with
        ``floor`` also m: [L] the mean over measured positions ≥ 1 of the change relative to the floored
        denominator, q: the mean output change there.
    """
    assert clean.probs is not None, "naive_effect needs clean_pass(..., with_probs=True)"
    T = ids.shape[1]
    positions = torch.arange(T)
    contrib: list[torch.Tensor] = [None] * adapter.n_layers  # type: ignore[list-item]

    def grab(l: int) -> Callable:
        def hook(mod, args, out):
            contrib[l] = layer_output(out)[0].float() - args[0][0].float()
        return hook

    hooks = intervention_hooks(adapter, clean, [row], positions, directions)
    hooks += [(layer, grab(l)) for l, layer in enumerate(adapter.layers)]  # after: sees the intervened output
    with forward_hooks(hooks):
        logits = adapter.model(ids).logits[0]
    meas = row.measured(positions)
    # contributions are fp32 already: the difference is taken in fp32, as the metric requires
    e = torch.stack([relative_norm(contrib[l][meas] - clean.contrib[l][meas], clean.contrib[l][meas]).max()
                     for l in range(adapter.n_layers)])
    d = (logits.float().softmax(-1) - clean.probs).norm(dim=-1)  # [T]
    if floor is None:
        return e, float(d[meas].max())
    avg = meas & (positions >= 1)
    den = robust_floor(clean, floor)
    m = torch.stack([((contrib[l][avg] - clean.contrib[l][avg]).norm(dim=-1)
                      / torch.maximum(clean.contrib[l][avg].norm(dim=-1), den[l])).mean()
                     for l in range(adapter.n_layers)])
    return e, float(d[meas].max()), m, float(d[avg].mean())


# ---- the fast path ---------------------------------------------------------------------------------------------

@contextmanager
def shortcut_layers(layers: Sequence[torch.nn.Module], value: torch.Tensor) -> Iterator[None]:
    """Make ``layers`` return ``value`` without computing (restored on exit).

    Skipping layer s cannot change layers < s, so their output at the input of layer s is the cached clean
    residual h_s; only the last shortcut layer's return value is ever used.
    """
    saved = [layer.forward for layer in layers]
    try:
        for layer in layers:
            layer.forward = lambda *args, **kwargs: value  # type: ignore[method-assign]
        yield
    finally:
        for layer, fwd in zip(layers, saved):
            layer.forward = fwd  # type: ignore[method-assign]


def prefix_reuse_ok(adapter: ModelAdapter, T: int) -> bool:
    """Keys/values can be cut at any position unless a sliding-window cache has already dropped some."""
    window = getattr(adapter.model.config, "sliding_window", None)
    return window is None or T < window


def output_change(adapter: ModelAdapter, final: torch.Tensor, clean: CleanPass, positions: torch.Tensor) -> float:
    """max_p ||softmax(unembed(final_p)) − P_clean[p]|| over the given positions, unembedded in chunks.

    Args:
        final: [P, D] raw residual after the last layer at ``positions`` ([P] absolute positions).
    """
    best = torch.zeros(())
    for i in range(0, len(positions), LOGIT_CHUNK):
        p = positions[i : i + LOGIT_CHUNK]
        new = adapter.unembed(final[i : i + LOGIT_CHUNK]).float().softmax(-1)
        ref = clean.probs[p] if clean.probs is not None else adapter.unembed(clean.resid_out[-1][p]).float().softmax(-1)
        best = torch.maximum(best, (new - ref).norm(dim=-1).max())
    return float(best)


@torch.no_grad()
def run_rows(
    adapter: ModelAdapter,
    ids: torch.Tensor,
    clean: CleanPass,
    rows: Sequence[Row],
    start: int = 0,
    prefix: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    keep_kv: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]] | None]:
    """One batched forward pass of several interventions on the same skipped layer s.

    Args:
        ids: [1, T] the prompt.
        rows: interventions (same ``s``), one batch element each.
        start: first position computed; positions < start come from ``prefix``.
        prefix: per layer (keys, values) [B, heads, start, head_dim] for positions < start (layers < s unused).
        keep_kv: return this pass's keys/values (to serve as the prefix of later cut points).

    Returns:
        E: [B, L] max relative change per affected layer (0 for layers < s, never computed);
        O: [B] output change; kv: per layer (keys, values) if ``keep_kv``.
    """
    from transformers import DynamicCache

    s, B, L = rows[0].s, len(rows), adapter.n_layers
    T = ids.shape[1]
    positions = torch.arange(start, T)
    meas = torch.stack([r.measured(positions) for r in rows])  # [B, W]
    E = torch.zeros(B, L)
    final: list[torch.Tensor] = []

    def measure(j: int) -> Callable:
        ref = clean.contrib[j][positions]  # [W, D]

        def hook(mod, args, out):
            rel = relative_norm(layer_output(out).float() - args[0].float() - ref, ref)  # [B, W]
            E[:, j] = rel.masked_fill(~meas, float("-inf")).amax(1).clamp_min(0)
            if j == L - 1:
                final.append(layer_output(out))
        return hook

    hooks = intervention_hooks(adapter, clean, rows, positions)
    hooks += [(adapter.layers[j], measure(j)) for j in range(s, L)]
    cache = None
    if prefix is not None:
        cache = DynamicCache(ddp_cache_data=prefix, config=adapter.model.config)
    elif keep_kv:
        cache = DynamicCache(config=adapter.model.config)
    h_s = clean.resid_in[s][positions].unsqueeze(0).expand(B, -1, -1).contiguous()
    with shortcut_layers(adapter.layers[:s], h_s), forward_hooks(hooks):
        adapter.model(ids[:, start:].expand(B, -1).contiguous(), past_key_values=cache, use_cache=cache is not None, logits_to_keep=1)
    O = torch.tensor([output_change(adapter, final[0][b][meas[b]], clean, positions[meas[b]]) for b in range(B)])
    kv = [(layer.keys, layer.values) for layer in cache.layers] if keep_kv and cache is not None else None
    return E, O, kv


def _prefix_for(
    clean: CleanPass, lead_kv: list[tuple[torch.Tensor, torch.Tensor]], s: int, start: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Keys/values of positions < start, row for row: the lead pass's for layers ≥ s, the clean ones below."""
    B = lead_kv[-1][0].shape[0]
    out = []
    for j, (k, v) in enumerate(lead_kv):
        if j < s:  # never read (those layers are shortcut), but the cache must report the right length
            k, v = (x[:, :, :start].expand(B, -1, -1, -1).contiguous() for x in clean.kv[j])
            out.append((k, v))
        else:
            out.append((k[:, :, :start].contiguous(), v[:, :, :start].contiguous()))
    return out


@dataclass(frozen=True)
class Variant:
    """What a (part, local) pair is called in results: e.g. ("layer", False) → part "layer"."""

    part: str
    local: bool

    @property
    def name(self) -> str:
        return "local" if self.local else self.part


def variants(parts: Sequence[str], local: bool) -> list[Variant]:
    """What a skipping run measures: each part removed, plus the layer's local effect if ``local``."""
    return [Variant(p, False) for p in parts] + ([Variant("layer", True)] if local else [])


def prompt_effects(
    adapter: ModelAdapter,
    ids: torch.Tensor,
    cuts: Sequence[int] = (),
    parts: Sequence[str] = PARTS,
    local: bool = True,
    current: bool = True,
    clean: CleanPass | None = None,
) -> dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor]]:
    """Fast path: all skip effects of one prompt.

    Args:
        ids: [1, T] the prompt.
        cuts: cut points t of the "future" analysis (effects measured at positions ≥ t, max over cuts).
        parts: which parts to skip; ``local`` adds the local (direct-effect) variant of the layer skip.
        current: also compute the "all tokens" analysis (t = None).

    Returns:
        ``{(analysis, variant): (E [L, L], O [L])}`` with analysis "current" or "future" and variant a part name
        or "local"; E[s, j] is the effect of skipping s on layer j, O[s] on the output.
    """
    L, T = adapter.n_layers, ids.shape[1]
    clean = clean or clean_pass(adapter, ids, with_probs=True)
    vs = variants(parts, local)
    cuts = sorted({t for t in cuts if t > 1}, reverse=True)  # t ≤ 1 intervenes nowhere: zero effect
    analyses = (["current"] if current else []) + (["future"] if cuts else [])
    out = {(a, v.name): (torch.zeros(L, L), torch.zeros(L)) for a in analyses for v in vs}
    if not analyses:
        return out
    # The lead pass per skipped layer: "all tokens" if wanted, else the last cut point. Its keys/values at
    # positions < t are exactly those of any cut t at or below it (the same intervention on those positions, and
    # attention is causal), so every other cut only computes positions ≥ t.
    lead_t = None if current else cuts[0]
    rest = cuts if current else cuts[1:]
    reuse = bool(rest) and prefix_reuse_ok(adapter, T)
    for s in range(L):
        lead = [Row(s, v.part, lead_t, v.local) for v in vs]
        E, O, kv = run_rows(adapter, ids, clean, lead, keep_kv=reuse)
        for i, v in enumerate(vs):
            _update_max(out["current" if current else "future", v.name], s, E[i], O[i])
        for t in rest:
            rows = [Row(s, v.part, t, v.local) for v in vs]
            if reuse:
                E, O, _ = run_rows(adapter, ids, clean, rows, start=t, prefix=_prefix_for(clean, kv, s, t))
            else:
                E, O, _ = run_rows(adapter, ids, clean, rows)
            for i, v in enumerate(vs):
                _update_max(out["future", v.name], s, E[i], O[i])
    return out


def _update_max(target: tuple[torch.Tensor, torch.Tensor], s: int, e: torch.Tensor, o: torch.Tensor) -> None:
    target[0][s] = torch.maximum(target[0][s], e)
    target[1][s] = torch.maximum(target[1][s], o)


def prompt_effects_naive(
    adapter: ModelAdapter,
    ids: torch.Tensor,
    cuts: Sequence[int] = (),
    parts: Sequence[str] = PARTS,
    local: bool = True,
    current: bool = True,
    floor: float | None = None,
    directions: torch.Tensor | None = None,
) -> dict[tuple[str, str], tuple[torch.Tensor, ...]]:
    """The reference twin of :func:`prompt_effects` and of :func:`lmdepth.traces.skip_effects.skip_effects`: the
    same results, one full forward pass per intervention; with ``floor`` also the robust means of ``skip_effects``
    (``(E, O, M, Q)``; M and Q averaged over the cut points). ``parts`` may hold :data:`NUDGE` (the nudge control,
    with ``directions`` [L, D]), which :func:`prompt_effects` does not run."""
    L = adapter.n_layers
    clean = clean_pass(adapter, ids, with_probs=True)
    cuts = sorted({t for t in cuts if t > 1})  # t ≤ 1 intervenes nowhere: zero effect (as the fast paths)
    out = {}
    for v in variants(parts, local):
        if current:
            res = [naive_effect(adapter, ids, clean, Row(s, v.part, None, v.local), floor, directions)
                   for s in range(L)]
            out["current", v.name] = (torch.stack([r[0] for r in res]), torch.tensor([r[1] for r in res]))
            if floor is not None:
                out["current", v.name] += (torch.stack([r[2] for r in res]), torch.tensor([r[3] for r in res]))
        if cuts:
            E, O, M, Q = torch.zeros(L, L), torch.zeros(L), torch.zeros(L, L), torch.zeros(L)
            for t in cuts:
                for s in range(L):
                    r = naive_effect(adapter, ids, clean, Row(s, v.part, t, v.local), floor, directions)
                    _update_max((E, O), s, r[0], torch.tensor(r[1]))
                    if floor is not None:
                        M[s] += r[2] / len(cuts)
                        Q[s] += r[3] / len(cuts)
            out["future", v.name] = (E, O) + ((M, Q) if floor is not None else ())
    return out


def draw_cuts(n_tokens: int, n_cuts: int, seed: int, key: str, stride: int = 8) -> list[int]:
    """The paper's cut points: candidates ``range(stride, T − 4, stride)``, shuffled, the first ``n_cuts``.

    Seeded per (seed, example id), so a problem gets the same cuts in every run and for every part.
    """
    candidates = list(range(stride, n_tokens - 4, stride))
    random.Random(f"{seed}:{key}").shuffle(candidates)
    return sorted(candidates[:n_cuts])


__all__ = ["PARTS", "NUDGE", "nudge_directions", "Row", "CleanPass", "clean_pass", "naive_effect", "robust_floor", "prompt_effects", "prompt_effects_naive",
           "draw_cuts", "run_rows", "variants"]
