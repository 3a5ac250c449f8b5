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
# # Can a model be trained to use its depth? MoEUT vs a Transformer on DeepMind Mathematics
#
# **Claim (paper §3.6, Fig. 9, exploratory).** The paper's last experiment asks whether the shallow, fixed-depth
# computation of pretrained LLMs is forced by the architecture or by training. It trains two 244M-parameter models
# from scratch on the arithmetic modules of DeepMind Mathematics: **MoEUT**, a shared-layer Universal Transformer
# with mixture-of-experts feed-forward and attention layers, and a standard pre-LN **Transformer**, each either with
# the usual language-modelling loss on every token ("question modelled") or with the loss on the answer only
# ("question not modelled"). Not modelling the question raises MoEUT's extrapolation accuracy from 36 % to 63 %
# (the Transformer: 41 % → 48 %), and residual erasure suggests that MoEUT then uses more of its depth in an
# input-dependent way, with later computation steps in later layers.
#
# This chapter trains the four runs at a size a CPU can train (~1M parameters; their exact sizes and measured
# training cost are read from the runs below), on a module with smaller numbers than the paper's so that the dense
# baseline learns the task, and applies the same measurements: exact match on the interpolate and extrapolate
# splits with the constant-answer baseline beside it, residual erasure on the paper's four probe problems, and —
# beyond the paper — the depth score of {doc}`05_depth_vs_complexity` against the number of operations in the
# problem. The pipeline runs unchanged at the paper's size with the `paper` profile on a GPU.
#
# :::{dropdown} Run this chapter yourself, retrain a run, or run the paper's size
# ```bash
# source .venv/bin/activate    # the environment scripts/setup_env.sh made (or your own)
# lmdepth run moeut                                     # the book's runs (committed, and shipped with the package)
# lmdepth run moeut --profile smoke                     # seconds: tiny models trained on the spot
# lmdepth train --runs moeut-lm --threads 1 --checkpoint-dir /tmp/my-runs   # retrain one run (resumable; ~1.9 CPU-h)
# lmdepth run moeut -p checkpoint_dir /tmp/my-runs      # the chapter on your runs (others: the committed ones)
# lmdepth run moeut --profile paper -p device cuda      # the paper's 244M configuration, for a GPU
# ```
# :::

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
profile: str = "default"  # training preset and parameter profile: smoke, default (CPU) or paper (GPU)
train: bool = True  # train runs that have no finished checkpoint (resuming an interrupted run); False: error instead
checkpoint_dir: str = "checkpoints/dm_math"  # finished runs, one folder per run and configuration hash; "" puts them under results_dir
n_per_operations: int = 12  # depth score: problems per number of operations and split
n_depth_per_operations: int = 40  # depth questions (comparison and fine-tuned runs): problems per operations count and split
finetune_dir: str = "checkpoints/dm_math_ft"  # the fine-tuned pretrained runs (scripts/finetune_runs.py)
n_boot: int = 1000  # bootstrap resamples for the intervals (paired gains, depth scores)
seed: int = 0  # seed of the problem sample and the bootstrap (training seeds are part of the preset)
device: str = "auto"  # "auto" (a GPU where there is one, else the CPU), "cpu", "cuda"
results_dir: str = "results"  # generated data and (with checkpoint_dir "") the trained runs

# %% tags=["remove-cell"]
from lmdepth.analyses import depth_questions, scratch as sa
from lmdepth.charts import findings_charts, scratch_charts as charts
from lmdepth.scratch import training
from lmdepth.book.measurement import show_measurement
from lmdepth.book.notebook import claims_md, folded, md, setup, show_table
from lmdepth.claims import report, scratch_claims as moeut_claims
from lmdepth.book.pages import scratch_page as page
from lmdepth.runtime import environment, resolve_device

t0 = setup(seed)
params = sa.ScratchParams(profile=profile, train=train, checkpoint_dir=checkpoint_dir, n_per_operations=n_per_operations, n_boot=n_boot,
                          n_depth_per_operations=n_depth_per_operations, finetune_dir=finetune_dir, seed=seed, device=resolve_device(device), results_dir=results_dir)

