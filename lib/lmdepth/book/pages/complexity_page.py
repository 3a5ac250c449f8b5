"""Chapter 05 (depth vs problem complexity): its prose, display tables and claim checks, from the runs of
:mod:`lmdepth.analyses.complexity` and :mod:`lmdepth.analyses.erasure`."""

from __future__ import annotations

import numpy as np
import pandas as pd

from lmdepth.analyses.complexity import ComplexitySummary, model_names, summary_frame
from lmdepth.analyses.erasure import ErasureSummary
from lmdepth.book.notebook import md, show_table
from lmdepth.claims import report
from lmdepth.claims import scratch_claims as sc
from lmdepth.claims.complexity_claims import length_r
from lmdepth.claims.findings_claims import saved_verdicts
from lmdepth.data.difficulty import LEVELS, SOURCE_TITLES
from lmdepth.metrics.intervals import exact_match
from lmdepth.results import RunResult


def runs_note(results: dict[tuple[str, str], RunResult]) -> str:
    """Markdown: how many runs and items, each model's depth, and how long the runs computed now took."""
    source = next(iter(results))[1]
    summaries = {k: ComplexitySummary.of(r) for k, r in results.items()}
    depth = ", ".join(f"**{m}** {summaries[m, source].n_layers} layers" for m in model_names(results))
    fresh = [s for s in summaries.values() if not s.from_cache]
    wall = sum(s.wall_time_s for s in fresh)
    return (f"Depth-score runs: {len(results)} (model × source), {len(summary_frame(results, 'items'))} items in all; "
            f"{depth}. Computed now: {wall:.0f} s ({len(fresh)} runs; the rest from the cache).")


def solved_cell(correct: pd.Series) -> str:
    """How many items were solved (``correct`` 1), or "–" where correctness was not checked (< 0)."""
    return f"{int((correct == 1).sum())}" if (correct >= 0).all() else "–"


def sizes_table(items: pd.DataFrame) -> pd.DataFrame:
    """Per source and level (rows) and model (columns): "n items · mean tokens · n solved" ("–" where the
    correctness was not checked)."""
    sizes = items.groupby(["source", "level", "model"]).agg(
        n=("item", "size"), tokens=("n_tokens", "mean"), solved=("correct", solved_cell)).reset_index()
    sizes["cell"] = [f"{r.n} items · {r.tokens:.0f} tokens · {r.solved} solved" for r in sizes.itertuples()]
    return sizes.pivot(index=["source", "level"], columns="model", values="cell").reset_index()


def accuracy_table(items: pd.DataFrame) -> pd.DataFrame:
    """Per model, source and level: items, accuracy with its 95 % Wilson interval, and the constant-answer baseline
    (always giving that level's most common reference answer). Rows whose correctness was not checked are left out.

    Columns: ``model, source, level, n, accuracy, ci_low, ci_high, baseline, above`` (``above``: the interval's lower
    end exceeds the baseline — the level is solved clearly better than by a constant answer).
    """
    rows = []
    for (model, source, level), g in items.groupby(["model", "source", "level"], sort=False):
        if (g.correct < 0).any():
            continue
        em = exact_match(g.correct == 1, g.answer if "answer" in g else [])
        rows.append(dict(model=model, source=source, level=int(level), n=em.n, accuracy=em.accuracy,
                         ci_low=em.ci_low, ci_high=em.ci_high, baseline=em.baseline, above=em.above))
    return pd.DataFrame(rows, columns=["model", "source", "level", "n", "accuracy", "ci_low", "ci_high", "baseline",
                                       "above"])


def accuracy_display(acc: pd.DataFrame) -> pd.DataFrame:
    """:func:`accuracy_table` as "accuracy [low, high] (baseline)" cells: rows source × level, one column a model."""
    cells = acc.assign(cell=[f"{a:.0%} [{lo:.0%}, {hi:.0%}] (n {n}; const. {b:.0%}){' ✓' if ab else ''}"
                             for a, lo, hi, n, b, ab in zip(acc.accuracy, acc.ci_low, acc.ci_high, acc.n, acc.baseline,
                                                            acc.above)])
    return cells.pivot(index=["source", "level"], columns="model", values="cell").reset_index()


