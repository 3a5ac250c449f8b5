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
# # When does the prediction settle? Logit lens and tuned lens
#
# **Claim (paper §3, Fig. 4).** Decoding the residual stream of each layer with the model's own output head
# (the *logit lens*), the divergence from the final output distribution falls, and the overlap of the top-5
# predictions rises, sharply around the middle of the network — at the same depth as the phase transition of
# {doc}`01_residual_norms` and {doc}`02_cosine_similarity`. The paper reads this as: the first half of the
# layers computes, the second half only *refines* the output distribution.
#
# The logit lens has a known blind spot: it reads every layer in the basis of the *last* one. If early layers
# already carry the prediction in another basis, the logit lens reports it late. The *tuned lens* (Belrose et al.
# 2023) learns one affine translator per layer that maps the residual into the output basis first. This chapter
# runs both lenses on the same problems and asks whether they agree on the depth where the prediction settles.
#
# **Rerun it.**
#
# ```bash
# source .venv/bin/activate    # the environment scripts/setup_env.sh made (or your own)
# lmdepth run lens --model smollm2-135m -p n_examples 5
# lmdepth run lens --model Qwen/Qwen2.5-1.5B -p device cuda -p positions_per_example 0
# jupytext --to ipynb -o - notebooks/04_logit_lens.py \
#   | papermill - /tmp/out.ipynb -p tuned_lens false -p results_dir /tmp/lmdepth-results
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
n_examples: int = 20  # number of problems (the paper: the first 20 GSM8K problems)
seed: int = 0  # seed of the example selection, the evaluated positions, the tuned-lens training and the bootstrap
selection: str = "random"  # "random" (the paper's wording) or "first" (the authors' code: first N in file order)
include_bos: bool = True  # include position 0 (BOS / attention sink) in the averages, as the paper does
n_boot: int = 1000  # bootstrap resamples over problems for the 95 % intervals of the means
positions_per_example: int = 64  # positions evaluated per problem (a seeded uniform sample), or 0 for every position
lens_dtype: str = "float32"  # dtype of the unembedding matmul ("bfloat16": the paper's precision; fast on GPUs, slow on CPUs without bf16 units)
tuned_lens: bool = True  # also train (cached) and evaluate the tuned lens
n_train_tokens: int = 16384  # tuned-lens training tokens per model (GSM8K train split; never the evaluated problems)
train_epochs: int = 4  # passes over the training tokens
profile: str = "default"  # label of the parameter profile this run came from (smoke/default/paper)
device: str = "auto"  # "auto" (a GPU where there is one, else the CPU), "cpu", "cuda"
dtype: str = "float32"  # "float32", "bfloat16", "float16"
remote: object = False  # false: here; true: on NDIF (a hosted hub id; NDIF_API_KEY; the tuned lens trained here first); "local": the offline simulation of NDIF
use_cache: bool = True  # reuse finished runs and resume interrupted ones; False recomputes
results_dir: str = "results"  # where tidy tables, sidecars and tuned-lens translators are written

# %% tags=["remove-cell"]
from lmdepth.analyses import bigram, lens, residual
from lmdepth.charts.lens_charts import lens_across_models, lens_layers, settling_chart, training_curves
from lmdepth.book.cost import announce_cost
from lmdepth.book.measurement import show_measurement
from lmdepth.book.notebook import chapter_models, claims_md, md, setup, show_table
from lmdepth.claims import report
from lmdepth.claims.paper_values import reported
from lmdepth.book.pages import lens_page as page
from lmdepth.model.translators import TunedLensRecipe
from lmdepth.runtime import environment, resolve_device

setup(seed)
announce_cost("lens", globals())  # before a long computation: its cost, and a smaller run
common_kw = dict(dataset=dataset, n_examples=n_examples, seed=seed, selection=selection, include_bos=include_bos,
                 n_boot=n_boot, device=resolve_device(device), dtype=dtype, remote=remote, results_dir=results_dir,
                 use_cache=use_cache)
lens_kw = dict(common_kw, positions_per_example=positions_per_example, lens_dtype=lens_dtype, tuned_lens=tuned_lens,
               n_train_tokens=n_train_tokens, train_epochs=train_epochs)
models = chapter_models(model_name, compare_models)  # checked: a typo stops here, before any model runs

