"""Chapter 06 (cross-model linear maps): its prose, display tables, claim checks and invariants, from the run of
:mod:`lmdepth.analyses.maps`."""

from __future__ import annotations

import numpy as np
import pandas as pd

from lmdepth.analyses.maps import MapsSummary, error_over_baseline, mean_baseline, summarize_map
from lmdepth.errors import DataError
from lmdepth.metrics.ridge import error_matrix


def run_md(run: MapsSummary) -> str:
    """One paragraph on the run: models, aligned positions per split, texts, tokenizer coverage and provenance."""
    origin = "loaded from the results cache" if run.from_cache else f"computed in {run.wall_time_s:.0f} s"
    aligned = run.aligned_tokens
    return ("Models: " + "; ".join(f"**{m}** ({s.n_layers} layers, d_model {s.d_model}, {s.family})"
                                    for m, s in run.models.items()) + ". "
            f"Aligned positions: {aligned['train']:,} train, {aligned['val']:,} validation, **{aligned['test']:,} "
            f"test**, from {sum(run.texts.values())} texts "
            f"({', '.join(f'{v} {k}' for k, v in run.texts_by_source.items())}). "
            f"**Coverage** (share of each model's tokens, position 0 and specials excluded, that align with every "
            f"other model): " + ", ".join(f"{m} {c:.1%}" for m, c in run.coverage.items()) + f". General text: "
            f"{run.general_text or 'none'}. Run {origin}.")


def summary_table(table: pd.DataFrame, run: MapsSummary) -> pd.DataFrame:
    """Per main map: how close the best source of each column and the best target of each row lie to the
    equal-relative-depth line (correlation, mean absolute offset), and its lowest and median error, for display."""
    rows = []
    for lab in run.labels("main"):
        s = run.alignments[lab]
        e = error_matrix(table, lab).to_numpy()
        rows.append({"map": lab, "layers (source, target)": f"{s.n_source_layers}, {s.n_target_layers}",
                     "per column: corr": round(s.col_corr, 3),
                     "per column: mean |offset|": round(s.col_mean_abs_offset, 3),
                     "per row: corr": round(s.row_corr, 3), "per row: mean |offset|": round(s.row_mean_abs_offset, 3),
                     "lowest error": round(float(e.min()), 3), "median error": round(float(np.median(e)), 3)})
    return pd.DataFrame(rows)


def best_sources_md(table: pd.DataFrame, run: MapsSummary) -> str:
    """The best-source summary over every main map (ranges of correlation and offset), with one example from the
    first map: the target boundary nearest mid-depth and its best source."""
    labels = run.labels("main")
    summ = run.alignments
    first = summ[labels[0]]
    b0 = pd.DataFrame(summarize_map(table, labels[0])["best_cols"])
    mid = b0.iloc[(b0.target_depth - 0.5).abs().argmin()]
    col = [summ[lab].col_corr for lab in labels]
    off = [summ[lab].col_mean_abs_offset for lab in labels]
    row_off = [summ[lab].row_mean_abs_offset for lab in labels]
    return (f"**Best source of each target boundary**, over the {len(labels)} maps ({len(labels) // 2} pairs × 2 "
            f"directions): correlation between target relative depth and the relative depth of its best source "
            f"**{min(col):.2f}–{max(col):.2f}**; mean absolute offset from the equal-depth line **{min(off):.2f}–"
            f"{max(off):.2f}** of the depth (per map in the table above). For example, {first.target} boundary "
            f"{int(mid.target_layer)} (depth {mid.target_depth:.2f}) is best predicted by {first.source} boundary "
            f"{int(mid.best_source_layer)} (depth {mid.source_depth:.2f}). **Best target of each source boundary** (the "
            f"paper's row-wise overlay): mean absolute offset {min(row_off):.2f}–{max(row_off):.2f}.")


