"""Residual erasure (paper Fig. 6b, METHOD §7.2) and integrated gradients (Fig. 6a, METHOD §7.3).

Introduced in chapter 05. Both work on any model that can be seen as a **residual stack** — embed → L blocks →
final norm → unembed — through the small :class:`ResidualStack` protocol: run the blocks from a given residual
boundary, optionally editing the residual at each boundary, and unembed a residual. Boundaries are numbered
b = 0..L: b = 0 is the input of block 0 (the embeddings), b ≥ 1 the output of block b − 1 (so b = L is the final
residual before the final norm). :class:`AdapterStack` implements the protocol for every Hugging Face model the
library has an adapter for (plain forward hooks); a model written from scratch (e.g. the MoEUT chapter's, whose
blocks are *applications* of shared layers) implements ``run`` with its own loop.

* **Erasure**: replace the residual at (boundary b, token t) by an uninformative mean residual μ_b and measure
  ``max over answer-predicting positions of ||P − P'||₂``. Batched: one erased position per batch element, with
  the clean sequence as element 0 (so a null erasure gives exactly 0, METHOD §1.4); blocks before b are not run.
* **Integrated gradients** of the answer probability ``f = Σ_i p(answer_i | prefix)`` with respect to the output
  of block l, X = h_{l+1}, from the position-mean baseline B (mean of X over positions): left Riemann sum with
  r_k = k/N, k = 0..N−1, ``IG[l, t] = (1/N) Σ_k Σ_d ∂f/∂X(B + r_k(X − B))[t, d] · (X − B)[t, d]``. Completeness:
  ``Σ_t IG[l, t] ≈ f(X) − f(B)``, where f(B) is the k = 0 term (computed anyway).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from lmdepth.model.families import ModelAdapter
from lmdepth.hooks.capture import _layer_output, forward_hooks
from lmdepth.hooks.skipping import shortcut_layers

ANALYSIS = "erasure_ig"

#: Case-study prompts (name, prompt, answer): the paper's manual prompts and a DM-math probe (METHOD §2), and a
#: short synthetic variable chain (a=3, b=5, c=1, d=6) where a compositional model would show a staircase.
CASE_STUDIES: tuple[tuple[str, str, str], ...] = (
    ("two-hop fact", "The spouse of the performer of Imagine is", " Yoko Ono"),
    ("arithmetic", "5 + 7 + 5 + 3 + 1 + 7 = ", "28"),
    ("variable chain (synthetic)", "a=3\nb=a+2\nc=b-4\nd=c+5\nd=", "6"),
    ("DM-math", "Q: What is the value of -24 + -10 + 22 + 1 + 1 + 25? A: ", "-15"),
)

#: ``edit(b, h)`` sees the residual h [B, T, D] at boundary b and returns a replacement, or None to keep it.
Edit = Callable[[int, torch.Tensor], "torch.Tensor | None"]


@runtime_checkable
class ResidualStack(Protocol):
    """What erasure, integrated gradients and the generic skip effects need from a model.

    Attributes:
        n_layers: number of blocks L (block *applications* for shared-layer models).
    """

    n_layers: int

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
        ...

    def unembed(self, h: torch.Tensor) -> torch.Tensor:
        """[..., D] raw residual → [..., V] logits (final norm, unembedding, any logit soft-capping)."""
        ...


@dataclass
class AdapterStack:
    """:class:`ResidualStack` of a Hugging Face causal LM, through its :class:`~lmdepth.model.families.ModelAdapter`.

    Blocks before ``start`` are short-cut (they return ``h_start`` without computing); the boundary-0 edit is a
    forward pre-hook on block 0, the others forward hooks on each block's output.
    """

    adapter: ModelAdapter

    @property
    def n_layers(self) -> int:
        return self.adapter.n_layers

    def unembed(self, h: torch.Tensor) -> torch.Tensor:
        return self.adapter.unembed(h)

    def run(self, ids: torch.Tensor, edit: Edit | None = None, start: int = 0,
            h_start: torch.Tensor | None = None) -> torch.Tensor:
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
                h = _layer_output(out)
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


def as_stack(model: Any) -> ResidualStack:
    """A :class:`ResidualStack` from a loaded model, an adapter, or anything already implementing the protocol."""
    if isinstance(model, ModelAdapter):
        return AdapterStack(model)
    if hasattr(model, "adapter") and isinstance(model.adapter, ModelAdapter):  # LoadedModel
        return AdapterStack(model.adapter)
    if isinstance(model, ResidualStack):
        return model
    raise TypeError(f"{type(model).__name__} is not a residual stack: give a LoadedModel, a ModelAdapter, or an "
                    "object with n_layers, run(ids, edit, start, h_start) and unembed(h).")


@torch.no_grad()
def boundary_residuals(stack: ResidualStack, ids: torch.Tensor) -> torch.Tensor:
    """[L+1, B, T, D] the residual at every boundary of a clean run (b = 0: embeddings; b = L: final, pre-norm)."""
    store: dict[int, torch.Tensor] = {}

    def record(b: int, h: torch.Tensor) -> None:
        store[b] = h.detach().clone()

    stack.run(ids, record)
    return torch.stack([store[b] for b in range(stack.n_layers + 1)])


@torch.no_grad()
def mean_residuals(stack: ResidualStack, texts_ids: Sequence[torch.Tensor]) -> torch.Tensor:
    """[L+1, D] the "uninformative" residual μ_b: token-weighted mean over every position (BOS included) of every
    text at each boundary (METHOD §7.2: the first 10 GSM8K problems)."""
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
def erasure_map(stack: ResidualStack, ids: torch.Tensor, a_start: int, means: torch.Tensor,
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


def answer_probability(stack: ResidualStack, final: torch.Tensor, ids: torch.Tensor, a_start: int) -> torch.Tensor:
    """f = Σ_i p(answer_i | prefix) per batch element, from final residuals [B, T, D] → [B] (METHOD §7.3)."""
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


def integrated_gradients(stack: ResidualStack, ids: torch.Tensor, a_start: int, n_steps: int = 256,
                         batch_size: int = 16, layers: Sequence[int] | None = None, rule: str = "left") -> IGResult:
    """Integrated gradients of the answer probability w.r.t. every block's output (METHOD §7.3, what="layer").

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


