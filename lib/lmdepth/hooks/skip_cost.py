"""What the layer-skipping analysis costs: the work of the naive loop and of the fast path counted from their
algorithms (the ceiling of any exact speed-up), and both paths timed on one prompt (chapter 03,
``scripts/bench_skipping.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lmdepth.hooks.skip_hooks import draw_cuts, prompt_effects, prompt_effects_naive
from lmdepth.model.families import ModelAdapter


def work_units(L: int, T: int, cuts: Sequence[int], current: bool, n_variants: int, logit_cost: float) -> dict[str, float]:
    """Layer-position units each path computes (one layer applied at one position = 1; unembedding one position
    = ``logit_cost``), counted from the algorithms, not timed: their ratio is the speed-up the fast path can reach
    at best on this input, whatever the hardware.

    naive: per (variant, cut or "all tokens", skipped layer s) a full pass, L·T + T·logit_cost.
    fast: per (variant, s) a lead pass over all positions for layers ≥ s (the largest cut, or "all tokens"), then
    per other cut t the positions ≥ t only; logits only where measured.
    Not counted: the clean pass both paths share, and the fallback without prefix reuse (a sliding-window cache
    shorter than the prompt, :func:`prefix_reuse_ok`), where the fast path recomputes every position and the
    counted ratio overstates it.
    """
    ts = sorted({t for t in cuts if t > 1}, reverse=True)
    runs = ([None] if current else []) + ts
    naive = n_variants * len(runs) * L * (L * T + T * logit_cost)
    fast = 0.0
    lead_t = None if current else (ts[0] if ts else None)
    rest = ts if current else ts[1:]
    for s in range(L):
        lead_meas = T - (lead_t or 0)
        fast += (L - s) * T + lead_meas * logit_cost
        fast += sum((L - s) * (T - t) + (T - t) * logit_cost for t in rest)
    return {"naive": naive, "fast": n_variants * fast}


def work_ratios(adapter: ModelAdapter, lengths: Sequence[tuple[str, int]], n_cuts: int, seed: int, current: bool,
                n_variants: int, stride: int = 8) -> list[float]:
    """Counted naive / fast work ratio (:func:`work_units`) for each prompt, with the cut points the analysis would
    draw for it: the best speed-up the fast path's algorithm allows on each input, without running a model.

    Args:
        lengths: (example id, token count) per prompt; ``n_cuts = 0`` with ``current`` counts the all-token analysis.
    """
    cost = unembed_cost(adapter)
    out = []
    for key, T in lengths:
        cuts = draw_cuts(T, n_cuts, seed, key, stride) if n_cuts else []
        u = work_units(adapter.n_layers, T, cuts, current, n_variants, cost)
        out.append(u["naive"] / u["fast"])
    return out


def unembed_cost(adapter: ModelAdapter) -> float:
    """Cost of unembedding one position in units of one layer at one position (parameter counts)."""
    per_layer = sum(p.numel() for p in adapter.layers[0].parameters())
    return adapter.model.get_output_embeddings().weight.numel() / per_layer


@dataclass(frozen=True)
class PathTiming:
    """Seconds the fast and the naive path took on one prompt (wall and process CPU time), and how far apart
    their results are (largest absolute difference of any effect)."""

    fast_s: float
    naive_s: float
    fast_cpu_s: float
    naive_cpu_s: float
    max_abs_diff: float


def time_paths(adapter: ModelAdapter, ids: torch.Tensor, fast: Callable[..., Any] = prompt_effects,
               **kwargs: Any) -> PathTiming:
    """Run ``fast(adapter, ids, **kwargs)`` — the library's path: by default the plain-hook
    :func:`lmdepth.hooks.skip_hooks.prompt_effects`; the analyses pass the trace
    (:func:`lmdepth.traces.skip_effects.skip_effects`) — then :func:`~lmdepth.hooks.skip_hooks.prompt_effects_naive`
    on one prompt with the same keyword arguments (``cuts, parts, local, current``), timed.

    Process CPU time is the fair measure on a shared machine (another job on the same cores slows whichever path
    happens to run beside it); wall time is returned too. Used by chapter 03 and ``scripts/bench_skipping.py``.
    """
    w0, c0 = time.perf_counter(), time.process_time()
    fast = fast(adapter, ids, **kwargs)
    w1, c1 = time.perf_counter(), time.process_time()
    naive = prompt_effects_naive(adapter, ids, **kwargs)
    w2, c2 = time.perf_counter(), time.process_time()
    diff = max(float((fast[k][i] - naive[k][i]).abs().max()) for k in naive for i in (0, 1))
    return PathTiming(fast_s=w1 - w0, naive_s=w2 - w1, fast_cpu_s=c1 - c0, naive_cpu_s=c2 - c1, max_abs_diff=diff)