# %% [markdown]
# ## Data
#
# Problems are generated by DeepMind's `mathematics-dataset` generator (v1.0.1, run here with four run-time fixes
# for current sympy and numpy) instead of downloading the v1.0 release. The `default` profile trains on
# `add_sub_multiple_small`: the generator's own expression sampler (`sample.arithmetic.arithmetic`, additions and
# subtractions, in the five question templates of `add_sub_multiple`) with the answer drawn uniformly from [−49,
# 49], small operands (entropy 1: mostly one digit, with one operand near the answer) and 2, 3 or 4 operations; its
# extrapolation split has 5 or 6 operations, as the release's `*_longer` splits add operations. A problem is the
# text `" Q: {question} A:"` followed by `" {answer}"`, tokenised by characters.
#
# :::{dropdown} Why this module, and how a problem is stored
# The release's own `add_sub_multiple` draws larger numbers, and four ~1M-parameter runs trained on it for 1,500 steps answered "-10",
# "-1" or "-11" to nearly every problem (exact match at the constant-answer baseline); the answer range is kept wide
# so that always giving the most common answer stays near 1–2 %. The `paper` profile uses every arithmetic module of
# the release at its own difficulties. A problem is one row, with a BOS token first and an EOS after the answer.
# Every generated problem is cached with its seed.
# :::

# %% tags=["hide-input"]
cfg0 = training.run_config(profile, "moeut", "lm")
data = training.load_data(cfg0, params.data_dir)
splits = sa.evaluation_splits(data)
md(page.data_md(cfg0, data))
show_table(page.split_table(data), caption="Per split: problems, numbers of operations and question length")

# %% tags=["hide-input"]
show_table(page.example_table(data), caption="Example problems of each split", fold=True)

# %% [markdown]
# The number of operations is counted from the question's arithmetic expression (binary `+ − × ÷`, unary minus
# not counted); the extrapolation problems are longer chains of the same operations.
#
# ## The four runs
#
# The two architectures of this profile (read from its preset, `training.PRESETS`) share d_model, RoPE and the
# optimiser (AdamW, warm-up and cosine decay, clipping). The **question modelled** objective is the usual loss on
# every token; **question not modelled** puts loss on the answer and the EOS only.

# %% tags=["hide-input"]
show_table(page.architecture_table(profile), caption="The two architectures of this profile, side by side", fold=True)

# %% tags=["hide-input"]
runs = sa.trained_runs(profile, params.runs_dir, params.data_dir, train=train, device=params.device)
show_table(page.runs_table(runs), caption="The four trained runs: size, steps, learning rate, training time and final loss", fold=True)
md(page.scale_md(runs, profile))

# %% [markdown]
# Loss "question modelled" averages over every token, so its values are not comparable with the answer-only loss.
#
# :::{dropdown} How the runs are trained and timed
# A run that has no finished checkpoint is trained here (with a progress bar; an interrupted run continues from its
# last checkpoint). The training times were measured when each run was trained (on the machine named in its
# `meta.json`); CPU time counts every thread of the training process.
# :::

# %% mystnb={"figure": {"caption": "Training loss (moving average over 25 steps) of the four runs. The two objectives average over different tokens (all tokens vs answer tokens only), so only runs with the same objective are comparable. Click a legend entry to isolate a run.", "name": "fig-moeut-loss"}}
charts.loss_chart(runs)

# %% mystnb={"figure": {"caption": "Learning curves: exact match during training on the first 200 problems of each evaluation split (dashed: always giving the most common answer of the interpolate split). Runs trained without a learning curve are absent. Click a legend entry to isolate a run.", "name": "fig-moeut-curve"}}
charts.learning_curve_chart(runs, baseline=page.interpolation_baseline(splits))

# %% [markdown]
# ## Accuracy (the numbers behind Fig. 9)
#
# Sequence-level exact match: every answer character and the EOS predicted by argmax under teacher forcing, which
# equals greedy decoding. Because exact match is coarse for weak models, the mean cross-entropy per answer token is
# shown too (lower is better; the same quantity for all four runs).

# %% tags=["hide-input"]
per_example = sa.evaluate_runs(runs, splits, device=params.device)
summary = sa.accuracy_summary(per_example)
show_table(page.accuracy_table(summary), caption="Exact match (with its interval) and answer loss per run and split, and the constant-answer baseline", fold=True)