# %% [markdown]
# ## Two ways to read a residual
#
# For every problem, one forward pass (teacher-forced on the prompt plus the reference solution) hooks the
# residual $h_l$ *entering* layer $l$ ($h_0$ = the embeddings) and the last layer's output $h_L$. Each is decoded
# with the model's own final norm and unembedding (and Gemma's logit soft-capping, where set):
#
# $$P_l^{\text{logit}} = \operatorname{softmax}\big(W_U\,\operatorname{Norm}(h_l)\big),\qquad
#   P_l^{\text{tuned}} = \operatorname{softmax}\big(W_U\,\operatorname{Norm}(h_l + A_l h_l + s_l b_l)\big),\qquad
#   P^{\text{final}} = P_L^{\text{logit}}.$$
#
# Per token, in fp32 after the matmul:
#
# - $\mathrm{KL}(P_l \,\|\, P^{\text{final}}) = \sum_v P_l(v)\,[\log P_l(v) - \log P^{\text{final}}(v)]$ —
#   **the direction of the authors' code** (lens first). The tuned lens is *trained* on the other direction,
#   $\mathrm{KL}(P^{\text{final}} \,\|\, P_l)$; both are computed, and a radio button below switches them.
# - top-5 overlap $\lvert\mathrm{top5}(P_l) \cap \mathrm{top5}(P^{\text{final}})\rvert / 5$.
#
# Averages follow the authors' script: the mean over positions within a problem, then a plain mean over problems
# (the nnsight notebook [NB] weights every token equally instead; both are in the results table). The bands are
# bootstrap 95 % intervals over problems.
#
# **What makes this cheap enough for a CPU.** The unembedding is the expensive part: Gemma 3 has a 262k-token
# vocabulary, so one layer's logits for 200 tokens are 200 MB. Inside the nnsight trace, the lens readings are
# unembedded in blocks of at most 8M logits (32 MB) and each block is reduced to per-token KL and overlap at once,
# so memory does not grow with depth and only [lenses × metrics × layers × positions] numbers leave the trace (the
# logit lens is written to run on NDIF this way; that is not tested here, without network).
# The matmul runs in `lens_dtype` (fp32 by default; the paper's models ran in bf16, which the `paper` profile
# uses — bf16 matmuls are fast on GPUs but several times slower than fp32 on CPUs without bf16 units; log-softmax
# is always fp32). In the model's own dtype the lens calls the model's head, as every trace does; another
# `lens_dtype` multiplies by the lens' own copy of the head's weight in that dtype, which only a run here makes (a
# hosted model's weights are not readable: remotely the lens needs `lens_dtype` equal to the model's dtype, and says
# so in one line before anything is sent). Each problem is evaluated at
# a seeded uniform sample of `positions_per_example` positions, which keeps the per-problem mean over positions
# unbiased (`positions_per_example=0` evaluates every position, as the paper does).

# %% tags=["hide-input"]
show_measurement("lens")

# %% [markdown]
# ## The tuned lens, trained here
#
# One affine translator per layer, $h \mapsto h + A_l h + s_l b_l$ ($A_l \in \mathbb{R}^{d\times d}$, $b_l \in
# \mathbb{R}^d$, both initialised to zero so training starts from the logit lens; $s_l$ is the mean RMS of $h_l$, a
# constant that makes the bias step scale-free), trained to minimise $\mathrm{KL}(P^{\text{final}} \,\|\,
# P^{\text{tuned}}_l)$ as in Belrose et al. Training uses `n_train_tokens` tokens of GSM8K **train**-split problems
# (the evaluated problems come from the test split), with Adam and a cosine-decayed learning rate, all layers'
# translators trained in the same pass over cached residuals. Held-out train-split problems give the dashed curves
# below, and each layer keeps the translator of the epoch with the lowest held-out loss — the identity (the logit
# lens) if training never beats it — so that overfitting cannot make the tuned lens worse than where it started.
# The translators are cached in the results directory, keyed by the model and every setting of the recipe.
#
# A full-vocabulary softmax for every (token, layer) pair is what makes this expensive (about 30 ns per logit
# forward and backward on this CPU: minutes per epoch for Gemma's 262k tokens). So training uses a **sampled
# softmax**: each step computes logits only on the union of the top output tokens of all training tokens (where
# the output's probability mass is; exact) plus uniform samples of the rest of the vocabulary, importance-weighted
# so that the loss estimates the full-vocabulary KL. The evaluation below always uses the full vocabulary.

