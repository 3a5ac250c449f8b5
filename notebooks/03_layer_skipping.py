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
# source .venv/bin/activate    # the environment scripts/setup_env.sh made (or your own)
# lmdepth run skipping --model smollm2-135m -p n_examples 3 -p n_examples_current 3 -p benchmark false
# python scripts/bench_skipping.py --model smollm2-135m --n-examples 1 --analysis future   # speed vs naive
# ```

# %% tags=["remove-cell"]
# Colab only. Fetches the repository (a shallow clone: the library, the stored results/ and the trained checkpoints),
# installs the library from it (never torch) and the packaged models, and works inside it, so this chapter reads the
# stored runs instead of computing them (minutes, not hours). Safe to run twice.
import os
import subprocess
import sys

if "google.colab" in sys.modules:  # pragma: no cover
    REPO = ""  # repository.url of _config.yml, written here by `lmdepth book`; "" until the book is published
    if os.path.basename(os.getcwd()) != "lmdepth-book":  # first run: clone (unless a clone is there), go inside
        if REPO:
            subprocess.run(f"[ -d lmdepth-book ] || git clone -q --depth 1 {REPO} lmdepth-book", shell=True, check=True)
        if os.path.isdir("lmdepth-book"):  # the clone, or one made by hand (no address here: the Reproducibility page)
            os.chdir("lmdepth-book")
    if os.path.isfile("pyproject.toml"):  # inside the clone
        # check=True: a failed install stops here, loudly, instead of failing later with a confusing import error
        subprocess.run(f"{sys.executable} -m pip install -q . && {sys.executable} -m pip install -q --no-deps "
                       "-r requirements-assets.txt", shell=True, check=True)
    else:  # no address and no clone: how to make one, and the notebook goes on (it needs the library installed)
        print("No repository address in this notebook: run `!git clone -q --depth 1 ADDRESS lmdepth-book` with the "
              "repository's address, then this cell again (the book's Reproducibility page, 'Open a chapter in Colab').")

# %% tags=["parameters"]
model_name: str = "smollm2-135m"  # packaged short name, Hugging Face hub id, or local directory
compare_models: list = ["gemma3-270m", "qwen2.5-coder-0.5b"]  # compared on relative depth; [] to skip
dataset: str = "gsm8k"  # "gsm8k", "math", or a .jsonl file with {"text"} or {"prompt", "answer"} lines
n_examples: int = 20  # problems for the future-token analysis of model_name (the paper: 10)
n_examples_current: int = 20  # problems for the all-token analysis of model_name (the paper: 20)
n_examples_compare: int = 10  # problems for each comparison model (and each random-init control of one)
n_cuts_compare: int = 4  # cut points per problem for the comparison models
parts_compare: list = ["layer"]  # what the comparison models and the random-init controls skip (the claims read the layer)
current_compare: bool = True  # also run the all-token analysis on the comparison models
seed: int = 0  # seed of the example selection, the cut points and the bootstrap
selection: str = "random"  # "random" (the paper's wording) or "first" (the authors' code: first N in file order)
parts: list = ["layer", "attention", "mlp"]  # what is skipped: the whole layer, its attention, its MLP
local: bool = True  # add the local (direct-effect) variant of the layer skip (paper appendix)
n_cuts: int = 4  # cut points per problem, drawn from every 8th token (the paper: 4)
threshold: float = 0.1  # future effect below which a layer counts as not feeding later computation
floor: float = 0.1  # the verdicts' robust statistic: denominators floored at this fraction of the layer's median norm
benchmark: bool = False  # True: time the fast path against the naive loop here if no timing is stored (minutes)
n_boot: int = 1000  # bootstrap resamples over problems for the cutoff interval
profile: str = "default"  # label of the parameter profile this run came from (smoke/default/paper)
device: str = "auto"  # "auto" (a GPU where there is one, else the CPU), "cpu", "cuda"
dtype: str = "float32"  # "float32", "bfloat16", "float16"
remote: object = False  # false: here; true: on NDIF (a hosted hub id; NDIF_API_KEY); "local": the offline simulation of NDIF
use_cache: bool = True  # reuse finished runs and resume interrupted ones; False recomputes
results_dir: str = "results"  # where tidy tables and sidecars are written

