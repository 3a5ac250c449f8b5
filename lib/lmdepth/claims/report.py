"""Verdict tables: decide a chapter's registered claims, show them, save them for the findings page."""

from __future__ import annotations

import re
import subprocess
import warnings
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lmdepth.claims import REGISTRY, for_chapter
from lmdepth.claims.spec import BUILT_IN, PAIRED, PERMUTATION, SEEDS, Decided, evaluate
from lmdepth.metrics.verdicts import MIN_UNITS, SATURATED, Side, State
from lmdepth.model.random_init import control_name
from lmdepth.results import atomic_write_text, book_record_dir, run_id, slug
from lmdepth.runtime import REPO_ROOT


class Counted(StrEnum):
    """How the findings page counts a verdict row (its ``counted_as``), in display order: the row's own state when
    its check discriminates on the paper's side; "no valid control" when its control was not run, shares too few
    units, cannot vary or is saturated; "not discriminating" when the paired interval of (real − control) contains 0
    (or the real statistic lies inside its permutation null); "explained by its control" for an 'agrees' whose
    control shows the claimed pattern at least as strongly (the paired interval lies on the other side of the
    control from the paper's): the pattern comes with the architecture or the measurement, and training weakens it —
    shown, not counted as agreement."""

    AGREES = State.AGREES.value
    DISAGREES = State.DISAGREES.value
    INCONCLUSIVE = State.INCONCLUSIVE.value
    NOT_TESTABLE = State.NOT_TESTABLE.value
    NO_VALID_CONTROL = "no valid control"
    NOT_DISCRIMINATING = "not discriminating"
    EXPLAINED = "explained by its control"


EXPLAINED = Counted.EXPLAINED
HEADLINE_STATES: tuple[Counted, ...] = tuple(Counted)
#: The sentence a page prints for each :class:`~lmdepth.metrics.verdicts.Side` of a verdict row.
SIDE_TEXT: dict[Side, str] = {
    Side.NONE: "", Side.BEYOND: "beyond its control (the paper's side)", Side.SHORT: "short of its control",
    Side.LATER: "later than its control", Side.EARLIER: "earlier than its control",
    Side.INDISTINCT: "not distinguishable from its control",
    Side.BEYOND_ALTERNATIVE: "beyond the alternative (the paper's side)",
    Side.SHORT_OF_ALTERNATIVE: "short of the alternative",
    Side.INDISTINCT_FROM_ALTERNATIVE: "not distinguishable from the alternative",
    Side.APART_FROM_POSITIVE: "apart from its positive control",
    Side.OUTSIDE_NULL: "outside its permutation null", Side.INSIDE_NULL: "inside its permutation null",
    Side.EVERY_SEED: "every seed on the interval's side", Side.SEEDS_INCONSISTENT: "not consistent across seeds",
    Side.TOO_FEW_SEEDS: "too few seeds to decide",
}
_SIDE_OF_TEXT = {text: side for side, text in SIDE_TEXT.items()}


def side_of(value: object) -> Side:
    """A recorded ``side`` as a :class:`~lmdepth.metrics.verdicts.Side`: its code, or — in a verdict CSV written
    before the codes — the sentence that was stored instead; :attr:`Side.NONE` for anything else."""
    text = "" if not isinstance(value, str) else value
    if text in Side._value2member_map_:
        return Side(text)
    return _SIDE_OF_TEXT.get(text, Side.NONE)


def side_text(value: object) -> str:
    """The sentence a page prints for a recorded ``side``."""
    return SIDE_TEXT[side_of(value)]


def control_models(models: list[str], remote: bool | str = False, n_units: int = MIN_UNITS) -> list[str]:
    """The random-init controls of ``models``: none for NDIF runs (``remote=True``: a control is built and run
    locally), the same as a local run's under ``remote="local"`` (the weights are here), and none when the sample has
    fewer than 10 units (the real check is then not testable: nothing to discriminate)."""
    if remote is True and models:
        warnings.warn("No random-init controls on NDIF (remote=true): a control is built and run here, so the "
                      "verdict rows that need one read 'no valid control'. Run with remote=false (a smaller model "
                      "of the family) for the controls.", stacklevel=2)
    return [] if remote is True or n_units < MIN_UNITS else [control_name(m) for m in models]


