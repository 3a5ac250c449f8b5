"""Analyses of the from-scratch runs of chapter 07 (paper Fig. 9, METHOD §9).

Four runs — MoEUT and a dense Transformer, each trained with the question modelled (``lm``) or not
(``answer_only``) — are loaded or trained (:mod:`lmdepth.scratch.training`), then compared on

* exact match and answer loss on the interpolate and extrapolate splits (:func:`evaluate_runs`),
* residual erasure on the paper's four DM-math probes, with the authors' erasure value: the position mean of one
  other DM-math example's residual (:func:`probe_erasure`),
* the depth score of :mod:`lmdepth.analyses.complexity` against the number of operations in the problem
  (:func:`depth_by_operations`).

The erasure and skip code is the same as for the pretrained models: a from-scratch model is wrapped in a
:class:`~lmdepth.model.families.ModelAdapter` whose "layers" are the depth steps (block applications for MoEUT).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from lmdepth.data.dm_math import ERASURE_REFERENCE, PROBES, CharTokenizer, MathExample
from lmdepth.errors import DataError
from lmdepth.scratch.models import ScratchLM, adapter_for
from lmdepth.scratch.training import (
    ARCHS,
    OBJECTIVES,
    evaluate,
    greedy_answer,
    load_trained,
    run_config,
    run_dir,
    train_run,
)

ARCH_LABELS = {"moeut": "MoEUT", "transformer": "Transformer"}


@dataclass
class TrainedRun:
    """One finished run: the model in eval mode, its tokenizer, its training meta (incl. loss ``history``), and
    whether this call trained it (False: loaded from a finished checkpoint)."""

    name: str
    arch: str
    objective: str
    model: ScratchLM
    tok: CharTokenizer
    meta: dict[str, Any]
    path: Path
    trained_now: bool = False


def trained_runs(profile: str, checkpoint_dir: str | Path, data_dir: str | Path, train: bool = True,
                 device: str = "cpu", progress: bool = True, **overrides: Any) -> dict[str, TrainedRun]:
    """The four runs of a profile, trained first where no finished checkpoint exists (and ``train`` is True).

    An interrupted training run resumes from its last checkpoint on the next call.

    Raises:
        DataError: a run is missing and ``train`` is False.
    """
    runs = {}
    for arch in ARCHS:
        for objective in OBJECTIVES:
            cfg = run_config(profile, arch, objective, **overrides)
            path = run_dir(cfg, checkpoint_dir) / "model.pt"
            trained_now = not path.exists()
            if trained_now:
                if not train:
                    raise DataError(f"No trained {cfg.name} run for profile {profile!r} under {checkpoint_dir} "
                                    f"(expected {path}). Set train=True (CLI: -p train true) to train it, or point "
                                    "checkpoint_dir at a directory that holds it.")
                train_run(cfg, checkpoint_dir, data_dir=data_dir, progress=progress, device=device)
            model, tok, meta = load_trained(path, device=device)
            runs[cfg.name] = TrainedRun(cfg.name, arch, objective, model, tok, meta, path, trained_now)
    return runs


# ---- accuracy -------------------------------------------------------------------------------------------------

def wilson_interval(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a proportion k/n (sensible at 0 and n, unlike the normal approximation)."""
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def evaluate_runs(runs: dict[str, TrainedRun], splits: dict[str, list[MathExample]], device: str = "cpu",
                  ) -> pd.DataFrame:
    """One row per (run, example): ``run, arch, objective, split, module, n_operations, question, answer, correct,
    answer_nll``."""
    frames = []
    for name, r in runs.items():
        for split, examples in splits.items():
            df = evaluate(r.model, r.tok, examples, device=device)
            frames.append(df.assign(run=name, arch=r.arch, objective=r.objective, split=split))
    return pd.concat(frames, ignore_index=True)


def accuracy_summary(per_example: pd.DataFrame) -> pd.DataFrame:
    """Per (run, split): ``n, correct, accuracy, ci_low, ci_high`` (Wilson 95 %) and the mean ``answer_nll``."""
    rows = []
    for (run, arch, objective, split), g in per_example.groupby(["run", "arch", "objective", "split"], sort=False):
        k, n = int(g.correct.sum()), len(g)
        lo, hi = wilson_interval(k, n)
        rows.append({"run": run, "arch": arch, "objective": objective, "split": split, "n": n, "correct": k,
                     "accuracy": k / n, "ci_low": lo, "ci_high": hi, "answer_nll": float(g.answer_nll.mean())})
    return pd.DataFrame(rows)