# %% tags=["remove-cell"]
from IPython.display import display

from lmdepth.analyses import skipping as skip_analysis
from lmdepth.book.cost import announce_cost
from lmdepth.book.measurement import show_measurement
from lmdepth.book.notebook import chapter_models, claims_md, md, setup, show_table
from lmdepth.claims import report
from lmdepth.claims.paper_values import reported
from lmdepth.book.pages import skipping_page as page
from lmdepth.charts.skipping_charts import comparison_panels, effect_heatmaps, later_effect_lines, output_effect_bars
from lmdepth.runtime import environment, resolve_device

setup(seed)
announce_cost("skipping", globals())  # before a long computation: its cost, and a smaller run
common = dict(dataset=dataset, seed=seed, selection=selection, parts=parts, local=local, threshold=threshold,
              device=resolve_device(device), dtype=dtype, remote=remote, results_dir=results_dir, use_cache=use_cache,
              n_boot=n_boot)
TITLES = page.VARIANT_TITLES
variants = skip_analysis.variant_names(parts, local)
output_variants = [v for v in variants if v != "local"]  # all tokens, output bars: the local variant is empty there
models = chapter_models(model_name, compare_models)  # checked: a typo stops here, before any model runs
# comparison models and controls: only what the claims read, so their samples can reach 10 problems on a CPU
compare_common = dict(common, parts=parts_compare, local=False, floor=floor)
compare_variants = skip_analysis.variant_names(parts_compare, False)

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
#
# **The statistic the verdicts decide on.** A max over ~200 positions of a relative change saturates: wherever a
# layer's clean contribution is small (the attention sink, a delimiter), any change is large relative to it, and the
# clipped max sits at 1. The verdicts therefore use the *mean* over the measured positions $p \ge \max(t, 1)$, with
# the denominator floored at a tenth of the layer's median contribution norm on the prompt
# (`floor`; book/method.md#method-skipping), and the mean output change; for future tokens averaged over the cut points:
#
# $$M[s, j] = \operatorname{mean}_{p} \frac{\lVert \Delta_j - \Delta'_j \rVert_2}
#   {\max(\lVert \Delta_j \rVert_2,\ 0.1 \cdot \operatorname{median}_{p'} \lVert \Delta_j(p') \rVert_2)},
#   \qquad Q[s] = \operatorname{mean}_{p} \lVert P - P' \rVert_2 .$$
#
# The figures keep the paper's max; the verdict table shows the paper's statistic beside the robust one.

# %% tags=["hide-input"]
show_measurement("skipping")

# %% tags=["hide-input"]
current = skip_analysis.run(model_name, analysis="current", n_examples=n_examples_current, **common)
future = skip_analysis.run(model_name, analysis="future", n_examples=n_examples, n_cuts=n_cuts, **common)
md(page.runs_md(model_name, current, future, n_cuts))

# %% [markdown]
# ## Effects on all tokens (Fig. 3a)

# %% mystnb={"figure": {"caption": "All tokens: relative change of each later layer's contribution when a layer (or its attention, or its MLP) is skipped at every position ≥ 1; max over positions and problems. Row s, column j: effect of skipping s on layer j. The diagonal of the layer skip is 1 by construction. The local variant is not shown: on all tokens it pins every position, so nothing can reach a later layer (its map is empty by construction).", "name": "fig-skip-current"}}
effect_heatmaps(current.table, "current", output_variants, TITLES, size=250)

# %% mystnb={"figure": {"caption": "All tokens: change of the output distribution ‖P − P′‖₂ (max over positions and problems) when each layer or sublayer is skipped. Click the legend to isolate a part.", "name": "fig-skip-current-out"}}
output_effect_bars(current.table, "current", output_variants, TITLES)

# %% [markdown]
# ## Effects on future tokens (Fig. 3b)