def check(chapter: str, units: pd.DataFrame, models: list[str], control_units: pd.DataFrame | None = None,
          n_boot: int = 1000, seed: int = 0, only: list[str] | None = None) -> pd.DataFrame:
    """Every registered claim of ``chapter`` (or the ids in ``only``) for every model, with its control.

    Args:
        units: the per-unit tables of ``models`` (concatenated; column ``model``).
        control_units: the per-unit tables of their controls (rows named by each claim's ``control_of``), or None.

    Returns:
        One verdict row per (claim, model): see :func:`lmdepth.claims.spec.evaluate`, plus ``counted_as`` (the
        headline state).
    """
    decided = Decided()
    rows = []
    for spec in for_chapter(chapter):
        if only is not None and spec.id not in only:
            continue
        for m in models:
            ctrl = spec.control_of(m) if spec.control_of is not None else None
            has_ctrl = control_units is not None and (control_units.model == ctrl).any()
            rows.append(evaluate(spec, units, m, control_units if has_ctrl else None, ctrl if has_ctrl else None,
                                 decided, n_boot=n_boot, seed=seed))
    out = pd.DataFrame(rows)
    out["counted_as"] = [headline_state(r) for r in out.itertuples()]
    return out


def headline_state(row) -> Counted:
    """The state a verdict row is counted as: "not testable" when the check is; "no valid control" when its
    control is missing or invalid (``control_valid``); "not discriminating" when the model cannot be told from its
    control (``discriminates``); otherwise its own state."""
    if row.state == State.NOT_TESTABLE:
        return Counted.NOT_TESTABLE
    if not row.control_valid:
        return Counted.NO_VALID_CONTROL
    if row.control_kind == SEEDS and row.state == State.INCONCLUSIVE:  # undecided at the level of seeds
        return Counted.INCONCLUSIVE
    if not row.discriminates:
        return Counted.NOT_DISCRIMINATING
    if row.state == State.AGREES and getattr(row, "paper_side", None) is False:
        return Counted.EXPLAINED
    return Counted(row.state)


def _fmt(est: float, lo: float, hi: float) -> str:
    return "—" if not np.isfinite(est) else (f"{est:.3g} [{lo:.3g}, {hi:.3g}]" if np.isfinite(lo) else f"{est:.3g}")


def control_cell(r) -> str:
    """The control column of a verdict row: the paired difference (real − control) with its interval and the side
    the model lies on, the permutation null's range and p, or why there is no valid control."""
    if r.state == "not testable":
        return "—"
    if not r.control_valid:
        return f"no valid control: {r.control_note}"
    if r.control_kind == PAIRED:
        if not np.isfinite(r.paired_diff):
            return side_text(r.side)
        return f"real − control {_fmt(r.paired_diff, r.paired_low, r.paired_high)}: {side_text(r.side)}"
    if r.control_kind == PERMUTATION:
        return (f"null 95 % [{r.control_ci_low:.3g}, {r.control_ci_high:.3g}], p = {r.p_value:.3g}: "
                f"{side_text(r.side)}")
    if r.control_kind == SEEDS:
        return (f"seeds' own statistics {r.control_ci_low:.3g} … {r.control_ci_high:.3g}; sign-flip p = "
                f"{r.p_value:.3g}: {side_text(r.side)}")
    if np.isfinite(r.control_estimate):  # a positive control: its own state, and real − alternative
        return (f"{r.control_state} ({_fmt(r.control_estimate, r.control_ci_low, r.control_ci_high)}); real − "
                f"alternative {_fmt(r.paired_diff, r.paired_low, r.paired_high)}")
    if np.isfinite(r.paired_diff):  # the statistic is the paired difference with the alternative
        return f"{BUILT_IN}: {_fmt(r.paired_diff, r.paired_low, r.paired_high)}, {side_text(r.side)}"
    return BUILT_IN


