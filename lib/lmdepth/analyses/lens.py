"""Logit lens and tuned lens (paper Fig. 4; chapter 04): when does the model's prediction settle?

The **logit lens** decodes the residual entering layer l (h_l, l = 0..L-1; h_0 = embeddings) with the model's own
final norm and unembedding, ``P_l = softmax(unembed(h_l))``, and compares it with the model's output distribution
``P_final = softmax(unembed(h_L))`` (METHOD §6):

- ``KL(P_l ‖ P_final)`` — the direction of the authors' code (also reported: ``KL(P_final ‖ P_l)``, the direction
  the tuned lens is trained on);
- top-5 overlap ``|top5(P_l) ∩ top5(P_final)| / 5``.

The **tuned lens** (Belrose et al. 2023) first applies a learned affine *translator* per layer,
``h ↦ h + A_l h + s_l b_l`` (A_l, b_l initialised to zero, so it starts as the logit lens; s_l is the mean RMS of
h_l, a constant that makes the bias step size scale-free), trained to minimise ``KL(P_final ‖ P_tuned)``.

Memory: vocabularies reach 262k tokens (Gemma 3), so every layer is reduced to per-token KL and overlap
immediately after its logits are computed; a [layers × tokens × vocab] tensor never exists. The unembedding
matmul runs in ``lens_dtype`` (fp32 by default; bf16 as in the paper's models is fast on GPUs but several times
slower than fp32 on CPUs without bf16 units); log-softmax is always fp32.

Training cost: a full-vocabulary softmax for every (token, layer) pair is what makes the tuned lens expensive on a
CPU (~30 ns per logit for forward and backward). Training therefore uses a *sampled softmax*: per step the logits
are computed for a candidate set S = (the union of the top-16 final tokens of all training tokens) ∪ (uniform
negatives from the rest, importance-weighted), which estimates the full-vocabulary KL and its gradient.
Evaluation always uses the full vocabulary.
"""

from __future__ import annotations

import math
import os
import random
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from lmdepth.model.families import resolve
from lmdepth.hooks.capture import hooked_residuals
from lmdepth.data.datasets import dataset_id, Example, load_examples, selection_record
from lmdepth.errors import DataError, ParameterError
from lmdepth.metrics.residual import DatasetStats, PromptStats
from lmdepth.params import check_choice, check_common, check_range, check_type
from lmdepth.model.registry import DTYPES, LoadedModel, load_model
from lmdepth.results import RunResult, RunStore
from lmdepth.runtime import environment, progress

ANALYSIS = "logit_lens"
TUNED_ANALYSIS = "tuned_lens"
TOP_K = 5
# fp32: bf16 (the paper's models) is fast on GPUs but several times slower than fp32 on CPUs without bf16 units
DEFAULT_LENS_DTYPE = "float32"
LENSES = ("logit_lens", "tuned_lens")
#: Per-token metrics of one lens at one layer, in the order :func:`lens_metrics` returns them.
METRICS = ("kl", "kl_final_lens", "top5_overlap")  # KL(P_lens‖P_final), KL(P_final‖P_lens), top-5 overlap
STATS = ("mean", "token_mean")  # per-problem mean then mean over problems (paper); token-weighted ([NB])


# ---- pure metric functions ---------------------------------------------------------------------------------

def kl_divergence(logp: torch.Tensor, logq: torch.Tensor, p: torch.Tensor | None = None) -> torch.Tensor:
    """KL(p ‖ q) = Σ_v p(v) (log p(v) − log q(v)) over the last dimension, in fp32.

    Args:
        logp: [..., vocab] log-probabilities of p.
        logq: [..., vocab] log-probabilities of q.
        p: optional ``logp.exp()`` when the caller already has it (saves one pass over the vocabulary).

    Returns:
        [...] non-negative KL divergences (nats).
    """
    logp, logq = logp.float(), logq.float()
    p = logp.exp() if p is None else p
    # nansum: a term with p(v) = 0 is 0 even where log p(v) = -inf (0·inf is NaN in floating point).
    return (p * (logp - logq)).nansum(-1)


def topk_overlap(logits_a: torch.Tensor, logits_b: torch.Tensor, k: int = TOP_K) -> torch.Tensor:
    """|top-k(a) ∩ top-k(b)| / k per row. [..., vocab] × [..., vocab] → [...] in [0, 1]."""
    return index_overlap(logits_a.topk(k, dim=-1).indices, logits_b.topk(k, dim=-1).indices)


def index_overlap(idx_a: torch.Tensor, idx_b: torch.Tensor) -> torch.Tensor:
    """Fraction of shared entries of two [..., k] index sets (each without repeats) → [...]."""
    return (idx_a.unsqueeze(-1) == idx_b.unsqueeze(-2)).any(-1).float().mean(-1)