# %% mystnb={"figure": {"caption": "Future tokens: relative change of later layers' contributions at positions ≥ t when a layer is skipped only at positions < t (max over 4 cut points per problem and over problems).", "name": "fig-skip-future"}}
effect_heatmaps(future.table, "future", variants, TITLES, size=250)

# %% mystnb={"figure": {"caption": "Future tokens: change of the output distribution at positions ≥ t when a layer or sublayer is skipped only at positions < t.", "name": "fig-skip-future-out"}}
output_effect_bars(future.table, "future", output_variants, TITLES)

# %% tags=["hide-input"]
md(page.later_effects_md(current, future, threshold))

# %% [markdown]
# ## Across models
#
# The comparison models skip whole layers only (`parts_compare`), on `n_examples_compare` problems with
# `n_cuts_compare` cut points each (the default profile: 10 and 4; the all-token analysis with
# `current_compare=True`): what the claims read, at the smallest sample a verdict may rest on. Their attention, MLP
# and local variants are not run by default: those cost about three times as much and no claim reads them.

# %% tags=["hide-input"]
comparison = skip_analysis.compare(models, current, future, n_examples=n_examples_compare, n_cuts=n_cuts_compare,
                                   with_current=current_compare, **compare_common)

# %% mystnb={"figure": {"caption": "Future tokens: for each skipped layer, the largest relative change it causes in any later layer (max over problems), per model on relative depth; the axis is clipped at 1 like the heatmaps (hover a point for its value). Dashed: the cutoff threshold. Shaded grey, labelled 'paper': where the paper finds its model's skipped layers have almost no effect on later layers at future tokens, the second half of the depth (Fig. 3b; it gives no value for 'almost no'); hover it for the paper's words.", "name": "fig-skip-models"}}
later_effect_lines(skip_analysis.later_effect_table(comparison.table, models), threshold, paper=reported("skipping"))

# %% tags=["hide-input"]
show_table(page.cutoff_table(comparison.futures, models, variants), caption="The future-effect cutoff per model and skip variant, with its 95 % interval")

# %% [markdown]
# The heatmaps and output changes of each comparison model (the parts in `parts_compare`; all tokens when
# `current_compare` is on, future tokens always).

# %% tags=["hide-input"]
for heading, heatmaps, bars in comparison_panels(comparison.table, comparison.futures, models[1:], compare_variants, TITLES,
                                                 n_examples_compare):
    md(heading)
    display(heatmaps, bars)

# %% [markdown]
# (claims-skipping)=
# ## Does the claim hold here?
#
# From the claims registry (`lmdepth.claims`), on the robust per-problem statistic ($M$ and $Q$ above). The claims
# read whole-layer skips only, so every model, the main one included, gets a whole-layer run that keeps the robust
# statistic (`floor`): its problems and cut points are those of the runs above. Each model's random-init
# control runs on the same problems and cut points where the model has at least 10 problems in both analyses; with
# fewer, the checks are not testable and a control would have nothing to discriminate. A check counts only when the
# paired interval of (model − control) over the shared problems excludes 0. The second table sets the deciding
# statistic beside the paper's (the same ratio on per-problem maxima clipped at 1) and the share of those maxima at
# the clip: where it reaches 50 %, the paper's statistic measures the clip rather than the model.
#
# **The output change has another control.** An untrained twin's output distribution barely depends on its input,
# so its output change is tiny in both halves and its ratio is a quotient of noise: such a control is no valid
# control. *2nd half still changes the output* is instead paired with a **random nudge of the skip's size** on the
# model itself, on the same problems and positions: at every position $p \ge 1$, layer $s$'s output is moved along
# a random unit vector $u_s$ by the norm of what the layer wrote there,
# $h'_{s+1} := h_{s+1} + \lVert \Delta_s \rVert_2\, u_s$, instead of losing it, $h'_{s+1} := h_s$. The directions
# (one per layer) are drawn afresh for every problem, seeded by `seed` and the problem's id, so the control is a
# distribution of random changes, not one draw: the spread between draws is in its per-problem values and in the
# interval. The residual moves exactly as far as when the layer is skipped, in a direction unrelated to what the
# layer computed, and the output change $Q$ is measured in the same way. The paired interval of the halves ratio,
# skip − nudge, asks whether removing what a second-half layer wrote changes the output more, relative to the
# first half, than a random change of the same size does. The third table shows each run's halves, the twin's as a
# reference.