# %% mystnb={"figure": {"caption": "Exact match per run and split (rules: Wilson 95 % intervals) and the mean answer loss per answer token.", "name": "fig-moeut-accuracy"}}
charts.accuracy_chart(summary)

# %% tags=["hide-input"]
gains = sa.gains_by_split(per_example, splits, n_boot=n_boot, seed=seed)
show_table(page.gains_table(gains), caption="The paired gains of not modelling the question per split and metric, with 95 % intervals", fold=True)

# %% [markdown]
# The table above: what not modelling the question changes, per architecture. The paper, on extrapolation: MoEUT
# +27 points (36 % → 63 %), Transformer +7 points (41 % → 48 %). Below, the two architectures compared directly.
#
# :::{dropdown} What the two tables hold
# What not modelling the question changes: exact match (answer-only minus all-token run, in points) and the
# reduction of the answer loss (nats per answer token; positive = better answers), for each architecture and the
# difference between them, with paired bootstrap intervals over the problems (every run answers the same ones).
#
# The two architectures compared directly, each pair of runs trained with the same objective (MoEUT minus
# Transformer; answer loss reduction positive = MoEUT's answers are better), with the same paired intervals.
# :::

# %% tags=["hide-input"]
gaps = sa.architecture_gaps(per_example, splits, n_boot=n_boot, seed=seed)
page.show_gaps(gaps)

# %% [markdown]
# ## Residual erasure on the paper's probes (Fig. 9)
#
# For each depth step $b$ (row 0: the embeddings; row $b$: the output of step $b-1$) and token $t$, the residual is
# replaced by an uninformative one and the largest change $\lVert P - P'\rVert_2$ of the answer-token predictions is
# recorded — the protocol of {doc}`05_depth_vs_complexity`. A model whose later computation steps sit in later
# layers shows a staircase: early operands stop mattering at lower depth than late ones.
#
# :::{dropdown} The authors' choices for these models, and the four probes
# The replacement is the **position mean of one other DM-math problem's residual** (`dm_math.ERASURE_REFERENCE`),
# tokens 1 … T−2 are erased, and the final output has no row.
#
# Probes 2 and 3 are
# `add_sub_multiple` problems (5 and 4 operations, the kind of problem the default runs learn, with some operands
# beyond their usual range), probes 1 and 4 `mul_div_multiple`; a module the runs were not trained on shows how a
# model spreads an unfamiliar input over depth, not a learned computation.
# :::

# %% tags=["hide-input"]
erasure_table, probe_answers = sa.probe_erasures(runs, device=params.device)
show_table(page.probe_answers_table(probe_answers), caption="The probe problems and each run's answer", fold=True)

# %% mystnb={"figure": {"caption": "Residual erasure on probe 2 of the paper (an add_sub_multiple problem), one row of panels per run: effect on the answer predictions of replacing the residual at (depth step, token) with the reference mean. Row 0 = embeddings, step 0 at the bottom; each panel has its own colour scale (hover for values).", "name": "fig-moeut-erasure"}}
charts.probe_chart(erasure_table, sa.PROBES[1][0], list(runs))

# %% mystnb={"figure": {"caption": "The same for probe 3 (add_sub_multiple).", "name": "fig-moeut-erasure-3"}}
charts.probe_chart(erasure_table, sa.PROBES[2][0], list(runs))

# %% mystnb={"figure": {"caption": "Probes 1 and 4 (mul_div_multiple, a module the default runs were not trained on), one row per run.", "name": "fig-moeut-erasure-other"}}
charts.probe_charts(erasure_table, [sa.PROBES[0][0], sa.PROBES[3][0]], list(runs), cell=7)

# %% tags=["hide-input"]
edepth = sa.erasure_depth(erasure_table)
show_table(page.erasure_depth_table(edepth), caption="Erasure depth per probe and run", fold=True)

