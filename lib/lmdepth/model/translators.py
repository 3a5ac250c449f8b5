"""The tuned lens's translators (Belrose et al. 2023) and their training: one affine map per layer that carries a
residual to where the final layer's unembedding reads it, ``h ↦ h + A_l h + s_l b_l`` (zero-initialised: it starts
as the logit lens), trained to minimise ``KL(P_final ‖ P_tuned)``.

A full-vocabulary softmax for every (token, layer) pair is what makes training expensive on a CPU, so training uses a
*sampled softmax* (:func:`~lmdepth.metrics.distributions.sampled_kl`): per step the logits are computed for the union
of the top-16 final tokens of all training tokens and uniform, importance-weighted negatives from the rest.
Evaluation always uses the full vocabulary.

The tuned lens as a run (its parameters, training text, residuals and cache entry) is
:mod:`lmdepth.analyses.tuned_lens`; the lens trace applies the translators as three tensors
(:mod:`lmdepth.traces.lens_trace`, reference twin :mod:`lmdepth.hooks.lens_hooks`).
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from lmdepth.data.datasets import Example
from lmdepth.errors import DataError
from lmdepth.metrics.distributions import Scratch, sampled_kl
from lmdepth.model.registry import LoadedModel
from lmdepth.model.unembed import DEFAULT_LENS_DTYPE, Unembedding
from lmdepth.runtime import progress


@dataclass(frozen=True)
class TunedLensRecipe:
    """Tuned-lens training recipe (part of the translators' cache key).

    Attributes:
        n_tokens: training tokens (all positions of GSM8K *train* problems, never the evaluated test problems).
        epochs: passes over the training tokens.
        batch_tokens: tokens per step (every layer's translator is trained on each of them in the same step).
        lr: peak Adam learning rate (cosine decay to 0).
        head_k: the top-``head_k`` final tokens of every training token form the always-included vocabulary head.
        n_negatives: uniform negatives from the rest of the vocabulary per step (importance-weighted).
        val_fraction: extra held-out tokens (other train-split problems), as a fraction of n_tokens.
        select_on_held_out: per layer, keep the translator of the epoch with the lowest held-out loss (the
            identity, i.e. the logit lens, if no epoch beats it): early stopping against overfitting, on
            train-split problems only.
        seed: seed of the problem selection, shuffling and negatives.
    """

    n_tokens: int = 16384
    epochs: int = 4
    batch_tokens: int = 64
    lr: float = 5e-4  # 2e-3 overshoots the last layers, already close to the output (Gemma 3's last stayed worse)
    head_k: int = 16
    n_negatives: int = 2048
    val_fraction: float = 0.125
    select_on_held_out: bool = True
    seed: int = 0


class Translators(nn.Module):
    """One affine translator per layer, ``h ↦ h + A_l h + s_l b_l``; zero-initialised, i.e. the identity.

    Attributes:
        A: [layers, d, d]; b: [layers, d]; scale: [layers] buffer (mean RMS of h_l on the training tokens).
    """

    def __init__(self, n_layers: int, d_model: int, scale: torch.Tensor | None = None):
        super().__init__()
        self.A = nn.Parameter(torch.zeros(n_layers, d_model, d_model))
        self.b = nn.Parameter(torch.zeros(n_layers, d_model))
        self.register_buffer("scale", torch.ones(n_layers) if scale is None else scale.float().clone())

    def forward(self, h: torch.Tensor, layer: int | None = None) -> torch.Tensor:
        """Translate one layer's residuals (``layer`` given: h [..., d]) or all layers (h [..., layers, d])."""
        h = h.float()
        if layer is not None:
            return h + h @ self.A[layer].T + self.scale[layer] * self.b[layer]
        x = h.reshape(-1, *h.shape[-2:])  # [n, layers, d]
        # A_l x_l as [layers, d, n]: its gradient for A is then [layers, d, d] in A's own layout (an einsum's was a
        # transposed copy, 22 of a step's ~230 ms for SmolLM2 on one thread); the same numbers, bit for bit
        ax = torch.bmm(self.A, x.permute(1, 2, 0)).permute(2, 0, 1)
        return (x + ax + self.scale[:, None] * self.b).reshape(h.shape)

    def state_arrays(self) -> dict[str, np.ndarray]:
        return {k: v.detach().cpu().numpy() for k, v in self.state_dict().items()}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> Translators:
        n_layers, d_model, _ = arrays["A"].shape
        t = cls(n_layers, d_model)
        t.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in arrays.items()})
        return t

    def to_npz(self) -> bytes:
        """The translators as the bytes of an ``.npz`` file (``A``, ``b``, ``scale``; fp32)."""
        buf = io.BytesIO()
        np.savez(buf, **self.state_arrays())
        return buf.getvalue()

    @classmethod
    def from_npz(cls, data: bytes) -> Translators:
        """Translators from :meth:`to_npz` bytes, in eval mode.

        Raises:
            ValueError, KeyError, OSError, EOFError or zipfile.BadZipFile: not such a file.
        """
        with np.load(io.BytesIO(data)) as z:
            return cls.from_arrays({k: z[k] for k in z.files}).eval()


