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
# # Reproducibility
#
# How this book was built, how to rebuild it, and how to rerun any chapter on another model — with the versions
# and wall times of the build you are reading (read from the executed notebooks, not typed in).
#
# ## Two commands
#
# ```bash
# bash scripts/build_book.sh          # install everything, execute changed chapters (default profile), render HTML
# bash scripts/build_book.sh --force  # re-execute every chapter
# bash scripts/test.sh                # install everything, run the tests (CI: .ci/run)
# ```
#
# The build executes a chapter only when its source, the library, its profile or the pinned requirements changed
# since the executed copy under `book/` was made (a hash stored in the notebook's metadata). Results are cached
# under `results/` by every parameter that changes them, so a re-execution with unchanged parameters reads them
# back; interrupted runs resume from per-problem checkpoints.
#
# ## One chapter, your model
#
# ```bash
# lmdepth list -v                                                     # chapters, parameters, packaged models
# lmdepth run norms --model meta-llama/Llama-3.1-8B -p device cuda -p dtype bfloat16
# lmdepth run skipping --profile default -p n_examples 10             # a profile, then overrides
# lmdepth run skipping --model meta-llama/Llama-3.1-70B -p remote true -p n_examples 2   # on NDIF (see below)
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
book_dir: str = "book"  # where the executed chapter notebooks are (their build record)
profile: str = "default"  # label of the parameter profile this run came from (smoke/default/paper)
results_dir: str = "results"  # the results whose book record gives the cost per chapter and model

# %% tags=["remove-cell"]
import pandas as pd
import yaml

from lmdepth.analyses import atlas
from lmdepth.book.build import repository_url
from lmdepth.book.chapters import CHAPTERS, profiles_dir
from lmdepth.book.cost import PAPER_LAYERS, build_cost, cost_table, remote_cost
from lmdepth.book.faults import fault_summary
from lmdepth.book.notebook import md, setup, show_table
from lmdepth.book.repository_buttons import colab_md
from lmdepth.runtime import REPO_ROOT, environment
from lmdepth.traces.remote import NOT_REMOTE, REMOTE_READY

setup(0)

# %% [markdown]
# ## Profiles
#
# A profile is a `common` block of parameters plus one block per chapter (`profiles/*.yaml`); the notebooks'
# defaults equal the `default` profile. The book you are reading was built with the profile shown in the build
# record below.

# %% tags=["hide-input"]
rows = []
for path in sorted(profiles_dir().glob("*.yaml")):
    doc = yaml.safe_load(path.read_text()) or {}
    rows.append({"profile": path.stem, "block": "common", "parameters": yaml.safe_dump(doc.get("common") or {},
                 default_flow_style=True, width=10_000).strip()})
    for chapter, params in (doc.get("chapters") or {}).items():
        rows.append({"profile": path.stem, "block": chapter,
                     "parameters": yaml.safe_dump(params, default_flow_style=True, width=10_000).strip()})
show_table(pd.DataFrame(rows), caption="The parameters each profile sets, per chapter")

# %% [markdown]
# ## Build record
#
# When and with which profile each page was executed and how long it took (a chapter whose results were cached
# takes seconds; the first build on a fresh machine computes everything).

# %% tags=["hide-input"]
record = atlas.build_record(book_dir)
record = record[record.chapter != "92_reproducibility"]
show_table(record, caption="The executed pages of this build: when, and in how long") if len(record) else md(f"*No executed chapter notebooks under `{book_dir}`: `lmdepth book` writes "
                                          "them (this page reads their build record).*")
known = pd.to_numeric(record["wall time (s)"], errors="coerce")
md(f"{len(record)} pages; the times of their last executions add up to {known.sum() / 60:.1f} min "
   f"({int(known.isna().sum())} without a record). These are the times of *this* build's executions — a page whose "
   "results were cached re-executes in seconds — not the cost of computing everything on a fresh machine (see "
   f"'What each chapter costs to compute' below). Chapters: {', '.join(CHAPTERS)}.")