# %% [markdown]
# A one-number summary of each map: the effect-weighted mean row at which erasing a *question* token changes the
# answer, divided by the index of the last row (0 = the embeddings, 1 = the input of the last depth step). Higher
# means that the question is still read deeper in the network.
#
# ## Depth score against the number of operations (beyond the paper)
#
# If a model composed its answer step by step, problems with more operations would need more depth steps. For
# `n_per_operations` problems per number of operations from each evaluation split, every depth step is skipped on
# the whole prompt and the effect on the later steps and on the answer predictions is measured
# ({doc}`05_depth_vs_complexity`, future-token variant with the cut at the first answer token); the **depth score**
# $D$ is the effect-weighted mean step, shown relative to $L-1$ (mean aggregation over problems, bootstrap 95 %
# intervals resampling problems within each count). The fitted rise within each split is shown beside the rise
# over all counts.
#
# :::{dropdown} Why the rise within each split
# The counts of the two splits do not overlap (interpolate has the short chains, extrapolate the long ones), so a
# rise over all counts mixes "more operations" with "longer than anything seen in training"; the fitted rise within
# each split is shown beside it.
# :::

# %% tags=["hide-input"]
depth = sa.depth_vs_operations(runs, data, per_example, n_per_operations, n_boot=n_boot, seed=seed, device=params.device)
md(page.depth_sample_md(depth, n_per_operations))

# %% mystnb={"figure": {"caption": "Relative depth score D/(L−1) against the number of operations in the problem, one line per run (rules: bootstrap 95 % intervals). A model that used more depth for longer computations would show a rising line. The radio button switches between the effect on later depth steps and on the answer predictions.", "name": "fig-moeut-depth-ops"}}
charts.depth_ops_chart(depth.levels)

# %% tags=["hide-input"]
rises = sa.overall_rises(depth)
show_table(page.rise_table(rises), caption="Rise of the depth score with the number of operations, per run and effect, with its 95 % interval", fold=True)
show_table(depth.split_rises, caption="Rise of the depth score per operation within each split, per run (layer effect, mean aggregation)", fold=True)  # layer effect, mean aggregation

# %% tags=["hide-input"]
show_table(page.solved_table(depth.solved_groups), caption="Relative depth score of the solved and the unsolved problems per run, with the group sizes", fold=True)

# %% [markdown]
# The same depth score for the sampled problems each run solves and fails (layer effect, all operation counts
# pooled). Groups with no problem are marked "–"; with fewer than 3 problems no interval is given.
#
# (claims-moeut)=
# ## Does the paper's picture hold here?
#
# From the claims registry (`lmdepth.claims`): not modelling the question should improve MoEUT's extrapolation —
# exact match (the paper's measure) and, finer for weak models, the answer loss — by more than it improves the
# Transformer's, each decided from a paired bootstrap interval over the extrapolation problems and the training
# seeds. The four runs above are not comparable (two learning rates, one seed each), so the checks read their own
# **comparison runs**: both architectures at 1e-3, seeds 0–4 of each objective.
#
# :::{dropdown} When runs are comparable, how the comparison runs are trained, and how their seeds enter the interval
# The checks are only testable on comparable runs: one learning rate for every compared run, at least three
# training seeds each, and every seed at ≥ 95 % interpolation exact match (a run still learning the training
# distribution would turn a comparison of objectives into one of training progress). The four runs above are not
# comparable (the Transformer trains at 2e-3, MoEUT at 1e-3, one seed each), so the checks read their own
# comparison runs: both architectures at 1e-3, seeds 0–4 of each objective (five seeds: the fewest a seed-level
# test can decide with; the table shows which are finished), otherwise the default recipe (MoEUT's seed-0 runs
# are the runs above). They take ~30 CPU-hours, so the book never trains them: `scripts/train_matched_runs.py` does
# (resumable). The table shows where they stood when this page was executed; a run that finishes in
# `checkpoints/dm_math` (where the script writes them) makes `lmdepth book` execute the page again. A run enters the
# checks once it is finished, and a comparison of runs reads the seeds all of them have finished (seed s of one
# beside seed s of the other; a seed whose twin is still training waits for it); a run's value on a problem is its
# mean over those seeds, and the interval resamples the seeds as well as the problems (one draw of seeds for all
# runs: runs with the same seed see the same batches), so it includes how much the seeds disagree. With three seeds
# that level is resampled coarsely (10 distinct draws, its variance understated by a third), while the problems'
# spread enters twice (once inside each seed's mean), which widens the interval.
# :::