#: A claim id quoted in a reason (``'cosine.sign_change'``) is one unbreakable word, and two of them set two of the
#: nine columns' least widths, past the text column (lmdepth.book.defects); a zero-width space after each dot and
#: underscore lets the table wrap it. Display only: the saved rows keep the plain id.
_QUOTED_ID = re.compile(r"'([a-z0-9_]+(?:\.[a-z0-9_]+)+)'")


def breakable(text: str) -> str:
    """``text`` with every quoted claim id wrappable (a zero-width space after its dots and underscores)."""
    return _QUOTED_ID.sub(lambda m: "'" + re.sub(r"([._])", "\\1\u200b", m[1]) + "'", text)


#: Columns of :func:`display` that only some statistics and controls have.
APPLIES_TO_SOME = ("with layers 0–1", "at the bound", "control's statistic")


def display(verdicts: pd.DataFrame) -> pd.DataFrame:
    """The compact table a chapter shows: claim, model, n, statistic with its 95 % interval, verdict, the share of
    values at a bound (for statistics with a clip; ≥ 50 % in a compared group: not testable), the control's own
    statistic by the same rule (shown, not deciding), the discrimination test, and how the row is counted. A column
    of :data:`APPLIES_TO_SOME` that applies to no row ("—" in every one: e.g. chapter 07's comparisons of runs read
    no layers and have no paired control; a chapter whose rows are all not testable) is left out, so the columns
    that do apply fit the text column."""
    out = pd.DataFrame({  # at most nine columns: what the text column holds without scrolling (lmdepth.book.defects)
        "claim (the paper's side)": [f"{r.claim} ({r.rule})" for r in verdicts.itertuples()],
        "model": verdicts["model"],
        "statistic [95 % CI], n": [f"{_fmt(r.estimate, r.ci_low, r.ci_high)}, n = {r.n}" for r in verdicts.itertuples()],
        "with layers 0–1": [f"{v:.3g}" if np.isfinite(v) else "—" for v in verdicts["with_layers_0_1"]],
        "verdict": [breakable(r.state + (f" ({r.reason})" if r.reason else "")) for r in verdicts.itertuples()],
        "at the bound": [f"{v:.0%}" if np.isfinite(v) else "—" for v in verdicts["at_bound"]],
        "control's statistic": [_fmt(r.control_estimate, r.control_ci_low, r.control_ci_high)
                                if r.control_kind == PAIRED else "—" for r in verdicts.itertuples()],
        "discrimination": [breakable(control_cell(r)) for r in verdicts.itertuples()],
        "counted as": [(r.counted_as if r.headline else "not counted") + _fragile_note(r)
                       for r in verdicts.itertuples()],
    })
    return out.drop(columns=[c for c in APPLIES_TO_SOME if len(out) and (out[c] == "—").all()])


def _fragile_note(r: Any) -> str:
    """", fragile: <which alternative flips it>" for a row whose statistic lands on the other side of its rule
    with layers 0–1 kept or by the paper's aggregation; "" otherwise (and for a CSV from before the column)."""
    why = getattr(r, "fragile", "")
    return f", fragile ({why})" if isinstance(why, str) and why else ""


def counts(verdicts: pd.DataFrame, headline_only: bool = True) -> pd.Series:
    """Verdict rows per headline state (every state listed, zeros included)."""
    v = verdicts[verdicts["headline"].astype(bool)] if headline_only else verdicts
    return v["counted_as"].value_counts().reindex(list(HEADLINE_STATES), fill_value=0)


def summary(verdicts: pd.DataFrame) -> str:
    """One sentence: counts per state, for the chapter's closing line."""
    c = counts(verdicts, headline_only=False)
    return "Verdicts (claim × model): " + ", ".join(f"{n} {s}" for s, n in c.items()) + "."


def save(verdicts: pd.DataFrame, chapter: str, results_dir: str | None = None) -> None:
    """Save the verdict rows, one file per model: inside a book build into the chapter's book record
    (``<results>/book/<profile>/<chapter>/verdicts/<model>.csv``, what the findings page reads), otherwise into
    ``<results_dir>/verdicts/<chapter>/<model>-<run id>.csv`` (your own runs, each under its own name
    (:func:`lmdepth.results.run_id`), never read by the book)."""
    record = book_record_dir()
    target = record / "verdicts" if record is not None else (
        Path(results_dir) / "verdicts" / chapter if results_dir is not None else None)
    if target is None:
        return
    run = "" if record is not None else "-" + run_id(verdicts.to_csv(index=False).encode())
    for model, rows in verdicts.groupby("model", sort=False):
        atomic_write_text(target / f"{slug(model)}{run}.csv", rows.to_csv(index=False))


