"""Depth vs problem complexity (paper Fig. 7; book/method.md#method-depth-score): data with known difficulty, correctness, depth score.

Introduced in chapter 05. The items and their difficulty levels come from :mod:`lmdepth.data.difficulty`; the
depth score and its statistics from :mod:`lmdepth.metrics.depth`.

Per item the layer-skip effects come from chapter 03's remote-ready session (:func:`lmdepth.traces.skip_effects.skip_effects`,
the paper's ``test_effect`` with part "layer", future version; one request per item on NDIF): layer s is skipped at positions 1..t−1 and the effect measured at positions ≥ t,
max over the item's cut points. For MATH and GSM8K the cut points are ``a_start + o`` with o drawn from
``range(0, n_answer − 4, 4)`` (the first 4 after a seeded shuffle), as in the authors' script. For the one-token
synthetic answers the default cut is the **answer-predicting** position ``t = a_start − 1`` on the prompt alone
(``hop_cut="predict"``), so the measured position is the one that predicts the answer; ``hop_cut="answer"``
reproduces the authors' choice ``t = a_start`` on prompt + answer, which measures the position *after* the answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import torch

from lmdepth.analyses.maps import tokenizer_of
from lmdepth.analyses.run import Job, RunSummary, UnitClock, record_unit_cost, resolved
from lmdepth.data import multihop
from lmdepth.data.datasets import Example, content_digest, selection_record
from lmdepth.data.difficulty import (
    LEVELS,
    SOURCE_TITLES,
    SOURCES,
    SYNTHETIC,
    analysis_input,
    answer_start,
    difficulty_examples,
    gsm8k_correct,
    last_boxed,
    math_correct,
)
from lmdepth.errors import DataError, ParameterError
from lmdepth.metrics.depth import depth_score, group_statistics, layer_effect, level_statistics
from lmdepth.model.registry import LoadedModel, ModelRef, load_model
from lmdepth.params import ModelParams, Params, check_remote, param
from lmdepth.results import RunResult, RunStore
from lmdepth.runtime import progress
from lmdepth.traces.generation import greedy_matches, greedy_texts
from lmdepth.traces.residual_metrics import TapPaths
from lmdepth.traces.skip_effects import skip_effects

ANALYSIS = "depth_complexity"


@dataclass(frozen=True)
class ComplexityParams(ModelParams):
    """Parameters of one (model, source) run of chapter 05."""

    source: str = param("math", choices=SOURCES, help="'math', 'gsm8k', 'arith', 'vars' or 'facts'")
    n_per_level: int = param(20, lo=1, hi=10_000, help="items per difficulty level (the paper: 20)")
    levels: list[int] | None = param(None, nullable=True, help="a subset of the source's levels (None: all)")
    n_cuts: int = param(4, lo=1, hi=64, help="MATH / GSM8K cut points per item (the paper: 4)")
    cut_stride: int = param(4, lo=1, hi=1024, help="cut points drawn from every k-th answer token")
    max_answer_tokens: int | None = param(None, lo=8, hi=100_000, nullable=True,
                                          help="keep only this many answer tokens of a solution (None: all)")
    hop_cut: str = param("predict", choices=("predict", "answer"),
                         help="multi-hop cut: 'predict' (t = a_start − 1) or 'answer' (t = a_start, the code)")
    gen_tokens: int = param(256, lo=0, hi=4096, help="MATH / GSM8K correctness: greedy generation budget (0: off)")
    remote: bool | str = param(False, help="false: here; true: on NDIF (hub ids only); 'local': the offline "
                                            "simulation of NDIF")

    def check_consistency(self) -> None:
        check_remote(self.model_name, self.remote)
        for lv in self.levels or ():
            if lv not in LEVELS[self.source]:
                raise ParameterError(f"Parameter 'levels' of {self.source} must be within {list(LEVELS[self.source])}, "
                                     f"got {lv!r}.")


def _correctness(lm: LoadedModel, source: str, todo: list[tuple[Example, torch.Tensor, int]], gen_tokens: int,
                 ) -> dict[str, tuple[int, str]]:
    """Item id → (1 solved / 0 not / −1 not checked, generated text)."""
    if source in SYNTHETIC:
        return {e.id: (int(greedy_matches(lm.nn, ids, a, lm.remote_mode)), "") for e, ids, a in todo}
    if gen_tokens == 0:
        return {e.id: (-1, "") for e, _, _ in todo}
    texts = generate_greedy(lm, [e.prompt for e, _, _ in todo], gen_tokens)
    check = (lambda e, g: gsm8k_correct(g, e.meta["final_answer"])) if source == "gsm8k" else \
        (lambda e, g: math_correct(g, e.answer))
    return {e.id: (int(check(e, g)), g) for (e, _, _), g in zip(todo, texts)}


def generate_greedy(lm: LoadedModel, prompts: list[str], max_new_tokens: int) -> list[str]:
    """Greedy solutions of ``prompts`` through the remote-ready generation trace (here, on NDIF or under its
    simulation, as ``lm.remote_mode`` says)."""
    return greedy_texts(lm.nn, lm.tokenizer, prompts, max_new_tokens, None if lm.remote else lm.device,
                        lm.remote_mode)


def run(params: ComplexityParams | ModelRef | str | None = None,
        lm: LoadedModel | Callable[[], LoadedModel] | None = None, **kwargs: Any) -> RunResult:
    """Skip effects, depth scores and correctness of one model on one difficulty-graded source (cached, resumable).

    Args:
        params: a :class:`ComplexityParams`, or its fields as keyword arguments.
        lm: an already loaded model, or a function that loads it (called only if something must be computed;
            see :func:`model_loader`), else loaded by name.

    Returns:
        Tidy table of per-item layer and logit effects (``model, source, item, level, correct, metric, layer,
        n_layers, value``); the sidecar's ``summary`` holds per-level depth scores, slopes, solved/unsolved
        scores and per-item scores.
    """
    p, ref = resolved(ComplexityParams, params, kwargs)
    levels = tuple(LEVELS[p.source] if p.levels is None else p.levels)
    examples = difficulty_examples(p.source, levels, p.n_per_level, p.seed)
    synthetic = p.source in SYNTHETIC
    key = dict(source=p.source, levels=list(levels), n_per_level=p.n_per_level, seed=p.seed, dtype=p.dtype,
               n_boot=p.n_boot, **({"hop_cut": p.hop_cut} if synthetic else
                                   {"n_cuts": p.n_cuts, "cut_stride": p.cut_stride,
                                    "max_answer_tokens": p.max_answer_tokens, "gen_tokens": p.gen_tokens}))
    key["outputs"] = 3  # 3: the reference answer in the summary's items too (older runs refinish from their checkpoints)
    # the items themselves: synthetic sources are generated by code, so their name and size do not fix their text
    key["items"] = content_digest(examples)
    per_item = {k: v for k, v in key.items() if k not in ("n_per_level", "levels", "n_boot", "outputs", "items")}
    return Job(ANALYSIS, p, key, per_item, refs=ref).execute(lambda store: _compute(p, ref, lm, key, examples, store))


def _compute(p: ComplexityParams, ref: ModelRef, lm: LoadedModel | Callable[[], LoadedModel] | None, key: dict[str, Any],
             examples: list[Example], store: RunStore) -> tuple[pd.DataFrame, dict[str, Any]]:
    lm = lm() if callable(lm) else (lm or load_model(ref, device=p.device, dtype=p.dtype))
    tok, source = lm.tokenizer, p.source
    if source in SYNTHETIC:
        bad = multihop.one_token_answers(tok, examples)
        if bad:
            raise DataError(f"{len(bad)} synthetic answers are not one token for {p.model_name} (e.g. {bad[0]}); "
                            "the multi-hop analysis needs one-token answers.")
    items: dict[str, dict[str, np.ndarray]] = {}
    todo = []
    for ex in examples:
        item = store.load_item(ex.content_name)  # by content: a checkpoint never serves another text
        if item is None:
            full = tok(ex.text, return_tensors="pt").input_ids  # length checked after truncation
            full = full if lm.remote else full.to(lm.device)  # NDIF: the ids travel from the CPU
            todo.append((ex, full))
        else:
            items[ex.id] = item
    # correctness first (batched generation), then the skip effects item by item, each checkpointed
    prepared = [(ex, full, answer_start(tok, ex, full)) for ex, full in todo]
    batch = UnitClock()
    correct = _correctness(lm, source, prepared, p.gen_tokens) if prepared else {}
    share = batch.elapsed(max(len(prepared), 1))  # each item's share of the batched correctness check
    for ex, full, _ in progress(prepared, desc=f"{p.model_name}: depth score on {source}"):
        clock = UnitClock()
        ids, cuts, a_start = analysis_input(tok, ex, full, source, p.seed, p.n_cuts, p.cut_stride,
                                            p.max_answer_tokens, p.hop_cut)
        if lm.max_tokens and ids.shape[1] > lm.max_tokens:
            raise DataError(f"Example {ex.id} has {ids.shape[1]} tokens, more than {p.model_name}'s context of "
                            f"{lm.max_tokens}: set max_answer_tokens to keep only the start of long solutions.")
        E, O = skip_effects(lm.nn, TapPaths.of(lm.adapter), ids, cuts=cuts, parts=("layer",), local=False,
                            current=False, config=lm.model.config, remote=lm.remote_mode)["future", "layer"]
        ok, text = correct[ex.id]
        item = clock.stamp({"E": E.numpy(), "O": O.numpy(), "correct": np.array(ok), "n_tokens": np.array(ids.shape[1]),
                            "a_start": np.array(a_start), "cuts": np.array(cuts), "generated": np.array(text)},
                           share)  # the unit's cost, for the sidecar's unit_compute_s
        store.save_item(ex.content_name, item)
        items[ex.id] = item
    store.unit_seconds, store.unit_cpu_seconds = [], []
    for e in examples:
        record_unit_cost(store, items[e.id])

    E = np.stack([items[e.id]["E"] for e in examples])
    O = np.stack([items[e.id]["O"] for e in examples])
    lv = np.array([e.meta["level"] for e in examples])
    ok = np.array([int(items[e.id]["correct"]) for e in examples])
    table = tidy_items(p.model_name, source, examples, E, O, ok)
    by_level, slopes = level_statistics(E, O, lv, p.n_boot, p.seed)
    groups = group_statistics(E, O, {"solved": ok == 1, "unsolved": ok == 0}, "mean", p.n_boot, p.seed)
    per = pd.DataFrame({"item": [e.id for e in examples], "level": lv, "correct": ok,
                        "answer": [reference_answer(source, e) for e in examples],
                        "n_tokens": [int(items[e.id]["n_tokens"]) for e in examples],
                        "prompt_tokens": [int(items[e.id]["a_start"]) for e in examples],
                        "layer_effect": depth_score(layer_effect(E)), "logit_effect": depth_score(O)})
    meta = {
        "parameters": {"model_name": p.model_name, **key, "device": p.device, "remote": p.remote},
        "model": lm.provenance(),
        "data": {**selection_record(source, "random", p.seed, examples),
                 "levels": [int(x) for x in lv], "cuts": {e.id: items[e.id]["cuts"].tolist() for e in examples}},
        "summary": {"n_layers": E.shape[1], "accuracy": float((ok == 1).mean()) if (ok >= 0).all() else None,
                    "levels": by_level.to_dict("records"), "slopes": slopes.to_dict("records"),
                    "solved": groups.to_dict("records"), "items": per.to_dict("records"),
                    "generated": {e.id: str(items[e.id]["generated"]) for e in examples if str(items[e.id]["generated"])}},
    }
    return table, meta


def model_loader(model_name: str, device: str = "cpu", dtype: str = "float32",
                 remote: bool | str = False) -> Callable[[], LoadedModel]:
    """A function that loads the model on its first call and returns the same object afterwards (so several
    cached runs of one model load it at most once, and not at all when every run is cached)."""
    return cache(lambda: load_model(model_name, device=device, dtype=dtype, remote=remote))


def reference_answer(source: str, ex: Example) -> str:
    """The final answer an item is scored on (GSM8K's number, MATH's last boxed expression, the one-token answer of
    a synthetic chain): what the constant-answer baseline counts."""
    if source == "gsm8k":
        return str(ex.meta["final_answer"])
    if source == "math":
        return last_boxed(ex.answer) or ex.answer
    return ex.answer.strip()


def tidy_items(model: str, source: str, examples: list[Example], E: np.ndarray, O: np.ndarray,
               correct: np.ndarray) -> pd.DataFrame:
    """Per-item layer and logit effect vectors as a long table (the E matrices stay in the per-item checkpoints);
    also the per-unit table of the claim checks (unit: the item), with each item's reference answer."""
    L = E.shape[1]
    e = layer_effect(E)
    rows = []
    for i, ex in enumerate(examples):
        base = dict(model=model, source=source, item=ex.id, level=ex.meta["level"], correct=int(correct[i]), n_layers=L,
                    answer=reference_answer(source, ex))
        for m, v in (("layer_effect", e[i]), ("logit_effect", O[i])):
            rows += [{**base, "metric": m, "layer": s, "value": float(v[s])} for s in range(L)]
    return pd.DataFrame(rows)