# %% tags=["hide-input"]
md(claims_md("skipping"))

# %% tags=["hide-input"]
verdict_units, controls = skip_analysis.claim_units(models, (n_examples_current, n_examples, n_cuts),
                                                    (n_examples_compare, n_cuts_compare), **compare_common)
verdicts = report.check("skipping", verdict_units, models, controls, n_boot=n_boot, seed=seed)
report.save(verdicts, "skipping", results_dir)
show_table(report.display(verdicts), caption="The paper's claims on each model: the statistic with its 95 % interval, the control and the verdict")
show_table(page.statistics_table(verdicts), caption="Per claim row: the robust statistic that decided it beside the paper's aggregation of the same check")
show_table(page.output_change_table(verdicts, verdict_units, controls, models), caption="Output change on all tokens per model: first- and second-half means and their ratio, for the skip, its nudge control and the random-init twin")

# %% mystnb={"figure": {"caption": "This chapter's claims at a glance. Left, on each claim's own scale: each model's statistic with its 95 % interval; dashed, the paper's threshold (shaded: the window of a 'between' rule). Right: the model minus its control, with the paired 95 % interval (solid: 0; grey band: a permutation null's central 95 %); a note where there is no difference to show. Colour: how the row counts on the findings page; hollow: not counted, not testable or without a valid control. Hover a mark for n, the rule, the control test and the reason.", "name": "fig-skipping-claims"}}
from lmdepth.charts.findings_charts import claims_forest
claims_forest(verdicts)

# %% tags=["remove-cell"]
# Identities that hold whatever the model (checks of the code, not of the claim).
page.check_identities(comparison.table, models)

# %% [markdown]
# ## Speed
#
# The authors run one forward pass per (problem, cut point, skipped layer, part). The library gets the same numbers
# with far less work, in one nnsight session per problem — the trace that also runs on NDIF, as one request
# (`lmdepth.traces.skip_effects`): per skipped layer it batches the parts together; it never recomputes the layers
# before the skipped one (they return the cached clean residual); it runs the first intervention once and reuses its
# keys and values as the prefix of every other cut point, so a cut at $t$ only computes positions $\ge t$; and it
# unembeds only measured positions, in chunks (no [layers × tokens × vocab] tensor). Below, both are timed on
# one problem (`scripts/bench_skipping.py` does the same on more problems). The timing is a measurement of a machine,
# so the build does not make it: the page shows the one stored with the book's results, with its date and machine
# (`-p benchmark true` times it on yours when none is stored).
#
# :::{dropdown} How much the shortcuts can save, and the cost of a problem on NDIF
# How much can these shortcuts save? Exact results need, for every skipped layer $s$ and cut $t$, the layers
# $\ge s$ at the positions $\ge t$ (and, once, the intervened positions before the largest cut); skipping the layers
# below $s$ halves the work on average and reusing the prefix saves the positions before each cut, but nothing can
# be shared between cut points at the measured positions. Counting that work (layer × position units, the
# unembedding included) gives the ratio to expect when matrix products dominate the time, as they do on a CPU:
# 2–3× for the paper's four cut points on a typical problem (more when the cuts fall late in the text; the
# distribution over 200 problems is computed below). On a quiet machine `scripts/bench_skipping.py` (SmolLM2, one
# 210-token problem, four cuts, three parts) measured naive 187.7 s vs fast 91.7 s, **2.05×**, equal to the
# counted ratio of 2.05× for that input, with the plain-hook implementation the session replaced (kept as the tests'
# reference), and 1.95× (0.95 of the counted ratio) with the session itself, one thread; the timing below is the
# session's.
#
# On NDIF a problem is one request, and a trace's rows are the parts measured together (at most five: three parts,
# the local variant, the nudge control), so the server holds activations for at most five copies of the prompt
# whatever the model's depth. The paper profile's cost table (Reproducibility page) gives the forward passes per
# problem for Llama 3.1 70B.
# :::