# %% tags=["hide-input"]
md(page.recipe_md(TunedLensRecipe(n_tokens=n_train_tokens, epochs=train_epochs, seed=seed), enabled=tuned_lens))

# %% tags=["hide-input"]
all_tables, all_runs, curves = lens.run_many(models, **lens_kw)
md(page.runs_md(all_runs, models, lens_dtype))

# %% [markdown]
# The last-layer check decodes $h_L$ with the lens and compares it with the logits the model itself produced:
# any difference is the rounding of the unembedding (float32 here; larger in bf16), and it is tiny next to the KL
# values below.

# %% [markdown]
# ## Training curves of the tuned lens
#
# The loss is the sampled estimate of $\mathrm{KL}(P^{\text{final}} \,\|\, P^{\text{tuned}}_l)$, averaged over the
# layers in four bands of depth. At zero tokens it is the logit lens.

# %% mystnb={"figure": {"caption": "Tuned-lens training: sampled KL(P_final ‖ P_tuned) against training tokens seen, averaged over the layers in four depth bands (log scale). Solid: training batches (averaged over 4 steps); dashed: held-out train-split problems, after every epoch (each layer keeps its translator from the lowest dashed point). At 0 tokens the translators are the identity, i.e. the logit lens.", "name": "fig-lens-training"}}
training_curves(curves) if tuned_lens and not curves.empty else md("*Tuned lens switched off (`tuned_lens=False`).*")

# %% tags=["hide-input"]
if tuned_lens and not curves.empty:
    md(page.curve_ends_md(curves, models))
    show_table(lens.tuned_convergence(curves), caption="Tuned-lens training per model: layers whose translator beats the logit lens, and layers still improving")  # converged: beats the logit lens at every layer, none still improving

# %% [markdown]
# Is the tuned lens trained enough? The table reads each layer's held-out curve: **beat logit lens** counts the
# layers whose selected translator has a lower held-out KL than the identity (the logit lens), **still improving**
# the layers whose held-out KL was still falling by more than 2 % at the last point. A converged tuned lens beats
# the logit lens at every layer with none still improving; until then its settling depths are upper bounds (a
# better-trained lens can only decode the prediction earlier or equally early).
#
# ## Per layer, for the main model (Fig. 4)
#
# The dashed line marks the cosine phase-transition layer of {doc}`02_cosine_similarity` (read from that chapter's
# cached run of the same problems).

# %% tags=["hide-input"]
res_tables, _ = residual.run_many(models, **common_kw)
transitions = {m: residual.cosine_transition_layer(res_tables, model=m) for m in models}

# %% mystnb={"figure": {"caption": "Logit lens and tuned lens per layer: KL divergence to the model's output distribution (left, log scale; the radio button switches the direction — the paper uses KL(P_lens ‖ P_final)) and top-5 overlap with the output's top 5 (right; dotted: the 0.2 threshold). x = l is the residual entering layer l (0 = embeddings). Bands: bootstrap 95 % intervals over problems. Dashed gray: where the cosine phase-transition layer of chapter 02 writes. Dashed dark, labelled 'paper': the depth from which the paper's model's KL falls and overlap rises sharply, its middle (Fig. 4), at the same relative depth of this model; hover it for the paper's words.", "name": "fig-lens-layers"}}
lens_layers(all_tables, model_name, transitions[model_name], paper=reported("lens"))

# %% tags=["hide-input"]
summary = lens.settling_summary(all_tables, transitions)
md(page.main_model_md(all_tables, all_runs, summary, transitions, model_name, tuned=tuned_lens))

# %% [markdown]
# ## Across models, on relative depth
#
# The models differ in depth (SmolLM2 30 layers, Qwen2.5-Coder 24, Gemma 3 18), so they are compared at relative
# depth $l/L$: 0 is the embeddings, 1 would be the output.

# %% mystnb={"figure": {"caption": "KL(P_lens ‖ P_final) per layer for each model, on relative depth l/L (log scale), logit lens (left) and tuned lens (right). Click a model in the legend to highlight it.", "name": "fig-lens-kl-models"}}
lens_across_models(all_tables, "kl", "KL(P_lens ‖ P_final), nats (log)", log_y=True)

