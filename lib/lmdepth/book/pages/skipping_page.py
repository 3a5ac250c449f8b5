"""Chapter 03 (layer skipping): its prose, display tables, claim checks and live benchmark, from the runs of
:mod:`lmdepth.analyses.skipping`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from lmdepth.analyses.skipping import BenchmarkSummary, SkipSummary, matrix
from lmdepth.claims.skipping_claims import ROBUST, nudge_control, per_layer
from lmdepth.claims.spec import EARLY_LAYERS
from lmdepth.errors import DataError
from lmdepth.metrics.effects import later_effect
from lmdepth.metrics.layer_curves import half_means
from lmdepth.model.random_init import control_name
from lmdepth.results import RunResult

VARIANT_TITLES = {"layer": "Layer skipped", "attention": "Attention removed", "mlp": "MLP removed",
                  "local": "Layer, local (direct) effect"}


def origin(run: SkipSummary) -> str:
    """Where a run's numbers came from: "cached", or the seconds it took to compute them."""
    return "cached" if run.from_cache else f"{run.wall_time_s:.0f} s"


def runs_md(model_name: str, current: RunResult, future: RunResult, n_cuts: int) -> str:
    """One sentence on the main model's two runs (all-token and future-token analysis): sizes and provenance."""
    cur, fut = SkipSummary.of(current), SkipSummary.of(future)
    return (f"**{model_name}** ({fut.n_layers} layers): all-token analysis on {cur.n_problems} problems "
            f"({origin(cur)}), future-token analysis on {fut.n_problems} problems with {n_cuts} cut points each "
            f"({origin(fut)}).")


def later_effects_md(current: RunResult, future: RunResult, threshold: float) -> str:
    """The later effect of first- vs second-half layers (all and future tokens) and the future-effect cutoff of the
    layer skip with its bootstrap interval, as one paragraph."""
    fut_later = later_effect(matrix(future.table, "future", "layer"))
    cur_later = later_effect(matrix(current.table, "current", "layer"))
    fut = SkipSummary.of(future)
    s, L = fut.cutoffs["layer"], fut.n_layers
    return (f"In the paper's aggregation — the largest relative change of any later layer, over positions and "
            f"problems, unclipped — the mean over the first vs the second half of the layers is: all tokens "
            f"{half_means(cur_later)[0]:.3g} → {half_means(cur_later)[1]:.3g}; future tokens "
            f"{half_means(fut_later)[0]:.3g} → {half_means(fut_later)[1]:.3g}. A max of a relative change is "
            f"carried by its few exploding values (a layer "
            f"whose clean contribution is near zero), so these numbers decide nothing: the verdicts below use "
            f"the robust per-problem mean and show the paper's clipped statistic beside it. **Cutoff** (the first layer from which skipping "
            f"changes no later layer's future contribution by ≥ {threshold:g}): layer {s.cutoff} of {L} "
            f"(relative depth {s.rel_depth:.2f}; 95 % bootstrap interval over problems: layers "
            f"{s.ci_low:.0f}–{s.ci_high:.0f}).")


def cutoff_table(futures: dict[str, SkipSummary], models: Sequence[str], variants: Sequence[str]) -> pd.DataFrame:
    """The future-effect cutoff of every (model, variant) with its bootstrap interval, for display (only the
    variants each model ran; "—" where one problem gives no interval).

    Args:
        futures: model → the summary of its future-token run.
    """
    rows = []
    for m in models:
        for v in (v for v in variants if v in futures[m].cutoffs):
            c = futures[m].cutoffs[v]
            ci = f"{c.ci_low:.0f}–{c.ci_high:.0f}" if np.isfinite([c.ci_low, c.ci_high]).all() else "—"
            rows.append({"model": m, "part": VARIANT_TITLES[v], "problems": futures[m].n_problems,
                         "cutoff layer": c.cutoff, "of layers": c.n_layers,
                         "relative depth": round(c.rel_depth, 2), "95% CI (layers)": ci})
    return pd.DataFrame(rows)


def statistics_table(verdicts: pd.DataFrame) -> pd.DataFrame:
    """Per verdict row, the robust statistic that decided it beside the paper's aggregation of the same check (on
    per-problem maxima clipped at 1) and the larger share, over the two halves, of those maxima at the clip."""
    if "paper_estimate" not in verdicts:  # verdicts saved before the robust statistic existed
        return pd.DataFrame()
    rows = verdicts[np.isfinite(verdicts["paper_estimate"].astype(float))]

    def ci(r) -> str:
        return (f"{r.estimate:.3g} [{r.ci_low:.3g}, {r.ci_high:.3g}]" if np.isfinite(r.ci_low)
                else (f"{r.estimate:.3g}" if np.isfinite(r.estimate) else "—"))

    return pd.DataFrame({"claim": rows["claim"], "model": rows["model"],
                         "robust statistic (decides) [95 % CI]": [ci(r) for r in rows.itertuples()],
                         "paper's statistic (clipped max)": [f"{v:.3g}" for v in rows["paper_estimate"]],
                         "paper's maxima at the clip": [f"{v:.0%}" for v in rows["paper_at_bound"]]})


OUTPUT_CLAIM = "skipping.current_output_changes"