# %% tags=["hide-input"]
matched, matched_states = sa.matched_runs(profile, params.runs_dir, device=params.device, loaded=runs)
matched_per_example = sa.evaluate_runs(matched, splits, device=params.device, known=per_example)
show_table(page.matched_table(matched_states, matched_per_example), caption="The comparison runs: state and exact match per architecture, objective and training seed")

# %% [markdown]
# A claim about a training recipe generalises over training runs, so the seeds decide: the control is a
# **seed-level sign-flip test** of each seed's own gain (the gain of seed 0 of each run, of seed 1, of seed 2 — runs
# with the same seed saw the same batches), and a row whose interval lies on one side counts only where the seeds
# reach p ≤ 0.05. With three seeds the test cannot go below p = 1/8, so three seeds can show a direction but not
# decide it: such a row is *inconclusive (3 seeds)*; five seeds reach 1/32. The claims of this chapter, including
# the depth claims of the next section:

# %% tags=["hide-input"]
md(claims_md("moeut"))

# %% tags=["hide-input"]
verdicts = report.check("moeut", moeut_claims.units_of(matched_per_example), [moeut_claims.SUBJECT],
                        only=list(moeut_claims.ACCURACY_CLAIMS), n_boot=n_boot, seed=seed)
show_table(report.display(verdicts), caption="The paper's claims on the comparison runs: accuracy")

# %% mystnb={"figure": {"caption": "This chapter's claims at a glance. Left, on each claim's own scale: each model's statistic with its 95 % interval; dashed, the paper's threshold (shaded: the window of a 'between' rule). Right: the model minus its control, with the paired 95 % interval (solid: 0; grey band: a permutation null's central 95 %); a note where there is no difference to show. Colour: how the row counts on the findings page; hollow: not counted, not testable or without a valid control. Hover a mark for n, the rule, the control test and the reason.", "name": "fig-moeut-claims"}}
findings_charts.claims_forest(verdicts)

# %% tags=["hide-input"]
md(page.comparison_md(verdicts))
md(folded("What the four default runs show (descriptive: one seed each, two learning rates)", page.findings_md(summary, gains, rises, edepth, per_example)))

# %% [markdown]
# (depth-questions)=
# ## Does depth grow with the problem?
#
# The paper's fourth question (§4–5): pretrained LLMs do not use more depth for harder problems, but "models trained
# from scratch all exhibit a trend of increasing depth with computational steps", MoEUT trained without modelling
# the question "significantly utilizes deeper layers" in a "more input-dependent" way, and fine-tuning a
# pretrained model does not change its depth use. {doc}`05_depth_vs_complexity` cannot ask this of the packaged
# models (they solve one or two rungs of its ladders); the comparison runs above solve their task, so they can be
# asked: each run's depth score, relative to its last depth step, on the problems every training seed solves, with
# "more operations" decided **within** each split.
#
# :::{dropdown} The problems, the three depth summaries of each, and the split
# For `n_depth_per_operations` problems per number of operations from each evaluation split, every run
# gets three depth summaries per problem, each relative to its last depth step (0 = first, 1 = last): the **depth
# score** of the layer effect and of the answer effect (every depth step skipped on the question, the effect
# measured from the first answer token on, as above) and the **erasure depth** (where erasing a question token
# still changes the answer, with the probes' erasure value). The claims read the problems that every training seed
# of the compared runs solves, at the numbers of operations with at least 5 of them. "More operations" is decided
# **within** each split (the slope at a fixed split); the rise across the splits, which mixes in "longer than any
# training problem", is shown in the figure.
# :::
#
# **What counts as a rise.** "Depth grows" counts a rise of at least δ = a quarter layer per operation; the pair
# rows of MoEUT against the Transformer count only what training adds beyond the two architectures' untrained twins.
#
# :::{dropdown} Why δ is a quarter layer, and why the pair rows subtract the untrained twins
# δ is one of the models' 8 depth steps over the ladder's four more operations, 2 → 6, derived from the alternative: a model that
# spends one more layer per operation would rise four times δ. A rise whose whole interval lies below δ is
# *disagrees* — depth grows, if at all, by less than a layer over the ladder — and an undecided row says how large a
# rise its seeds could have detected. **MoEUT against the Transformer** compares architectures as much as training:
# the pair rows count only what training adds, the trained gap minus the same gap of the two architectures'
# untrained twins (the weights each seed started from).
# :::
#
# A fine-tuned **SmolLM2-135M** asks the paper's contrast: a pretrained model fine-tuned on the task.
#
# :::{dropdown} The fine-tuned SmolLM2-135M: how it is trained, and why its row is not testable
# It is the packaged model, trained on the same problems with the answer-only loss, three seeds
# (`scripts/finetune_runs.py`). It is
# trained outside the book (hours on a CPU); this page reads what is finished, and the table says what is not. Its
# row has the same 95 % competence gate as every depth row; the CPU fine-tunes did not reach it (the table's last
# columns), so the row is not testable and says the level reached.
# :::