def ladder_md(acc: pd.DataFrame) -> str:
    """Markdown: per source and model, the levels solved clearly above a constant answer (✓ in the accuracy table),
    and the accuracy on the hardest level beside its baseline — whether a ladder falls toward chance, read off the
    table rather than asserted. One line per source."""
    lines = []
    for source, g in acc.groupby("source", sort=False):
        parts = []
        for model, m in g.sort_values("level").groupby("model", sort=False):
            above = [str(lv) for lv in m.level[m.above]]
            top = m.iloc[-1]
            parts.append(f"{model}: {', '.join(above) if above else 'none'} (level {top.level}: {top.accuracy:.0%} "
                         f"[{top.ci_low:.0%}, {top.ci_high:.0%}], constant answer {top.baseline:.0%})")
        lines.append(f"- *{SOURCE_TITLES.get(source, source)}* — levels solved clearly above a constant answer: "
                     + "; ".join(parts) + ".")
    return "\n".join(lines)


def _lengths(items: pd.DataFrame) -> pd.DataFrame:
    """Per source and model: tokens per level (least-squares slope of the prompt length over items) and the Pearson
    r of level and prompt length over all of the source's items (:func:`length_r`)."""
    rows = [{"source": source, "model": model, "r": length_r(g),
             "per_level": float(np.polyfit(g.level, g.prompt_tokens.astype(float), 1)[0])
             if g.level.nunique() > 1 else np.nan}
            for (source, model), g in items.groupby(["source", "model"], sort=False)]
    return pd.DataFrame(rows, columns=["source", "model", "per_level", "r"])


def _items_per_level(slopes: pd.DataFrame, levels: pd.DataFrame) -> list[int]:
    """Per slope row, the fewest items any of its source's levels holds for its model (below 3, every bootstrap
    resample is nearly the same item set and the slope's interval means nothing)."""
    min_n = levels[levels.aggregation == "mean"].groupby(["model", "source"])["n"].min()
    return [int(min_n.get((m, src), 0)) for m, src in zip(slopes.model, slopes.source)]


def slope_table(slopes: pd.DataFrame, levels: pd.DataFrame, items: pd.DataFrame) -> pd.DataFrame:
    """The fitted slopes of the depth score over levels (mean aggregation), with how much the prompt length follows
    the level beside them.

    Columns: ``model, source, metric``, the slope in layers per level, the rise over the source's whole range of
    levels in units of relative depth (``D / (L − 1)``), and its 95 % interval — "n/a (k per level)" when some level
    has fewer than 3 items (every bootstrap resample is then nearly the same item set); then the prompt tokens a
    level adds and the Pearson r of level and prompt length over all of the source's items (:func:`_lengths`: the r
    the claim check bounds, there over the levels the model is competent on).
    """
    sl = slopes[(slopes.aggregation == "mean")].copy()
    span = sl.source.map({s: max(lv) - min(lv) for s, lv in LEVELS.items()})
    sl["rise over all levels (rel. depth)"] = (sl.rel_slope * span).round(3)
    sl["items per level"] = _items_per_level(sl, levels)
    sl["95% CI"] = [f"{lo * sp:+.3f} … {hi * sp:+.3f}" if n >= 3 else f"n/a ({n} per level)"
                    for lo, hi, sp, n in zip(sl.rel_ci_low, sl.rel_ci_high, span, sl["items per level"])]
    sl["slope (layers/level)"] = sl.slope.round(3)
    sl = sl.merge(_lengths(items), on=["model", "source"], how="left")
    sl["prompt tokens per level"], sl["r (level, prompt length)"] = sl.per_level.round(1), sl.r.round(2)
    return sl[["model", "source", "metric", "slope (layers/level)", "rise over all levels (rel. depth)", "95% CI",
               "prompt tokens per level", "r (level, prompt length)"]]


def solved_counts(items: pd.DataFrame) -> pd.DataFrame:
    """Solved and unsolved items per model and source (items whose correctness was not checked count in neither)."""
    return (items.assign(solved=items.correct == 1, unsolved=items.correct == 0)
            .groupby(["model", "source"])[["solved", "unsolved"]].sum().reset_index())


def summary_note(verdicts: pd.DataFrame, results: dict[tuple[str, str], RunResult]) -> str:
    """Markdown: the verdict counts and where the results are."""
    return f"{report.summary(verdicts)} Results: `{next(iter(results.values())).path.parent.parent}`."