def output_change_table(verdicts: pd.DataFrame, units: pd.DataFrame, controls: pd.DataFrame | None,
                        models: Sequence[str]) -> pd.DataFrame:
    """The output change on all tokens — the statistic that decides *2nd half still changes the output* — per model:
    first- and second-half means (layers 0–1 left out) and their ratio, for the layer skip, for its control (the
    nudge of the same size) and for the random-init twin (a reference), with the paired interval of the ratio
    (skip − nudge) and how the row counts; the nudge's ratio with its 95 % interval, which holds the spread of its
    per-problem random draws. "—" where a run is missing."""
    values = per_layer("current", ROBUST["output_change"])
    rows = verdicts.set_index(["claim_id", "model"])

    def halves(table: pd.DataFrame | None, name: str) -> str:
        try:
            v = values(table, name).to_numpy(dtype=float) if table is not None else None
        except DataError:
            v = None
        if v is None:
            return "—"
        a, b = half_means(v.mean(0), EARLY_LAYERS)  # every problem has every layer: the mean of its halves
        return f"{a:.3g} → {b:.3g} ({b / a:.2f}), n = {len(v)}" if a > 0 else f"{a:.3g} → {b:.3g}, n = {len(v)}"

    out = []
    for m in models:
        r = rows.loc[(OUTPUT_CLAIM, m)] if (OUTPUT_CLAIM, m) in rows.index else None
        paired = (f"{r.paired_diff:.3g} [{r.paired_low:.3g}, {r.paired_high:.3g}]"
                  if r is not None and np.isfinite(r.paired_diff) else "—")
        # the nudge draws afresh per problem: its ratio's interval holds the spread of the draws
        nudge = halves(controls, nudge_control(m))
        if nudge != "—" and r is not None and np.isfinite(r.control_ci_low):
            nudge += f"; ratio [{r.control_ci_low:.2f}, {r.control_ci_high:.2f}] over problems and draws"
        out.append({"model": m, "layer skipped: 1st → 2nd half (ratio)": halves(units, m),
                    "nudge of the same size (control)": nudge,
                    "random-init twin (reference)": halves(controls, control_name(m)),
                    "ratio, skip − nudge [95 % CI]": paired,
                    "counted as": r.counted_as if r is not None else "—"})
    return pd.DataFrame(out)


def check_identities(table: pd.DataFrame, models: Sequence[str]) -> None:
    """Identities of the layer skip that hold whatever the model (checks of the code, not of the paper's claim).

    Raises:
        AssertionError: all tokens: a skipped layer's own contribution does not vanish, or an earlier layer changes;
            future tokens: a layer at or before the skipped one changes.
    """
    with_current = set(table[table.analysis == "current"].model)
    for m in models:
        if m in with_current:
            E = matrix(table, "current", "layer", model=m)
            if not np.allclose(np.diag(E), 1.0, atol=1e-4):
                raise AssertionError(f"{m}, all tokens: a skipped layer's own contribution vanishes")
            if not np.allclose(np.tril(E, -1), 0.0):
                raise AssertionError(f"{m}, all tokens: earlier layers cannot change")
        if not np.allclose(np.tril(matrix(table, "future", "layer", model=m)), 0.0, atol=1e-5):
            raise AssertionError(f"{m}, future tokens: layers up to the skipped one cannot change")


def benchmark_md(result: RunResult | None) -> list[str]:
    """Chapter 03's benchmark (:func:`lmdepth.analyses.skipping.benchmark`) as four Markdown paragraphs: when and
    where it was measured, the two paths timed, the work both do counted, and the counted ratio over many problems;
    one paragraph saying how to time it where none is stored."""
    if result is None:
        return ["No timing of this model is stored here: `-p benchmark true` times the session against the naive "
                "loop on one problem in this chapter (a few minutes on a CPU), and `scripts/bench_skipping.py` does "
                "so on more problems."]
    b, s = result.table.iloc[0], BenchmarkSummary.of(result)
    when = (f"Measured {s.measured_at or '(date not recorded)'} on {s.platform or 'an unrecorded machine'}"
            f"{', ' + s.cuda if s.cuda else ''}, {int(b.threads)} CPU threads"
            + (f", load average {max(s.load_average):.1f}" if s.load_average else "") + " — "
            + ("stored with the book's results, so rebuilding the page does not time it again (`use_cache=False` "
               "re-times it on your machine)." if s.from_cache else "timed in this build."))
    ratio = b.naive_cpu_s / b.fast_cpu_s
    verdict = (f"**{ratio:.1f}× less**" if ratio >= 1 else
               f"**{1 / ratio:.1f}× more** — timings on a shared machine vary by more than the work saved; the counted "
               "ratio below is the measure that does not depend on the load")
    timed = (f"Future-token analysis, layer skip, one problem ({int(b.tokens)} tokens, {int(b.n_cuts)} cut points, "
             f"{int(b.naive_passes)} naive forward passes). CPU time: naive {b.naive_cpu_s:.1f} s, fast "
             f"{b.fast_cpu_s:.1f} s — {verdict}; wall time: naive {b.naive_s:.1f} s, fast {b.fast_s:.1f} s "
             f"({b.naive_s / b.fast_s:.1f}×). Largest difference between the two results {b.max_abs_diff:.1e}.")
    counted = (f"Work the two paths do on this input, counted rather than timed (layer × position units, unembedding "
               f"included): naive / fast = **{b.counted_ratio:.1f}×** with these {int(b.n_cuts)} cut points, "
               f"{b.counted_ratio_4:.1f}× with the paper's 4.")
    ceiling = (f"Over {int(b.pool)} problems of the data set with the paper's 4 cut points, the counted ratio is "
               f"{b.pool_min:.2f}× at least, **{b.pool_median:.2f}× in the median**, {b.pool_max:.2f}× at most "
               f"({b.pool_share_5x:.0%} of problems reach 5×): a 5× speed-up over the naive loop is beyond what exact "
               "shortcuts allow on a typical problem; timing cannot beat the count by much.")
    return [when, timed, counted, ceiling]
