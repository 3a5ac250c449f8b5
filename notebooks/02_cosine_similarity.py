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
# # Do layers erase, reinforce, or write something new?
#
# **Claim (paper §3.1, Fig. 2b).** The cosine similarity between what a sublayer writes and the residual it writes
# into changes sign around the middle of the network: early layers partly *erase* features already in the residual
# (negative cosine), later layers *reinforce* them (positive cosine). The paper calls this a phase transition at the
# same depth where the relative contributions of {doc}`01_residual_norms` drop.
#
# A negative cosine means the write points against the residual (removing features), a cosine near 0 writes
# directions orthogonal to it (new features), a positive one strengthens what is there. In superposition these are
# statements about the residual as a whole, not about individual features (the paper's limitation, too).
#
# ```bash
# source .venv/bin/activate    # the environment scripts/setup_env.sh made (or your own)
# lmdepth run cosine --model smollm2-135m -p n_examples 5
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
from lmdepth.charts.residual_charts import across_models, layer_bars
from lmdepth.runtime import environment, resolve_device

setup(seed)
announce_cost("cosine", globals())  # before a long computation: its cost, and a smaller run
models = chapter_models(model_name, compare_models)  # checked: a typo stops here, before any model runs
run_kw = dict(dataset=dataset, n_examples=n_examples, seed=seed, selection=selection, include_bos=include_bos, n_boot=n_boot,
              device=resolve_device(device), dtype=dtype, remote=remote, results_dir=results_dir, use_cache=use_cache)

# %% [markdown]
# ## Cosine of each write with the residual (Fig. 2b)
#
# Per token, in fp32 (eps $10^{-8}$), averaged over all tokens of all problems:
#
# $$\cos(a_l, h_l),\qquad \cos(m_l, h_l + a_l),\qquad \cos(a_l + m_l, h_l)$$
#
# The same forward passes as the norms chapter (shared cache): one pass per problem.

# %% tags=["hide-input"]
show_measurement("cosine")

# %% tags=["hide-input"]
main = residual.run(model_name, **run_kw)
table, run = main.table, residual.ResidualSummary.of(main)
origin = "loaded from the results cache" if run.from_cache else f"computed in {run.wall_time_s:.0f} s"
md(f"**{model_name}**: {run.n_layers} layers, {run.n_problems} {dataset} examples, {run.n_tokens:,} tokens; {origin}.")

# %% mystnb={"figure": {"caption": "Mean cosine similarity between each layer's attention, MLP and total write and the residual it is added to (bars overlap, the largest magnitude at the back; rules: bootstrap 95 % interval). Negative: erasing; near zero: writing new directions; positive: reinforcing. Grey dashed rule, labelled 'paper': where the paper locates its model's sign change, between the two halves of the depth (Fig. 2b; it gives no layer), so at the middle of the bars; hover it for the paper's words.", "name": "fig-cos-components"}}
layer_bars(table, "cosine", "Cosine similarity", ["attention", "mlp", "layer"], stats=("mean",), paper=reported("cosine"))

# %% tags=["hide-input"]
cos = {c: residual.select(table, "cosine", c) for c in ("attention", "mlp", "layer")}
trans = residual.cosine_transition_layer(table)
L = run.n_layers
md("Mean cosine, first half → second half: " + "; ".join(
    f"{c} {a:+.3f} → {b:+.3f}" for c, (a, b) in ((c, residual.half_means(v)) for c, v in cos.items())) + ". "
   + (f"The mean of the three cosines changes sign, negative before and positive from layer {trans} on "
      f"(relative depth {trans / L:.2f}; the change point over layers 2…{L - 1})." if trans is not None else
      "The mean of the three cosines has no sustained sign change over layers 2…L−1 (negative on average before "
      "its change point and positive after it)."))

# %% [markdown]
# ## Input–output cosine (appendix)
#
# $\cos(h_{l+1}, h_l)$: how much a whole layer rotates the residual. Values near 1 mean the layer barely changes
# its direction.

