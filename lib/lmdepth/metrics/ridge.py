"""Closed-form ridge regression between residual streams (chapter 06), from streamed sufficient statistics.

Pure tensor functions (no model access, no data knowledge: the caller passes the rows of each split): per-split
statistics of every (source layer, target layer) pair, one eigendecomposition per source layer serving every ridge
strength and target layer, the exact validation and test errors from the statistics, and the error matrix of one
map read back from the run's tidy table. See :mod:`lmdepth.analyses.maps` for the protocol.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from lmdepth.errors import DataError

#: The splits a fit reads from ``split_rows``: it fits on "train", picks the ridge strength on "val" and scores on
#: "test"; a split's place here also seeds its shuffled-pairs control.
SPLITS = ("train", "val", "test")
DEFAULT_ALPHAS = (1e-5, 1e-3, 1e-2, 1e-1, 1.0)


PRODUCT_DTYPES = {"float32": torch.float32, "float64": torch.float64}


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
    if missing := [k for k in SPLITS if k not in split_rows]:
        raise DataError(f"split_rows lacks the split(s) {', '.join(missing)}: a fit needs {', '.join(SPLITS)}.")
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


def error_matrix(table: pd.DataFrame, label: str, metric: str = "relative_error") -> pd.DataFrame:
    """[source boundary × target boundary] matrix of one map from the tidy table."""
    t = table[(table["map"] == label) & (table.metric == metric)]
    return t.pivot(index="source_layer", columns="target_layer", values="value").sort_index().sort_index(axis=1)