def paired_gains(per_example: pd.DataFrame, split: str, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """What not modelling the question changes, per architecture and MoEUT − Transformer, with paired bootstrap 95 %
    intervals (all runs answer the same problems, so problems are resampled jointly).

    Metrics: ``exact match`` (answer-only − all-token accuracy) and ``answer loss reduction`` (all-token − answer-only
    mean answer cross-entropy, nats per token; positive = the answer-only run predicts the answers better).

    Returns:
        ``split, metric, comparison ("moeut", "transformer", "moeut − transformer"), gain, ci_low, ci_high, n``.
    """
    d = per_example[per_example.split == split].copy()
    d["item"] = d.groupby("run").cumcount()  # evaluate() keeps the order of the examples for every run
    n = int(d.item.nunique())
    idx = np.random.default_rng(seed).integers(0, n, (n_boot, n))
    rows = []
    for metric, col, sign in (("exact match", "correct", 1.0), ("answer loss reduction", "answer_nll", -1.0)):
        w = d.pivot(index="item", columns="run", values=col).astype(float)
        gains = {a: sign * (w[f"{a}-answer_only"] - w[f"{a}-lm"]).to_numpy() for a in ARCHS}
        gains["moeut − transformer"] = gains["moeut"] - gains["transformer"]
        for name, g in gains.items():
            lo, hi = np.quantile(g[idx].mean(1), [0.025, 0.975])
            rows.append({"split": split, "metric": metric, "comparison": name, "gain": float(g.mean()),
                         "ci_low": float(lo), "ci_high": float(hi), "n": n})
    return pd.DataFrame(rows)


# ---- residual erasure on the probes ----------------------------------------------------------------------------

@torch.no_grad()
def probe_erasure(run: TrainedRun, probes: Sequence[tuple[str, str]] = PROBES,
                  reference: tuple[str, str] = ERASURE_REFERENCE, batch_size: int = 64,
                  device: str = "cpu") -> tuple[pd.DataFrame, dict[str, Any]]:
    """Residual erasure maps of the probes, as the authors' script for these models (METHOD §9).

    The erasure value at boundary b is the mean over positions of ``reference``'s residual at b; positions
    1 … T−2 of ``" Q: {q} A: {a}"`` (no EOS) are erased one at a time; the effect is the largest L2 change of the
    answer-token distributions. Rows are boundaries 0 … L−1 (0 = embeddings; the final output, which the paper's
    figure has no row for, is dropped).

    Returns:
        (table ``model, prompt, method, layer, position, token, is_answer, value`` in the layout of
         :func:`lmdepth.analyses.erasure.map_chart`, with ``model`` = the run name;
         per probe: greedy answer, whether it is right, the number of tokens and the answer start).
    """
    from lmdepth.analyses.erasure import as_stack, erasure_map, mean_residuals

    stack = as_stack(adapter_for(run.model))
    ref_ids, _ = run.tok.encode_example(*reference, eos=False)
    mu = mean_residuals(stack, [torch.tensor([ref_ids], device=device)])  # [L+1, D]
    rows, info = [], {}
    for q, a in probes:
        ids, a_start = run.tok.encode_example(q, a, eos=False)
        T = len(ids)
        er = erasure_map(stack, torch.tensor([ids], device=device), a_start, mu, batch_size=batch_size,
                         positions=range(1, T - 1))[:-1]  # [L, T]
        labels = run.tok.tokens(ids)
        rows += [{"model": run.name, "prompt": q, "method": "erasure", "layer": l, "position": p, "token": labels[p],
                  "is_answer": p >= a_start, "value": float(er[l, p])} for l in range(er.shape[0]) for p in range(T)]
        got = greedy_answer(run.model, run.tok, q, device=device)
        info[q] = {"answer": a, "greedy": got, "correct": got == a, "n_tokens": T, "a_start": a_start}
    return pd.DataFrame(rows), info


def erasure_depth(table: pd.DataFrame) -> pd.DataFrame:
    """Per (run, probe): the effect-weighted mean boundary of the erasure map, over question positions only
    (``Σ_b b·m_b / Σ_b m_b`` with m_b the summed effect of boundary b), relative to the number of boundaries − 1.
    A summary of where in depth erasing the question still changes the answer."""
    q = table[(table.method == "erasure") & ~table.is_answer & (table.position > 0)]
    out = []
    for (run, prompt), g in q.groupby(["model", "prompt"], sort=False):
        m = g.groupby("layer").value.sum()
        n = int(g.layer.max())
        out.append({"run": run, "prompt": prompt, "erasure_depth": float((m.index * m).sum() / m.sum()) / max(n, 1)
                    if m.sum() > 0 else float("nan")})
    return pd.DataFrame(out)


# ---- depth score against the number of operations ---------------------------------------------------------------

def operation_sample(examples: Sequence[MathExample], n_per_count: int, seed: int = 0,
                     min_count: int = 1) -> list[MathExample]:
    """Up to ``n_per_count`` examples per number of operations (seeded), counts with fewer than ``min_count``
    examples dropped, ordered by count."""
    rng = np.random.default_rng(seed)
    by: dict[int, list[MathExample]] = {}
    for e in examples:
        if e.n_operations is not None:
            by.setdefault(e.n_operations, []).append(e)
    out = []
    for k in sorted(by):
        pool = by[k]
        if len(pool) < min_count:
            continue
        take = rng.choice(len(pool), size=min(n_per_count, len(pool)), replace=False)
        out += [pool[i] for i in sorted(take)]
    return out


@torch.no_grad()
def depth_by_operations(run: TrainedRun, examples: Sequence[MathExample], device: str = "cpu",
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Layer-skip effects of each example for the depth score (:func:`lmdepth.analyses.complexity.stack_skip_effects`).

    The cut is the first answer token: each depth step is skipped on the whole prompt (positions 1 … a−1) and the
    effect measured where the answer is written (positions ≥ a).

    Returns:
        E [P, L, L] and O [P, L].
    """
    from lmdepth.analyses.complexity import stack_skip_effects
    from lmdepth.analyses.erasure import as_stack

    stack = as_stack(adapter_for(run.model))
    Es, Os = [], []
    for e in examples:
        ids, a_start = run.tok.encode_example(e.question, e.answer, eos=False)
        E, O = stack_skip_effects(stack, torch.tensor([ids], device=device), [a_start])
        Es.append(E.numpy())
        Os.append(O.numpy())
    return np.stack(Es), np.stack(Os)


# ---- charts ----------------------------------------------------------------------------------------------------

RUN_COLORS = {"moeut-lm": "#9ecae9", "moeut-answer_only": "#3366cc", "transformer-lm": "#ffbf79",
              "transformer-answer_only": "#e45756"}


def _run_scale(names: Sequence[str]):
    import altair as alt

    return alt.Scale(domain=list(names), range=[RUN_COLORS.get(n, "#888888") for n in names])


def loss_chart(runs: dict[str, TrainedRun], window: int = 25, width: int = 420, height: int = 220):
    """Training loss per step (moving average over ``window`` steps), one line per run; legend click isolates."""
    import altair as alt

    frames = []
    for name, r in runs.items():
        h = pd.DataFrame(r.meta["history"], columns=["step", "loss"])
        h["loss"] = h.loss.rolling(window, min_periods=1).mean()
        frames.append(h.iloc[:: max(1, len(h) // 150)].assign(run=name))  # ~150 points per line keep the page small
    d = pd.concat(frames).round(4)
    pick = alt.selection_point(fields=["run"], bind="legend")
    return alt.Chart(d).mark_line().encode(
        x=alt.X("step:Q", title="Training step"), y=alt.Y("loss:Q", title="Training loss (nats / token)"),
        color=alt.Color("run:N", scale=_run_scale(list(runs)), legend=alt.Legend(title="Run")),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)), tooltip=["run:N", "step:Q", "loss:Q"],
    ).add_params(pick).properties(width=width, height=height)


def accuracy_chart(summary: pd.DataFrame, width: int = 190, height: int = 200):
    """Exact match with Wilson 95 % intervals per run, one panel per split; a radio button switches to answer loss."""
    import altair as alt

    d = summary.round(4).copy()
    names = list(dict.fromkeys(d.run))
    x = alt.X("run:N", title=None, sort=names, axis=alt.Axis(labelAngle=-35))
    color = alt.Color("run:N", scale=_run_scale(names), legend=None)
    bars = alt.Chart(d).mark_bar().encode(
        x=x, y=alt.Y("accuracy:Q", title="Exact match", axis=alt.Axis(format="%")), color=color,
        tooltip=["run:N", "split:N", "n:Q", "correct:Q", alt.Tooltip("accuracy:Q", format=".1%"),
                 alt.Tooltip("ci_low:Q", format=".1%"), alt.Tooltip("ci_high:Q", format=".1%"),
                 alt.Tooltip("answer_nll:Q", format=".3f")])
    err = alt.Chart(d).mark_rule(strokeWidth=1.5).encode(x=x, y="ci_low:Q", y2="ci_high:Q")
    acc = alt.layer(bars, err).properties(width=width, height=height).facet(column=alt.Column("split:N", title=None))
    nll = alt.Chart(d).mark_bar().encode(
        x=x, y=alt.Y("answer_nll:Q", title="Answer loss (nats / token)"), color=color,
        tooltip=["run:N", "split:N", alt.Tooltip("answer_nll:Q", format=".3f")],
    ).properties(width=width, height=height).facet(column=alt.Column("split:N", title=None))
    return alt.vconcat(acc, nll)


def probe_chart(table: pd.DataFrame, probe: str, runs: Sequence[str], cell: int = 9):
    """Erasure maps of one probe, one row per run (layer 0 at the bottom)."""
    import altair as alt

    from lmdepth.analyses.erasure import map_chart

    return alt.vconcat(*[map_chart(table, "erasure", r, prompts=[probe], cell=cell).properties(title=r)
                         for r in runs]).resolve_scale(color="independent")


def depth_ops_chart(levels: pd.DataFrame, width: int = 420, height: int = 220):
    """Relative depth score per number of operations, one line per run, with bootstrap 95 % intervals; a radio
    button picks the effect (layer / logit)."""
    import altair as alt

    d = levels[levels.aggregation == "mean"].round(4).copy()
    names = list(dict.fromkeys(d.run))
    effect = alt.param(name="ops_effect", value="layer_effect",
                       bind=alt.binding_radio(options=["layer_effect", "logit_effect"],
                                              labels=["layer effect", "logit effect"], name="Effect: "))
    pick = alt.selection_point(fields=["run"], bind="legend")
    base = alt.Chart(d).transform_filter(alt.datum.metric == effect)
    x = alt.X("level:O", title="Operations in the problem", axis=alt.Axis(labelAngle=0))
    color = alt.Color("run:N", scale=_run_scale(names), legend=alt.Legend(title="Run"))
    line = base.mark_line(point=True).encode(
        x=x, y=alt.Y("rel_depth_score:Q", title="Depth score D / (L − 1)", scale=alt.Scale(zero=False)), color=color,
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.12)),
        tooltip=["run:N", alt.Tooltip("level:O", title="operations"), "n:Q",
                 alt.Tooltip("rel_depth_score:Q", format=".3f"), alt.Tooltip("rel_ci_low:Q", format=".3f"),
                 alt.Tooltip("rel_ci_high:Q", format=".3f")])
    band = base.mark_rule(strokeWidth=2).encode(x=x, y="rel_ci_low:Q", y2="rel_ci_high:Q", color=color,
                                                 opacity=alt.condition(pick, alt.value(0.4), alt.value(0.05)))
    return alt.layer(band, line).add_params(effect, pick).properties(width=width, height=height)


__all__ = ["TrainedRun", "trained_runs", "wilson_interval", "evaluate_runs", "accuracy_summary", "paired_gains",
           "probe_erasure", "erasure_depth", "operation_sample", "depth_by_operations", "loss_chart",
           "accuracy_chart", "probe_chart", "depth_ops_chart", "ARCH_LABELS", "RUN_COLORS"]
