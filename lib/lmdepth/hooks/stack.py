"""A model as a residual stack, and the interventions that need only that: boundary residuals, residual erasure
(paper Fig. 6b; book/method.md#method-erasure) and integrated gradients (Fig. 6a; book/method.md#method-ig).

A **residual stack** — embed → L blocks → final norm → unembed — is :class:`AdapterStack`: run
the blocks from a given residual boundary, optionally editing the residual at each boundary, and unembed a
residual. Boundaries are numbered b = 0..L: b = 0 is the input of block 0 (the embeddings), b ≥ 1 the output of
block b − 1 (so b = L is the final residual before the final norm). It serves every Hugging Face model the library
has an adapter for (plain forward hooks) and the from-scratch models of chapter 07 (whose blocks are *applications*
of shared layers).

What runs here: integrated gradients (it needs gradients through the model, which a trace's block does not take
remotely). The erasure map and the mean residuals are the plain-hook reference twins of
:mod:`lmdepth.traces.erasure_trace`, which chapters 05 and 07 run; the tests and ``scripts/bench_traces.py`` hold the
trace to them.

* **Erasure**: replace the residual at (boundary b, token t) by an uninformative mean residual μ_b and measure
  ``max over answer-predicting positions of ||P − P'||₂``. Batched: one erased position per batch element, with
  the clean sequence as element 0 (so a null erasure gives exactly 0, book/method.md#method-numerics); blocks before b are not run.
* **Integrated gradients** of the answer probability ``f = Σ_i p(answer_i | prefix)`` with respect to the output
  of block l, X = h_{l+1}, from the position-mean baseline B (mean of X over positions): left Riemann sum with
  r_k = k/N, k = 0..N−1, ``IG[l, t] = (1/N) Σ_k Σ_d ∂f/∂X(B + r_k(X − B))[t, d] · (X − B)[t, d]``. Completeness:
  ``Σ_t IG[l, t] ≈ f(X) − f(B)``, where f(B) is the k = 0 term (computed anyway).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from lmdepth.hooks.skip_hooks import shortcut_layers
from lmdepth.model.families import ModelAdapter
from lmdepth.model.taps import forward_hooks, layer_output

#: ``edit(b, h)`` sees the residual h [B, T, D] at boundary b and returns a replacement, or None to keep it.
Edit = Callable[[int, torch.Tensor], "torch.Tensor | None"]


@dataclass
class AdapterStack:
    """A causal LM as a residual stack, through its :class:`~lmdepth.model.families.ModelAdapter` (what erasure,
    integrated gradients and the boundary residuals need from a model).

    Blocks before ``start`` are short-cut (they return ``h_start`` without computing); the boundary-0 edit is a
    forward pre-hook on block 0, the others forward hooks on each block's output.
    """

    adapter: ModelAdapter

    @property
    def n_layers(self) -> int:
        return self.adapter.n_layers

    def unembed(self, h: torch.Tensor) -> torch.Tensor:
        """[..., D] raw residual → [..., V] logits (final norm, unembedding, any logit soft-capping)."""
        return self.adapter.unembed(h)

    def run(self, ids: torch.Tensor, edit: Edit | None = None, start: int = 0,
            h_start: torch.Tensor | None = None) -> torch.Tensor:
        """Run the blocks and return the final residual h_L [B, T, D] (raw, before the final norm).

        Args:
            ids: [B, T] token ids.
            edit: called at every boundary b = start..L, in order (see :data:`Edit`).
            start: first boundary; blocks < start are not run.
            h_start: [B, T, D] the residual at boundary ``start`` (required when start > 0; at start = 0 it
                replaces the embeddings).
        """
        L, layers = self.n_layers, self.adapter.layers
        if not 0 <= start <= L:
            raise ValueError(f"start must be in 0..{L}, got {start}")
        if start > 0 and h_start is None:
            raise ValueError("start > 0 needs h_start, the residual at that boundary")
        h0 = h_start
        if h0 is not None and edit is not None:
            new = edit(start, h0)
            h0 = h0 if new is None else new
        if start == L:
            return h0
        final: list[torch.Tensor] = []

        def pre(mod, args):  # boundary 0: the embeddings entering block 0
            x = args[0]
            if h0 is not None:
                x = h0
            elif edit is not None:
                new = edit(0, x)
                x = x if new is None else new
            return (x, *args[1:])

        def post(l: int) -> Callable:
            def hook(mod, args, out):
                h = layer_output(out)
                if edit is not None:
                    new = edit(l + 1, h)
                    if new is not None:
                        h = new
                        out = (h, *out[1:]) if isinstance(out, tuple) else h
                if l == L - 1:
                    final.append(h)
                return out
            return hook

        hooks = [(layers[l], post(l)) for l in range(start, L)]
        handle = layers[0].register_forward_pre_hook(pre) if start == 0 and (edit or h0 is not None) else None
        try:
            with shortcut_layers(layers[:start], h0), forward_hooks(hooks):
                self.adapter.model(ids, use_cache=False, logits_to_keep=1)
        finally:
            if handle is not None:
                handle.remove()
        return final[0]


@torch.no_grad()
def boundary_residuals(stack: AdapterStack, ids: torch.Tensor) -> torch.Tensor:
    """[L+1, B, T, D] the residual at every boundary of a clean run (b = 0: embeddings; b = L: final, pre-norm)."""
    store: dict[int, torch.Tensor] = {}

    def record(b: int, h: torch.Tensor) -> None:
        store[b] = h.detach().clone()

    stack.run(ids, record)
    return torch.stack([store[b] for b in range(stack.n_layers + 1)])


@torch.no_grad()
def mean_residuals(stack: AdapterStack, texts_ids: Sequence[torch.Tensor]) -> torch.Tensor:
    """[L+1, D] the "uninformative" residual μ_b: token-weighted mean over every position (BOS included) of every
    text at each boundary (book/method.md#method-erasure: the first 10 GSM8K problems)."""
    total, count = None, 0
    for ids in texts_ids:
        r = boundary_residuals(stack, ids).float()  # [L+1, 1, T, D]
        s = r.sum(dim=(1, 2))
        total = s if total is None else total + s
        count += r.shape[1] * r.shape[2]
    return total / count


def answer_positions(n_tokens: int, a_start: int) -> torch.Tensor:
    """Positions whose next-token prediction is an answer token: a_start − 1 … T − 2."""
    return torch.arange(a_start - 1, n_tokens - 1)


@torch.no_grad()
def erasure_map(stack: AdapterStack, ids: torch.Tensor, a_start: int, means: torch.Tensor,
                batch_size: int = 32, positions: Sequence[int] | None = None) -> torch.Tensor:
    """Effect of erasing the residual at each (boundary, token) on the answer predictions.

    Args:
        ids: [1, T] prompt + answer; a_start: index of the first answer token.
        means: [L+1, D] the replacement residual per boundary (:func:`mean_residuals`).
        batch_size: forward batch (one erased position per element plus the clean copy as element 0).
        positions: token positions to erase (default: all, BOS included, as the authors' code).

    Returns:
        [L+1, T] ``max_{p answer-predicting} ||P_p − P'_p||₂`` (0 where a position was not erased). Rows are
        boundaries: row 0 = embeddings, row b = output of block b − 1.
    """
    if batch_size < 2:
        raise ValueError("batch_size must be at least 2 (the clean copy plus one erased position)")
    L, T = stack.n_layers, ids.shape[1]
    clean = boundary_residuals(stack, ids)[:, 0]  # [L+1, T, D]
    pred = answer_positions(T, a_start)
    positions = list(range(T)) if positions is None else list(positions)
    out = torch.zeros(L + 1, T)
    for b in range(L + 1):
        for i in range(0, len(positions), batch_size - 1):
            ts = positions[i : i + batch_size - 1]
            B = len(ts) + 1
            h = clean[b].unsqueeze(0).repeat(B, 1, 1)
            h[torch.arange(1, B), torch.tensor(ts)] = means[b].to(h.dtype)
            final = stack.run(ids.expand(B, -1), start=b, h_start=h)
            p = stack.unembed(final[:, pred]).float().softmax(-1)  # [B, n_pred, V]
            out[b, ts] = (p[1:] - p[:1]).norm(dim=-1).amax(-1).cpu()
    return out


def answer_probability(stack: AdapterStack, final: torch.Tensor, ids: torch.Tensor, a_start: int) -> torch.Tensor:
    """f = Σ_i p(answer_i | prefix) per batch element, from final residuals [B, T, D] → [B] (book/method.md#method-ig)."""
    T = ids.shape[1]
    pred = answer_positions(T, a_start)
    probs = stack.unembed(final[:, pred]).float().softmax(-1)  # [B, n, V]
    target = ids[0, a_start:].to(probs.device)
    return probs.gather(-1, target.view(1, -1, 1).expand(probs.shape[0], -1, 1)).squeeze(-1).sum(-1)


@dataclass
class IGResult:
    """Integrated gradients of one prompt.

    Attributes:
        ig: [L, T] attribution of each token's block-l output (row l = X = h_{l+1}).
        f_x: f at the clean input.
        f_baseline: [L] f with every position of h_{l+1} replaced by its position mean.
        n_steps: Riemann steps.
        rule: quadrature rule, "left" (the paper) or "midpoint".
    """

    ig: np.ndarray
    f_x: float
    f_baseline: np.ndarray
    n_steps: int
    rule: str = "left"

    @property
    def completeness_error(self) -> np.ndarray:
        """[L] |Σ_t IG[l, t] − (f(X) − f(B_l))| / max(|f(X) − f(B_l)|, 1e-6)."""
        delta = self.f_x - self.f_baseline
        return np.abs(self.ig.sum(1) - delta) / np.maximum(np.abs(delta), 1e-6)


def integrated_gradients(stack: AdapterStack, ids: torch.Tensor, a_start: int, n_steps: int = 256,
                         batch_size: int = 16, layers: Sequence[int] | None = None, rule: str = "left") -> IGResult:
    """Integrated gradients of the answer probability w.r.t. every block's output (book/method.md#method-ig; what="layer").

    Args:
        ids: [1, T] prompt + answer; a_start: first answer token.
        n_steps: N, the left Riemann sum's steps r_k = k/N (the paper: 256).
        batch_size: interpolation steps per forward/backward pass (the paper: 16).
        layers: blocks to attribute (default all; rows of the others stay 0).
        rule: ``"left"`` — r_k = k/N, the authors' left Riemann sum (f(B) is its k = 0 term); ``"midpoint"`` —
            r_k = (k + ½)/N, a second-order rule, usually more accurate for the same N (f(B) then costs one
            extra batch element).
    """
    if rule not in ("left", "midpoint"):
        raise ValueError(f"rule must be 'left' or 'midpoint', got {rule!r}")
    L, T = stack.n_layers, ids.shape[1]
    clean = boundary_residuals(stack, ids)[:, 0]  # [L+1, T, D]
    with torch.no_grad():
        f_x = float(answer_probability(stack, clean[L].unsqueeze(0), ids, a_start)[0])
    ig = np.zeros((L, T))
    f_b = np.full(L, np.nan)
    for l in (range(L) if layers is None else layers):
        X = clean[l + 1].float()
        base = X.mean(0, keepdim=True)
        diff = X - base
        total = torch.zeros(T)
        for k0 in range(0, n_steps, batch_size):
            k = torch.arange(k0, min(k0 + batch_size, n_steps), dtype=torch.float32)
            r = (k + (0.5 if rule == "midpoint" else 0.0)) / n_steps
            extra = rule == "midpoint" and k0 == 0  # prepend r = 0 for f(B)
            if extra:
                r = torch.cat([torch.zeros(1), r])
            z = (base + r.view(-1, 1, 1) * diff).to(clean.dtype).requires_grad_(True)
            with torch.enable_grad():
                final = stack.run(ids.expand(len(r), -1), start=l + 1, h_start=z)
                f = answer_probability(stack, final, ids, a_start)
                (g,) = torch.autograd.grad(f.sum(), z)
            total += (g[int(extra):].float() * diff).sum(-1).sum(0).detach().cpu()
            if k0 == 0:
                f_b[l] = float(f[0].detach())
        ig[l] = (total / n_steps).numpy()
    return IGResult(ig, f_x, f_b, n_steps, rule)
