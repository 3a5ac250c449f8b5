"""Cross-model linear maps between residual streams (paper Fig. 8; METHOD §8; chapter 06).

For a source model A and a target model B read on the same text, fit for every pair of residual boundaries
(m in A, l in B; m = 0 is the embedding output, m = L the last layer's output before the final norm) an affine map
f(h) = h W + b that predicts h_l^B from h_m^A at the same text position, and report its held-out error

    relative error(m, l) = sqrt( Σ_t ‖h_l(t) − f(h_m(t))‖² / Σ_t ‖h_l(t)‖² )      (a ratio of sums over test tokens).

How (all closed form, no SGD):

1. Positions: where every model's tokenizer ends a token at the same character offset
   (:mod:`lmdepth.data.alignment`); position 0 and special tokens are dropped. Texts are assigned whole to the test,
   validation and training splits, so neighbouring tokens never straddle two splits.
2. Residuals h_0..h_L of each model are collected once at those positions ([tokens, L+1, d] float32 in memory).
3. Sufficient statistics per split, streamed over 2048-token chunks and centred by the *training* means:
   per-layer Gram matrices X̃_mᵀX̃_m (float64 accumulators), the cross-products X̃_mᵀỸ_l of every layer pair (one
   matrix [(L_A+1)·d_A, (L_B+1)·d_B], shared by both directions A→B and B→A), and Σ‖h‖² per layer.
4. Per source layer m: one eigendecomposition of X̃_mᵀX̃_m (float64) serves every ridge strength λ and every
   target layer l: W_λ = V diag(1/(s+λ)) Vᵀ X̃_mᵀỸ, bias b = μ_Y − μ_X W. λ = α · mean eigenvalue, α per (m, l)
   chosen on the validation split. Validation and test errors follow exactly from their statistics:
   Σ‖ỹ − x̃W‖² = Σ‖ỹ‖² − 2⟨W, X̃ᵀỸ⟩ + ⟨W, X̃ᵀX̃ W⟩.

Cost: dominated by the cross-products, 2 · tokens · (L_A+1)d_A · (L_B+1)d_B flops per model pair (both
directions); minutes on a CPU against the paper's 80 GPU-days of SGD.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from lmdepth.data.alignment import (GENERAL_TEXTS, Doc, align, eligible_count, general_docs, general_text_id, interleave,
                        math_docs, token_ends)
from lmdepth.hooks.capture import _layer_output, forward_hooks
from lmdepth.data.datasets import dataset_id
from lmdepth.errors import DataError, ParameterError
from lmdepth.params import check_choice, check_range, check_type
from lmdepth.results import RunResult, RunStore
from lmdepth.runtime import environment, progress

ANALYSIS = "linear_maps"
SPLITS = ("train", "val", "test")
DEFAULT_ALPHAS = (1e-5, 1e-3, 1e-2, 1e-1, 1.0)
PRODUCT_DTYPES = {"float32": torch.float32, "float64": torch.float64}


# ---- residuals at every layer boundary ------------------------------------------------------------------------

@torch.no_grad()
def boundary_residuals(adapter: Any, input_ids: torch.Tensor) -> torch.Tensor:
    """h_0 … h_L of every position: the input of each decoder layer and the output of the last one.

    h_0 is the embedding output (Gemma's scaling included), h_L the raw last residual *before* the final norm.

    Args:
        adapter: the model's :class:`~lmdepth.model.families.ModelAdapter`.
        input_ids: [batch, tokens]. Texts of different lengths may be right-padded with any token: causal
            attention never lets a position see a later one, so padding changes nothing before it.

    Returns:
        [L + 1, batch, tokens, d_model] float32 on CPU.
    """
    n = adapter.n_layers
    store: list[torch.Tensor | None] = [None] * (n + 1)
    hooks = []
    for l, layer in enumerate(adapter.layers):
        def on_layer(mod, args, out, l=l):
            store[l] = args[0].detach()
            if l == n - 1:
                store[n] = _layer_output(out).detach()

        hooks.append((layer, on_layer))
    with forward_hooks(hooks):
        adapter.model(input_ids, logits_to_keep=1)
    return torch.stack(store).float().cpu()  # type: ignore[arg-type]


# ---- corpus plan: texts, alignment, splits ---------------------------------------------------------------------

@dataclass
class CorpusPlan:
    """Which texts each split reads and which positions of each model align.

    Attributes:
        models: model names, in the order of ``ids`` and ``positions``.
        docs: the texts read, test texts first, then validation, then training.
        ids: per doc, per model, the token ids.
        positions: per doc, per model, the aligned token indices (same length for every model).
        split_rows: split → slice of the rows (aligned positions, in doc order) of the residual arrays.
        split_docs: split → number of texts.
        eligible: per model, tokens that could align (not special, not position 0) in the texts read.
    """

    models: list[str]
    docs: list[Doc]
    ids: list[list[list[int]]]
    positions: list[list[np.ndarray]]
    split_rows: dict[str, slice]
    split_docs: dict[str, int]
    eligible: list[int]

    @property
    def n_rows(self) -> int:
        return max(s.stop for s in self.split_rows.values())

    def coverage(self) -> dict[str, float]:
        """Fraction of each model's eligible tokens that align with every other model."""
        return {m: self.n_rows / e if e else float("nan") for m, e in zip(self.models, self.eligible)}

    def record(self) -> dict[str, Any]:
        src = pd.Series([d.source for d in self.docs])
        rows = {k: s.stop - s.start for k, s in self.split_rows.items()}
        return {"aligned_tokens": rows, "texts": self.split_docs, "coverage": self.coverage(),
                "eligible_tokens": dict(zip(self.models, self.eligible)),
                "texts_by_source": src.value_counts().to_dict(), "doc_ids": [d.id for d in self.docs]}


def plan_corpus(
    tokenizers: dict[str, Any],
    docs: list[Doc],
    n_tokens: dict[str, int],
    max_tokens: dict[str, int | None] | None = None,
) -> CorpusPlan:
    """Tokenize texts in order with every tokenizer, align, and fill test → val → train up to the budgets.

    Args:
        tokenizers: model name → tokenizer (fast, with offsets).
        docs: candidate texts in reading order (see :func:`lmdepth.data.alignment.interleave`).
        n_tokens: split → minimum number of aligned positions.
        max_tokens: model name → context length (longer texts are skipped).

    Raises:
        DataError: the texts run out before the budgets are met.
    """
    models = list(tokenizers)
    chosen: list[Doc] = []
    ids_all, pos_all = [], []
    eligible = [0] * len(models)
    counts = {k: 0 for k in SPLITS}
    n_docs = {k: 0 for k in SPLITS}
    order = ("test", "val", "train")
    split_i = 0
    for doc in docs:
        while split_i < len(order) and counts[order[split_i]] >= n_tokens[order[split_i]]:
            split_i += 1
        if split_i == len(order):
            break
        toks = [token_ends(tokenizers[m], doc.text) for m in models]
        if max_tokens and any(max_tokens.get(m) and len(t[0]) > max_tokens[m] for m, t in zip(models, toks)):
            continue
        _, positions = align([t[1] for t in toks])
        if len(positions[0]) == 0:
            continue
        chosen.append(doc)
        ids_all.append([t[0] for t in toks])
        pos_all.append(positions)
        for i, t in enumerate(toks):
            eligible[i] += eligible_count(t[1])
        counts[order[split_i]] += len(positions[0])
        n_docs[order[split_i]] += 1
    short = {k: (counts[k], n_tokens[k]) for k in SPLITS if counts[k] < n_tokens[k]}
    if short:
        raise DataError(f"The texts ran out before the token budgets were met (aligned, asked): {short}. Lower "
                        "n_train_tokens / n_val_tokens / n_test_tokens, or add text (general_text, dataset).")
    rows, start = {}, 0
    for k in order:
        rows[k] = slice(start, start + counts[k])
        start += counts[k]
    return CorpusPlan(models, chosen, ids_all, pos_all, rows, n_docs, eligible)


def corpus_docs(dataset: str, general_text: str, general_fraction: float, max_doc_chars: int, seed: int) -> list[Doc]:
    """The candidate texts in reading order: general text and word problems interleaved (seeded)."""
    general = general_docs(max_doc_chars) if general_text == "python-docs" and general_fraction > 0 else []
    math = math_docs(dataset, max_doc_chars) if general_fraction < 1 else []
    return interleave(general, math, general_fraction, seed)


@torch.no_grad()
def collect(lm: Any, plan: CorpusPlan, model_index: int, batch_tokens: int = 2048, desc: str = "") -> np.ndarray:
    """Residuals h_0..h_L of one model at the plan's aligned positions, in row order.

    Consecutive texts are batched (right-padded, up to ``batch_tokens`` padded tokens per batch; see
    :func:`boundary_residuals` for why padding is harmless): fewer, larger matrix products, which suits a GPU.

    Returns:
        [rows, L + 1, d_model] float32.
    """
    out = np.empty((plan.n_rows, lm.n_layers + 1, lm.adapter.d_model), dtype=np.float32)
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    batches, cur = [], []
    for k, ids in enumerate(plan.ids):
        longest = max([len(plan.ids[j][model_index]) for j in cur] + [len(ids[model_index])])
        if cur and longest * (len(cur) + 1) > batch_tokens:
            batches.append(cur)
            cur = []
        cur.append(k)
    batches.append(cur)
    r = 0
    for batch in progress(batches, desc=desc or f"{lm.name}: residuals"):
        seqs = [plan.ids[k][model_index] for k in batch]
        width = max(len(q) for q in seqs)
        ids = torch.tensor([q + [pad] * (width - len(q)) for q in seqs], device=lm.device)
        h = boundary_residuals(lm.adapter, ids)  # [L+1, B, T, d]
        for b, k in enumerate(batch):
            p = torch.as_tensor(plan.positions[k][model_index])
            out[r : r + len(p)] = h[:, b, p].transpose(0, 1).numpy()
            r += len(p)
    assert r == plan.n_rows
    return out


# ---- closed-form ridge -----------------------------------------------------------------------------------------

def ridge_fit(x: np.ndarray, y: np.ndarray, alpha: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Affine ridge regression y ≈ x W + b in float64 (the bias is not penalised).

    λ = ``alpha`` × the mean eigenvalue of the centred Gram matrix, as in :func:`fit_maps`.

    Args:
        x: [tokens, d_in]; y: [tokens, d_out].

    Returns:
        (W [d_in, d_out], b [d_out]).
    """
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    mx, my = x.mean(0), y.mean(0)
    xc, yc = x - mx, y - my
    g = xc.T @ xc
    lam = alpha * np.trace(g) / g.shape[0]
    w = np.linalg.solve(g + lam * np.eye(g.shape[0]), xc.T @ yc) if lam > 0 else np.linalg.lstsq(xc, yc, rcond=None)[0]
    return w, my - mx @ w


def boundary_layers(n_layers: int, stride: int = 1) -> list[int]:
    """Boundaries 0, stride, 2·stride, … and always the last one (L)."""
    return sorted(set(range(0, n_layers + 1, stride)) | {n_layers})


@dataclass
class SplitStats:
    """Sufficient statistics of one split, centred by the training means.

    Attributes:
        n: tokens.
        cross: [Ls·ds, Lt·dt] Σ x̃ᵀỹ over all (source layer, target layer) blocks.
        gram_s: [Ls, ds, ds] float64 Σ x̃_mᵀ x̃_m.  gram_t: [Lt, dt, dt] the same for the target side.
        raw_s, raw_t: [Ls], [Lt] float64 Σ ‖h‖² (uncentred: the denominators of the relative error).
    """

    n: int
    cross: torch.Tensor
    gram_s: torch.Tensor
    gram_t: torch.Tensor
    raw_s: torch.Tensor
    raw_t: torch.Tensor


def split_stats(
    src: np.ndarray, tgt: np.ndarray, rows: slice, src_layers: list[int], tgt_layers: list[int],
    mu_s: torch.Tensor, mu_t: torch.Tensor, perm: np.ndarray | None = None, chunk: int = 2048,
    product_dtype: str = "float32", device: str = "cpu",
) -> SplitStats:
    """Stream one split's statistics over chunks of tokens.

    Args:
        src, tgt: [rows, L+1, d] residual arrays (the same array for a self-map).
        rows: the split's rows.
        src_layers, tgt_layers: boundaries used on each side.
        mu_s, mu_t: [len(layers), d] float32 training means of those boundaries.
        perm: optional permutation of the split's source rows (shuffled-pairs control).
        chunk: tokens per chunk.
        product_dtype: dtype of the chunk products (the Gram accumulators are float64 either way).
        device: where the products run.
    """
    dt = PRODUCT_DTYPES[product_dtype]
    n = rows.stop - rows.start
    ds, dtg = src.shape[2], tgt.shape[2]
    ls, lt = len(src_layers), len(tgt_layers)
    same = src is tgt and list(src_layers) == list(tgt_layers) and perm is None
    cross = torch.zeros(ls * ds, lt * dtg, dtype=dt, device=device)
    gram_s = torch.zeros(ls, ds, ds, dtype=torch.float64, device=device)
    gram_t = gram_s if same else torch.zeros(lt, dtg, dtg, dtype=torch.float64, device=device)
    raw_s = torch.zeros(ls, dtype=torch.float64, device=device)
    raw_t = raw_s if same else torch.zeros(lt, dtype=torch.float64, device=device)
    mu_s, mu_t = mu_s.to(device), mu_t.to(device)
    src_rows = np.arange(rows.start, rows.stop)
    if perm is not None:
        src_rows = src_rows[perm]
    for c0 in range(0, n, chunk):
        c1 = min(n, c0 + chunk)
        if perm is None:
            xs_raw = torch.from_numpy(src[rows.start + c0 : rows.start + c1][:, src_layers]).to(device)
        else:
            xs_raw = torch.from_numpy(src[src_rows[c0:c1]][:, src_layers]).to(device)
        raw_s += (xs_raw.norm(dim=-1).double() ** 2).sum(0)
        xs = (xs_raw - mu_s).to(dt)
        del xs_raw
        gram_s += torch.bmm(xs.permute(1, 2, 0), xs.permute(1, 0, 2)).double()
        xf = xs.reshape(c1 - c0, -1)
        if same:
            # symmetric: fill block rows i, columns from block i on, then mirror
            for i in range(ls):
                cross[i * ds : (i + 1) * ds, i * ds :] += xf[:, i * ds : (i + 1) * ds].T @ xf[:, i * ds :]
            continue
        yt_raw = torch.from_numpy(tgt[rows.start + c0 : rows.start + c1][:, tgt_layers]).to(device)
        raw_t += (yt_raw.norm(dim=-1).double() ** 2).sum(0)
        yt = (yt_raw - mu_t).to(dt)
        del yt_raw
        gram_t += torch.bmm(yt.permute(1, 2, 0), yt.permute(1, 0, 2)).double()
        cross.addmm_(xf.T, yt.reshape(c1 - c0, -1))
    if same:
        upper = torch.triu(torch.ones(ls, ls, dtype=torch.bool, device=device), diagonal=1)
        for i, j in upper.nonzero().tolist():
            cross[j * ds : (j + 1) * ds, i * ds : (i + 1) * ds] = cross[i * ds : (i + 1) * ds, j * ds : (j + 1) * ds].T
    return SplitStats(n, cross, gram_s, gram_t, raw_s, raw_t)


def _oriented(st: SplitStats, reverse: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any]:
    """(gram of the source side, gram of the target side, raw target Σ‖y‖², source-block getter)."""
    if not reverse:
        ds = st.gram_s.shape[1]
        return st.gram_s, st.gram_t, st.raw_t, lambda i: st.cross[i * ds : (i + 1) * ds]
    dt = st.gram_t.shape[1]
    return st.gram_t, st.gram_s, st.raw_s, lambda i: st.cross[:, i * dt : (i + 1) * dt].T


@dataclass
class MapFit:
    """Errors of every (source boundary, target boundary) map of one direction.

    Attributes:
        rel_error: [Ls, Lt] test relative error sqrt(Σ‖y − ŷ‖² / Σ‖y‖²).
        fvu: [Ls, Lt] test fraction of variance unexplained Σ‖y − ŷ‖² / Σ‖y − μ_train‖².
        val_rel_error: [Ls, Lt] validation relative error of the chosen ridge strength.
        alpha: [Ls, Lt] chosen α (λ = α · mean eigenvalue of the source Gram).
        baseline: [Lt] test relative error of predicting the training mean (a map that ignores the source).
        src_layers, tgt_layers: the boundaries of the rows and columns.
    """

    rel_error: np.ndarray
    fvu: np.ndarray
    val_rel_error: np.ndarray
    alpha: np.ndarray
    baseline: np.ndarray
    src_layers: list[int]
    tgt_layers: list[int]

    def arrays(self) -> dict[str, np.ndarray]:
        return {k: np.asarray(v) for k, v in self.__dict__.items()}

    @classmethod
    def from_arrays(cls, a: dict[str, np.ndarray]) -> "MapFit":
        return cls(**{k: (a[k].tolist() if k.endswith("layers") else a[k]) for k in cls.__dataclass_fields__})


def _block_sum(m: torch.Tensor, lt: int) -> torch.Tensor:
    """[d_src, Lt·d_tgt] → [Lt]: the sum over each target layer's block of columns."""
    return m.reshape(m.shape[0], lt, -1).sum((0, 2))


def fit_direction(stats: dict[str, SplitStats], reverse: bool, alphas: tuple[float, ...] | list[float],
                  src_layers: list[int], tgt_layers: list[int], product_dtype: str = "float32") -> MapFit:
    """Fit every (m, l) map of one direction from the three splits' statistics.

    ``reverse=False`` maps the statistics' source side onto its target side; ``True`` the other way round. The
    eigendecompositions are float64; the matrix products with the [d, (L+1)·d] statistics run in
    ``product_dtype`` and every per-layer sum is accumulated in float64.
    """
    pdt = PRODUCT_DTYPES[product_dtype]
    tr, va, te = (_oriented(stats[k], reverse) for k in SPLITS)
    g_tr, _, _, c_tr = tr
    g_va, gt_va, raw_va, c_va = va
    g_te, gt_te, raw_te, c_te = te
    ls, lt = g_tr.shape[0], gt_va.shape[0]
    syy_va = torch.diagonal(gt_va, dim1=1, dim2=2).sum(-1)  # Σ‖ỹ‖² per target layer (train-centred)
    syy_te = torch.diagonal(gt_te, dim1=1, dim2=2).sum(-1)
    out = {k: np.zeros((ls, lt)) for k in ("rel_error", "fvu", "val_rel_error", "alpha")}
    tiny = torch.finfo(torch.float64).tiny

    def numerator(syy: torch.Tensor, b: torch.Tensor, c: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        # Σ‖ỹ − x̃W‖² = Σ‖ỹ‖² − 2⟨W, X̃ᵀỸ⟩ + ⟨W, X̃ᵀX̃ W⟩, per target layer, all in the source eigenbasis
        return syy - 2 * _block_sum(b * c, lt).double() + _block_sum(b * (g @ b), lt).double()

    for i in range(ls):
        # λ is relative to the mean eigenvalue; dividing by it first also keeps LAPACK fast (the raw Grams span
        # many orders of magnitude, and eigh on them was ~10× slower, likely from denormal intermediates)
        scale = (torch.diagonal(g_tr[i]).sum() / g_tr[i].shape[0]).clamp_min(tiny)
        s, v64 = torch.linalg.eigh(g_tr[i] / scale)
        s = s.clamp_min(0) * scale
        v = v64.to(pdt)
        a = v.T @ c_tr(i).to(pdt)  # [ds, Lt·dt]: Vᵀ X̃ᵀỸ
        cv, gv = v.T @ c_va(i).to(pdt), (v64.T @ g_va[i] @ v64).to(pdt)
        best = torch.full((lt,), math.inf, dtype=torch.float64, device=a.device)
        best_b = torch.zeros_like(a).reshape(a.shape[0], lt, -1)
        best_alpha = torch.zeros(lt, dtype=torch.float64)
        for alpha in alphas:
            b = a / (s + alpha * scale).to(pdt)[:, None]  # W = V b
            num = numerator(syy_va, b, cv, gv)
            better = num < best
            best = torch.where(better, num, best)
            best_b[:, better] = b.reshape(b.shape[0], lt, -1)[:, better]
            best_alpha[better.cpu()] = alpha
        del cv, gv
        bb = best_b.reshape(a.shape)
        ct, gt = v.T @ c_te(i).to(pdt), (v64.T @ g_te[i] @ v64).to(pdt)
        num_te = numerator(syy_te, bb, ct, gt).clamp_min(0)
        out["rel_error"][i] = (num_te / raw_te).sqrt().cpu().numpy()
        out["fvu"][i] = (num_te / syy_te.clamp_min(tiny)).cpu().numpy()
        out["val_rel_error"][i] = (best.clamp_min(0) / raw_va).sqrt().cpu().numpy()
        out["alpha"][i] = best_alpha.numpy()
    baseline = (syy_te / raw_te).sqrt().cpu().numpy()
    return MapFit(out["rel_error"], out["fvu"], out["val_rel_error"], out["alpha"], baseline,
                  list(src_layers), list(tgt_layers))


def train_means(x: np.ndarray, rows: slice, layers: list[int], chunk: int = 4096) -> torch.Tensor:
    """[len(layers), d] float32 mean over the training rows (accumulated in float64)."""
    acc = np.zeros((len(layers), x.shape[2]))
    for c0 in range(rows.start, rows.stop, chunk):
        acc += x[c0 : min(rows.stop, c0 + chunk)][:, layers].sum(0, dtype=np.float64)
    return torch.from_numpy(acc / (rows.stop - rows.start)).float()


def fit_maps(
    src: np.ndarray, tgt: np.ndarray, split_rows: dict[str, slice], src_layers: list[int] | None = None,
    tgt_layers: list[int] | None = None, alphas: tuple[float, ...] | list[float] = DEFAULT_ALPHAS,
    both_directions: bool = False, shuffle_seed: int | None = None, product_dtype: str = "float32",
    device: str = "cpu", chunk: int = 2048, max_stats_gb: float | None = None,
) -> tuple[MapFit, MapFit | None]:
    """All layer-pair maps src → tgt (and tgt → src from the same statistics when ``both_directions``).

    Args:
        src, tgt: [rows, L+1, d] residuals at the same aligned positions (row r of both is the same text position).
        split_rows: "train"/"val"/"test" → rows.
        src_layers, tgt_layers: boundaries to use (default: all).
        alphas: ridge strengths, relative to the mean eigenvalue of the source Gram; chosen per (m, l) on "val".
        both_directions: also fit tgt → src (no extra pass over the data when the statistics fit the budget).
        shuffle_seed: pair every target token with a random source token of the same split (control).
        product_dtype, device, chunk: see :func:`split_stats`.
        max_stats_gb: memory budget of the three splits' cross-product matrices. Above it, the target boundaries
            are processed in groups (one more pass over the data per group, and each direction separately).
    """
    src_layers = list(range(src.shape[1])) if src_layers is None else list(src_layers)
    tgt_layers = list(range(tgt.shape[1])) if tgt_layers is None else list(tgt_layers)
    tr = split_rows["train"]
    if tr.stop - tr.start < 2:
        raise DataError("The training split needs at least 2 tokens.")
    itemsize = torch.tensor([], dtype=PRODUCT_DTYPES[product_dtype]).element_size()
    per_target_layer = 3 * len(src_layers) * src.shape[2] * tgt.shape[2] * itemsize
    budget = math.inf if max_stats_gb is None else max_stats_gb * 2**30
    kw = dict(alphas=alphas, shuffle_seed=shuffle_seed, product_dtype=product_dtype, device=device, chunk=chunk)
    if per_target_layer * len(tgt_layers) <= budget:
        return _fit_group(src, tgt, split_rows, src_layers, tgt_layers, both_directions=both_directions, **kw)
    fwd = _fit_grouped(src, tgt, split_rows, src_layers, tgt_layers, budget, **kw)
    bwd = None
    if both_directions:
        # the shuffled control permutes the *source* rows; the reverse direction never needs it (main maps only)
        bwd = _fit_grouped(tgt, src, split_rows, tgt_layers, src_layers, budget, **kw)
    return fwd, bwd


def _fit_group(src, tgt, split_rows, src_layers, tgt_layers, alphas, both_directions, shuffle_seed, product_dtype,
               device, chunk) -> tuple[MapFit, MapFit | None]:
    tr = split_rows["train"]
    mu_s, mu_t = train_means(src, tr, src_layers), train_means(tgt, tr, tgt_layers)
    stats = {}
    for k in SPLITS:
        rows = split_rows[k]
        perm = None
        if shuffle_seed is not None:
            perm = np.random.default_rng([shuffle_seed, SPLITS.index(k)]).permutation(rows.stop - rows.start)
        stats[k] = split_stats(src, tgt, rows, src_layers, tgt_layers, mu_s, mu_t, perm, chunk, product_dtype, device)
    fwd = fit_direction(stats, False, alphas, src_layers, tgt_layers, product_dtype)
    bwd = fit_direction(stats, True, alphas, tgt_layers, src_layers, product_dtype) if both_directions else None
    return fwd, bwd


def _fit_grouped(src, tgt, split_rows, src_layers, tgt_layers, budget, **kw) -> MapFit:
    """One direction, target boundaries in groups whose cross-products fit the memory budget."""
    itemsize = torch.tensor([], dtype=PRODUCT_DTYPES[kw["product_dtype"]]).element_size()
    per_layer = 3 * len(src_layers) * src.shape[2] * tgt.shape[2] * itemsize
    size = max(1, int(budget // per_layer))
    parts = [_fit_group(src, tgt, split_rows, src_layers, tgt_layers[g : g + size], both_directions=False, **kw)[0]
             for g in range(0, len(tgt_layers), size)]
    cat = {k: np.concatenate([getattr(p, k) for p in parts], axis=-1)
           for k in ("rel_error", "fvu", "val_rel_error", "alpha", "baseline")}
    return MapFit(cat["rel_error"], cat["fvu"], cat["val_rel_error"], cat["alpha"], cat["baseline"],
                  list(src_layers), list(tgt_layers))


# ---- summaries -------------------------------------------------------------------------------------------------

def best_matches(err: np.ndarray, src_layers: list[int], tgt_layers: list[int], n_src: int, n_tgt: int) -> pd.DataFrame:
    """Per source boundary (row), the target boundary with the lowest error, with relative depths m/L_A, l/L_B."""
    j = np.argmin(err, axis=1)
    d = pd.DataFrame({"source_layer": src_layers, "best_target_layer": np.asarray(tgt_layers)[j],
                      "error": err[np.arange(len(j)), j]})
    d["source_depth"] = d.source_layer / n_src
    d["target_depth"] = d.best_target_layer / n_tgt
    d["offset"] = d.target_depth - d.source_depth
    return d


def best_sources(err: np.ndarray, src_layers: list[int], tgt_layers: list[int], n_src: int, n_tgt: int) -> pd.DataFrame:
    """Per target boundary (column), the source boundary that predicts it best.

    Unlike :func:`best_matches` this compares errors of the *same* target, so a target boundary that is easy to
    predict from anything (e.g. mostly a constant direction) cannot attract every row's best match.
    """
    i = np.argmin(err, axis=0)
    d = pd.DataFrame({"target_layer": tgt_layers, "best_source_layer": np.asarray(src_layers)[i],
                      "error": err[i, np.arange(len(i))]})
    d["source_depth"] = d.best_source_layer / n_src
    d["target_depth"] = d.target_layer / n_tgt
    d["offset"] = d.target_depth - d.source_depth
    return d


def diagonal_summary(best: pd.DataFrame) -> dict[str, float]:
    """How close best matches (:func:`best_matches` or :func:`best_sources`) lie to the equal-relative-depth line.

    Returns:
        ``corr``: Pearson correlation of source and best-target relative depth (NaN if either is constant);
        ``mean_abs_offset``: mean |l*/L_B − m/L_A|; ``max_abs_offset``.
    """
    a, b = best.source_depth.to_numpy(), best.target_depth.to_numpy()
    corr = float(np.corrcoef(a, b)[0, 1]) if a.std() > 0 and b.std() > 0 else float("nan")
    off = np.abs(best.offset.to_numpy())
    return {"corr": corr, "mean_abs_offset": float(off.mean()), "max_abs_offset": float(off.max())}


def map_table(fit: MapFit, label: str, kind: str, source: str, target: str, n_src: int, n_tgt: int) -> pd.DataFrame:
    """Tidy rows: one per (source boundary, target boundary, metric), plus the mean-only baseline per target."""
    rows = []
    metrics = {"relative_error": fit.rel_error, "unexplained_variance": fit.fvu,
               "val_relative_error": fit.val_rel_error, "ridge_alpha": fit.alpha}
    base = dict(map=label, kind=kind, source=source, target=target, n_source_layers=n_src, n_target_layers=n_tgt)
    for i, m in enumerate(fit.src_layers):
        for j, l in enumerate(fit.tgt_layers):
            for name, arr in metrics.items():
                rows.append({**base, "source_layer": m, "target_layer": l, "source_depth": m / n_src,
                             "target_depth": l / n_tgt, "metric": name, "value": float(arr[i, j])})
    for j, l in enumerate(fit.tgt_layers):
        rows.append({**base, "source_layer": -1, "target_layer": l, "source_depth": np.nan, "target_depth": l / n_tgt,
                     "metric": "mean_baseline_error", "value": float(fit.baseline[j])})
    return pd.DataFrame(rows)


def error_matrix(table: pd.DataFrame, label: str, metric: str = "relative_error") -> pd.DataFrame:
    """[source boundary × target boundary] matrix of one map from the tidy table."""
    t = table[(table["map"] == label) & (table.metric == metric)]
    return t.pivot(index="source_layer", columns="target_layer", values="value").sort_index().sort_index(axis=1)


def summarize_map(table: pd.DataFrame, label: str) -> dict[str, Any]:
    """Best matches per row (source boundary) and per column (target boundary) and how close each set lies to the
    equal-relative-depth line (``row_corr``, ``row_mean_abs_offset``, …, ``col_corr``, …), from the tidy table."""
    t = table[table["map"] == label]
    n_src, n_tgt = int(t.n_source_layers.iloc[0]), int(t.n_target_layers.iloc[0])
    e = error_matrix(table, label)
    args = (e.to_numpy(), list(e.index), list(e.columns), n_src, n_tgt)
    rows, cols = best_matches(*args), best_sources(*args)
    return {"map": label, "kind": t.kind.iloc[0], "source": t.source.iloc[0], "target": t.target.iloc[0],
            "n_source_layers": n_src, "n_target_layers": n_tgt,
            **{f"row_{k}": v for k, v in diagonal_summary(rows).items()},
            **{f"col_{k}": v for k, v in diagonal_summary(cols).items()},
            "best_rows": rows.to_dict(orient="list"), "best_cols": cols.to_dict(orient="list")}


# ---- the run ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MapSpec:
    """One map family to fit: ``kind`` is "main" (both directions), "self" or "shuffled"."""

    kind: str
    source: str
    target: str
    stride: int = 1

    @property
    def labels(self) -> list[str]:
        if self.kind == "main":
            return [f"{self.source} → {self.target}", f"{self.target} → {self.source}"]
        suffix = " (self-map)" if self.kind == "self" else " (shuffled pairs)"
        return [f"{self.source} → {self.target}{suffix}"]


def map_specs(model_name: str, compare_models: list[str], self_map_model: str, shuffle_control: bool,
              control_stride: int, layer_stride: int = 1, all_pairs: bool = False) -> list[MapSpec]:
    """The maps of one run: ``model_name`` with each compare model (and, with ``all_pairs``, every pair of compare
    models too), both directions each, then the controls."""
    specs = [MapSpec("main", model_name, c, layer_stride) for c in compare_models]
    if all_pairs:
        specs += [MapSpec("main", a, b, layer_stride) for i, a in enumerate(compare_models) for b in compare_models[i + 1:]]
    if self_map_model:
        specs.append(MapSpec("self", self_map_model, self_map_model, control_stride))
    if shuffle_control and compare_models:
        specs.append(MapSpec("shuffled", model_name, compare_models[0], control_stride))
    return specs


def check_params(**p: Any) -> None:
    """Type and range checks of :func:`run`'s parameters (clear errors before anything loads)."""
    check_type("model_name", p["model_name"], str)
    check_type("compare_models", p["compare_models"], list)
    for m in p["compare_models"]:
        check_type("compare_models[]", m, str)
    others = [m for m in p["compare_models"] if m != p["model_name"]]
    if not others:
        raise ParameterError("compare_models must name at least one model other than model_name: the maps go "
                             f"between two models (got model_name={p['model_name']!r}, compare_models="
                             f"{p['compare_models']!r}). Example: compare_models: [gemma3-270m].")
    check_type("all_pairs", p["all_pairs"], bool)
    check_type("self_map_model", p["self_map_model"], str)
    check_type("shuffle_control", p["shuffle_control"], bool)
    check_type("dataset", p["dataset"], str)
    check_choice("general_text", p["general_text"], GENERAL_TEXTS)
    check_type("general_fraction", p["general_fraction"], float)
    check_range("general_fraction", p["general_fraction"], 0.0, 1.0)
    if p["general_text"] == "none" and p["general_fraction"] > 0:
        raise ParameterError("general_fraction must be 0 when general_text is 'none'.")
    for k, lo in (("n_train_tokens", 2), ("n_val_tokens", 1), ("n_test_tokens", 1)):
        check_type(k, p[k], int)
        check_range(k, p[k], lo, 10_000_000)
    check_type("max_doc_chars", p["max_doc_chars"], int)
    check_range("max_doc_chars", p["max_doc_chars"], 50, 100_000)
    check_type("ridge_alphas", p["ridge_alphas"], list)
    # α = 0 would divide by the zero eigenvalues of a rank-deficient Gram (NaN errors): use a tiny α instead
    if not p["ridge_alphas"] or not all(isinstance(a, (int, float)) and not isinstance(a, bool) and a > 0
                                        for a in p["ridge_alphas"]):
        raise ParameterError(f"ridge_alphas must be a non-empty list of numbers > 0 (e.g. 1e-8 for almost no "
                             f"regularisation), got {p['ridge_alphas']!r}.")
    for k in ("layer_stride", "control_stride"):
        check_type(k, p[k], int)
        check_range(k, p[k], 1, 1000)
    check_choice("product_dtype", p["product_dtype"], list(PRODUCT_DTYPES))
    check_type("max_stats_gb", p["max_stats_gb"], float)
    check_range("max_stats_gb", p["max_stats_gb"], 0.001, 1e6)
    check_type("seed", p["seed"], int)
    check_type("device", p["device"], str)
    check_choice("dtype", p["dtype"], ["float32", "bfloat16", "float16"])
    check_type("use_cache", p["use_cache"], bool)


def _load_average() -> float | None:
    import os

    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _tokenizer(name: str) -> tuple[Any, int | None]:
    from transformers import AutoConfig, AutoTokenizer

    from lmdepth.model.registry import resolve_model_path

    path = resolve_model_path(name)[0]
    cfg = AutoConfig.from_pretrained(path)
    return AutoTokenizer.from_pretrained(path), getattr(cfg, "max_position_embeddings", None)


def run(
    model_name: str = "smollm2-135m",
    compare_models: list[str] | None = None,
    all_pairs: bool = True,
    self_map_model: str = "gemma3-270m",
    shuffle_control: bool = True,
    dataset: str = "gsm8k",
    general_text: str = "python-docs",
    general_fraction: float = 0.5,
    n_train_tokens: int = 12000,
    n_val_tokens: int = 4000,
    n_test_tokens: int = 20000,
    max_doc_chars: int = 1200,
    ridge_alphas: list[float] | None = None,
    layer_stride: int = 1,
    control_stride: int = 2,
    product_dtype: str = "float32",
    max_stats_gb: float = 6.0,
    seed: int = 0,
    device: str = "cpu",
    dtype: str = "float32",
    results_dir: str | Path = "results",
    use_cache: bool = True,
) -> RunResult:
    """Fit every layer-pair linear map between ``model_name`` and each of ``compare_models`` (both directions),
    plus the controls, or load the run from the cache.

    Args:
        model_name: one model of every pair (packaged short name, hub id or local directory).
        compare_models: the other model of each pair.
        all_pairs: also map every pair of ``compare_models`` onto each other (every pair of the model set).
        self_map_model: model mapped onto itself (control: the identity line); "" to skip.
        shuffle_control: also fit ``model_name`` → ``compare_models[0]`` on shuffled token pairs.
        dataset: word problems ("gsm8k", "math" — train split — or a JSONL file).
        general_text: "python-docs" (Python language reference shipped with CPython, PSF License) or "none".
        general_fraction: share of the general text in every split, in characters.
        n_train_tokens, n_val_tokens, n_test_tokens: minimum aligned positions per split (whole texts are added
            until each is reached).
        max_doc_chars: texts are cut to this many characters.
        ridge_alphas: ridge strengths relative to the mean eigenvalue of the source Gram; chosen per (m, l) on the
            validation split.
        layer_stride: the main maps use every ``layer_stride``-th boundary (and the last); 1 = all of them.
        control_stride: the controls use every ``control_stride``-th boundary (and the last).
        product_dtype: dtype of the streamed products ("float32" is 2× faster on CPU; solves are float64).
        max_stats_gb: memory budget of the cross-product statistics; above it target layers go in groups
            (slower: more passes over the data). The residuals themselves take tokens · Σ(L+1)·d · 4 bytes.
        seed: seed of the text order and of the shuffled pairs.
        device, dtype: where and how the models run (the statistics use the same device).
        results_dir, use_cache: results cache.

    Returns:
        Tidy table (``map, kind, source, target, source_layer, target_layer, n_source_layers, n_target_layers,
        source_depth, target_depth, metric, value``) and the sidecar (corpus, coverage, summaries, timings).
    """
    compare_models = ["gemma3-270m"] if compare_models is None else list(compare_models)
    ridge_alphas = list(DEFAULT_ALPHAS) if ridge_alphas is None else list(ridge_alphas)
    check_params(**{k: v for k, v in locals().items() if k != "results_dir"})
    compare_models = [m for m in dict.fromkeys(compare_models) if m != model_name]
    specs = map_specs(model_name, compare_models, self_map_model, shuffle_control, control_stride, layer_stride,
                      all_pairs)
    models = list(dict.fromkeys([model_name, *compare_models] + ([self_map_model] if self_map_model else [])))
    key_params = dict(compare_models=compare_models, self_map_model=self_map_model, shuffle_control=shuffle_control,
                      **({"all_pairs": True} if all_pairs and len(compare_models) > 1 else {}),
                      dataset=dataset_id(dataset), general_text=general_text, general_fraction=general_fraction,
                      n_train_tokens=n_train_tokens, n_val_tokens=n_val_tokens, n_test_tokens=n_test_tokens,
                      max_doc_chars=max_doc_chars, ridge_alphas=ridge_alphas, layer_stride=layer_stride,
                      control_stride=control_stride,
                      product_dtype=product_dtype, seed=seed, dtype=dtype)
    if general_text == "python-docs" and general_fraction > 0:
        key_params["general_text_id"] = general_text_id()
    store = RunStore(results_dir, ANALYSIS, model_name, key_params)
    if use_cache and store.complete:
        return store.load()
    if not use_cache:
        store.clear()

    timings: dict[str, float] = {}
    t0, cpu0 = time.perf_counter(), time.process_time()
    load_before = _load_average()
    import gc

    from lmdepth.model.registry import load_model

    # The corpus is planned with the tokenizers alone; then one model at a time is loaded, its residuals collected
    # and the model released, so peak memory is one model plus the residuals (the paper profile maps 1.5B ↔ 14B).
    toks = {m: _tokenizer(m) for m in models}
    timings["load_tokenizers"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    docs = corpus_docs(dataset, general_text, general_fraction, max_doc_chars, seed)
    plan = plan_corpus({m: tok for m, (tok, _) in toks.items()}, docs,
                       {"train": n_train_tokens, "val": n_val_tokens, "test": n_test_tokens},
                       {m: max_len for m, (_, max_len) in toks.items()})
    timings["tokenize_and_align"] = time.perf_counter() - t1

    fits: dict[str, MapFit] = {}
    for spec in specs:
        for label in spec.labels:
            cached = store.load_item(label)
            if cached is not None:
                fits[label] = MapFit.from_arrays(cached)

    residuals: dict[str, np.ndarray] = {}
    provenance: dict[str, dict[str, Any]] = {}
    needed = {m for s in specs if any(l not in fits for l in s.labels) for m in (s.source, s.target)}
    for m in models:
        t1 = time.perf_counter()
        lm = load_model(m, device=device, dtype=dtype)
        provenance[m] = lm.provenance()
        if m in needed:
            residuals[m] = collect(lm, plan, models.index(m))
            timings[f"residuals {m}"] = time.perf_counter() - t1
        del lm
        gc.collect()

    n_layers = {m: provenance[m]["n_layers"] for m in models}
    for spec in specs:
        if all(l in fits for l in spec.labels):
            continue
        t1 = time.perf_counter()
        a, b = residuals[spec.source], residuals[spec.target]
        sl = boundary_layers(n_layers[spec.source], spec.stride)
        tl = boundary_layers(n_layers[spec.target], spec.stride)
        fwd, bwd = fit_maps(a, b, plan.split_rows, sl, tl, ridge_alphas, both_directions=spec.kind == "main",
                            shuffle_seed=seed if spec.kind == "shuffled" else None, product_dtype=product_dtype,
                            device=device, max_stats_gb=max_stats_gb)
        for label, fit in zip(spec.labels, (fwd, bwd)):
            fits[label] = fit
            store.save_item(label, fit.arrays())
        timings[f"fit {spec.kind} {spec.source}→{spec.target}"] = time.perf_counter() - t1
    residuals.clear()

    tables = []
    for spec in specs:
        ends = [(spec.source, spec.target), (spec.target, spec.source)]
        for label, (s, t) in zip(spec.labels, ends):
            tables.append(map_table(fits[label], label, spec.kind, s, t, n_layers[s], n_layers[t]))
    table = pd.concat(tables, ignore_index=True)
    timings["total"] = time.perf_counter() - t0
    cpu_total = time.process_time() - cpu0
    meta = {
        "analysis": ANALYSIS,
        "parameters": {"model_name": model_name, **key_params, "device": device},
        "models": provenance,
        "corpus": {"general_text": general_text_id() if general_text == "python-docs" else None,
                   "dataset": dataset, **plan.record()},
        "maps": [{"labels": s.labels, "kind": s.kind, "source": s.source, "target": s.target, "stride": s.stride}
                 for s in specs],
        "summaries": {label: {k: v for k, v in summarize_map(table, label).items() if not k.startswith("best")}
                      for s in specs for label in s.labels},
        "timings_s": {k: round(v, 2) for k, v in timings.items()},
        "environment": environment(),
        "wall_time_s": round(timings["total"], 2),
        # CPU time of this process (all threads): fairer than wall time on a shared machine
        "cpu_time_s": round(cpu_total, 2),
        # 1-minute load average of the machine before and after: wall times on a busy machine are not comparable
        "load_average": [load_before, _load_average()],
    }
    return store.finalize(table, meta)


# ---- charts ----------------------------------------------------------------------------------------------------
# (Builders take the tidy table and return altair charts; they compute nothing but the per-row argmin.)

def map_heatmap(table: pd.DataFrame, label: str, size: int = 260, max_error: float = 1.0,
                normalized: bool = False) -> Any:
    """Error over (source boundary ↑, target boundary →), with relative-depth axes on top and right, the
    equal-relative-depth line (dashed white), the best target of each row (red dots) and the best source of each
    column (white diamonds).

    ``normalized=False`` shows the relative error (the paper's metric); ``True`` the error relative to the
    mean-only predictor's, sqrt(fraction of variance unexplained), which removes each target boundary's own scale.
    """
    import altair as alt

    metric = "unexplained_variance" if normalized else "relative_error"
    t = table[(table["map"] == label) & (table.metric == metric)].copy()
    if normalized:
        t["value"] = np.sqrt(t["value"])
    n_src, n_tgt = int(t.n_source_layers.iloc[0]), int(t.n_target_layers.iloc[0])
    src, tgt = t.source.iloc[0], t.target.iloc[0]
    step_s = np.diff(sorted(t.source_layer.unique())).min() if t.source_layer.nunique() > 1 else 1
    step_t = np.diff(sorted(t.target_layer.unique())).min() if t.target_layer.nunique() > 1 else 1
    # Only (m, l, error) per cell go into the chart; cell edges and relative depths are derived in Vega (with
    # six maps and their normalized copies, storing them per cell put chapter 06 over the notebook size limit).
    d = pd.DataFrame({"m": t.source_layer, "l": t.target_layer, "e": t.value.round(4)})
    xs = alt.Scale(domain=[-step_t / 2, n_tgt + step_t / 2], nice=False, zero=False)
    ys = alt.Scale(domain=[-step_s / 2, n_src + step_s / 2], nice=False, zero=False)
    x_title, y_title = f"Target boundary l ({tgt})", f"Source boundary m ({src})"
    c_title = "Error / mean-only error" if normalized else "Relative error"
    rects = alt.Chart(d).transform_calculate(
        ms=f"datum.m - {step_s / 2}", me=f"datum.m + {step_s / 2}", ls=f"datum.l - {step_t / 2}",
        le=f"datum.l + {step_t / 2}", rm=f"datum.m / {n_src}", rl=f"datum.l / {n_tgt}",
    ).mark_rect().encode(
        x=alt.X("ls:Q", scale=xs, title=x_title, axis=alt.Axis(grid=False)), x2="le:Q",
        y=alt.Y("ms:Q", scale=ys, title=y_title, axis=alt.Axis(grid=False)), y2="me:Q",
        color=alt.Color("e:Q", title=c_title,
                        scale=alt.Scale(scheme="viridis", domain=[0, max_error], clamp=True)),
        tooltip=[alt.Tooltip("m:Q", title=f"source m ({src})"), alt.Tooltip("rm:Q", format=".3f", title="m / L_source"),
                 alt.Tooltip("l:Q", title=f"target l ({tgt})"), alt.Tooltip("rl:Q", format=".3f", title="l / L_target"),
                 alt.Tooltip("e:Q", format=".3f", title=c_title.lower())],
    )
    line = alt.Chart(pd.DataFrame({"l": [0, n_tgt], "m": [0, n_src]})).mark_line(
        color="white", strokeDash=[5, 4], strokeWidth=2).encode(x=alt.X("l:Q", scale=xs), y=alt.Y("m:Q", scale=ys))
    e = error_matrix(table, label)  # the argmins are the same for both metrics within a column, not within a row
    args = (e.to_numpy(), list(e.index), list(e.columns), n_src, n_tgt)
    rows, cols = best_matches(*args), best_sources(*args)
    b = pd.DataFrame({"m": rows.source_layer, "l": rows.best_target_layer, "kind": "best target of the row"})
    c = pd.DataFrame({"m": cols.best_source_layer, "l": cols.target_layer, "kind": "best source of the column"})
    marks = []
    for data, shape, fill in ((b, "circle", "#e45756"), (c, "diamond", "white")):
        marks.append(alt.Chart(data).mark_point(shape=shape, color=fill, filled=True, size=40, stroke="black",
                                                strokeWidth=0.6).encode(
            x=alt.X("l:Q", scale=xs), y=alt.Y("m:Q", scale=ys),
            tooltip=[alt.Tooltip("kind:N", title="best match"), alt.Tooltip("m:Q", title="source m"),
                     alt.Tooltip("l:Q", title="target l")]))
    main = alt.layer(rects, line, *marks)
    # relative-depth axes: an invisible layer with its own scales mapping l/L and m/L onto the same pixels
    rel = alt.Chart(pd.DataFrame({"r": [0.0, 1.0]})).mark_point(opacity=0).encode(
        x=alt.X("r:Q", scale=alt.Scale(domain=[-step_t / 2 / n_tgt, 1 + step_t / 2 / n_tgt], nice=False, zero=False),
                axis=alt.Axis(orient="top", title="Target relative depth l / L", grid=False)),
        y=alt.Y("r:Q", scale=alt.Scale(domain=[-step_s / 2 / n_src, 1 + step_s / 2 / n_src], nice=False, zero=False),
                axis=alt.Axis(orient="right", title="Source relative depth m / L", grid=False)))
    return alt.layer(main, rel).resolve_scale(x="independent", y="independent").properties(
        width=size, height=size, title=label)


def map_heatmaps(table: pd.DataFrame, labels: list[str], size: int = 260, max_error: float = 1.0,
                 normalized: bool = False) -> Any:
    """Several :func:`map_heatmap` side by side with one colour scale."""
    import altair as alt

    charts = [map_heatmap(table, lab, size, max_error, normalized) for lab in labels]
    return alt.hconcat(*charts).resolve_scale(color="shared")


def floor_lines(table: pd.DataFrame, label: str, width: int = 420) -> Any:
    """Per target boundary: error of the best source boundary, of the embeddings alone (m = 0, the floor), and of
    the mean-only predictor (no information), on target relative depth."""
    import altair as alt

    e = error_matrix(table, label)
    t = table[(table["map"] == label)]
    n_tgt = int(t.n_target_layers.iloc[0])
    base = t[t.metric == "mean_baseline_error"].set_index("target_layer")["value"]
    rows = []
    for l in e.columns:
        rows += [{"l": l, "r": l / n_tgt, "series": "best source boundary", "e": float(e[l].min()),
                  "m": int(e[l].idxmin())},
                 {"l": l, "r": l / n_tgt, "series": "source embeddings only (m = 0)", "e": float(e[l].loc[0]), "m": 0},
                 {"l": l, "r": l / n_tgt, "series": "training mean (ignores the source)", "e": float(base[l]), "m": -1}]
    d = pd.DataFrame(rows).round(4)
    names = ["best source boundary", "source embeddings only (m = 0)", "training mean (ignores the source)"]
    pick = alt.selection_point(fields=["series"], bind="legend")
    return alt.Chart(d).mark_line(point=True).encode(
        x=alt.X("r:Q", title=f"Target relative depth l / L ({t.target.iloc[0]})", scale=alt.Scale(domain=[0, 1])),
        y=alt.Y("e:Q", title="Held-out relative error", scale=alt.Scale(zero=True)),
        color=alt.Color("series:N", sort=names, title=None, legend=alt.Legend(orient="top", columns=1),
                        scale=alt.Scale(domain=names, range=["#54A24B", "#F58518", "#9d9d9d"])),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
        tooltip=["series:N", alt.Tooltip("l:Q", title="target l"), alt.Tooltip("m:Q", title="best source m"),
                 alt.Tooltip("e:Q", format=".3f", title="relative error")],
    ).add_params(pick).properties(width=width, height=240, title=label)


__all__ = ["ANALYSIS", "boundary_residuals", "plan_corpus", "corpus_docs", "collect", "ridge_fit", "split_stats",
           "fit_direction", "fit_maps", "MapFit", "best_matches", "best_sources", "diagonal_summary",
           "summarize_map", "error_matrix", "map_table", "run", "map_heatmap", "map_heatmaps", "floor_lines",
           "boundary_layers", "CorpusPlan"]