# %% tags=["hide-input"]
show_measurement("moeut")

# %% tags=["hide-input"]
dq = depth_questions.ask(matched, data, matched_per_example, params, earlier=verdicts)
show_table(page.finetune_table(dq.finetune_states, dq.over_training), caption="The fine-tuned SmolLM2-135M runs: state, steps, snapshots and the exact match they reached", fold=True)

# %% mystnb={"figure": {"caption": "Mean relative depth per number of operations, one line per run (the mean over its training seeds; points: each seed), on the problems every seed of the run solves: the depth score D/(L−1) of the layer effect (what the claims read), of the answer effect, or the erasure depth (radio button). Left of the dashed rule the interpolation split, right of it the extrapolation split, whose problems are longer than any training problem. Click a legend entry to isolate a run.", "name": "fig-moeut-depth-recipes"}}
charts.depth_recipe_chart(dq.units[dq.units.run.isin([*moeut_claims.RECIPES.values(), moeut_claims.FINETUNED_RUN])])

# %% tags=["hide-input"]
page.show_depth_rows(dq.verdicts, depth_questions.pair_gaps(dq.units))
report.save(dq.chapter_verdicts, "moeut", results_dir)

# %% [markdown]
# (chain-control)=
# ## Can the depth score see depth grow?
#
# The arithmetic above is a sum of small numbers: every operand can be read at once and added in one parallel
# pass, so a model need not spend more depth on more operations, and a flat depth score says nothing about whether
# the score *could* see depth grow. The positive control is a task whose steps must run in sequence: **operation
# chains**. A question is a digit and k = 1 … 6 operations applied left to right, mod 10 — `7+3*3-4` is
# ((7 + 3) · 3 − 4) mod 10 = 6 — and the extrapolation split has 7 and 8. Each operation acts on the result of the
# ones before it, and with multiplications among them the operands cannot simply be added up at once: the steps
# must be composed, and more operations take more steps.
#
# :::{dropdown} How the questions are built so that only computing the chain works
# The operations are `+d` and `-d` (d = 1 … 9), `*3`, `*7` and `*9`, drawn uniformly: each maps the ten digits
# one to one, so no operation erases the ones before it, the last one alone says nothing of the answer, and the
# answer is uniform over the digits at every k. Every question of a split is padded with spaces to one length, so
# neither its length nor the answer's position tells k.
# :::
#
# The recipe is this chapter's Transformer with the question not modelled, with the same depth score, sample size,
# competence gate, within-split rise and δ as the rows above, trained shortest chains first: a chain one operation
# longer joins the training mix once the model answers 90 % of held-out problems of the longest length it trains
# on. It trains on 128 problems a step for 16,000 steps (`scripts/train_matched_runs.py --task chains`), five
# seeds; the control decides only over seeds that finished and pass the competence gate.
#
# :::{dropdown} The earlier task, the pilots, and how the control runs are trained
# The control first used **pointer chains** (`q=7;x=4;c=q;h=c;… What is h?`: follow k assignments to a digit).
# Four designs of them were not learned and were replaced before any depth was measured: every line shuffled
# (23 % exact match at step 9,000 of 30,000), the queried chain among shorter ones (its run answered the longest
# chain's digit, not the query's), twins whose fillers used only the other eight digits (its run answered a digit
# that occurs once), and twins among fillers of any digit, which no recipe piloted learned above 35 % on one-lookup
# chains (learning rates 1e-3 and 3e-3, lookups written out, two layers, shorter questions).
# Operation chains were piloted on exact match alone, no depth measured (`scripts/pilot_chain_recipe.py ops`):
# every length mixed from the start stalled at 12–27 % by step 8,000; shortest first at 32 problems a step, two
# operations stood at 76 % by step 12,000; at 128 a step every length had joined by step 7,000, with one to five
# operations at 94–100 % and six at 48 % (step 7,250). The curriculum holds 100 problems of each length out of
# training and checks them every 250 steps; the stages a run went through are stored with it. Each run stores a
# snapshot of its depth score at step 0 and every 10 % of training; a run takes about 1.7 CPU-hours on one
# thread (0.37 s a step).
# :::

