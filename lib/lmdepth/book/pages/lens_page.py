"""Chapter 04 (logit lens and tuned lens): its prose, claim checks and invariants, from the runs of
:mod:`lmdepth.analyses.lens`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from lmdepth.analyses.lens import (
    KL_CRITERION,
    LENSES,
    OVERLAP_CRITERION,
    STATS,
    LensSummary,
    curve_ends,
    select,
    settled_depth,
    settling_summary,
)
from lmdepth.model.translators import TunedLensRecipe


def lenses(tuned: bool) -> list[str]:
    """The lenses a run evaluates: the logit lens, and the tuned lens when ``tuned``."""
    return [name for name in LENSES if tuned or name == "logit_lens"]


def recipe_md(recipe: TunedLensRecipe, enabled: bool = True) -> str:
    """The tuned-lens training recipe in one sentence (or that the tuned lens is switched off)."""
    if not enabled:
        return "Tuned lens switched off (`tuned_lens=False`)."
    return (f"Recipe: {recipe.n_tokens:,} training tokens × {recipe.epochs} epochs, {recipe.batch_tokens} tokens per step, "
            f"peak learning rate {recipe.lr:g}; vocabulary head = the top {recipe.head_k} output tokens of every training "
            f"token, plus {recipe.n_negatives:,} uniform negatives per step; held-out tokens: {recipe.val_fraction:.1%} "
            "of the training count.")


def describe_run(model: str, run: LensSummary, lens_dtype: str) -> str:
    """One model's run: sizes, how the tuned lens was obtained, and the last-layer self-check."""
    tl = run.tuned
    origin = "computed" if not tl else (
        "loaded from the cache" if tl.from_cache else f"trained in {tl.train_time_s:.0f} s")
    tuned = "" if not tl else (
        f"; tuned lens {origin} ({tl.train_tokens:,} tokens × {tl.epochs} epochs, vocabulary head "
        f"{tl.head_size:,} + {tl.n_negatives:,} sampled of {tl.vocab:,}; {tl.layers_kept_identity} of "
        f"{run.n_layers} layers kept the identity)")
    return (f"**{model}**: {run.n_layers} layers, {run.n_problems} problems, "
            f"{run.n_positions_evaluated:,} of {run.n_tokens:,} positions evaluated{tuned}; "
            f"last-layer check KL(lens on h_L ‖ model output) ≤ {run.last_layer_check_kl_max:.1e} nats "
            f"({lens_dtype} unembedding).")


def runs_md(runs: dict[str, LensSummary], models: Sequence[str], lens_dtype: str) -> str:
    """:func:`describe_run` for every model, one paragraph each."""
    return "\n\n".join(describe_run(m, runs[m], lens_dtype) for m in models)


def curve_ends_md(curves: pd.DataFrame, models: Sequence[str]) -> str:
    """Held-out loss of the tuned lens before and after training and on the last training batches
    (:func:`curve_ends`), per model, and whether the translators overfit."""
    ends = curve_ends(curves)
    return ("Mean over layers of the sampled KL(P_final ‖ P_tuned) on the held-out problems, before training (the logit "
            "lens) → with the selected translators, and on the last training batches: " + "; ".join(
                f"**{m}** {ends.loc[m, 'held-out start']:.2f} → {ends.loc[m, 'held-out selected']:.2f} (train "
                f"{ends.loc[m, 'train end']:.2f})" for m in models if m in ends.index) + ". "
            + ("Held-out above training: the d × d translators overfit their training tokens; the held-out "
               "value is the honest one, and the test problems evaluated below are held out too."
               if (ends["held-out selected"] > ends["train end"]).any() else
               "No overfitting is visible at this budget (held-out at or below the training batches)."))


def settled_at(summary: pd.DataFrame, model: str, lens: str, criterion: str, n_layers: int) -> str:
    """Where one lens settles by one criterion, in words ("at layer l (l/L = …)" or "at no layer before the output")."""
    d = settled_depth(summary, model, lens, criterion)
    return ("at no layer before the output" if d is None or round(d * n_layers) >= n_layers
            else f"at layer {round(d * n_layers)} (l/L = {d:.2f})")


def main_model_md(table: pd.DataFrame, runs: dict[str, LensSummary], summary: pd.DataFrame,
                  transitions: dict[str, int | None], model: str, tuned: bool = True) -> str:
    """The main model's lens curves in one paragraph: overlap at the embeddings, mid-depth and the last layer, where
    each lens settles (:func:`settling_summary`), and the cosine phase transition of chapter 02."""
    L = runs[model].n_layers
    ov = {name: select(table, "top5_overlap", name, model=model) for name in lenses(tuned)}
    kl = {name: select(table, "kl", name, model=model) for name in lenses(tuned)}
    text = (f"**{model}.** Logit lens: top-5 overlap {ov['logit_lens'].iloc[0]:.2f} at the embeddings, "
            f"{ov['logit_lens'].iloc[L // 2]:.2f} at mid-depth (l = {L // 2}), {ov['logit_lens'].iloc[-1]:.2f} entering the "
            f"last layer; it first exceeds 0.2 {settled_at(summary, model, 'logit_lens', OVERLAP_CRITERION, L)}, and KL "
            f"first falls below 10 % of its maximum {settled_at(summary, model, 'logit_lens', KL_CRITERION, L)}.")
    if tuned:
        text += (f" Tuned lens: top-5 overlap {ov['tuned_lens'].iloc[0]:.2f} → {ov['tuned_lens'].iloc[L // 2]:.2f} → "
                 f"{ov['tuned_lens'].iloc[-1]:.2f}; it first exceeds 0.2 "
                 f"{settled_at(summary, model, 'tuned_lens', OVERLAP_CRITERION, L)}. "
                 f"At mid-depth its KL(P_lens ‖ P_final) is {kl['tuned_lens'].iloc[L // 2]:.2f} nats against "
                 f"{kl['logit_lens'].iloc[L // 2]:.2f} for the logit lens.")
    tr = transitions[model]
    text += (f" The cosine phase transition of chapter 02 is at layer {tr} ((t + 0.5)/L = {(tr + 0.5) / L:.2f})."
             if tr is not None else " The cosines of chapter 02 show no sign change for this model.")
    return text