# %% mystnb={"figure": {"caption": "Top-5 overlap with the output per layer for each model, on relative depth l/L, logit lens (left) and tuned lens (right).", "name": "fig-lens-overlap-models"}}
lens_across_models(all_tables, "top5_overlap", "Top-5 overlap")

# %% [markdown]
# ## Where does the prediction settle?
#
# Scalar summaries per model, with the definitions of arXiv 2512.14064: the first layer where the lens' KL falls
# below 10 % of its maximum over layers, and the first layer where the top-5 overlap exceeds 0.2. Both are
# reported at relative depth $l/L$. A lens that never crosses a threshold before the output is placed at $l = L$
# (relative depth 1), where the lens is the output. The KL criterion is relative to each lens' own maximum, and the
# logit lens' maximum is usually its (meaningless) reading of the embeddings; so the tuned lens is also placed at
# the *logit lens'* threshold, which compares both lenses at the same KL. The cosine phase-transition layer $t$ of
# chapter 02 writes between $h_t$ and $h_{t+1}$, so it sits at $(t + 0.5)/L$ on the same axis.

# %% tags=["hide-input"]
show_table(lens.summary_wide(summary), caption="Where each lens settles per model, as layer (l/L), beside the cosine transition")

# %% mystnb={"figure": {"caption": "Where the prediction settles, per model, on relative depth: first layer with KL below 10 % of the lens' maximum, with KL below 10 % of the logit lens' maximum (tuned lens), and with top-5 overlap above 0.2; gray tick: the cosine phase transition ((t + 0.5)/L). Marks at 1.0 never crossed the threshold before the output. Dashed dark, labelled 'paper': where the paper's model settles, from mid-depth (Fig. 4).", "name": "fig-lens-settling"}}
settling_chart(summary, paper=reported("lens"))

# %% tags=["hide-input"]
if tuned_lens:
    md(page.disagreement_md(all_tables, all_runs, summary, models))

# %% [markdown]
# **What the disagreement means.** The tuned lens at $l = 0$ is a learned linear function of the current token's
# embedding alone — in effect a bigram model — so its overlap there is a baseline, not evidence of computation.
# What matters is how the tuned lens improves *from* that baseline. Where it improves steadily through the first
# half while the logit lens stays flat, the first-half layers are building the prediction in a basis the output
# head cannot read yet; the logit lens' late, sharp rise is then partly a change of basis becoming visible, and
# "the second half only refines" overstates how little is left to do after mid-depth. Where the tuned lens, too,
# improves mostly in the second half, the paper's reading survives the better readout. The claim checks below
# make this call per model.

# %% [markdown]
# (claims-lens)=
# ## Does the claim hold here?
#
# From the claims registry (`lmdepth.claims`), on per-problem means over the evaluated positions. The control is
# each model's random-init twin (same architecture, weights never trained) read by the same logit lens on the same
# problems: its settling depth is paired with the model's problem by problem, and a check counts only when the
# interval of the difference excludes 0. The count-bigram baseline (a predictor that sees only the current token)
# is no control — flat over depth, it would fix every settling depth by construction — but the tuned lens is
# judged against it (at layer 0 the tuned lens *is* a bigram model). With `tuned_lens` on, each twin gets a tuned
# lens of its own, trained the same way on the same tokens (this doubles the tuned-lens cost of the chapter), and
# its bigram baseline: the tuned-lens rows are paired with it. Whether the lenses settle at the cosine phase
# transition (arXiv 2512.14064) is shown in the settling table above, not judged.

# %% tags=["hide-input"]
md(claims_md("lens"))

# %% tags=["hide-input"]
units = bigram.with_baseline(lens.run_units(models, **lens_kw), models, **lens_kw)
twins = report.control_models(models, remote is True, n_examples)  # random-init twins, read by the same lenses
controls = bigram.with_baseline(lens.run_units(twins, **lens_kw), twins, **lens_kw) if twins else None
verdicts = report.check("lens", units, models, controls, n_boot=n_boot, seed=seed)
report.save(verdicts, "lens", results_dir)
show_table(report.display(verdicts), caption="The paper's claims on each model: the statistic with its 95 % interval, the control and the verdict")