# %% tags=["hide-input"]
page.show_chain_control(dq.chain_states, dq.chain_accuracy, dq.verdicts)

# %% mystnb={"figure": {"caption": "The positive control: mean relative depth per number of operations, one line (the mean over its seeds; points: each seed), on the problems every seed solves. Left of the dashed rule the interpolation split (1–6 operations), right of it the extrapolation split (7–8).", "name": "fig-moeut-chain-depth"}}
charts.depth_recipe_chart(dq.units[dq.units.run == moeut_claims.CHAIN_RUN], split_at=6.5, x_title="Operations in the chain")

# %% mystnb={"figure": {"caption": "The positive control over training: top, the rise of the depth score per operation within the splits on every problem of the snapshot's sample; bottom, exact match on 200 problems of each split; one line per seed, a snapshot every 10 % of training (step 0: the untrained weights).", "name": "fig-moeut-chain-training"}}
charts.over_training_chart(dq.chain_over_training, step="Training step")

# %% mystnb={"figure": {"caption": "The comparison runs trained since snapshots are stored, over training: top, the rise of the depth score per operation within the splits on every problem of the snapshot's sample; bottom, exact match on 200 problems of each split; a snapshot every 10 % of training (a run resumed from a checkpoint has the snapshots after it).", "name": "fig-moeut-comparison-training"}}
charts.over_training_chart(dq.comparison_over_training, step="Training step")

# %% mystnb={"figure": {"caption": "Depth over fine-tuning (SmolLM2-135M): top, the rise of the depth score per operation within the splits on every problem of the depth sample; bottom, exact match on 200 problems of each split. Step 0 is the pretrained model; one snapshot every 10 % of training.", "name": "fig-moeut-depth-training"}}
charts.over_training_chart(dq.over_training)

# %% tags=["hide-input"]
md(folded("Depth over fine-tuning, seed by seed", page.over_training_md(dq.over_training, dq.finetune_states)))

# %% tags=["remove-cell"]
# Checks of the code, not of the claims: depth scores lie inside the network; accuracies are proportions; every
# probe map has one row per depth step.
page.check_results(runs, summary, erasure_table, depth.levels)