def controls_table(table: pd.DataFrame, run: MapsSummary) -> pd.DataFrame:
    """What each control measured, one row per map: the self-map's diagonal, the shuffled pairs' error against the
    mean-only error, and how much the embeddings alone (m = 0) lose against the best source boundary."""
    ctrl = []
    for lab in run.labels("self"):
        e = error_matrix(table, lab).to_numpy()
        ctrl.append({"control": "self-map", "map": lab, "measured": f"diagonal error max {np.diag(e).max():.1e}; "
                     f"best match = same boundary in {int((np.argmin(e, 1) == np.arange(len(e))).sum())}/{len(e)} rows"})
    for lab in run.labels("shuffled"):
        ratio = error_over_baseline(table, lab)
        ctrl.append({"control": "shuffled pairs", "map": lab,
                     "measured": f"error / mean-only error: min {ratio.min():.3f}, median {np.median(ratio):.3f}; "
                     f"best-source correlation {run.alignments[lab].col_corr:.2f}"})
    for lab in run.labels("main"):
        e0 = error_matrix(table, lab)
        floor_gap = (e0.loc[0] - e0.min(axis=0)).to_numpy()
        ctrl.append({"control": "embeddings only (floor)", "map": lab,
                     "measured": f"error from m = 0 minus the best error, mean over target boundaries "
                     f"{floor_gap.mean():.3f} (largest {floor_gap.max():.3f} at target boundary "
                     f"{int(e0.columns[floor_gap.argmax()])})"})
    return pd.DataFrame(ctrl)


def method_checks(table: pd.DataFrame, run: MapsSummary) -> pd.DataFrame:
    """Checks of the method (not claims of the paper): the self-map's best match of every row is the same boundary
    with error < 0.01; on shuffled pairs no cell beats 0.98 × the mean-only error."""
    rows = []
    for lab in run.labels("self"):
        e = error_matrix(table, lab).to_numpy()
        ok = bool((np.argmin(e, 1) == np.arange(len(e))).all() and np.diag(e).max() < 0.01)
        rows.append({"check": "self-map gives the identity", "criterion": "argmin = same boundary, error < 0.01",
                     "map": lab, "measured": f"diagonal max {np.diag(e).max():.1e}", "passes": "yes" if ok else "NO"})
    for lab in run.labels("shuffled"):
        r = float(error_over_baseline(table, lab).min())
        rows.append({"check": "shuffled pairs carry no information", "criterion": "error ≥ 0.98 × mean-only error",
                     "map": lab, "measured": f"min ratio {r:.3f}", "passes": "yes" if r >= 0.98 else "NO"})
    return pd.DataFrame(rows, columns=["check", "criterion", "map", "measured", "passes"])


def check_run(table: pd.DataFrame, run: MapsSummary) -> None:
    """Invariants that hold whatever the models (checks of the code, not of the claim), and enough token alignment.

    Raises:
        AssertionError: an error is negative or not finite, a mean-only error is not positive, or a main map is much
            worse than the mean (> 1.5: with a small α among the choices a fit cannot be, on held-out data).
        DataError: the alignment covers at most half of some model's tokens — not a bug: these tokenizers rarely
            end tokens at the same characters, so the maps would rest on few tokens.
    """
    main = run.labels("main")
    for lab in main + run.labels("self") + run.labels("shuffled"):
        e = error_matrix(table, lab).to_numpy()
        if not (np.isfinite(e).all() and (e >= 0).all()):
            raise AssertionError(f"{lab}: errors must be finite and non-negative")
        base = mean_baseline(table, lab).to_numpy()
        if not (np.isfinite(base).all() and (base > 0).all()):
            raise AssertionError(f"{lab}: mean-only errors must be finite and positive")
        if lab in main and not (e <= 1.5).all():
            raise AssertionError(f"{lab}: a map is much worse than the mean-only predictor")
    low = {m: c for m, c in run.coverage.items() if c <= 0.5}
    if low:
        raise DataError(f"Token alignment covers only {', '.join(f'{m} {c:.0%}' for m, c in low.items())} of the "
                        "tokens: the tokenizers of this model set rarely end tokens at the same character offsets. "
                        "Pick models with more similar tokenizers.")


def speed_md(table: pd.DataFrame, run: MapsSummary) -> str:
    """The run's wall (and CPU) time, the machine, and how many layer-pair maps it fitted."""
    total = run.timings_s["total"]
    n_pairs = sum(len(error_matrix(table, lab).to_numpy().ravel()) for lab in run.labels("main"))
    return (f"Wall time of this run: **{total:.0f} s** ({total / 60:.1f} min"
            + (f"; CPU time of the process, all threads: {run.cpu_time_s:.0f} s" if run.cpu_time_s else "") + ") on "
            f"{run.cpu_threads} CPU threads{' and ' + run.cuda if run.cuda else ''}, "
            f"for {n_pairs} layer-pair maps of the main pair(s) plus the controls"
            + (" (this page shows the cached run; the time is the one measured when it was computed)."
               if run.from_cache else "."))


def timings_table(run: MapsSummary) -> pd.DataFrame:
    """Seconds per step of the run (tokenizers, alignment, residuals per model, fits per map family, total)."""
    return pd.DataFrame([{"step": k, "seconds": v} for k, v in run.timings_s.items()])