def residuals_until(lm: LoadedModel, examples: list[Example], n_tokens: int,
                    residuals: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The training residuals: ``residuals(ids)`` ([T, L + 1, d]) of the examples in order, concatenated and cut at
    ``n_tokens`` ([n_tokens, L + 1, d]); a text longer than the context is skipped (training text is ours to choose).
    ``residuals`` is the remote-ready trace in a run (:func:`lmdepth.analyses.tuned_lens.collect_residuals`), plain
    hooks in its reference twin (:func:`lmdepth.hooks.lens_hooks.collect_residuals_hooked`)."""
    parts, n = [], 0
    for ex in examples:
        if n >= n_tokens:
            break
        try:
            ids = lm.encode(ex.text, label=f"Example {ex.id}")
        except DataError:
            continue
        parts.append(residuals(ids))
        n += parts[-1].shape[0]
    if n < n_tokens:
        raise DataError(f"The training text has only {n} tokens, {n_tokens} were asked for (n_train_tokens).")
    return torch.cat(parts)[:n_tokens]


@torch.no_grad()
def final_targets(
    unembed: Unembedding, h_final: torch.Tensor, k: int, max_logits: int = 1 << 23
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact log-normaliser and top-k of the output distribution, in blocks of ``max_logits`` logits.

    h_final: [tokens, d] → ([tokens], [tokens, k]).
    """
    chunk = max(1, max_logits // unembed.vocab)
    scratch = Scratch(min(chunk, len(h_final)), unembed.vocab, unembed.dtype)
    lse, top = [], []
    for s in range(0, len(h_final), chunk):
        z = unembed(h_final[s : s + chunk], scratch)
        lse.append(torch.logsumexp(z, -1))
        top.append(z.topk(k, -1).indices)
    return torch.cat(lse), torch.cat(top)


@contextmanager
def frozen(module: nn.Module) -> Iterator[nn.Module]:
    """Turn off gradients of a module's parameters for a block and restore them in ``finally``."""
    flags = [(p, p.requires_grad) for p in module.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        yield module
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def vocabulary_split(top: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampled softmax's vocabulary: the head (every token in ``top`` [tokens, k], the final top-k of the
    training tokens, always included) and the tail (the rest, sampled) → ([|head|], [vocab − |head|]) token ids."""
    head = torch.unique(top.flatten())
    is_tail = torch.ones(vocab, dtype=torch.bool)
    is_tail[head] = False
    return head, is_tail.nonzero().squeeze(1)


def sample_candidates(
    head: torch.Tensor, tail: torch.Tensor, n: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Vocabulary subset S = head ∪ n uniform tail samples, with log importance weights."""
    neg = tail[torch.randint(len(tail), (n,), generator=gen)]
    log_w = torch.cat([torch.zeros(len(head)), torch.full((n,), math.log(len(tail) / n))])
    return torch.cat([head, neg]), log_w


def _batch_kl(tr: Translators, unembed: Unembedding, h: torch.Tensor, lse_final: torch.Tensor,
              cand: torch.Tensor, log_w: torch.Tensor) -> torch.Tensor:
    """Sampled KL(P_final ‖ P_tuned) of a batch, differentiable in the translators.

    h: [tokens, layers + 1, d] residuals; lse_final: [tokens] → [tokens, layers].
    """
    on_s = unembed.rows(cand)  # the candidates' rows, gathered once for both readings
    with torch.no_grad():
        z_final = on_s.logits_of_normed(on_s.norm(h[:, -1]))
    z_lens = on_s.logits_of_normed(on_s.norm(tr(h[:, :-1])))
    return sampled_kl(z_lens, z_final, lse_final, log_w)


def optimizer(tr: Translators, lr: float) -> torch.optim.Adam:
    """The translators' Adam. Fused: one kernel for the whole update, 7 instead of 56 ms a step for SmolLM2's
    30 × 576² parameters on one CPU thread (measured 2026-12-04); what it trains equals the default's to 1e-9."""
    return torch.optim.Adam(tr.parameters(), lr=lr, fused=True)


def training_step(tr: Translators, opt: torch.optim.Optimizer, unembed: Unembedding, h: torch.Tensor,
                  lse_final: torch.Tensor, cand: torch.Tensor, log_w: torch.Tensor, lr: float) -> torch.Tensor:
    """One Adam step of every layer's translator on a batch (h: [tokens, layers + 1, d], lse_final: [tokens],
    cand / log_w: [|S|]) at learning rate ``lr`` → [layers] the batch's mean sampled KL per layer (detached)."""
    per_layer = _batch_kl(tr, unembed, h, lse_final, cand, log_w).mean(0)
    for g in opt.param_groups:
        g["lr"] = lr
    opt.zero_grad()
    per_layer.sum().backward()  # translators are independent: the sum trains each on its own loss
    opt.step()
    return per_layer.detach()


def train_translators(
    lm: LoadedModel,
    train_h: torch.Tensor,
    val_h: torch.Tensor,
    cfg: TunedLensRecipe,
    lens_dtype: str = DEFAULT_LENS_DTYPE,
    log_every: int = 4,
) -> tuple[Translators, pd.DataFrame, dict[str, Any]]:
    """Train one translator per layer on cached residuals (all layers in one pass per batch).

    Args:
        lm: loaded model (its final norm and unembedding are used, frozen).
        train_h: [tokens, layers + 1, d] training residuals (:func:`residuals_until`).
        val_h: [tokens', layers + 1, d] held-out residuals (the held-out curve and the per-layer selection).
        cfg: the recipe.
        lens_dtype: dtype of the unembedding matmul.
        log_every: steps per logged point of the training curve.

    Returns:
        (translators, curve, info). The curve is a tidy table (``split`` train/held-out, ``step``, ``tokens``,
        ``layer``, ``value`` = sampled KL(P_final ‖ P_tuned), mean over the logged steps' tokens).
    """
    unembed = Unembedding.of(lm, lens_dtype, traced=False)
    n_layers, vocab = lm.n_layers, unembed.weight.shape[0]
    lse_tr, top_tr = final_targets(unembed, train_h[:, -1], cfg.head_k)
    lse_val, _ = final_targets(unembed, val_h[:, -1], cfg.head_k)
    head, tail = vocabulary_split(top_tr, vocab)
    n_neg = min(cfg.n_negatives, len(tail))
    gen = torch.Generator().manual_seed(cfg.seed)
    val_cand = sample_candidates(head, tail, n_neg, torch.Generator().manual_seed(cfg.seed + 1))  # fixed: comparable points

    scale = train_h[:, :n_layers].pow(2).mean(-1).sqrt().mean(0)  # [layers] mean RMS of h_l
    tr = Translators(n_layers, lm.adapter.d_model, scale)
    opt = optimizer(tr, cfg.lr)
    steps_per_epoch = math.ceil(len(train_h) / cfg.batch_tokens)
    total = cfg.epochs * steps_per_epoch
    rows: list[dict[str, Any]] = []
    best_kl, best_step = torch.full((n_layers,), math.inf), torch.zeros(n_layers, dtype=torch.long)
    best_A, best_b = tr.A.detach().clone(), tr.b.detach().clone()

    def log(split: str, step: int, values: torch.Tensor) -> None:
        for l, v in enumerate(values.tolist()):
            rows.append({"split": split, "step": step, "tokens": step * cfg.batch_tokens, "layer": l, "value": v})

    def held_out(step: int) -> None:
        with torch.no_grad():  # in training-sized batches: memory stays O(batch × layers × |S|)
            kl = [_batch_kl(tr, unembed, val_h[s : s + cfg.batch_tokens], lse_val[s : s + cfg.batch_tokens], *val_cand)
                  for s in range(0, len(val_h), cfg.batch_tokens)]
            value = torch.cat(kl).mean(0)
        log("held-out", step, value)
        better = value < best_kl  # per layer: remember the translator with the lowest held-out loss so far
        best_kl[better], best_step[better] = value[better], step
        best_A[better], best_b[better] = tr.A.detach()[better], tr.b.detach()[better]

    t0 = time.time()
    held_out(0)
    acc, n_acc = torch.zeros(n_layers), 0
    with frozen(lm.model):
        for step in progress(range(1, total + 1), desc=f"{lm.name}: tuned lens", total=total):
            if (step - 1) % steps_per_epoch == 0:
                order = torch.randperm(len(train_h), generator=gen)
            pick = order[((step - 1) % steps_per_epoch) * cfg.batch_tokens :][: cfg.batch_tokens]
            lr = cfg.lr * 0.5 * (1 + math.cos(math.pi * (step - 1) / total))
            per_layer = training_step(tr, opt, unembed, train_h[pick], lse_tr[pick],
                                      *sample_candidates(head, tail, n_neg, gen), lr)
            acc, n_acc = acc + per_layer, n_acc + 1
            if step % log_every == 0 or step == total:
                log("train", step, acc / n_acc)
                acc, n_acc = torch.zeros(n_layers), 0
            if step % steps_per_epoch == 0:
                held_out(step)
    if cfg.select_on_held_out:
        with torch.no_grad():
            tr.A.copy_(best_A)
            tr.b.copy_(best_b)
    info = {"head_size": len(head), "n_negatives": n_neg, "vocab": vocab, "steps": total,
            "train_tokens": len(train_h), "held_out_tokens": len(val_h), "train_time_s": round(time.time() - t0, 2),
            "selected_step": best_step.tolist() if cfg.select_on_held_out else None,
            "layers_kept_identity": int((best_step == 0).sum()) if cfg.select_on_held_out else 0}
    return tr.eval(), pd.DataFrame(rows), info