#: The per-run tables of :class:`ComplexitySummary` that :func:`summary_frame` concatenates.
SUMMARY_PARTS = ("levels", "slopes", "solved", "items")


@dataclass(frozen=True, eq=False)
class ComplexitySummary(RunSummary):
    """What chapter 05 and the atlas read of one (model, source) run (:meth:`of`); its tables as the sidecar's
    ``summary`` stores them (:func:`_compute`).

    Attributes:
        source: the data source; ``n_per_level``: items per difficulty level.
        n_layers: the model's layers.
        accuracy: share of items solved (None when the correctness was not checked).
        levels: the depth score per (level, metric, aggregation) with its interval (``depth_score, ci_low, ci_high,
            n`` …).
        slopes: the slope of the depth score over levels per (metric, aggregation) with its interval.
        solved: the depth score of the solved and of the unsolved items.
        items: per item: level, correctness, reference answer, tokens analysed, prompt tokens (runs from before
            they were recorded lack them: :func:`prompt_lengths`) and its depth scores.
    """

    source: str
    n_per_level: int
    n_layers: int
    accuracy: float | None
    levels: pd.DataFrame
    slopes: pd.DataFrame
    solved: pd.DataFrame
    items: pd.DataFrame

    @classmethod
    def of(cls, result: RunResult) -> ComplexitySummary:
        p, s = result.meta["parameters"], result.meta["summary"]
        return cls(**cls.fields_of(result), source=str(p["source"]), n_per_level=int(p["n_per_level"]),
                   n_layers=int(s["n_layers"]), accuracy=s.get("accuracy"),
                   **{part: pd.DataFrame(s[part]) for part in SUMMARY_PARTS})