# %% [markdown]
# ## Differences from the paper
#
# Models of about 1M parameters trained on a CPU, on one module with small numbers, instead of 244M-parameter models
# on every arithmetic module; the two architectures at different learning rates in the four default runs, so the
# verdicts read comparison runs at one learning rate over five training seeds. Beyond the paper: the depth score
# against the number of operations, registered depth claims decided over training seeds, an operation-chain positive
# control, and a fine-tuned SmolLM2-135M (LoRA) in place of a fully fine-tuned Llama-3.2-3B.
#
# :::{dropdown} The differences in detail: scale, data, learning rates, tokenizer, erasure rows, depth questions, positive control, fine-tuning
# - **Scale.** ~1M-parameter models (d_model 128, 8 depth steps) trained on a CPU for the steps in the runs table,
#   instead of 244M parameters (d_model 1024, 18 depth steps) trained for days on two A100s. The `paper` profile holds
#   the public MoEUT-244M configuration and a dense baseline of about the same size (`training.PRESETS["paper"]`);
#   its optimiser settings follow the MoEUT paper's language-model recipe, not confirmed for these runs.
# - **Data.** One module with smaller numbers, `add_sub_multiple_small` (above), generated here, instead of every
#   arithmetic module of the v1.0 release at its difficulties: at this budget the release's modules are not
#   learned (three modules gave 0.1–0.4 % exact match in 600-step trials; `add_sub_multiple` alone, 1,500 steps,
#   the constant-answer baseline). Evaluation on 500 problems per split (the paper: 5,000).
# - **Learning rates differ by architecture.** The Transformer trains at 2e-3 and MoEUT at 1e-3. MoEUT's residual
#   is not normalised between layers (peri-LN, as the paper's), and at 2e-3 its largest activation grew about tenfold
#   per layer (1.4e10 at the last layer by step 1,000 in a probe) until the gradient overflowed at step 3,239; at
#   1e-3 it stayed near 20 by step 1,000 with the same loss, and both MoEUT runs finished 16,000 steps without a
#   non-finite update. The largest activation still grows with depth in the finished runs (on 32 training problems,
#   up to 8.7e7 at the last layer of the answer-only run and 9.8e3 for the all-token run), within float32's range.
#   The runs table gives each run's settings. A comparison of the architectures needs one learning rate, several
#   training seeds and matched competence (the claims registry's precondition), so the MoEUT − Transformer
#   differences of the four runs are descriptive, and the verdict rows read the comparison runs (both architectures
#   at 1e-3, seeds 0–4 per objective; table above); until enough of those are finished the rows are *not testable
#   (runs not comparable)*. `scripts/train_matched_runs.py` trains them (resumable); the book never trains them
#   itself.
# - **Tokenizer.** Characters (95 printable ASCII + 4 specials) instead of a 512-piece SentencePiece model; one
#   problem per row (padded), not packed into 512-token windows.
# - **Erasure rows.** Depth steps of the whole model (block applications); the authors' script uses the same rows.
# - **Depth score against operations, intervals, solved/unsolved and the answer loss** are additions, not in the
#   paper.
# - **The depth questions** (section "Does depth grow with the problem?"). The paper reads its §5 depth claims off
#   erasure maps and depth scores of 244M-parameter runs; here they are registered claims with a statistic, decided
#   on the ~1M-parameter comparison runs at the level of training seeds (three or four seeds cannot reach
#   p ≤ 0.05, so a row read over so few can say at most *inconclusive*; five can). The paper credits MoEUT's deeper
#   depth use to its training objective; here the pair rows subtract what the two architectures show before any
#   training (their untrained twins), and "depth grows" is decided against a smallest rise δ, not against 0.
# - **The positive control** (operation chains, section "Can the depth score see depth grow?") is not in the paper: it
#   tests whether the depth score can see depth grow at all on a task that needs sequential steps.
#   The paper fine-tunes all weights of Llama-3.2-3B on DM math; here SmolLM2-135M is fine-tuned with LoRA adapters
#   (rank 8, every linear map of every layer, merged before any measurement), on this chapter's problems, because a
#   run spans several sessions of a 2-core CPU and its resume checkpoint must be committed between them (29 MB for
#   the adapters and their optimiser; 1.6 GB for the full model's).
# :::
#
# ## Reproducibility
#
# :::{dropdown} Where the trained runs are stored, and how a run is retrained
# The trained runs live in `checkpoint_dir` (one folder per run, named by a hash of everything that determines the
# weights, with `meta.json`: configuration, data, wall time, environment); the book's default runs are committed in
# `checkpoints/dm_math/`, so rebuilding the book does not retrain, and copied into the installed package, so Colab and
# a `pip install` load them from any directory (a run is looked up in `checkpoint_dir` first, then among the shipped
# runs). Delete a folder (or change the preset) and the chapter trains it again into `checkpoint_dir`; an
# interrupted training resumes from its last checkpoint (`ckpt_every` steps).
# :::
#
# ## Summary and environment

# %% tags=["hide-input"]
md(page.page_md(dq.chapter_verdicts, runs, t0))
md(" · ".join(f"{k} {v}" for k, v in environment().items() if v is not None))
