"""Chapter 03 (layer skipping): its prose, display tables, claim checks and live benchmark, from the runs of
:mod:`lmdepth.analyses.skipping`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from lmdepth.analyses.skipping import matrix
from lmdepth.data.datasets import load_examples
from lmdepth.hooks.skip_cost import time_paths, unembed_cost, work_ratios, work_units
from lmdepth.hooks.skipping import draw_cuts
from lmdepth.metrics.effects import halves, later_effect
from lmdepth.model.registry import load_model
from lmdepth.results import RunResult


VARIANT_TITLES = {"layer": "Layer skipped", "attention": "Attention removed", "mlp": "MLP removed",
                  "local": "Layer, local (direct) effect"}


def origin(result: RunResult) -> str:
    """Where a run's numbers came from: "cached", or the seconds it took to compute them."""
    return "cached" if result.from_cache else f"{result.meta['wall_time_s']:.0f} s"


def runs_md(model_name: str, current: RunResult, future: RunResult, n_cuts: int) -> str:
    """One sentence on the main model's two runs (all-token and future-token analysis): sizes and provenance."""
    cur_meta, fut_meta = current.meta, future.meta
    L = fut_meta["model"]["n_layers"]
    return (f"**{model_name}** ({L} layers): all-token analysis on {cur_meta['data']['n']} problems ({origin(current)}), "
            f"future-token analysis on {fut_meta['data']['n']} problems with {n_cuts} cut points each ({origin(future)}).")


def later_effects_md(current: RunResult, future: RunResult, threshold: float) -> str:
    """The later effect of first- vs second-half layers (all and future tokens) and the future-effect cutoff of the
    layer skip with its bootstrap interval, as one paragraph."""
    fut_later = later_effect(matrix(future.table, "future", "layer"))
    cur_later = later_effect(matrix(current.table, "current", "layer"))
    s = future.meta["summary"]["layer"]
    L = future.meta["model"]["n_layers"]
    return (f"Largest effect of a skipped layer on any later layer, mean over the first vs the second half of the layers: "
            f"all tokens {halves(cur_later)[0]:.2f} → {halves(cur_later)[1]:.2f}; future tokens "
            f"{halves(fut_later)[0]:.2f} → {halves(fut_later)[1]:.2f}. **Cutoff** (the first layer from which skipping "
            f"changes no later layer's future contribution by ≥ {threshold:g}): layer {s['cutoff']} of {L} "
            f"(relative depth {s['rel_depth']:.2f}; 95 % bootstrap interval over problems: layers "
            f"{s['ci_low']:.0f}–{s['ci_high']:.0f}).")


def cutoff_table(metas: dict[str, dict[str, Any]], models: Sequence[str], variants: Sequence[str]) -> pd.DataFrame:
    """The future-effect cutoff of every (model, variant) with its bootstrap interval, for display."""
    return pd.DataFrame([{"model": m, "part": VARIANT_TITLES[v], "problems": metas[m]["data"]["n"],
                          "cutoff layer": metas[m]["summary"][v]["cutoff"], "of layers": metas[m]["summary"][v]["n_layers"],
                          "relative depth": round(metas[m]["summary"][v]["rel_depth"], 2),
                          "95% CI (layers)": f"{metas[m]['summary'][v]['ci_low']:.0f}–{metas[m]['summary'][v]['ci_high']:.0f}"}
                         for m in models for v in variants])


def check_identities(table: pd.DataFrame, models: Sequence[str]) -> None:
    """Identities of the layer skip that hold whatever the model (checks of the code, not of the paper's claim).

    Raises:
        AssertionError: all tokens: a skipped layer's own contribution does not vanish, or an earlier layer changes;
            future tokens: a layer at or before the skipped one changes.
    """
    with_current = set(table[table.analysis == "current"].model)
    for m in models:
        if m in with_current:
            E = matrix(table, "current", "layer", model=m)
            if not np.allclose(np.diag(E), 1.0, atol=1e-4):
                raise AssertionError(f"{m}, all tokens: a skipped layer's own contribution vanishes")
            if not np.allclose(np.tril(E, -1), 0.0):
                raise AssertionError(f"{m}, all tokens: earlier layers cannot change")
        if not np.allclose(np.tril(matrix(table, "future", "layer", model=m)), 0.0, atol=1e-5):
            raise AssertionError(f"{m}, future tokens: layers up to the skipped one cannot change")