def summary_frame(results: dict[tuple[str, str], RunResult], part: str) -> pd.DataFrame:
    """Concatenate one summary part ("levels", "slopes", "solved", "items") of several (model, source) runs,
    with ``model, source, n_layers`` and relative depth ``D / (L − 1)`` columns added."""
    frames = []
    for (model, source), r in results.items():
        summary = ComplexitySummary.of(r)
        df = getattr(summary, part).copy()
        if df.empty:
            continue
        L = summary.n_layers
        df.insert(0, "source", source)
        df.insert(0, "model", model)
        df["n_layers"] = L
        for c in ("depth_score", "ci_low", "ci_high", "slope", "layer_effect", "logit_effect"):
            if c in df:
                df[f"rel_{c}"] = df[c] / max(L - 1, 1)
        frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


# ---- chapter 05: the grid of runs, its summaries and the claim ------------------------------------------------------


@dataclass(frozen=True)
class GridParams(Params):
    """Chapter 05's grid of depth-score runs (:func:`run_grid`): the parameters that no single run's
    :class:`ComplexityParams` holds by the same name (the runs' own fields go through that class).

    ``max_answer_tokens`` is the chapter's convention: 0 keeps the whole solution (a run's ``None``), else ≥ 8.
    """

    sources: list[str] = param(list(SOURCES), choices=SOURCES, help="data sources: one run per model and source")
    n_synthetic: int = param(20, lo=1, hi=10_000, help="synthetic items per step / hop count for the main model")
    n_per_level_compare: int = param(1, lo=1, hi=10_000,
                                     help="MATH and GSM8K items per level for each comparison model")
    n_synthetic_compare: int = param(12, lo=1, hi=10_000,
                                     help="synthetic items per step / hop count for each comparison model")
    max_answer_tokens: int = param(0, lo=0, hi=100_000, help="MATH / GSM8K answer tokens kept; 0: the whole solution")

    def check_consistency(self) -> None:
        if not self.sources:
            raise ParameterError("Parameter 'sources' must name at least one of " + ", ".join(SOURCES) + ".")
        if 0 < self.max_answer_tokens < 8:
            raise ParameterError(f"Parameter 'max_answer_tokens' must be 0 (whole solution) or at least 8, "
                                 f"got {self.max_answer_tokens}.")