# %% [markdown]
# ## What each chapter costs to compute
#
# Per chapter and model, from the runs this profile's build recorded: the units (problems or items — each
# analysis's own), how many of them carry their compute time (units computed before the timing existed do not),
# the seconds per timed unit on the machine in the versions table below, and the profile's total where every unit
# was timed, and the wall time of the executions that finished the runs (from each run's sidecar). A run without
# units computed in one execution (chapter 03's benchmark, chapter 07's depth runs) is counted by that execution's
# CPU time once its sidecar keeps it; older sidecars keep only the wall time, a lower bound where a run may have
# resumed from checkpoints. Choose sizes for your hardware from the seconds per unit; a fresh machine also converts
# the packaged models once (about 2.5 min on 2 cores). Norms and cosine share their runs. Chapter 07's rows are its
# depth runs: each trained, untrained and positive-control model's depth on the problem sample, and the fine-tuned
# SmolLM2 runs' evaluation and depth (hours each). Its training is not a run of the record: a build trains nothing,
# and what training cost, with the command to retrain, is on its own page.

# %% tags=["hide-input"]
show_table(cost_table(results_dir, profile), caption="Compute time per chapter and model, from the runs' own timings")
built = build_cost(results_dir, profile)
md(f"In all, {built.sentence()}. Chapters 01 and 02 share their runs (counted once). This is the book's one "
   "cold-build figure: the README's and each chapter's cost announcement read the same sum "
   "(`lmdepth.book.cost.build_cost`)." if built.minutes else "*No runs recorded for this profile: no cost to add up.*")

# %% [markdown]
# ## Open a chapter in Colab

# %% tags=["hide-input"]
md(colab_md(repository_url()))

# %% [markdown]
# ## Where each chapter runs: here, on a GPU, on NDIF
#
# Every chapter runs here on a CPU and, with `device cuda`, on a GPU. A chapter runs on NDIF (`remote true`, a hub
# id of a model NDIF hosts, an API key) when the code that touches its model is a *remote-ready trace*: an nnsight
# trace or session whose block reads only torch, the model's envoys and plain data, and returns only what it
# saves. The same traces are what a local run executes. `remote true` first checks, in seconds and before loading
# anything, that an API key is set, the hub and NDIF answer, NDIF runs the model and its nnsight, transformers and
# torch versions equal ours (one line per failure).
#
# **Verified offline.** `remote local` runs the traces through a simulation of the NDIF server stricter than
# nnsight's own (`lmdepth.traces.server`): the request is serialised as the remote backend does, anything the server
# could not import is refused, only the deserialised copy runs, with this library hidden, and only saved values come
# back. The tests run every trace that way on tiny models of all five families and require the numbers of the
# plain-hook reference to 1e-5 (`tests/test_traces.py`), and run each remote-ready chapter's analyses both ways,
# requiring the same tables to 1e-5 — chapter 01 through the `lmdepth run` command as a reader types it
# (`tests/test_remote_chapters.py`).
#
# **Not verified here: a run against the real NDIF server** (the book is built and tested without network access).
# The one command that checks it, with an API key:
#
# ```bash
# NDIF_API_KEY=... python scripts/ndif_smoke.py   # Llama 3.1 8B, one problem: residual norms, every layer skipped
# ```
#
# It prints the per-layer numbers and writes the server's versions beside the runs (`ndif_smoke.json`, and each
# run's sidecar); without a key or the network it says so in one line, before loading anything. NDIF computes in
# bf16: compare with a local bf16 run.

# %% tags=["hide-input"]
show_table(pd.DataFrame([{"chapter": c, "here (CPU, GPU)": "yes",
                          "NDIF (remote true) and its simulation (remote local)": (
                              f"yes: {REMOTE_READY[c]}" if c in REMOTE_READY else f"no: {NOT_REMOTE.get(c, '')}")}
                         for c in CHAPTERS]), caption="Where each chapter runs: here, on a GPU, on NDIF")

# %% [markdown]
# ### What a prompt costs on NDIF
#
# Per chapter, for Llama 3.1 70B (80 layers of width 8,192, the paper's model) with the `paper` profile's parameters:
# the requests (one nnsight trace or session each, a round trip to the server), the forward passes of the model (a
# batched pass counts once), the rows of a batched pass, the tensors a request ships besides its code (the block and
# the kernels, a few kB) and what it brings back (only the saved values). Counted from the traces' structure and the
# code's batching defaults, not measured (the tests hold the counts to the forward passes the traces make and the
# sizes to what the strict offline server records); the third column says where the profile itself runs the chapter.
# NDIF documents no cap on either; the project sets its own, 1 GB shipped and 50 MB returned per request (the second
# is the strict server's bound): chapter 06's residual collection splits its batches to stay under it, and a tuned
# lens whose translators exceed the first is refused in one line before anything is sent.

