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
# # How much does each layer write into the residual stream?
#
# **Claim (paper §3.1, Fig. 2a).** In pre-layernorm LLMs the contribution of each layer to the residual stream,
# relative to the residual it is added to, drops sharply around the middle of the network — most of all for the
# attention sublayers. The paper reads this as a first sign that the second half of the layers does less.
#
# This chapter reproduces Fig. 2a (mean relative contribution per layer), its appendix variants (max over tokens,
# absolute norms), and compares the three packaged models on relative depth. The same cached run feeds
# {doc}`02_cosine_similarity`.
#
# **Rerun it.** On your own model and data (papermill or the CLI; the executed notebook is saved beside the results):
#
# ```bash
# source .venv/bin/activate    # the environment scripts/setup_env.sh made (or your own)
# lmdepth run norms --model smollm2-135m -p n_examples 5
# lmdepth run norms --model Qwen/Qwen2.5-1.5B -p device cuda -p dtype bfloat16
# jupytext --to ipynb -o - notebooks/01_residual_norms.py \
#   | papermill - /tmp/out.ipynb -p model_name gemma3-270m -p results_dir /tmp/lmdepth-results
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
compare_models: list = ["gemma3-270m", "qwen2.5-coder-0.5b"]  # shown side by side on relative depth; [] to skip
dataset: str = "gsm8k"  # "gsm8k", "math", or a .jsonl file with {"text"} or {"prompt", "answer"} lines
n_examples: int = 20  # number of problems (the paper: 10–20 GSM8K problems)
seed: int = 0  # seed of the example selection and the bootstrap
selection: str = "random"  # "random" (the paper's wording) or "first" (the authors' code: first N in file order)
include_bos: bool = True  # include position 0 (BOS / attention sink) in the averages, as the paper does
n_boot: int = 1000  # bootstrap resamples over problems for the 95 % intervals of the means
profile: str = "default"  # label of the parameter profile this run came from (smoke/default/paper)
device: str = "auto"  # "auto" (a GPU where there is one, else the CPU), "cpu", "cuda"
dtype: str = "float32"  # "float32", "bfloat16", "float16"
remote: object = False  # false: here; true: on NDIF (a hosted hub id; NDIF_API_KEY); "local": the offline simulation of NDIF
use_cache: bool = True  # reuse finished runs and resume interrupted ones; False recomputes
results_dir: str = "results"  # where tidy tables and sidecars are written

# %% tags=["remove-cell"]
from lmdepth.analyses import residual
from lmdepth.book.cost import announce_cost
from lmdepth.book.measurement import show_measurement
from lmdepth.book.notebook import chapter_models, claims_md, md, setup, show_table
from lmdepth.claims import report
from lmdepth.claims.paper_values import reported
from lmdepth.charts.residual_charts import across_models, layer_bars, norms_lines
from lmdepth.runtime import environment, resolve_device

setup(seed)
announce_cost("norms", globals())  # before a long computation: its cost, and a smaller run
models = chapter_models(model_name, compare_models)  # checked: a typo stops here, before any model runs
run_kw = dict(dataset=dataset, n_examples=n_examples, seed=seed, selection=selection, include_bos=include_bos, n_boot=n_boot,
              device=resolve_device(device), dtype=dtype, remote=remote, results_dir=results_dir, use_cache=use_cache)

# %% [markdown]
# ## One forward pass per problem
#
# For every token and layer $l$ we hook the residual entering the layer $h_l$, the attention contribution $a_l$
# and the MLP contribution $m_l$ (for Gemma 3 these are the outputs of its post-sublayer norms; the library's
# adapter checks $h_{l+1} = h_l + a_l + m_l$ numerically when the model loads). The run is teacher-forced on the
# prompt plus the reference solution, as in the paper.

# %% tags=["hide-input"]
main = residual.run(model_name, **run_kw)
table, run = main.table, residual.ResidualSummary.of(main)
origin = "loaded from the results cache" if run.from_cache else f"computed in {run.wall_time_s:.0f} s"
md(f"**{model_name}**: {run.n_layers} layers, d_model {run.d_model}, "
   f"{run.n_problems} {dataset} examples ({selection} selection, seed {seed}), {run.n_tokens:,} tokens; "
   f"{run.bos_policy}; additivity self-check error {run.additivity_error:.1e}; {origin}.")