#: Completeness-table columns (:func:`completeness_table`).
COMPLETENESS_COLUMNS = ["prompt", "f(X)", "median |error|", "max |error|", "layers with error > 5 %", "of layers"]


def case_table(case: dict[str, RunResult]) -> pd.DataFrame:
    """One row per (model, case-study prompt): tokens, answer tokens and whether the greedy answer is right."""
    return pd.DataFrame([{"model": m, "prompt": p, "tokens": v.n_tokens, "answer tokens": v.n_tokens - v.a_start,
                          "greedy answer right": "yes" if v.correct else "no"}
                         for m, r in case.items() for p, v in ErasureSummary.of(r).prompts.items()])


def completeness_table(result: RunResult) -> pd.DataFrame:
    """Integrated-gradients completeness per prompt that has them (rounded to 4 decimals; empty if none): f(X),
    the median and max over layers of |Σ_t IG − (f(X) − f(B))| / |f(X) − f(B)|, and how many layers exceed 5 %."""
    rows = [{"prompt": p, "f(X)": round(v.f_x, 4), "median |error|": float(np.median(v.completeness_error)),
             "max |error|": float(np.max(v.completeness_error)),
             "layers with error > 5 %": int((np.array(v.completeness_error) > 0.05).sum()),
             "of layers": len(v.completeness_error)}
            for p, v in ErasureSummary.of(result).prompts.items() if v.completeness_error is not None]
    return pd.DataFrame(rows, columns=COMPLETENESS_COLUMNS).round(4)


def completeness_by_model(case: dict[str, RunResult]) -> pd.DataFrame:
    """:func:`completeness_table` of every model that has integrated gradients, with a ``model`` column first."""
    return pd.DataFrame([{"model": m, **row} for m, r in case.items() for row in completeness_table(r).to_dict("records")],
                        columns=["model", *COMPLETENESS_COLUMNS])


def completeness_note(result: RunResult) -> str:
    """Markdown introducing :func:`completeness_table` (steps and quadrature rule of the run), or saying that
    integrated gradients were skipped."""
    if completeness_table(result).empty:
        return "Integrated gradients were skipped (`ig_steps = 0` or `n_ig_prompts = 0`)."
    s = ErasureSummary.of(result)
    return (f"Integrated gradients with {s.ig_steps} steps, {s.ig_rule} rule (the paper: 256, left). "
            "Completeness error per layer, |Σ_t IG − (f(X) − f(B))| / |f(X) − f(B)|:")


# ---- a positive control from a trained run (chapter 07's depth rows) ------------------------------------------

#: Chapter 07's claims whose rows could be this chapter's positive control: a model trained from scratch whose depth
#: score rises with the number of operations that must run in sequence (the operation chains, built as the control)
#: or in a sum, measured with this chapter's depth score.
CHAIN_CLAIM = "moeut.chain_depth_grows"
GROWTH_CLAIMS = (CHAIN_CLAIM, "moeut.depth_grows")


def trained_growth_rows(results_dir: str, profile: str) -> pd.DataFrame:
    """Chapter 07's rise rows (:data:`GROWTH_CLAIMS`: the operation-chain positive control, then "depth grows with the
    number of operations" per recipe trained from scratch): those the book build recorded for ``profile`` (chapter
    07 executes before this chapter), else those of the latest ``lmdepth run moeut`` into ``results_dir``; empty
    when chapter 07 has not been run."""
    for recorded in (profile, None):
        rows = saved_verdicts(results_dir, recorded)
        rows = rows[rows.claim_id.isin(GROWTH_CLAIMS)]
        if len(rows):
            return rows.reset_index(drop=True)
    return rows.reset_index(drop=True)


def _rise(r) -> str:
    return f"{r.estimate:+.4f} [{r.ci_low:+.4f}, {r.ci_high:+.4f}]" if np.isfinite(r.estimate) else "—"