def token_labels(tokenizer: Any, ids: torch.Tensor) -> list[str]:
    """Readable, unique labels "position: token" (BOS → "BOS", newline → "⏎", leading space → "␣")."""
    out = []
    for p, i in enumerate(ids[0].tolist()):
        text = "BOS" if i == tokenizer.bos_token_id and p == 0 else tokenizer.decode([i])
        text = text.replace("\n", "⏎").replace(" ", "␣") or "∅"
        out.append(f"{p}: {text}")
    return out


def run(
    model_name: str = "smollm2-135m",
    n_case_studies: int = 4,
    n_mean_examples: int = 10,
    ig_steps: int = 64,
    ig_prompts: int | None = None,
    ig_rule: str = "left",
    ig_batch: int = 16,
    erasure_batch: int = 32,
    device: str = "cpu",
    dtype: str = "float32",
    results_dir: str | Any = "results",
    use_cache: bool = True,
    lm: Any = None,
) -> Any:
    """Erasure maps and integrated gradients of the case-study prompts for one model (cached per prompt).

    Args:
        n_case_studies: how many of :data:`CASE_STUDIES` (in order).
        n_mean_examples: GSM8K test problems (the first N, as the authors' code) whose mean residual is erased in.
        ig_steps: integrated-gradients Riemann steps (the paper: 256); 0 skips integrated gradients.
        ig_prompts: integrated gradients for the first this many prompts only (None: all).
        ig_rule: "left" (the paper's left Riemann sum) or "midpoint" (more accurate for few steps).
        ig_batch, erasure_batch: forward batch sizes.

    Returns:
        :class:`~lmdepth.results.RunResult`: table ``model, prompt, method ("erasure" | "ig"), layer, position,
        token, is_answer, value`` (erasure rows are boundaries 0..L, IG rows blocks 0..L−1) and a sidecar whose
        ``summary`` holds per prompt the answer start, f(X), f(B_l), the completeness error per layer and whether
        the model's greedy answer is right.
    """
    import time

    import pandas as pd

    from lmdepth.data.datasets import load_examples
    from lmdepth.params import check_common, check_range, check_type
    from lmdepth.model.registry import load_model
    from lmdepth.results import RunStore
    from lmdepth.runtime import environment, progress

    check_common(model_name=model_name, device=device, dtype=dtype, use_cache=use_cache)
    for name, value, lo, hi in (("n_case_studies", n_case_studies, 1, len(CASE_STUDIES)),
                                ("n_mean_examples", n_mean_examples, 1, 1000), ("ig_steps", ig_steps, 0, 4096),
                                ("ig_batch", ig_batch, 1, 1024), ("erasure_batch", erasure_batch, 2, 4096)):
        check_type(name, value, int)
        check_range(name, value, lo, hi)
    studies = CASE_STUDIES[:n_case_studies]
    n_ig = len(studies) if ig_prompts is None else min(ig_prompts, len(studies))
    if ig_rule not in ("left", "midpoint"):
        from lmdepth.errors import ParameterError

        raise ParameterError(f"Parameter 'ig_rule' must be one of ['left', 'midpoint'], got {ig_rule!r}.")
    key = dict(prompts=[list(c) for c in studies], n_mean_examples=n_mean_examples, ig_steps=ig_steps,
               ig_rule=ig_rule, ig_prompts=n_ig, dtype=dtype)
    per_item = {k: v for k, v in key.items() if k not in ("prompts", "ig_prompts")}
    store = RunStore(results_dir, ANALYSIS, model_name, key, item_params=per_item)
    if use_cache and store.complete:
        return store.load()
    if not use_cache:
        store.clear()
    t0 = time.time()
    lm = lm() if callable(lm) else (lm or load_model(model_name, device=device, dtype=dtype))
    stack = AdapterStack(lm.adapter)
    means = store.load_item("means")
    if means is None:
        texts = load_examples("gsm8k", n_examples=n_mean_examples, selection="first")
        means = {"mu": mean_residuals(stack, [lm.encode(e.text) for e in texts]).numpy()}
        store.save_item("means", means)
    mu = torch.from_numpy(means["mu"]).to(lm.device)
    rows, summary = [], {}
    for k, (name, prompt, answer) in enumerate(progress(studies, desc=f"{model_name}: erasure and IG")):
        want_ig = bool(ig_steps) and k < n_ig
        ids = lm.encode(prompt + answer)
        head = lm.tokenizer(prompt, return_tensors="pt").input_ids[0]
        a = len(head) if torch.equal(ids[0, : len(head)].cpu(), head) else ids.shape[1] - len(
            lm.tokenizer(answer, add_special_tokens=False).input_ids)
        item = store.load_item(f"{name}|{prompt}|{answer}")
        if item is not None and want_ig and "ig" not in item:
            item = None  # computed earlier without integrated gradients
        if item is None:
            er = erasure_map(stack, ids, a, mu, batch_size=erasure_batch)
            with torch.no_grad():
                logits = lm.model(ids, logits_to_keep=ids.shape[1] - a + 1).logits[0, :-1]
            item = {"erasure": er.numpy(), "correct": np.array(int((logits.argmax(-1) == ids[0, a:]).all()))}
            if want_ig:
                ig = integrated_gradients(stack, ids, a, n_steps=ig_steps, batch_size=ig_batch, rule=ig_rule)
                item |= {"ig": ig.ig, "f_x": np.array(ig.f_x), "f_baseline": ig.f_baseline}
            store.save_item(f"{name}|{prompt}|{answer}", item)
        labels = token_labels(lm.tokenizer, ids)
        T = ids.shape[1]
        has_ig = want_ig and "ig" in item
        maps = [("erasure", item["erasure"])] + ([("ig", item["ig"])] if has_ig else [])
        for method, m in maps:
            rows += [{"model": model_name, "prompt": name, "method": method, "layer": l, "position": p,
                      "token": labels[p], "is_answer": p >= a, "value": float(m[l, p])}
                     for l in range(m.shape[0]) for p in range(T)]
        info = {"a_start": a, "n_tokens": T, "tokens": labels, "correct": int(item["correct"])}
        if has_ig:
            res = IGResult(item["ig"], float(item["f_x"]), item["f_baseline"], ig_steps, ig_rule)
            info |= {"f_x": res.f_x, "f_baseline": res.f_baseline.tolist(),
                     "ig_sum": res.ig.sum(1).tolist(), "completeness_error": res.completeness_error.tolist()}
        summary[name] = info
    meta = {"analysis": ANALYSIS, "parameters": {"model_name": model_name, **key, "device": device},
            "model": lm.provenance(), "summary": {"n_layers": lm.n_layers, "prompts": summary},
            "environment": environment(), "wall_time_s": round(time.time() - t0, 2)}
    return store.finalize(pd.DataFrame(rows), meta)