# %% [markdown]
# ## Relative contribution per layer (Fig. 2a)
#
# $$r_\text{att}(l) = \frac{\lVert a_l\rVert}{\lVert h_l\rVert},\qquad
#   r_\text{mlp}(l) = \frac{\lVert m_l\rVert}{\lVert h_l + a_l\rVert},\qquad
#   r_\text{layer}(l) = \frac{\lVert a_l + m_l\rVert}{\lVert h_l\rVert}$$
#
# computed per token in fp32 (denominators clamped at $10^{-6}$), then averaged over all tokens of all problems
# (token-weighted) or maximised over them. The MLP is normalised by the residual at its own accumulation point.

# %% tags=["hide-input"]
show_measurement("norms")

# %% mystnb={"figure": {"caption": "Mean relative contribution of each layer's attention, MLP and whole layer to the residual stream (bars overlap, the shortest in front; black rules: bootstrap 95 % interval of the mean over problems). As in the paper the axis stops at 1.5; hover an off-scale bar for its value. Click the legend to isolate a component. Grey, labelled 'paper': the bounds the paper reports for its model's whole layer (Fig. 2a; dashed: the bound, shaded: the side its layers lie on), in each half of the depth, so the halves split at the middle of the bars; hover a mark for the paper's words.", "name": "fig-norms-relative"}}
layer_bars(table, "relative_contribution", "Mean relative contribution", ["attention", "mlp", "layer"], y_max=1.5,
           paper=reported("norms"))

# %% tags=["hide-input"]
rel = {c: residual.select(table, "relative_contribution", c) for c in ("attention", "mlp", "layer")}
halves = {c: residual.half_means(v, skip_first=2) for c, v in rel.items()}
md("Mean relative contribution, first half (without layers 0–1) vs second half of the layers: "
   + "; ".join(f"{c} {a:.3f} → {b:.3f} (×{b / a:.2f})" for c, (a, b) in halves.items()) + ". "
   + f"Largest attention contribution after layer 1: layer {int(rel['attention'].iloc[2:].idxmax())} "
   + f"({rel['attention'].iloc[2:].max():.3f}).")

# %% [markdown]
# The maximum over all tokens (paper appendix) shows whether a layer ever writes a lot, e.g. at a few special
# positions, even when its mean contribution is small.

# %% mystnb={"figure": {"caption": "Maximum over all tokens of all problems of the relative contribution of attention and MLP (axis clipped at 2 as in the paper's appendix).", "name": "fig-norms-max"}}
layer_bars(table, "relative_contribution", "Max relative contribution", ["attention", "mlp"], stats=("max",), y_max=2.0)

# %% [markdown]
# The first layers write a lot relative to the (small) embedding they start from. Whether the contributions then
# fall off after mid-depth — the paper's claim — is read off the second half of the bars and checked below.

# %% [markdown]
# ## Absolute norms (appendix)
#
# The residual norm $\lVert h_l\rVert$ grows with depth, so a constant-size write is a shrinking *relative*
# contribution. The absolute norms tell the two apart. (The authors' code averaged these over the last prompt
# only — an accumulator bug; here they are token-weighted means over all problems.)

# %% mystnb={"figure": {"caption": "Absolute L2 norms of the residual entering each layer and of the attention and MLP contributions (log scale). Switch mean/max with the radio buttons.", "name": "fig-norms-absolute"}}
norms_lines(table)

# %% [markdown]
# ## Across models, on relative depth
#
# The packaged models differ in depth (SmolLM2 30 layers, Qwen2.5-Coder 24, Gemma 3 18), so they are compared at
# relative depth $(l + 0.5)/L$.

# %% tags=["hide-input"]
all_tables, all_runs = residual.run_many(models, **run_kw)
md(", ".join(f"**{m}**: {all_runs[m].n_layers} layers, {all_runs[m].n_tokens:,} tokens" for m in models))

# %% mystnb={"figure": {"caption": "Mean relative contribution of attention, MLP and the whole layer for each model, on relative depth (axis clipped at 1.5). Click a model in the legend to highlight it. Grey, labelled 'paper', on the whole layer's panel: the bounds the paper reports for its model in each half of the depth (Fig. 2a; dashed: the bound, shaded: the side its layers lie on); hover a mark for the paper's words.", "name": "fig-norms-models"}}
across_models(all_tables, "relative_contribution", "Mean relative contribution", ["attention", "mlp", "layer"], y_max=1.5,
              paper=reported("norms"))