@dataclass
class FinalDistribution:
    """The model's output distribution at a set of positions, precomputed once and shared by every layer.

    Attributes:
        logp: [tokens, vocab] fp32 log-probabilities.
        p: [tokens, vocab] fp32 probabilities.
        top: [tokens, k] indices of the top-k tokens.
    """

    logp: torch.Tensor
    p: torch.Tensor
    top: torch.Tensor

    @classmethod
    def from_logits(cls, logits: torch.Tensor, k: int = TOP_K) -> "FinalDistribution":
        logp = torch.log_softmax(logits.float(), dim=-1)
        return cls(logp, logp.exp(), logits.topk(k, dim=-1).indices)


class Scratch:
    """Reusable [tokens, vocab] fp32 buffers for :func:`lens_metrics`, one set per block of positions.

    Why: a fresh tensor of tens of MB is a new memory mapping, and its page faults cost more than the arithmetic
    (measured: a freshly allocated ``a - b`` is 4× slower than ``torch.sub(a, b, out=buf)``).
    """

    def __init__(self, tokens: int, vocab: int, matmul_dtype: torch.dtype = torch.float32):
        self.z, self.logp, self.p, self.diff = (torch.empty(tokens, vocab) for _ in range(4))
        self.z_mm = self.z if matmul_dtype == torch.float32 else torch.empty(tokens, vocab, dtype=matmul_dtype)

    def view(self, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.logp[:n], self.p[:n], self.diff[:n]


def _rowdot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Σ_v a[t, v]·b[t, v] per row, without materialising the product. [t, v] × [t, v] → [t]."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).view(-1)


def lens_metrics(logits: torch.Tensor, final: FinalDistribution, scratch: Scratch | None = None) -> torch.Tensor:
    """Reduce lens logits to per-token metrics (rows in :data:`METRICS` order).

    Equal to :func:`kl_divergence` in both directions and :func:`topk_overlap` (tested), computed with shared
    intermediate buffers: log p_lens − log p_final is formed once and dotted with p_lens and with p_final.

    Args:
        logits: [..., tokens, vocab] fp32 lens logits (finite); leading dims, e.g. several layers, share ``final``.
        final: the output distribution at the same tokens ([tokens, vocab]).
        scratch: reusable buffers with at least ``logits.numel() / vocab`` rows (allocated here when None).

    Returns:
        [3, ..., tokens]: KL(P_lens‖P_final), KL(P_final‖P_lens), top-k overlap.
    """
    shape, vocab = logits.shape[:-1], logits.shape[-1]
    n = logits.numel() // vocab
    logp, p, diff = (t.view(*shape, vocab) for t in (scratch or Scratch(n, vocab)).view(n))
    torch.sub(logits, torch.logsumexp(logits, dim=-1, keepdim=True), out=logp)
    torch.exp(logp, out=p)
    torch.sub(logp, final.logp, out=diff)
    kl = _rowdot(p.view(n, vocab), diff.view(n, vocab)).view(shape)
    kl_final = -torch.mul(diff, final.p, out=p).sum(-1)  # p is free again: reuse it for the product
    overlap = index_overlap(logits.topk(final.top.shape[-1], dim=-1).indices, final.top)
    return torch.stack([kl, kl_final, overlap])


# ---- the unembedding and the translators ---------------------------------------------------------------------

@dataclass
class Unembedding:
    """``lm_head(final_norm(h))`` with the model's logit soft-capping — :meth:`ModelAdapter.unembed` with the
    matmul in a chosen dtype (a bf16 copy of the unembedding is ~5× faster on CPUs with bf16 support).

    Attributes:
        norm: the final norm; an nnsight envoy inside traces (an ad hoc call that leaves the trace alone),
            the module itself outside.
        weight: [vocab, d_model] unembedding in the lens dtype.
        bias: [vocab] or None.
        softcap: the model's ``final_logit_softcapping`` or None.
        head: remote models only: the ``lm_head`` envoy (weight is None then; the matmul runs on the server).
        remote_vocab: remote models only: the vocabulary size.
    """

    norm: Callable[[torch.Tensor], torch.Tensor]
    weight: torch.Tensor | None
    bias: torch.Tensor | None = None
    softcap: float | None = None
    head: Callable[[torch.Tensor], torch.Tensor] | None = None
    remote_vocab: int = 0

    @classmethod
    def of(cls, lm: LoadedModel, dtype: str = DEFAULT_LENS_DTYPE, traced: bool = True) -> "Unembedding":
        """Build from a loaded model. ``traced``: take the final norm's nnsight envoy (for use inside traces)."""
        softcap = getattr(lm.model.config, "final_logit_softcapping", None) or None
        if lm.remote:  # the weights live on the server: call its lm_head (in the model's dtype) inside the trace
            fam = lm.adapter.family
            return cls(resolve(lm.nn, fam.final_norm), None, softcap=softcap, head=resolve(lm.nn, fam.lm_head),
                       remote_vocab=int(lm.model.config.vocab_size))
        head = lm.adapter.lm_head
        norm = resolve(lm.nn, lm.adapter.family.final_norm) if traced else lm.adapter.final_norm
        bias = getattr(head, "bias", None)
        weight = head.weight.detach().to(DTYPES[dtype])
        return cls(norm, weight, None if bias is None else bias.detach().float(), softcap)

    @property
    def vocab(self) -> int:
        return int(self.weight.shape[0]) if self.weight is not None else self.remote_vocab

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32 if self.weight is None else self.weight.dtype

    def logits_of_normed(self, x: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of already-normed residuals (differentiable). x: [..., d]; ``rows``: optional vocabulary subset
        → [..., |rows|] fp32."""
        if self.weight is None:
            return self.softcapped(self.head(x).float())
        w = self.weight if rows is None else self.weight[rows]
        z = F.linear(x.to(w.dtype), w).float()
        if self.bias is not None:
            z = z + (self.bias if rows is None else self.bias[rows])
        return self.softcapped(z)

    def softcapped(self, z: torch.Tensor) -> torch.Tensor:
        """The model's logit soft-capping (Gemma 2: 30·tanh(z/30)) on raw ``lm_head`` logits, in fp32."""
        z = z.float()
        return torch.tanh(z / self.softcap) * self.softcap if self.softcap else z

    def __call__(self, h: torch.Tensor, scratch: Scratch | None = None) -> torch.Tensor:
        """[tokens, d] raw residual → [tokens, vocab] fp32 logits; written into ``scratch.z`` when given.

        The final norm is applied with the residual's own dtype; the matmul runs in the lens dtype.
        """
        x = self.norm(h)
        if scratch is None or self.weight is None:
            return self.logits_of_normed(x)
        n = x.shape[0]
        z = scratch.z[:n]
        torch.matmul(x.to(self.weight.dtype), self.weight.T, out=scratch.z_mm[:n])
        if scratch.z_mm is not scratch.z:
            z.copy_(scratch.z_mm[:n])
        if self.bias is not None:
            z.add_(self.bias)
        if self.softcap:
            z.div_(self.softcap).tanh_().mul_(self.softcap)
        return z


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
        return h + torch.einsum("...ld,led->...le", h, self.A) + self.scale[:, None] * self.b

    def state_arrays(self) -> dict[str, np.ndarray]:
        return {k: v.detach().cpu().numpy() for k, v in self.state_dict().items()}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> "Translators":
        n_layers, d_model, _ = arrays["A"].shape
        t = cls(n_layers, d_model)
        t.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in arrays.items()})
        return t