def check_chapter_parameters(*, sources: list[str], n_per_level: int, n_synthetic: int, n_per_level_compare: int,
                             n_synthetic_compare: int, max_answer_tokens: int, n_cuts: int, hop_cut: str,
                             gen_tokens: int, n_boot: int) -> None:
    """Check chapter 05's depth-score parameters before any model loads: the grid's through :class:`GridParams`,
    the runs' own through :class:`ComplexityParams`. The models are checked by
    :func:`lmdepth.book.notebook.chapter_models`.

    Raises:
        ParameterError: naming the parameter, the value given and what is allowed.
    """
    GridParams(sources=sources, n_synthetic=n_synthetic, n_per_level_compare=n_per_level_compare,
               n_synthetic_compare=n_synthetic_compare, max_answer_tokens=max_answer_tokens)
    ComplexityParams(n_per_level=n_per_level, n_cuts=n_cuts, hop_cut=hop_cut, gen_tokens=gen_tokens, n_boot=n_boot)


def model_loaders(models: list[str], device: str = "cpu", dtype: str = "float32", remote: bool | str = False,
                  ) -> dict[str, Callable[[], LoadedModel]]:
    """One :func:`model_loader` per model: each model loads at most once however many runs use it."""
    return {m: model_loader(m, device=device, dtype=dtype, remote=remote) for m in models}