# %% tags=["hide-input"]
ndif_cost = remote_cost("paper", PAPER_LAYERS)
sizes = ["ships / request", "returns / request"]
show_table(ndif_cost.drop(columns=sizes), caption="What each chapter costs on NDIF for Llama 3.1 70B: requests and forward passes per prompt")  # two tables, so each fits the text column
show_table(ndif_cost[["chapter", "measurement", *sizes]], caption="What one NDIF request of each chapter ships and returns")

# %% [markdown]
# ## Results that defend themselves
#
# Every finished run's sidecar records the sha256 and row count of its tables, written in the same atomic step as
# the run; a run whose files no longer match is moved aside as `<key>.damaged-<time>` and computed again, and a book
# build stops, naming the run and the command that restores it, when a page it keeps shows a missing or damaged run.
# `use_cache false` computes beside the finished run and replaces it only when the new one is complete. `lmdepth
# clean` removes only the library's own temporaries (`.lmdepth-tmp-*`) and old checkpoint folders inside a
# directory marked as a results root (`lmdepth-results.json`), and `--dry-run` lists them first. Runs made with
# `lmdepth run` name their executed notebook and verdict files by their settings, so no run overwrites another's.
# The tests that hold all this, counted:

# %% tags=["hide-input"]
md(fault_summary(REPO_ROOT / "tests" / "test_faults.py"))

# %% [markdown]
# ## Measured build times
#
# Measured on 2-core CPUs without a GPU, in fresh clones, with `/usr/bin/time -v` (2026-11; the same code has taken
# up to 1.5× longer in one session than in another):
#
# - **From the stored results**: `bash scripts/build_book.sh` 1 min 32 s, setup included, every page up to date so
#   HTML only; then `--force`, every page re-executed from the stored runs with nothing recomputed, 3 min 52 s (the
#   ten pages 213 s, chapter 07 124 of them), peak memory 1.2 GB. The packaged models' first conversion adds about
#   2.5 min once.
# - **Cold**, every run computed: the sum of the runs' own timings, under 'What each chapter costs to compute'
#   above — the one cold-build figure this book gives.
# - **The `quick` profile, cold** (from an empty results folder): 13 min 33 s, and 9 min 13 s in another session
#   with the same profile file (the difference is the machine's).
#
# The commits these were measured at, and earlier measurements, are in the repository's `CHANGELOG.md`.

# %% [markdown]
# ## Versions of this build

# %% tags=["hide-input"]
env = environment()
show_table(pd.DataFrame({"package / fact": list(env), "value": ["—" if v is None else str(v) for v in env.values()]}), caption="Versions and machine facts of this build")

# %% [markdown]
# ## What differs from the paper, and why
#
# Every chapter ends with its own "Differences from the paper" section; the common ones are:
#
# - **Models.** The paper studies Llama 3.1 70B on NDIF in bf16, and Qwen 3 models run locally (8-bit). The book's
#   default models are small enough for a CPU and ship inside PyPI packages (SmolLM2-135M-Instruct, Gemma 3 270M,
#   Qwen2.5-Coder-0.5B-Instruct), de-quantised from GGUF files to fp32. The `paper` profile names the paper's
#   models; the code path is the same.
# - **Samples.** The paper's sample where a CPU affords it: 20 GSM8K problems for norms, cosines and lenses (the
#   lenses at 64 sampled positions per problem, not every position), and layer skipping at or above the paper's
#   sizes on SmolLM2 (20 all-token problems, 20 future-token problems × 4 cuts; the paper: 20 and 10 × 4; the
#   comparison models 10 × 4, whole layers). Depth vs difficulty (chapter 05) uses 1–2 MATH and GSM8K items per
#   level (shown, not counted in the headline) and adds synthetic ladders with ≥ 10 items per rung; the linear
#   maps (chapter 06) train on about 36k aligned tokens instead of the paper's training run. Each chapter says so
#   and the `paper` profile restores the paper's sizes. Selections are seeded and their ids recorded in every
#   result's sidecar.
# - **Training from scratch.** The paper's 244M-parameter MoEUT and Transformer were trained for days on two A100s;
#   chapter 07 trains small versions (d = 128, 8 layers) on one arithmetic module for 16,000 steps on the CPU (the
#   trained checkpoints are committed in `checkpoints/dm_math/`); the `paper` profile holds the 244M configuration.
# - **Numerics.** Metrics are computed in fp32, without the known slips of the authors' released code (each
#   chapter names the ones that matter to it).
# - **Beyond the paper.** Bootstrap intervals over problems, claim verdicts in four states with controls (the claims registry),
#   a tuned lens next to the logit lens, solved vs unsolved items, synthetic multi-hop data with known hop counts,
#   and the cross-model atlas.