# ---- one problem: both lenses inside one nnsight trace -------------------------------------------------------

def _layer_output(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out


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
    out = torch.zeros(lenses, len(METRICS), n_layers, n_pos)
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
    """One traced forward pass → lens metrics at the chosen positions, computed inside the trace.

    Only [lenses × metrics × layers × positions] numbers leave the trace (so the same code can run on NDIF).

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
        h_last = _layer_output(resolve(nn_model, adapter.layer_path(adapter.n_layers - 1)).output)[0]
        hs.append(h_last[positions])
        model_logits = resolve(nn_model, adapter.family.lm_head).output[0, -1:]
        check = kl_divergence(torch.log_softmax(unembed(h_last[-1:]), -1),
                              torch.log_softmax(unembed.softcapped(model_logits), -1))
        saved.append(lens_stats(hs, unembed, translators, k).save())
        saved.append(check.save())
    return torch.as_tensor(saved[0]).cpu(), float(torch.as_tensor(saved[1]).max())


def sample_positions(n_tokens: int, n: int, key: str, include_bos: bool = True) -> torch.Tensor:
    """A seeded, sorted sample of ``n`` positions of a text (all of them when ``n`` is 0 or ≥ the count).

    Uniform sampling keeps the per-problem mean over positions unbiased. Position 0 is excluded when
    ``include_bos`` is False.
    """
    pool = list(range(0 if include_bos else 1, n_tokens))
    if 0 < n < len(pool):
        pool = sorted(random.Random(key).sample(pool, n))
    return torch.tensor(pool, dtype=torch.long)


# ---- tuned-lens training -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TrainConfig:
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

    n_tokens: int = 3072
    epochs: int = 2
    batch_tokens: int = 64
    lr: float = 2e-3
    head_k: int = 16
    n_negatives: int = 2048
    val_fraction: float = 0.125
    select_on_held_out: bool = True
    seed: int = 0


def sampled_kl(z_lens: torch.Tensor, z_final: torch.Tensor, lse_final: torch.Tensor, log_w: torch.Tensor) -> torch.Tensor:
    """Importance-sampled estimate of KL(P_final ‖ P_lens) from the logits on a vocabulary subset S.

    Each candidate v ∈ S carries a weight w_v (1 for the head, |tail|/n for a uniform tail sample), so
    Σ_{v∈S} w_v f(v) estimates Σ_v f(v) over the full vocabulary. With S = the full vocabulary and w = 1 this is the
    exact KL.

    Args:
        z_lens: [tokens, layers, |S|] lens logits on S.
        z_final: [tokens, |S|] final logits on S.
        lse_final: [tokens] exact log-normaliser of the final logits over the full vocabulary.
        log_w: [|S|] log importance weights.

    Returns:
        [tokens, layers] KL estimates.
    """
    logp_f = z_final - lse_final[:, None]
    wp_f = (logp_f + log_w).exp()  # w_v · p_final(v)
    log_z = torch.logsumexp(z_lens + log_w, dim=-1)  # estimate of the lens' log-normaliser
    # Σ w p_f (log p_f − z + log Z): the first term does not depend on the lens, so it is formed per token only.
    neg_entropy = (wp_f * logp_f).sum(-1, keepdim=True)  # [tokens, 1]
    return neg_entropy - torch.einsum("ts,tls->tl", wp_f, z_lens) + log_z


@torch.no_grad()
def collect_residuals(lm: LoadedModel, examples: list[Example], n_tokens: int) -> torch.Tensor:
    """Residuals h_0..h_L of every position of the examples, in order, until ``n_tokens`` tokens.

    Returns:
        [tokens, layers + 1, d_model] fp32 (the last row is the last layer's output h_L).
    """
    parts, n = [], 0
    for ex in examples:
        if n >= n_tokens:
            break
        try:
            ids = lm.encode(ex.text, label=f"Example {ex.id}")
        except DataError:  # longer than the context: training text is ours to choose, skip it
            continue
        r = hooked_residuals(lm.adapter, ids, logits_to_keep=1)
        parts.append(torch.cat([r["resid_pre"][:, 0], r["resid_post"][-1:, 0]]).transpose(0, 1).float())  # [T, L+1, d]
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


def _candidates(
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
    with torch.no_grad():
        z_final = unembed.logits_of_normed(unembed.norm(h[:, -1]), cand)
    z_lens = unembed.logits_of_normed(unembed.norm(tr(h[:, :-1])), cand)
    return sampled_kl(z_lens, z_final, lse_final, log_w)


def train_translators(
    lm: LoadedModel,
    train_h: torch.Tensor,
    val_h: torch.Tensor,
    cfg: TrainConfig,
    lens_dtype: str = DEFAULT_LENS_DTYPE,
    log_every: int = 4,
) -> tuple[Translators, pd.DataFrame, dict[str, Any]]:
    """Train one translator per layer on cached residuals (all layers in one pass per batch).

    Args:
        lm: loaded model (its final norm and unembedding are used, frozen).
        train_h: [tokens, layers + 1, d] training residuals (:func:`collect_residuals`).
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
    head = torch.unique(top_tr.flatten())
    is_tail = torch.ones(vocab, dtype=torch.bool)
    is_tail[head] = False
    tail = is_tail.nonzero().squeeze(1)
    n_neg = min(cfg.n_negatives, len(tail))
    gen = torch.Generator().manual_seed(cfg.seed)
    val_cand = _candidates(head, tail, n_neg, torch.Generator().manual_seed(cfg.seed + 1))  # fixed: comparable points

    scale = train_h[:, :n_layers].pow(2).mean(-1).sqrt().mean(0)  # [layers] mean RMS of h_l
    tr = Translators(n_layers, lm.adapter.d_model, scale)
    opt = torch.optim.Adam(tr.parameters(), lr=cfg.lr)
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
            kl = _batch_kl(tr, unembed, train_h[pick], lse_tr[pick], *_candidates(head, tail, n_neg, gen))
            per_layer = kl.mean(0)
            for g in opt.param_groups:
                g["lr"] = cfg.lr * 0.5 * (1 + math.cos(math.pi * (step - 1) / total))
            opt.zero_grad()
            per_layer.sum().backward()  # translators are independent: the sum trains each on its own loss
            opt.step()
            acc, n_acc = acc + per_layer.detach(), n_acc + 1
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


def train_examples(dataset: str, n_tokens: int, seed: int) -> list[Example]:
    """Held-out training text: the *train* split of the named data set (GSM8K for user files), in random order.

    Twice as many problems as ~100 tokens each would need (GSM8K and MATH problems are longer): the first half
    is for training, the second for the held-out curve.
    """
    name = dataset if dataset in ("gsm8k", "math") else "gsm8k"
    return load_examples(name, n_examples=2 * (n_tokens // 100 + 5), seed=seed, selection="random", split="train")


def fit_tuned_lens(
    lm: LoadedModel,
    cfg: TrainConfig,
    dataset: str = "gsm8k",
    dtype: str = "float32",
    lens_dtype: str = DEFAULT_LENS_DTYPE,
    results_dir: str | Path = "results",
    use_cache: bool = True,
) -> tuple[Translators, RunResult]:
    """Train (or load from the results cache) the tuned-lens translators of one model.

    Cached under ``<results_dir>/tuned_lens/<model>/<key>/``: ``table.csv`` (training curve), ``meta.json``,
    ``translators.npz``.

    Returns:
        (translators, the cache entry's RunResult; its table is the training curve).
    """
    store = tuned_store(lm.name, cfg, dataset, dtype, lens_dtype, results_dir)
    state = store.dir / "translators.npz"
    if use_cache and store.complete and state.exists():
        with np.load(state) as z:
            return Translators.from_arrays({k: z[k] for k in z.files}).eval(), store.load()
    store.clear()
    exs = train_examples(dataset, cfg.n_tokens, cfg.seed)
    # Held-out problems are the last ones of the shuffled list: never read for training.
    n_val = max(1, int(cfg.n_tokens * cfg.val_fraction))
    train_h = collect_residuals(lm, exs[: len(exs) // 2], cfg.n_tokens)
    val_h = collect_residuals(lm, exs[len(exs) // 2 :], n_val)
    translators, curve, info = train_translators(lm, train_h, val_h, cfg, lens_dtype)
    curve.insert(0, "model", lm.name)
    meta = {"analysis": TUNED_ANALYSIS, "parameters": {"model_name": lm.name, **store.params},
            "model": lm.provenance(), "training": info, "environment": environment()}
    result = store.finalize(curve, meta)
    _atomic_savez(state, translators.state_arrays())
    return translators, result


def tuned_store(model_name: str, cfg: TrainConfig, dataset: str, dtype: str, lens_dtype: str,
                results_dir: str | Path) -> RunStore:
    """Cache entry of a model's translators, keyed by the recipe, the training text and the numerics."""
    train_data = (dataset if dataset in ("gsm8k", "math") else "gsm8k") + "/train"
    return RunStore(results_dir, TUNED_ANALYSIS, model_name,
                    {**asdict(cfg), "train_data": train_data, "dtype": dtype, "lens_dtype": lens_dtype})


def _atomic_savez(path: Path, arrays: dict[str, np.ndarray]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".translators-", suffix=".npz")
    os.close(fd)
    np.savez(tmp, **arrays)
    os.replace(tmp, path)


def training_curve(result: RunResult) -> pd.DataFrame:
    """The tuned-lens training curve of a lens run (read from the translators' cache entry named in its sidecar)."""
    info = result.meta.get("tuned_lens")
    if not info:
        return pd.DataFrame()
    return pd.read_csv(Path(info["path"]) / "table.csv")


# ---- the run ------------------------------------------------------------------------------------------------

def tidy_table(per_prompt: np.ndarray, counts: np.ndarray, model: str, n_boot: int, seed: int) -> pd.DataFrame:
    """Long table: one row per (lens, metric, stat, layer).

    Args:
        per_prompt: [problems, lenses, metrics, layers] per-problem means over the evaluated positions.
        counts: [problems] tokens of each problem (the weights of the token-weighted mean).

    ``rel_depth`` is l / L: the fraction of layers applied before the residual entering layer l.
    """
    n_lens, n_layers = per_prompt.shape[1], per_prompt.shape[3]
    flat = per_prompt.reshape(len(per_prompt), -1, n_layers)  # [problems, lenses·metrics, layers]: DatasetStats' shape
    rows = []
    for stat in STATS:
        ds = DatasetStats()
        for v, c in zip(flat, counts):
            w = 1 if stat == "mean" else int(c)
            ds.add(PromptStats(sum=v * w, max=v, count=w))
        mean = ds.mean().reshape(per_prompt.shape[1:])
        lo, hi = (x.reshape(per_prompt.shape[1:]) for x in ds.bootstrap_mean_ci(n_boot=n_boot, seed=seed))
        for i in range(n_lens):
            for j, metric in enumerate(METRICS):
                for l in range(n_layers):
                    rows.append(dict(model=model, metric=metric, component=LENSES[i], stat=stat, layer=l,
                                     n_layers=n_layers, rel_depth=l / n_layers, value=mean[i, j, l],
                                     ci_low=lo[i, j, l], ci_high=hi[i, j, l]))
    return pd.DataFrame(rows)


def check_lens_params(positions_per_example: Any, lens_dtype: Any, tuned_lens: Any, n_train_tokens: Any,
                      train_epochs: Any) -> None:
    """Checks of this chapter's own parameters (the shared ones are in :func:`lmdepth.params.check_common`)."""
    check_type("positions_per_example", positions_per_example, int)
    check_range("positions_per_example", positions_per_example, 0, 100_000)
    check_choice("lens_dtype", lens_dtype, list(DTYPES))
    check_type("tuned_lens", tuned_lens, bool)
    check_type("n_train_tokens", n_train_tokens, int)
    check_range("n_train_tokens", n_train_tokens, 64, 10_000_000)
    check_type("train_epochs", train_epochs, int)
    check_range("train_epochs", train_epochs, 1, 1000)


def run(
    model_name: str = "smollm2-135m",
    dataset: str = "gsm8k",
    n_examples: int = 20,
    seed: int = 0,
    selection: str = "random",
    include_bos: bool = True,
    device: str = "cpu",
    dtype: str = "float32",
    remote: bool = False,
    results_dir: str | Path = "results",
    use_cache: bool = True,
    n_boot: int = 1000,
    positions_per_example: int = 16,
    lens_dtype: str = DEFAULT_LENS_DTYPE,
    tuned_lens: bool = True,
    n_train_tokens: int = 3072,
    train_epochs: int = 2,
) -> RunResult:
    """Compute (or load from cache) the logit lens and the tuned lens of one model on a data set.

    Args:
        model_name, dataset, n_examples, seed, selection, include_bos, device, dtype, remote, results_dir,
            use_cache, n_boot: as in :func:`lmdepth.analyses.residual.run`.
        positions_per_example: positions evaluated per problem, a seeded uniform sample (0 = every position, as
            the paper); the per-problem mean over positions stays unbiased.
        lens_dtype: dtype of the unembedding matmul (log-softmax is always fp32).
        tuned_lens: also train (or load) and evaluate the tuned lens.
        n_train_tokens, train_epochs: tuned-lens training budget (:class:`TrainConfig`; the rest is fixed).

    Returns:
        The tidy table (``model, metric, component, stat, layer, n_layers, rel_depth, value, ci_low, ci_high``;
        component = lens) and the sidecar (with ``tuned_lens``: the translators' cache entry and training info).
    """
    check_common(model_name=model_name, dataset=dataset, n_examples=n_examples, seed=seed, selection=selection,
                 device=device, dtype=dtype, use_cache=use_cache, remote=remote)
    check_type("include_bos", include_bos, bool)
    check_type("n_boot", n_boot, int)
    check_lens_params(positions_per_example, lens_dtype, tuned_lens, n_train_tokens, train_epochs)
    if tuned_lens and remote:
        raise ParameterError("The tuned lens is trained locally: use remote=False, or tuned_lens=False on NDIF.")
    examples = load_examples(dataset, n_examples=n_examples, seed=seed, selection=selection)
    data_id = dataset_id(dataset)
    cfg = TrainConfig(n_tokens=n_train_tokens, epochs=train_epochs, seed=seed)
    tuned_key = tuned_store(model_name, cfg, dataset, dtype, lens_dtype, results_dir).key if tuned_lens else None
    key_params = dict(dataset=data_id, n_examples=n_examples, seed=seed, selection=selection, include_bos=include_bos,
                      dtype=dtype, n_boot=n_boot, positions_per_example=positions_per_example, lens_dtype=lens_dtype,
                      top_k=TOP_K, tuned_lens=tuned_key)
    # A problem's numbers do not depend on which other problems are in the sample: share its checkpoint.
    item_params = {k: v for k, v in key_params.items() if k not in ("n_examples", "selection", "n_boot")}
    store = RunStore(results_dir, ANALYSIS, model_name, key_params, item_params=item_params)
    if use_cache and store.complete:
        return store.load()
    if not use_cache:
        store.clear()

    t0 = time.time()
    lm = load_model(model_name, device=device, dtype=dtype, remote=remote)
    encoded = [(e, lm.encode(e.text, label=f"Example {e.id}")) for e in examples]
    translators, tuned = (fit_tuned_lens(lm, cfg, dataset, dtype, lens_dtype, results_dir, use_cache)
                          if tuned_lens else (None, None))
    t_eval = time.time()
    unembed = Unembedding.of(lm, lens_dtype, traced=True)
    per_prompt, counts, checks, n_pos = [], [], [], 0
    for ex, ids in progress(encoded, desc=f"{model_name}: lenses"):
        item = store.load_item(ex.id)
        if item is None:
            pos = sample_positions(ids.shape[1], positions_per_example, f"{seed}:{ex.id}", include_bos)
            vals, check = prompt_lens(lm, ids, pos.to(ids.device), unembed, translators)
            item = {"mean": vals.mean(-1).numpy(), "count": np.array(ids.shape[1] - (0 if include_bos else 1)),
                    "positions": pos.numpy(), "check": np.array(check)}
            store.save_item(ex.id, item)
        per_prompt.append(item["mean"])
        counts.append(int(item["count"]))
        checks.append(float(item["check"]))
        n_pos += len(item["positions"])

    table = tidy_table(np.stack(per_prompt), np.array(counts), model_name, n_boot=n_boot, seed=seed)
    meta = {
        "analysis": ANALYSIS,
        "parameters": {"model_name": model_name, **key_params, "tuned_lens": tuned_lens, "n_train_tokens": n_train_tokens,
                       "train_epochs": train_epochs, "device": device, "remote": remote},
        "model": lm.provenance(),
        "data": selection_record(dataset, selection, seed, examples),
        "n_tokens": int(sum(counts)),
        "n_positions_evaluated": n_pos,
        "last_layer_check_kl_max": max(checks),
        "tuned_lens": None if tuned is None else {
            "path": str(tuned.path), "cache_key": tuned.meta["cache_key"], "from_cache": tuned.from_cache,
            "recipe": asdict(cfg), **tuned.meta["training"]},
        "environment": environment(),
        "eval_time_s": round(time.time() - t_eval, 2),
        "wall_time_s": round(time.time() - t0, 2),
    }
    return store.finalize(table, meta)


def run_many(model_names: list[str], **kwargs: Any) -> tuple[pd.DataFrame, dict[str, dict[str, Any]], pd.DataFrame]:
    """:func:`run` for several models: (concatenated table, each model's sidecar, concatenated training curves)."""
    results = {m: run(model_name=m, **kwargs) for m in model_names}
    curves = [training_curve(r) for r in results.values()]
    curves = [c for c in curves if not c.empty]
    return (pd.concat([r.table for r in results.values()], ignore_index=True),
            {m: r.meta for m, r in results.items()},
            pd.concat(curves, ignore_index=True) if curves else pd.DataFrame())


# ---- scalar summaries (arXiv 2512.14064) ------------------------------------------------------------------------

def select(table: pd.DataFrame, metric: str, lens: str, stat: str = "mean", model: str | None = None) -> pd.Series:
    """Values indexed by layer for one (model, metric, lens, stat)."""
    t = table[(table.metric == metric) & (table.component == lens) & (table.stat == stat)]
    if model is not None:
        t = t[t.model == model]
    return t.set_index("layer")["value"].sort_index()


def first_layer_below(values: pd.Series, threshold: float) -> int | None:
    """First layer whose value is < threshold (None if none)."""
    hits = values.index[values.to_numpy() < threshold]
    return int(hits[0]) if len(hits) else None


def first_layer_above(values: pd.Series, threshold: float) -> int | None:
    """First layer whose value is > threshold (None if none)."""
    hits = values.index[values.to_numpy() > threshold]
    return int(hits[0]) if len(hits) else None


def settling_layers(table: pd.DataFrame, model: str, lens: str, kl_fraction: float = 0.1, overlap: float = 0.2,
                    kl_threshold: float | None = None, stat: str = "mean") -> dict[str, int | None]:
    """Where a lens' prediction settles (arXiv 2512.14064): the first layer with KL < ``kl_fraction`` × max KL
    (of the same lens), and the first layer with top-5 overlap > ``overlap``. ``kl_threshold`` overrides the
    relative threshold with an absolute one (to compare two lenses at the same KL). ``stat``: "mean" (per-problem
    means, the paper's script) or "token_mean" ([NB])."""
    kl = select(table, "kl", lens, stat=stat, model=model)
    thr = kl_fraction * float(kl.max()) if kl_threshold is None else kl_threshold
    ov = select(table, "top5_overlap", lens, stat=stat, model=model)
    return {"kl": first_layer_below(kl, thr), "overlap": first_layer_above(ov, overlap)}


KL_CRITERION = "KL < 10 % of max"
OVERLAP_CRITERION = "top-5 overlap > 0.2"
SHARED_KL_CRITERION = "KL < 10 % of the logit lens' max"
COSINE_CRITERION = "cosine transition"


def settling_summary(table: pd.DataFrame, transitions: dict[str, int | None] | None = None,
                     stat: str = "mean") -> pd.DataFrame:
    """Per model: where each lens settles, and the cosine phase-transition layer, on one relative-depth axis.

    A lens reads h_l (l = 0..L-1), placed at l / L. "Never below the threshold before the output" is reported as
    l = L (relative depth 1), since at h_L the lens *is* the output. The cosine transition layer t writes between
    h_t and h_(t+1), so it is placed at (t + 0.5) / L — the convention of chapter 02.

    Args:
        table: :func:`run` tables (one or more models).
        transitions: model → :func:`lmdepth.analyses.residual.cosine_transition_layer` (None: no sign change).
        stat: which average of the table to summarise (see :func:`settling_layers`).

    Returns:
        ``model, lens, criterion, layer, n_layers, rel_depth`` rows.
    """
    rows = []
    for model, t in table.groupby("model", sort=False):
        n_layers = int(t["n_layers"].iloc[0])
        lenses = [lens for lens in LENSES if lens in set(t.component)]
        logit_max = float(select(t, "kl", "logit_lens", stat=stat).max())

        def add(lens: str, criterion: str, layer: int | None) -> None:
            layer = n_layers if layer is None else layer
            rows.append(dict(model=model, lens=lens, criterion=criterion, layer=layer, n_layers=n_layers,
                             rel_depth=layer / n_layers))

        for lens in lenses:
            s = settling_layers(t, model, lens, stat=stat)
            add(lens, KL_CRITERION, s["kl"])
            add(lens, OVERLAP_CRITERION, s["overlap"])
        if "tuned_lens" in lenses:
            shared = settling_layers(t, model, "tuned_lens", kl_threshold=0.1 * logit_max, stat=stat)
            add("tuned_lens", SHARED_KL_CRITERION, shared["kl"])
        if transitions is not None:
            tr = transitions.get(model)
            rows.append(dict(model=model, lens="cosine", criterion=COSINE_CRITERION, layer=tr, n_layers=n_layers,
                             rel_depth=None if tr is None else (tr + 0.5) / n_layers))
    return pd.DataFrame(rows)


def summary_wide(summary: pd.DataFrame) -> pd.DataFrame:
    """:func:`settling_summary` as one row per model and one column per (lens, criterion): "layer (l/L)" text,
    "output" when a lens never crosses its threshold before the output, "none" when there is no cosine transition."""
    def cell(r: pd.Series) -> str:
        if pd.isna(r["layer"]):
            return "none"
        if r["lens"] != "cosine" and r["layer"] >= r["n_layers"]:
            return "output"
        return f"{int(r['layer'])} ({r['rel_depth']:.2f})"

    s = summary.assign(column=summary["lens"].str.replace("_", " ") + ": " + summary["criterion"],
                       text=summary.apply(cell, axis=1))
    wide = s.pivot(index="model", columns="column", values="text")
    wide = wide.reindex(index=list(dict.fromkeys(s["model"])), columns=list(dict.fromkeys(s["column"])))
    layers = s.groupby("model", sort=False)["n_layers"].first()
    return wide.rename_axis(columns=None).reset_index().merge(layers.rename("layers").reset_index(), on="model")


def curve_ends(curve: pd.DataFrame) -> pd.DataFrame:
    """Per model, layer means of the training curve: held-out at the start (the logit lens), held-out of the
    selected translators (each layer's lowest held-out point), and the last logged training batches."""
    out = {}
    for model, c in curve.groupby("model", sort=False):
        ho, trn = c[c.split == "held-out"], c[c.split == "train"]
        out[model] = {"held-out start": ho[ho.step == 0]["value"].mean(),
                      "held-out selected": ho.groupby("layer")["value"].min().mean(),
                      "train end": trn[trn.step == trn.step.max()]["value"].mean() if len(trn) else float("nan")}
    return pd.DataFrame.from_dict(out, orient="index")


def settled_depth(summary: pd.DataFrame, model: str, lens: str, criterion: str) -> float | None:
    """Relative depth of one row of :func:`settling_summary` (None when absent)."""
    r = summary[(summary.model == model) & (summary.lens == lens) & (summary.criterion == criterion)]
    return None if r.empty or pd.isna(r["rel_depth"].iloc[0]) else float(r["rel_depth"].iloc[0])


__all__ = [
    "ANALYSIS", "LENSES", "METRICS", "kl_divergence", "topk_overlap", "lens_metrics", "lens_stats", "prompt_lens",
    "Unembedding", "Translators", "TrainConfig", "sampled_kl", "train_translators", "fit_tuned_lens", "run",
    "run_many", "training_curve", "select", "settling_layers", "settling_summary", "settled_depth", "summary_wide",
    "curve_ends", "STATS", "KL_CRITERION", "OVERLAP_CRITERION", "SHARED_KL_CRITERION", "COSINE_CRITERION",
]