def run_grid(models: list[str], sources: list[str], n_per_level: int, n_synthetic: int, n_per_level_compare: int,
             n_synthetic_compare: int, max_answer_tokens: int = 0,
             loaders: dict[str, Callable[[], LoadedModel]] | None = None, **kwargs: Any,
             ) -> dict[tuple[str, str], RunResult]:
    """:func:`run` for every (model, source) pair, models outer, in the given order.

    Args:
        models: the main model first, then the comparison models.
        sources: data sources (see :data:`SOURCES`).
        n_per_level / n_synthetic: items per level of MATH / GSM8K and of the synthetic sets for the main model;
            ``n_per_level_compare`` / ``n_synthetic_compare`` the same for each comparison model.
        max_answer_tokens: answer tokens kept after the prompt, 0 for the whole solution.
        loaders: model name → loader (:func:`model_loaders`), shared with other analyses; made here if None.
        **kwargs: further :class:`ComplexityParams` fields (seed, n_cuts, hop_cut, gen_tokens, n_boot, device,
            dtype, results_dir, use_cache).

    Returns:
        ``{(model, source): RunResult}``.
    """
    if loaders is None:
        p = ComplexityParams.of(**kwargs)  # the loaders' settings, with the parameters' own defaults and checks
        loaders = model_loaders(models, p.device, p.dtype, p.remote)
    results: dict[tuple[str, str], RunResult] = {}
    for m in models:
        main = m == models[0]
        for src in sources:
            synthetic = src in SYNTHETIC
            n = (n_synthetic if synthetic else n_per_level) if main else \
                (n_synthetic_compare if synthetic else n_per_level_compare)
            results[m, src] = run(m, source=src, n_per_level=n, lm=loaders[m],
                                  max_answer_tokens=max_answer_tokens or None, **kwargs)
    return results