# %% tags=["hide-input"]
if remote is False:  # a timing of a machine, not part of the build: the stored one unless asked to time it
    for paragraph in page.benchmark_md(skip_analysis.benchmark(model_name, n_cuts=n_cuts, compute=benchmark, **common)):
        md(paragraph)

# %% [markdown]
# ## Differences from the paper
#
# Small packaged models and smaller samples than the paper's; a batched implementation that gives the same
# numbers; and verdicts from a robust per-problem statistic with an interval and a control (a random-init twin, or
# a random nudge of the skip's size), where the paper reads the maximum over positions and problems, uncontrolled.
#
# :::{dropdown} The differences in detail: models and sample, cut points, implementation, statistic, cutoff, controls
# - **Models and sample.** Small PyPI-packaged models in fp32 instead of Llama 3.1 70B in bf16. The analysis costs
#   one forward pass per (problem, cut point, skipped layer, part) — 480 passes per problem for SmolLM2 — so on a
#   2-core CPU the default profile gives the main model 20 problems for the all-token and 20 (× 4 cut points) for
#   the future-token analysis (the paper: 20 all-token, 10 future-token × 4 cut points), and each comparison model
#   10 problems × 4 cut points for whole layers only. The exact values of this build are in the parameters cell at
#   the top of the page. Runs with more problems reuse the per-problem results already computed. Max-aggregated
#   effects can only grow with more problems; the bootstrap intervals say how much the cutoffs could move. The
#   `paper` profile restores the paper's models and sizes for a GPU.
# - **Cut points** are drawn per problem with a seed derived from the problem id, and are the same for every part
#   (the authors' single random stream gave each part different draws).
# - **Implementation.** Batched and prefix-reusing instead of one pass per intervention; the tests and the live
#   benchmark check that both give the same numbers (≤ 1e-5).
# - **Verdicts use a robust statistic**, not the paper's max: within a problem, the mean over positions of the
#   change relative to a denominator floored at a tenth of the layer's median contribution norm (averaged over the
#   cut points); across problems, means. The paper's max over positions (and over problems) saturates at the clip
#   for most layers of a trained model and only grows with the sample; one relative change that explodes (a
#   position where a layer's clean contribution is near zero) would carry it. The figures keep the paper's max, and
#   the verdict table shows the paper's statistic (on maxima clipped at 1) beside the deciding one with its share at
#   the clip. The floor is a stated choice, not fitted: `floor` is a parameter, so a reader can rerun the chapter
#   with another (`lmdepth run skipping -p floor 0.05`).
# - **The cutoff.** The figures' cutoff (max over problems, the chapter's `threshold`) cannot exceed L − 1, since
#   the last layer has no later layer; the registry's cutoff leaves that layer out and is L ("none") when layer
#   L − 2 still feeds forward. It moves with the threshold, so it is reported here and not counted on the findings
#   page; where half or more of a model's (or its control's) problems have no cutoff of their own, the cutoff of
#   their mean is pinned at "none" and the row is not testable (saturated), or has no valid control.
# - **Controls** are not in the paper. The later-effect checks are paired with a random-init twin; the output
#   change with a random nudge of the skip's size on the same model (the twin's output change is too small in both
#   halves to make a ratio, and is shown as a reference only). The nudge's directions are standard normal draws of
#   a generator seeded with `seed` and the problem's id, one per layer and problem, scaled to unit length.
# - **Beyond the paper:** the mean over problems is stored beside the paper's max; a cutoff layer per model with
#   a bootstrap interval; verdicts with intervals and a paired control.
# :::
#
# ## Summary and environment

# %% tags=["hide-input"]
md(f"{report.summary(verdicts)} Results: `{future.path}`.")
md(" · ".join(f"{k} {v}" for k, v in environment().items() if v is not None))