def mid_depth_share(table: pd.DataFrame, model: str, n_layers: int) -> float:
    """KL(P_final ‖ P_tuned) at mid-depth (l = ⌊L/2⌋) as a fraction of its value at the embeddings."""
    klf = select(table, "kl_final_lens", "tuned_lens", model=model)
    return float(klf.iloc[n_layers // 2] / klf.iloc[0])


def disagreement_md(table: pd.DataFrame, runs: dict[str, LensSummary], summary: pd.DataFrame,
                    models: Sequence[str]) -> str:
    """Logit lens vs tuned lens, per model: where each overlap first exceeds 0.2, the tuned lens' overlap on the
    embeddings alone, and how much of its KL at the embeddings is left at mid-depth."""
    parts = []
    for m in models:
        lo = settled_depth(summary, m, "logit_lens", OVERLAP_CRITERION)
        to = settled_depth(summary, m, "tuned_lens", OVERLAP_CRITERION)
        n = runs[m].n_layers
        o0 = select(table, "top5_overlap", "tuned_lens", model=m).iloc[0]
        share = mid_depth_share(table, m, n)
        shift = round((lo - to) * n)
        when = f"{abs(shift)} layers {'earlier' if shift > 0 else 'later'} with the tuned lens" if shift else "the same layer"
        parts.append(f"**{m}**: top-5 overlap > 0.2 at l/L = {lo:.2f} (logit) vs {to:.2f} (tuned), {when}; the tuned "
                     f"lens reaches {o0:.2f} on the embeddings alone, and at mid-depth {share:.0%} of its "
                     f"KL(P_final ‖ P_tuned) at the embeddings is left.")
    return "Logit lens vs tuned lens: " + " ".join(parts)


def check_invariants(table: pd.DataFrame, runs: dict[str, LensSummary], curves: pd.DataFrame,
                     models: Sequence[str], lens_dtype: str, tuned: bool = True) -> None:
    """Invariants that must hold whatever the model (checks of the code, not of the paper's claim).

    Raises:
        AssertionError: the lens on h_L differs from the model's output beyond rounding of ``lens_dtype``; a KL is
            negative or not finite; an overlap lies outside [0, 1]; a training curve lacks its start or has gaps.
    """
    for m in models:
        if not runs[m].last_layer_check_kl_max < (1e-2 if lens_dtype != "float32" else 1e-4):
            raise AssertionError(f"{m}: lens on h_L != output")
        for name in lenses(tuned):
            for stat in STATS:
                k = select(table, "kl", name, stat=stat, model=m).to_numpy()
                kr = select(table, "kl_final_lens", name, stat=stat, model=m).to_numpy()
                o = select(table, "top5_overlap", name, stat=stat, model=m).to_numpy()
                if not (np.isfinite(k).all() and (k >= -1e-4).all() and (kr >= -1e-4).all()):
                    raise AssertionError(f"{m}, {name}, {stat}: KL must be >= 0")
                if not ((o >= 0) & (o <= 1)).all():
                    raise AssertionError(f"{m}, {name}, {stat}: overlap must lie in [0, 1]")
        if tuned:
            c = curves[curves.model == m]
            if not ((c.step == 0).any() and c["value"].notna().all()):
                raise AssertionError(f"{m}: the training curve lacks its start or has missing values")


def averaging_md(table: pd.DataFrame, models: Sequence[str], tuned: bool = True) -> str:
    """How much the two averages of the table (per-problem means, the paper's; token-weighted means, [NB]) differ:
    in top-5 overlap at any layer, and in the settling layers of :func:`settling_summary`."""
    gap = max(float((select(table, "top5_overlap", name, stat="mean", model=m)
                     - select(table, "top5_overlap", name, stat="token_mean", model=m)).abs().max())
              for m in models for name in lenses(tuned))
    moved = (settling_summary(table, stat="token_mean")["layer"] - settling_summary(table)["layer"]).abs()
    return (f"Per-problem means vs token-weighted means ([NB]): the top-5 overlap differs by at most {gap:.3f} at any "
            f"layer of any model, and the settling layers of the table above move by at most {int(moved.max())} "
            "layer(s) when computed from token-weighted means (both averages are in the results table, `stat` = "
            "`mean` / `token_mean`).")