# %% [markdown]
# (claims-norms)=
# ## Does the claim hold here?
#
# The claim checks come from the book's claims registry (`lmdepth.claims`); nothing in this page sets a threshold.
# Each model is checked beside a random-init model of its own architecture, run on the same problems, and a check
# counts only when the paired interval of (model − twin) over the problems excludes 0: a pattern the untrained model
# shows just as strongly measures the architecture, not the training. The *discrimination* column says on which
# side of its twin the model lies — an "agrees" whose twin drops *more* ("short of its control") says the drop comes
# with the architecture, and training weakens it.

# %% tags=["hide-input"]
md(claims_md("norms"))

# %% tags=["hide-input"]
controls = residual.run_units(report.control_models(models, remote, n_examples), **run_kw)  # random-init twins
verdicts = report.check("norms", residual.run_units(models, **run_kw), models, controls, n_boot=n_boot, seed=seed)
report.save(verdicts, "norms", results_dir)
show_table(report.display(verdicts), caption="The paper's claims on each model: the statistic with its 95 % interval, the control and the verdict")

# %% mystnb={"figure": {"caption": "This chapter's claims at a glance. Left, on each claim's own scale: each model's statistic with its 95 % interval; dashed, the paper's threshold (shaded: the window of a 'between' rule). Right: the model minus its control, with the paired 95 % interval (solid: 0; grey band: a permutation null's central 95 %); a note where there is no difference to show. Colour: how the row counts on the findings page; hollow: not counted, not testable or without a valid control. Hover a mark for n, the rule, the control test and the reason.", "name": "fig-norms-claims"}}
from lmdepth.charts.findings_charts import claims_forest
claims_forest(verdicts)

# %% tags=["remove-cell"]
# Invariants that must hold whatever the model (these are checks of the code, not of the paper's claim).
import numpy as np

for m in models:
    att = residual.select(all_tables, "relative_contribution", "attention", model=m).to_numpy()
    mlp = residual.select(all_tables, "relative_contribution", "mlp", model=m).to_numpy()
    lay = residual.select(all_tables, "relative_contribution", "layer", model=m).to_numpy()
    assert np.isfinite(att).all() and (att >= 0).all() and (mlp >= 0).all()
    mx = residual.select(all_tables, "relative_contribution", "layer", stat="max", model=m).to_numpy()
    assert (mx >= lay - 1e-9).all(), "max over tokens must be at least the mean"

# %% [markdown]
# ## Explore
#
# Every chart above is interactive without a kernel: hover for values and intervals, click legend entries to
# isolate components or models, switch mean/max. To run on your own model, change the parameters cell (or use the
# CLI above); results are cached under `results_dir` keyed by every parameter that changes them.
#
# ## Differences from the paper
#
# - **Models.** The paper's main model is Llama 3.1 70B (80 layers) run in bf16 on NDIF; this book runs small
#   models packaged on PyPI (SmolLM2-135M-Instruct, Gemma 3 270M, Qwen2.5-Coder-0.5B-Instruct), de-quantised from
#   4-bit GGUF files to fp32. Quantisation changes the weights slightly; small models may behave differently from
#   70B ones. The `paper` profile names the paper's models for a GPU or NDIF.
# - **Sample.** The paper says "10 random GSM8K examples"; the authors' code uses the first 20 in file order. The
#   default here is 20 examples drawn at random with a recorded seed (`selection="first"` reproduces the code).
# - **Numerics.** Metrics are computed in fp32 from fp32 activations (the code took norms of bf16 tensors).
# - **Absolute norms** are token-weighted means over all problems, without the authors' accumulator bug.
# - **Gemma 3** has post-sublayer ("sandwich") norms; its contributions are the outputs of
#   `post_attention_layernorm` and `post_feedforward_layernorm`, verified by the additivity check.
# - **Beyond the paper:** bootstrap 95 % intervals over problems for every mean; claim verdicts from intervals,
#   with layers 0–1 left out (the book's one convention) and a random-init control. Without layers 0–1 the
#   paper's "second half contributes less" is a statement about mid-depth layers, not about the first two layers'
#   large writes on a small embedding — which every residual network shows, trained or not.
#
# ## Summary and environment

# %% tags=["hide-input"]
md(f"{report.summary(verdicts)} Results: `{main.path}`.")
env = environment()
md(" · ".join(f"{k} {v}" for k, v in env.items() if v is not None))