def benchmark_md(model_name: str, dataset: str, seed: int, selection: str, n_cuts: int, device: str = "cpu",
                 dtype: str = "float32", tol: float = 1e-5, n_pool: int = 200) -> list[str]:
    """Chapter 03's live benchmark, as three Markdown paragraphs: the fast and the naive path timed on one problem
    (future tokens, layer skip, at most 2 cut points), the work both do on it counted (:func:`work_units`), and the
    counted ratio with the paper's 4 cut points over ``n_pool`` problems (tokenization only).

    Raises:
        AssertionError: the two paths differ by more than ``tol``.
    """
    lm = load_model(model_name, device=device, dtype=dtype)
    ex = load_examples(dataset, n_examples=1, seed=seed, selection=selection)[0]
    ids = lm.encode(ex.text)
    # two cut points keep the live naive loop to 2 × L passes; scripts/bench_skipping.py runs the full setting
    cuts = draw_cuts(ids.shape[1], min(n_cuts, 2), seed, ex.id)
    t = time_paths(lm.adapter, ids, cuts=cuts, parts=("layer",), local=False, current=False)
    ratio = t.naive_cpu_s / t.fast_cpu_s
    verdict = (f"**{ratio:.1f}× less**" if ratio >= 1 else
               f"**{1 / ratio:.1f}× more** — timings on a shared machine vary by more than the work saved; the counted "
               "ratio below is the measure that does not depend on the load")
    timed = (f"Future-token analysis, layer skip, one problem ({ids.shape[1]} tokens, {len(cuts)} cut points, "
             f"{len(cuts) * lm.n_layers} naive forward passes), {torch.get_num_threads()} CPU threads. CPU time: naive "
             f"{t.naive_cpu_s:.1f} s, fast {t.fast_cpu_s:.1f} s — {verdict}; wall "
             f"time: naive {t.naive_s:.1f} s, fast {t.fast_s:.1f} s ({t.naive_s / t.fast_s:.1f}×). Largest difference "
             f"between the two results {t.max_abs_diff:.1e}.")
    if t.max_abs_diff > tol:
        raise AssertionError(f"fast and naive paths disagree: {t.max_abs_diff:.3g} > {tol}")
    u = work_units(lm.n_layers, ids.shape[1], cuts, False, 1, unembed_cost(lm.adapter))
    r4 = work_ratios(lm.adapter, [(ex.id, ids.shape[1])], 4, seed, False, 1)[0]  # the paper's 4 cuts
    counted = (f"Work the two paths do on this input, counted rather than timed (layer × position units, unembedding "
               f"included): naive / fast = **{u['naive'] / u['fast']:.1f}×** with these {len(cuts)} cut points, "
               f"{r4:.1f}× with the paper's 4.")
    # the same count over many problems (tokenization only): how far exact shortcuts can go on this data
    pool = load_examples(dataset, n_examples=n_pool, seed=seed, selection=selection)
    ratios = np.array(work_ratios(lm.adapter, [(e.id, lm.encode(e.text).shape[1]) for e in pool], 4, seed, False, 1))
    ceiling = (f"Over {len(pool)} problems of the data set with the paper's 4 cut points, the counted ratio is "
               f"{ratios.min():.2f}× at least, **{np.median(ratios):.2f}× in the median**, {ratios.max():.2f}× at most "
               f"({(ratios >= 5).mean():.0%} of problems reach 5×): a 5× speed-up over the naive loop is beyond what "
               "exact shortcuts allow on a typical problem; timing cannot beat the count by much.")
    return [timed, counted, ceiling]