__all__ = ["CASE_STUDIES", "token_labels", "run", "ResidualStack", "AdapterStack", "as_stack", "boundary_residuals", "mean_residuals", "erasure_map",
           "answer_positions", "answer_probability", "integrated_gradients", "IGResult", "Edit"]


def map_chart(table, method: str, model: str, prompts: Sequence[str] | None = None, cell: int = 16):
    """Token × layer heatmaps, one per case-study prompt (layer 0 at the bottom; the last token, which feeds no
    answer prediction, is dropped as in the paper). Erasure: sequential scale from 0; integrated gradients:
    diverging scale centred at 0. Both scales are clipped at the largest |value| outside position 0 (the paper's
    choice for IG), because erasing the attention-sink token can dwarf every other cell."""
    import altair as alt

    t = table[(table.method == method) & (table.model == model)]
    charts = []
    for name in (prompts or list(dict.fromkeys(t.prompt))):
        d = t[t.prompt == name]
        d = d[d.position < d.position.max()][["layer", "position", "token", "value", "is_answer"]].copy()
        d["value"] = d.value.round(5)
        order = list(dict.fromkeys(d.sort_values("position").token))
        n_rows = int(d.layer.max()) + 1
        if method == "ig":
            r = float(d[d.position > 0].value.abs().max() or 1e-9)
            scale = alt.Scale(scheme="redblue", domain=[-r, r], reverse=True, clamp=True)
            title = "IG attribution"
        else:  # position 0 (BOS / attention sink) can dwarf the rest: clip there too, the tooltip keeps the value
            r = float(d[d.position > 0].value.max() or 1e-9)
            scale = alt.Scale(scheme="viridis", domain=[0, r], clamp=True)
            title = "‖P − P′‖₂"
        charts.append(alt.Chart(d).mark_rect().encode(
            x=alt.X("token:N", sort=order, title=None, axis=alt.Axis(labelAngle=-60, labelLimit=90, grid=False)),
            y=alt.Y("layer:O", sort="descending", title="Layer boundary" if method == "erasure" else "Layer (output of)",
                    axis=alt.Axis(labelOverlap="greedy", grid=False)),
            color=alt.Color("value:Q", title=title, scale=scale),
            tooltip=["token:N", "layer:O", alt.Tooltip("value:Q", format=".4f"), "is_answer:N"],
        ).properties(title=name, width=cell * len(order), height=max(120, 7 * n_rows)))
    return alt.hconcat(*charts).resolve_scale(color="independent")