# %% mystnb={"figure": {"caption": "Mean cosine similarity between the residual leaving and entering each layer.", "name": "fig-cos-io"}}
layer_bars(table, "cosine", "cos(h_(l+1), h_l)", ["io"], stats=("mean",))

# %% [markdown]
# ## Across models, on relative depth

# %% tags=["hide-input"]
all_tables, all_runs = residual.run_many(models, **run_kw)
md(", ".join(f"**{m}**: {all_runs[m].n_layers} layers" for m in models))

# %% mystnb={"figure": {"caption": "Mean cosine of the attention, MLP and whole-layer writes with the residual, per model, on relative depth (dashed: zero). Click a model in the legend to highlight it. Grey dashed rule, labelled 'paper': where the paper locates its model's sign change (Fig. 2b, between the two halves).", "name": "fig-cos-models"}}
across_models(all_tables, "cosine", "Mean cosine similarity", ["attention", "mlp", "layer"], zero_line=True,
              paper=reported("cosine"))

# %% [markdown]
# (claims-cosine)=
# ## Does the claim hold here?
#
# From the claims registry (`lmdepth.claims`), each model beside a random-init model of its own architecture on the
# same problems; a check counts only when the paired interval of (model − twin) excludes 0. For the transition's
# depth, a twin without a sustained sign change has no transition to compare with, so that row has no valid control
# (whether the model's sign change beats the twin's is the sign-change row's question, counted there once).

# %% tags=["hide-input"]
md(claims_md("cosine"))

# %% tags=["hide-input"]
controls = residual.run_units(report.control_models(models, remote, n_examples), **run_kw)  # random-init twins
verdicts = report.check("cosine", residual.run_units(models, **run_kw), models, controls, n_boot=n_boot, seed=seed)
report.save(verdicts, "cosine", results_dir)
show_table(report.display(verdicts), caption="The paper's claims on each model: the statistic with its 95 % interval, the control and the verdict")

# %% mystnb={"figure": {"caption": "This chapter's claims at a glance. Left, on each claim's own scale: each model's statistic with its 95 % interval; dashed, the paper's threshold (shaded: the window of a 'between' rule). Right: the model minus its control, with the paired 95 % interval (solid: 0; grey band: a permutation null's central 95 %); a note where there is no difference to show. Colour: how the row counts on the findings page; hollow: not counted, not testable or without a valid control. Hover a mark for n, the rule, the control test and the reason.", "name": "fig-cosine-claims"}}
from lmdepth.charts.findings_charts import claims_forest
claims_forest(verdicts)

# %% tags=["remove-cell"]
import numpy as np

for m in models:
    for c in ("attention", "mlp", "layer", "io"):
        v = residual.select(all_tables, "cosine", c, model=m).to_numpy()
        assert np.isfinite(v).all() and (np.abs(v) <= 1 + 1e-5).all(), "cosines must lie in [-1, 1]"

# %% [markdown]
# ## Differences from the paper
#
# - **Models and precision** as in {doc}`01_residual_norms`: small PyPI-packaged models in fp32 instead of
#   Llama 3.1 70B in bf16; cosines in fp32 (the code used bf16 inputs).
# - **Sample:** 20 random GSM8K problems with a recorded seed (the code: the first 20).
# - **Phase transition as a number:** the paper reads it off the figure. arXiv 2512.14064 takes the last
#   negative-to-non-negative crossing of the mean of the three cosines; on these models that crossing is often the
#   last of several noise crossings (and every model crosses between layers 0 and 1). Here the transition is the
#   change point of the mean cosine over layers 2…L−1 — the split with the most layers negative before it and
#   non-negative after it, each side at least max(2, L/8) layers — and a sign change counts only when the curve is
#   negative on average before it and positive after it. The atlas and chapter 04 use the same definition.
# - **Beyond the paper:** bootstrap intervals over problems and explicit criteria per model.
#
# ## Summary and environment

# %% tags=["hide-input"]
md(f"{report.summary(verdicts)} Results: `{main.path}`.")
md(" · ".join(f"{k} {v}" for k, v in environment().items() if v is not None))