#: The claims registry's code: its criteria and the code that applies and shows them in the chapters
#: (``lib/lmdepth/claims``), without the findings page's own tables, links and counts (``findings_claims.py``),
#: which apply nothing. Paths from the top of the checkout, wherever git runs.
REGISTRY_PATHS = (":(top)lib/lmdepth/claims", ":(top,exclude)lib/lmdepth/claims/findings_claims.py")


def registry_commit(root: Path = REPO_ROOT) -> str:
    """The last commit that changed the claims registry's code (:data:`REGISTRY_PATHS`), as ``<hash> (<date>)``, in
    the git checkout that holds ``root``. The findings page names it so a reader can check that the registry predates
    the runs it judges; a commit that changed only how verdicts are shown counts too, so it may name a later commit
    than the last change of a criterion, never an earlier one."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        if head.returncode != 0:
            return "unknown (not a git checkout)"
        out = subprocess.run(["git", "log", "-1", "--format=%h (%cs)", "--", *REGISTRY_PATHS], cwd=root,
                             capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", *REGISTRY_PATHS], cwd=root,
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (git is not available)"
    commit = out.stdout.strip() or "not committed yet"
    return commit + (", with uncommitted changes" if dirty else "")


def describe(chapter: str) -> str:
    """Markdown: the chapter's registered claims, each with its statistic, rule, unit and control, the one
    convention on layers 0–1, and the dated history of criteria changed after their numbers were seen."""
    specs = for_chapter(chapter)
    lines = [f"- **{s.claim}** ({s.figure}): {s.statement} *Statistic* — {s.statistic}; the paper's side: "
             f"{s.rule.describe(s.statistic.split(':')[0])}; unit: {s.unit}"
             + (f"; only meaningful if *{REGISTRY[s.requires].claim}* agrees" if s.requires else "") + "."
             for s in specs]
    controls = sorted({s.control for s in specs})
    history = [f"- *{s.claim}*: {h}" for s in specs for h in s.history]
    return ("\n".join(lines)
            + f"\n\nEach verdict is decided from a 95 % percentile bootstrap interval over {specs[0].unit}s "
            f"(at least 1000 resamples, seeded): **agrees** when the whole interval lies on the paper's side, **disagrees** "
            f"when it lies on the other side, **inconclusive** when it straddles the threshold, **not testable** "
            f"when a precondition fails (fewer than 10 {specs[0].unit}s — a row so small is shown here but not "
            f"counted on the findings page —, or the one the verdict names). "
            f"Layers 0–1 are left out of every verdict statistic in this book (their writes are large relative to "
            f"the small embedding they start from); the column *with layers 0–1* shows the statistic with them (the table "
            f"leaves out this column, *at the bound* and *control's statistic* where they apply to none of its rows). "
            f"A statistic with {SATURATED:.0%} or more of its values at a bound (a clip, a ceiling) in either compared "
            f"group cannot move and is not testable. Control: {'; '.join(controls)}. "
            f"A paired control's own statistic is shown beside the verdict but does not decide; discrimination is a paired "
            f"test: the statistic's difference real − control, with both resampled jointly over the {specs[0].unit}s "
            f"they share, must have a 95 % interval that excludes 0 (a permutation null: the real statistic must lie "
            f"outside the null's central 95 %). The column *discrimination* says on which side of its control the "
            f"model lies. A row whose control was not run, cannot vary (flat over depth, identical in every unit), is "
            f"saturated or is undefined counts as **no valid control**; one whose interval contains 0 as **not "
            f"discriminating**; neither counts as agreement or disagreement on the findings page."
            + ("\n\nChanges to the criteria after their numbers were seen:\n" + "\n".join(history) if history else ""))
