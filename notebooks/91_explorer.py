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
# # Explorer: your prompt, layer by layer
#
# Type a prompt, pick a model and a layer, and see, computed on the spot for that one prompt:
#
# - how much each layer's attention, MLP and whole block write into the residual stream (the relative
#   contributions of chapter {doc}`01 <01_residual_norms>`, averaged over the prompt's tokens);
# - what the **logit lens** reads from the residual entering each layer at a chosen token (chapter
#   {doc}`04 <04_logit_lens>`): its top tokens and the top-1 probability;
# - what **skipping** the chosen layer does to every later layer and to the output (chapter
#   {doc}`03 <03_layer_skipping>`, "all tokens" variant: the layer's output := its input at every position ≥ 1).
#
# The interactive form needs a live kernel: run `lmdepth explore` (this page as a local web app, offline; `--model`
# and `-p` set its parameters), open this notebook in Jupyter, or open it in Colab (**In Colab**, below). On the static
# page below, the same computation is shown once for a fixed example.
#
# The three computations are one nnsight session, chapter 03's skip session for the chosen layer, whose clean pass
# also reads the contributions and the logit lens: two forward passes per prompt, the clean one and the skipped one.
# So they also run on [NDIF](https://ndif.us): with `remote = True`, an NDIF API key (`NDIF_API_KEY`, e.g. a Colab
# secret) and `model_name` a hub id that NDIF hosts (e.g. `"meta-llama/Llama-3.1-70B"`, with `compare_models = []`),
# you explore a 70B model live from this notebook, one request per click; the weights stay on the server. Without a key, the
# network or the model hosted, NDIF's preflight stops the notebook in seconds, before anything is loaded, with one
# line saying which (`lmdepth run explorer -p remote=true` checks the same before the notebook starts).

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
model_name: str = "smollm2-135m"  # model of the static example (and the first in the picker)
compare_models: list = ["gemma3-270m", "qwen2.5-coder-0.5b"]  # further models in the live picker
prompt: str = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did she sell in May? Half of 48 is"  # example prompt
skip_layer: int = 3  # layer skipped in the static example
position: int = -1  # token whose logit lens is shown (-1: the last)
top_k: int = 5  # logit-lens tokens per layer
profile: str = "default"  # label of the parameter profile this run came from (smoke/default/paper)
device: str = "auto"  # "auto" (a GPU where there is one, else the CPU), "cpu", "cuda"
dtype: str = "float32"  # "float32", "bfloat16", "float16"
remote: object = False  # false: here; true: on NDIF (a hosted hub id; NDIF_API_KEY); "local": the offline simulation of NDIF

# %% tags=["remove-cell"]
import os

from lmdepth.book import explorer
from lmdepth.book.build import repository_url
from lmdepth.book.repository_buttons import colab_md
from lmdepth.charts.explorer_charts import exploration_charts
from lmdepth.book.notebook import md, setup, show_table
from lmdepth.params import check_remote, check_type
from lmdepth.runtime import resolve_device

setup(0)
check_type("compare_models", compare_models, list)
check_type("skip_layer", skip_layer, int)
for name in [model_name, *compare_models]:  # remote=true takes hub ids only: a packaged name stops here, in one line
    check_remote(name, remote)
lm = explorer.load(model_name, resolve_device(device), dtype, remote)  # remote=true: NDIF's preflight first
if not 0 <= skip_layer < lm.adapter.n_layers:
    raise ValueError(f"skip_layer must be in 0..{lm.adapter.n_layers - 1} for {model_name}, got {skip_layer}")
live = os.environ.get("LMDEPTH_BOOK_BUILD") != "1"

# %% tags=["hide-input"]
md(colab_md(repository_url()))

# %% [markdown]
# ## Live explorer *(live kernel only)*
#
# In `lmdepth explore`, Jupyter or Colab: edit the prompt, pick a model, move the layer slider, press **Run**. Models
# load on first use (the packaged ones in seconds, from the local cache).

# %% tags=["hide-input"]
if live:
    from IPython.display import display

    display(explorer.explorer_widget([model_name, *compare_models], prompt, skip_layer, device=resolve_device(device),
                                     dtype=dtype, k=top_k, loaded=lm, remote=remote))
else:
    md("*Live kernel only: the explorer's form appears here when this notebook runs in Jupyter or Colab. The "
       "static example below was computed when the book was built.*")

# %% [markdown]
# ## Static example

# %% tags=["hide-input"]
x = explorer.explore(lm, prompt, skip_layer, position, top_k)
where = {True: " on NDIF", "local": " through the offline simulation of NDIF"}.get(remote, "")
md(f"**{model_name}** ({lm.adapter.n_layers} layers){where}, {len(x.tokens)} tokens; logit lens at token "
   f"{x.position} ({x.tokens[x.position]!r}); layer {skip_layer} skipped at every position ≥ 1.")

# %% mystnb={"figure": {"caption": "One prompt: relative contributions of each layer (left), the logit lens' top-1 probability at the chosen token for the residual entering each layer, the last bar being the model's output (middle; hover for the token), and the largest relative change of every layer's contribution when the chosen layer is skipped (right).", "name": "fig-explorer"}}
exploration_charts(x)

# %% tags=["hide-input"]
e = x.skip.set_index("layer")["relative_change"]
later = e.iloc[skip_layer + 1 :]
final = x.lens[(x.lens.layer == lm.adapter.n_layers) & (x.lens["rank"] == 1)].iloc[0]
L = lm.adapter.n_layers
top1 = x.lens[(x.lens["rank"] == 1) & (x.lens.layer < L)].set_index("layer")["token_id"]
settle = next((l for l in top1.index if (top1.loc[l:] == final.token_id).all()), None)
md(f"The model's next token is {final.token!r} (p = {final.prob:.2f}); "
   + (f"the logit lens' top-1 token equals it from the residual entering layer {settle} on (l/L = {settle / L:.2f}). "
      if settle is not None else "the logit lens' top-1 token before the output never settles on it. ")
   + (f"Skipping layer {skip_layer} changes later layers' contributions by up to {later.max():.2f} "
      f"(layer {int(later.idxmax())}) and the output distribution by {x.output_change:.3f}."
      if len(later) else f"Layer {skip_layer} is the last one; skipping it changes the output by {x.output_change:.3f}."))

# %% tags=["hide-input"]
show_table(explorer.lens_token_table(x), caption="Logit-lens top tokens per layer, for the prompt above")

# %% [markdown]
# ## Notes
#
# - One prompt is an anecdote: the chapters average the same quantities over problems and report intervals.
# - The skip effect here is the largest change over *all* positions ≥ 1 of the prompt (chapter 03's "all tokens"
#   variant for a single prompt): one intervened forward pass per click, besides the clean one.
# - The logit lens reads every residual in the output basis; chapter 04 shows where a tuned lens disagrees.