def prompt_lengths(results: dict[tuple[str, str], RunResult]) -> pd.DataFrame:
    """Each item's prompt length in tokens: the answer start of the input the run analysed (the model's own
    tokenizer on the item's prompt + answer, :func:`lmdepth.data.difficulty.answer_start`). A run records it in its
    summary's items; for a run from before it did, the run's items are regenerated (the sidecar's item digest
    guards that they are the same) and encoded again, with the tokenizer alone (no model is loaded; a packaged model is converted on first use).

    Returns:
        ``model, source, item, prompt_tokens``, one row per item of every run.

    Raises:
        DataError: a run's items can no longer be regenerated as they were.
    """
    tokenizers: dict[str, Any] = {}
    frames = []
    for (model, source), r in results.items():
        items = ComplexitySummary.of(r).items
        if "prompt_tokens" not in items:
            p = r.meta["parameters"]
            examples = difficulty_examples(p["source"], tuple(p["levels"]), int(p["n_per_level"]), int(p["seed"]))
            if content_digest(examples) != p["items"]:
                raise DataError(f"The items of {r.path} can no longer be regenerated as they were (item digest "
                                f"{content_digest(examples)}, the run's {p['items']}): recompute that run.")
            if p["model_name"] not in tokenizers:
                tokenizers[p["model_name"]] = tokenizer_of(p["model_name"])[0]
            tok = tokenizers[p["model_name"]]
            start = {e.id: answer_start(tok, e, tok(e.text, return_tensors="pt").input_ids) for e in examples}
            items = items.assign(prompt_tokens=items.item.map(start))
        frames.append(items[["item", "prompt_tokens"]].assign(model=model, source=source))
    cols = ["model", "source", "item", "prompt_tokens"]
    return pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)


class GridFrames(NamedTuple):
    """The summaries of a grid of runs (:func:`grid_frames`)."""

    levels: pd.DataFrame  #: depth score per level (:func:`summary_frame` part "levels")
    slopes: pd.DataFrame  #: slope of the depth score over levels
    solved: pd.DataFrame  #: depth score of solved / unsolved items
    items: pd.DataFrame  #: per-item depth scores, correctness, token counts and prompt length (``prompt_tokens``)
    table: pd.DataFrame  #: the runs' tidy tables, concatenated, with each item's ``prompt_tokens`` (the claims' units)


def grid_frames(results: dict[tuple[str, str], RunResult]) -> GridFrames:
    """The four summary frames of :func:`summary_frame` and the concatenated tidy tables of a grid of runs, the
    items and the tidy table with each item's prompt length (:func:`prompt_lengths`).

    Raises:
        RuntimeError: a depth score outside [0, L − 1] (an effect-weighted mean layer index cannot be: the effects
            were not non-negative weights).
    """
    lengths = prompt_lengths(results)
    on = ["model", "source", "item"]
    levels, slopes, solved, items = (summary_frame(results, part) for part in SUMMARY_PARTS)
    table = pd.concat([r.table for r in results.values()], ignore_index=True)
    frames = GridFrames(levels, slopes, solved, items.drop(columns="prompt_tokens", errors="ignore").merge(
        lengths, on=on, how="left"), table.merge(lengths, on=on, how="left"))
    d = frames.levels.dropna(subset=["depth_score"])
    if not d.eval("depth_score >= 0 and depth_score <= n_layers - 1").all():
        raise RuntimeError("A depth score lies outside [0, L − 1]: the layer effects it weights are not non-negative.")
    return frames


def model_names(results: dict[tuple[str, str], RunResult]) -> list[str]:
    """The models of a grid of ``(model, source)`` runs, each once, in the order they were run."""
    return list(dict.fromkeys(m for m, _ in results))


__all__ = ["ANALYSIS", "ComplexityParams", "ComplexitySummary", "SOURCES", "LEVELS", "SOURCE_TITLES", "run", "tidy_items", "summary_frame", "model_loader", "model_names", "GridParams", "check_chapter_parameters", "model_loaders", "run_grid", "GridFrames", "grid_frames"]