def trained_control_md(growth: pd.DataFrame, verdicts: pd.DataFrame, slopes: pd.DataFrame,
                       levels: pd.DataFrame) -> str:
    """Markdown: whether a run trained from scratch is this chapter's positive control, and which of the chapter's
    ladders could detect a rise of its size — all read off the rows.

    Args:
        growth: :func:`trained_growth_rows` (estimates: rise of the relative depth score per operation).
        verdicts: this chapter's verdict rows (estimates: rise of the relative depth score per level).
        slopes: this chapter's descriptive slopes (``model, source, metric, aggregation, rel_slope, rel_ci_low,
            rel_ci_high``: relative depth score per level, over all levels as they come); levels: its depth score
            per level (``n`` items), for the ladders with at least 3 items on every level.
    """
    if growth.empty:
        return ("Chapter 07 has not been run here (`lmdepth run moeut`), so this chapter has no positive control from "
                "a trained run; the synthetic one stands in.")
    listed = "; ".join(f"{r.model} {_rise(r)}, n = {r.n}, {r.counted_as}" for r in growth.itertuples())
    chain = growth[growth.claim_id == CHAIN_CLAIM]
    below = len(chain) and chain.iloc[0].counted_as == "disagrees"
    small = bool(below) and sc.rises(chain.iloc[0])
    blind = ("" if not below else
             " The positive control built for it — operation chains, whose steps must run in sequence — rises, but "
             "by less than δ, so in models of this size the depth score sees sequential depth only as a rise of that "
             "size." if small else
             " Even the positive control built for it — operation chains, whose steps must run in sequence — does "
             "not rise by δ, so in models of this size the depth score does not see sequential depth, and no flat "
             "row of this chapter is evidence that depth does not grow.")
    rising = growth[growth.counted_as == "agrees"]
    if len(rising):
        best = rising.loc[rising.estimate.idxmax()]
        size, what = float(best.estimate), f"the control's rise, {best.estimate:.4f} per step"
        head = (f"**Positive control from a trained run: {best.model}** (chapter 07): its depth score rises by "
                f"{_rise(best)} of its depth per operation. Chapter 07's rows per recipe: {listed}.")
    else:
        finite = growth.estimate[np.isfinite(growth.estimate)]
        size = float(finite.max()) if len(finite) and finite.max() > 0 else float("nan")
        what = f"the largest estimated rise, {size:.4f} per step" if np.isfinite(size) else ""
        lead = ("**A trained positive control rises, but by less than δ.**" if small else
                "**No positive control from a trained run yet.**")
        head = (f"{lead} No recipe trained from scratch has a depth score "
                f"that rises by its claim's δ with the number of operations (chapter 07's rows, rise of the "
                f"relative depth score per step [95 % CI]: {listed}), so the synthetic control above stands in."
                + blind)
    if not np.isfinite(size):
        return head
    testable = verdicts[verdicts.state != "not testable"]
    narrow_enough = testable[(testable.ci_high - testable.ci_low) / 2 < size]
    sl = slopes[(slopes.aggregation == "mean") & (slopes.metric == "layer_effect")]
    sl = sl[np.array(_items_per_level(sl, levels)) >= 3]
    narrow = sl[(sl.rel_ci_high - sl.rel_ci_low) / 2 < size]
    checks = (", ".join(f"{r.claim} on {r.model}" for r in narrow_enough.itertuples()) if len(narrow_enough) else
              f"none of its {len(testable)} testable claim rows has an interval that narrow" if len(testable) else
              f"none: not one of its {len(verdicts)} claim rows is testable")
    ladders = ("; ".join(f"{m}: " + ", ".join(SOURCE_TITLES.get(src, src) for src in g.source)
                         for m, g in narrow.groupby("model", sort=False)) if len(narrow) else "none")
    return (f"{head} Could this chapter see a rise of that size ({what})? Its checks that could: {checks}. Its "
            f"ladders with at least 3 items per level whose descriptive slope (layer effect, mean aggregation, "
            f"relative depth per level) has a 95 % interval narrower than that on either side — a rise of that size "
            f"would show there once a model solves the ladder: {ladders}.")


def show_completeness(case: dict[str, RunResult], main: str) -> None:
    """Integrated gradients' completeness: the main model's note (:func:`completeness_note`), then the per-prompt
    table of every model that has them (:func:`completeness_by_model`; none shown without any)."""
    md(completeness_note(case[main]))
    completeness = completeness_by_model(case)
    if len(completeness):
        show_table(completeness, caption="Integrated-gradients completeness per model and prompt")