# %% mystnb={"figure": {"caption": "This chapter's claims at a glance. Left, on each claim's own scale: each model's statistic with its 95 % interval; dashed, the paper's threshold (shaded: the window of a 'between' rule). Right: the model minus its control, with the paired 95 % interval (solid: 0; grey band: a permutation null's central 95 %); a note where there is no difference to show. Colour: how the row counts on the findings page; hollow: not counted, not testable or without a valid control. Hover a mark for n, the rule, the control test and the reason.", "name": "fig-lens-claims"}}
from lmdepth.charts.findings_charts import claims_forest
claims_forest(verdicts)

# %% tags=["remove-cell"]
# Invariants that must hold whatever the model (checks of the code, not of the paper's claim).
page.check_invariants(all_tables, all_runs, curves, models, lens_dtype, tuned=tuned_lens)

# %% tags=["hide-input"]
md(page.averaging_md(all_tables, models, tuned=tuned_lens))

# %% [markdown]
# ## Explore
#
# Hover any chart for values and intervals; switch the KL direction with the radio button; click legend entries to
# highlight a model. To run on your own model, change the parameters cell (or use the CLI above). The tidy table has
# one row per (model, lens, metric, statistic, layer); the translators of the tuned lens are saved beside their
# training curve under `results_dir/tuned_lens/`.
#
# ## Differences from the paper
#
# Small packaged models in fp32 and a sample of positions per problem, instead of Llama 3.1 70B and every
# position; the authors' aggregation and KL direction. Beyond the paper: a tuned lens trained here, scalar
# summaries with bootstrap intervals, and verdicts with a random-init twin as the control.
#
# :::{dropdown} The differences in detail: models, sample, aggregation, KL direction, tuned lens, verdicts
# - **Models.** Small PyPI-packaged models (SmolLM2-135M-Instruct, Gemma 3 270M, Qwen2.5-Coder-0.5B-Instruct),
#   de-quantised from 4-bit GGUF to fp32, instead of Llama 3.1 70B in bf16 on NDIF; the unembedding matmul runs in
#   fp32 (the `paper` profile: bf16, as in the paper), with fp32 log-softmax.
# - **Sample.** 20 random GSM8K test problems with a recorded seed (the code: the first 20), and a seeded uniform
#   sample of `positions_per_example` positions per problem (64 by default; all of a shorter problem) instead of
#   every position — an unbiased estimate of the per-problem mean at a fraction of the cost (the run summaries at
#   the top give the share evaluated; `positions_per_example=0` evaluates every position, as the paper does).
# - **Aggregation** as in the authors' script (per-problem mean, then a plain mean over problems); the token-weighted
#   mean of [NB] is in the table as `token_mean`.
# - **KL direction.** The paper's code computes KL(P_lens ‖ P_final); so does this chapter's main figure. The tuned
#   lens is trained on KL(P_final ‖ P_lens), which is also reported.
# - **Tuned lens (beyond the paper).** The paper has no tuned lens. Belrose et al. train on ~65M tokens of the
#   Pile with SGD; here each model's translators see `n_train_tokens` GSM8K training tokens (16,384 by default,
#   4 epochs, Adam at a peak learning rate of 5e-4) with a sampled-softmax estimate of the full-vocabulary KL. At
#   3,072 tokens and 2e-3 (this book before), every layer was still improving and Gemma 3's last two layers stayed
#   worse than the logit lens; the convergence table above says how far the current budget gets. Where layers are
#   still improving, the tuned lens' settling depths are upper bounds.
# - **Scalar summaries (beyond the paper)** from arXiv 2512.14064, and bootstrap intervals over problems.
# - **Verdicts (beyond the paper).** Settling depths are searched from layer 2 (the book's convention on layers
#   0–1); a lens that never settles before the output says nothing about *late* settling, and where half or more
#   of the problems' own curves never settle, the settling depth of their mean is pinned at 1.0 and cannot move:
#   the row is not testable (saturated), and a twin like that is no valid control. The tuned lens must beat the
#   count-bigram baseline by 0.2 in top-5 overlap: with the plain 0.2 level the tuned-lens check could not pass,
#   because a bigram table alone exceeds it.
# :::
#
# ## Summary and environment

# %% tags=["hide-input"]
md(f"{report.summary(verdicts)} Evaluation time ({model_name}): {all_runs[model_name].eval_time_s:.0f} s.")
md(" · ".join(f"{k} {v}" for k, v in environment().items() if v is not None))
