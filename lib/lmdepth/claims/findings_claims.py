"""The findings page's view of the verdicts: what the book build saved, as a table of rows, a claim × model matrix
and counts.

Nothing here decides anything: the chapters decided and saved their verdict rows (:func:`lmdepth.claims.report.save`);
this module reads them back and arranges them.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from lmdepth.claims import REGISTRY
from lmdepth.claims.report import HEADLINE_STATES, control_cell, side_of, side_text
from lmdepth.claims.spec import BUILT_IN, PAIRED, PERMUTATION, SEEDS
from lmdepth.metrics.verdicts import Side

# Columns a verdict row may lack (a CSV from before the paired test): what they read as.
_DEFAULTS: dict[str, object] = {
    "figure": "", "rule": "", "n": np.nan, "estimate": np.nan, "ci_low": np.nan, "ci_high": np.nan, "reason": "",
    "control": "", "control_model": "", "headline": True, "counted_as": "", "control_kind": "", "control_note": "",
    "control_state": "", "control_valid": False, "control_estimate": np.nan, "control_ci_low": np.nan,
    "control_ci_high": np.nan, "paired_diff": np.nan, "paired_low": np.nan, "paired_high": np.nan, "p_value": np.nan,
    "side": "", "fragile": "",
}
_NUMERIC = ("n", "estimate", "ci_low", "ci_high", "control_estimate", "control_ci_low", "control_ci_high",
            "paired_diff", "paired_low", "paired_high", "p_value")
_TEXT = ("figure", "rule", "reason", "control", "control_model", "counted_as", "control_kind", "control_note",
         "control_state", "side", "fragile")


def _text(v: object) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def _flag(v: object) -> bool:
    return str(v).strip().lower() in ("true", "1", "1.0")


def interval(est: float, lo: float, hi: float) -> str:
    """``est [lo, hi]`` to 3 significant digits; ``est`` alone without an interval, "—" without an estimate."""
    if not np.isfinite(est):
        return "—"
    return f"{est:.3g} [{lo:.3g}, {hi:.3g}]" if np.isfinite(lo) and np.isfinite(hi) else f"{est:.3g}"


def normalized(verdicts: pd.DataFrame) -> pd.DataFrame:
    """The verdict rows with every column the findings views read (a missing one filled as "not recorded"),
    numbers as floats, ``headline`` and ``control_valid`` as bools and ``counted_as`` set (an old row without it:
    its own state). A verdict CSV written before the paired test reads this way too."""
    v = verdicts.reset_index(drop=True).copy()
    for col, default in _DEFAULTS.items():
        if col not in v.columns:
            v[col] = default
    for col in _NUMERIC:
        v[col] = pd.to_numeric(v[col], errors="coerce").astype(float)
    for col in _TEXT:
        v[col] = v[col].map(_text)
    for col in ("headline", "control_valid"):
        v[col] = v[col].map(_flag)
    v["counted_as"] = [c or s for c, s in zip(v["counted_as"], v["state"])]
    return v


def saved_verdicts(results_dir: str | Path, profile: str | None = None) -> pd.DataFrame:
    """Every verdict row the chapters saved.

    With ``profile``: those the book build recorded for it (``<results>/book/<profile>/<chapter>/verdicts``);
    without: those of runs outside the book (``<results>/verdicts/<chapter>``; of several runs of one chapter and
    model, the latest). Rows of claims that are no longer in the registry are dropped (a stale record must not
    reach the page)."""
    if profile is None:
        files = sorted(Path(results_dir, "verdicts").glob("*/*.csv"))
    else:
        files = sorted((Path(results_dir) / "book" / Path(profile).stem).glob("*/verdicts/*.csv"))
    frames = [pd.read_csv(p).assign(_mtime=p.stat().st_mtime) for p in files]
    if not frames:
        return pd.DataFrame(columns=["chapter", "claim_id", "claim", "model", "state", "counted_as", "headline"])
    out = pd.concat(frames, ignore_index=True)
    out = out[out["claim_id"].isin(list(REGISTRY))]
    if profile is None:  # each ad-hoc run keeps its own file (lmdepth.claims.report.save): show the latest
        out = out[out["_mtime"] == out.groupby(["chapter", "model"])["_mtime"].transform("max")]
    out = out.drop(columns="_mtime")
    order = {cid: i for i, cid in enumerate(REGISTRY)}
    return out.sort_values("claim_id", key=lambda c: c.map(order), kind="stable", ignore_index=True)


def shown(verdicts: pd.DataFrame, models: list[str], among: set[str] | list[str]) -> pd.DataFrame:
    """The rows the findings page shows for ``models``, picked from ``among`` (every model the page could show):
    all rows but those of a model of ``among`` that was not picked (of a map ``A → B``, either end). A subject that
    is none of ``among`` (a run trained here, a fine-tuned model, a comparison such as ``MoEUT vs Transformer``) is
    always shown, so with every model picked the page counts the rows the introduction counts."""
    hidden = set(among) - set(models)
    # a boolean array, not a list: an empty list would select no columns of an empty record instead of no rows
    keep = np.array([not any(m.strip() in hidden for m in str(s).split("→")) for s in verdicts["model"]], dtype=bool)
    return verdicts[keep]


def _cell(r) -> str:
    counted = "" if r.headline else " · not counted"
    if r.state == "not testable":
        return f"not testable: {r.reason} (n {r.n}){counted}"
    ci = f" [{r.ci_low:.3g}, {r.ci_high:.3g}]" if np.isfinite(r.ci_low) else ""
    tag = {"not discriminating": " ⊘", "no valid control": " ∅"}.get(r.counted_as, "")
    fragile = " · fragile" if isinstance(getattr(r, "fragile", ""), str) and getattr(r, "fragile", "") else ""
    return f"{r.state}{tag} · {r.estimate:.3g}{ci} · n {r.n} · {control_cell(r)}{fragile}{counted}"


def verdict_matrix(verdicts: pd.DataFrame, models: list[str] | None = None) -> pd.DataFrame:
    """One row per claim (with its paper figure and the paper's side), one column per model or subject: the
    verdict, the statistic with its 95 % interval, n, and the discrimination test against its control; ⊘ marks a
    check that does not tell the model from its control (not discriminating), ∅ one without a valid control, "not
    counted" a row outside the headline (a chapter-only claim, or a sample below its size requirement). :func:`verdict_matrices` splits it into tables
    that fit the book's text column."""
    if verdicts.empty:
        return pd.DataFrame()
    subjects = list(dict.fromkeys(verdicts["model"]))
    models = [m for m in (models or []) if m in subjects] + [s for s in subjects if s not in (models or [])]
    v = verdicts.assign(cell=lambda d: [_cell(r) for r in d.itertuples()],
                        label=lambda d: d["claim"] + " (" + d["figure"] + "; " + d["rule"] + ")")
    wide = v.pivot_table(index="label", columns="model", values="cell", aggfunc="first", sort=False)
    return wide.reindex(columns=models).reset_index().fillna("—").rename_axis(columns=None).rename(
        columns={"label": "claim (paper figure; the paper's side)"})


def verdict_matrices(verdicts: pd.DataFrame, models: list[str] | None = None) -> dict[str, pd.DataFrame]:
    """:func:`verdict_matrix` split by subject so each table fits the text column: the models (claims × models),
    the model pairs of chapter 06 (pairs × claims: six pairs would be six more columns) and any other subject
    (e.g. chapter 07's MoEUT vs Transformer). Empty groups are left out; keys are the tables' titles."""
    subjects = list(dict.fromkeys(verdicts["model"])) if len(verdicts) else []
    pairs = [s for s in subjects if " → " in s]
    single = [s for s in (models or subjects) if s in subjects and s not in pairs]  # in the page's model order
    other = [s for s in subjects if s not in pairs and s not in single]
    out = {}
    for title, group in (("Per model", single), ("Per model pair (source → target)", pairs),
                         ("From-scratch models", other)):
        if not group:
            continue
        m = verdict_matrix(verdicts[verdicts["model"].isin(group)], group)
        if group is pairs:
            m = m.set_index(m.columns[0]).T.rename_axis("model pair").reset_index().rename_axis(columns=None)
        out[title] = m
    return out


#: The columns of :func:`row_table`: six, so the table fits the text column (lmdepth.book.defects: a table of more
#: than six columns must not be wider than the column).
ROW_COLUMNS = ("claim (paper figure; the paper's side)", "model", "verdict", "statistic [95 % CI], n", "control",
               "model − control [95 % CI]")
#: The controls' names in :func:`row_table`, by the prefix of ``control_model``
#: (:func:`lmdepth.model.random_init.control_name`).
CONTROL_NAMES = {"random-init": "random-init twin", "absolute-index": "alignment by layer index",
                 "random-nudge": "random nudge of the skip's size"}
#: Shorter forms of a row's ``side`` (:func:`lmdepth.claims.spec.evaluate`) under the column's title (the others
#: print :data:`~lmdepth.claims.report.SIDE_TEXT`).
SIDES = {Side.BEYOND: "beyond it, on the paper's side", Side.SHORT: "short of it", Side.INDISTINCT: "contains 0",
         Side.EARLIER: "earlier", Side.LATER: "later", Side.OUTSIDE_NULL: "outside", Side.INSIDE_NULL: "inside",
         Side.EVERY_SEED: "every seed on its side", Side.SEEDS_INCONSISTENT: "seeds not consistent",
         Side.TOO_FEW_SEEDS: "too few seeds"}


def short(text: str, limit: int = 90) -> str:
    """A reason or note in a table cell: its first clause (up to ";"), a label before ": " (e.g. "saturated",
    "runs not comparable") instead of its details, without its parentheses if it is still longer than ``limit``
    characters, and then cut there. The whole text is in the chapter's table and the forest plot's tooltip."""
    first = text.split(";")[0].strip()
    label, sep, _ = first.partition(": ")
    if sep and len(label) <= 25:
        first = label
    if len(first) > limit:
        first = re.sub(r"\s*\([^()]*\)", "", first).strip()
    return first if len(first) <= limit else first[:limit - 1].rstrip() + "…"


def _verdict_text(r) -> str:
    """The row's own verdict (why, if it is not testable), how the headline counts it where that differs, and
    "not counted" for a row outside the headline."""
    text = r.state + (f": {short(r.reason)}" if r.state == "not testable" and r.reason else "")
    if r.counted_as != r.state:
        text += f"; {'counted as ' if r.headline else ''}{r.counted_as}"
    if r.fragile:
        text += f"; fragile: the other side {r.fragile}"
    return text + ("" if r.headline else "; not counted")


def _control_text(r) -> str:
    """The control and its own verdict by the same rule (shown, not deciding)."""
    if r.state == "not testable":
        return "—"
    if r.control_kind == PAIRED:
        prefix = r.control_model.split(":")[0] if ":" in r.control_model else ""
        name = CONTROL_NAMES.get(prefix, prefix or "paired control")
        return f"{name}: {r.control_state}" if r.control_state else name
    if r.control_kind == PERMUTATION:
        return "permutation null" + (f", p = {r.p_value:.2g}" if np.isfinite(r.p_value) else "")
    if r.control_kind == BUILT_IN:
        return r.control_state or BUILT_IN
    if r.control_kind == SEEDS:
        return "training seeds" + (f", sign-flip p = {r.p_value:.2g}" if np.isfinite(r.p_value) else "")
    return "not recorded"


def _difference_text(r) -> str:
    """The discrimination test: model − control with its paired interval and the side the model lies on, the
    permutation null's central 95 %, or why there is none."""
    if r.state == "not testable" or r.control_kind not in (PAIRED, PERMUTATION, BUILT_IN, SEEDS):
        return "—"
    if not r.control_valid:
        return f"no valid control: {short(r.control_note)}" if r.control_note else "no valid control"
    side = SIDES.get(side_of(r.side), side_text(r.side))
    if r.control_kind == PERMUTATION:
        null = f"null 95 % [{r.control_ci_low:.3g}, {r.control_ci_high:.3g}]"
        return f"{null}: {side}" if side else null
    if r.control_kind == SEEDS:
        return f"seeds {r.control_ci_low:.3g} … {r.control_ci_high:.3g}: {side}"
    if not np.isfinite(r.paired_diff):
        return side or "—"
    diff = interval(r.paired_diff, r.paired_low, r.paired_high)
    return f"{diff}: {side}" if side else diff


def row_table(verdicts: pd.DataFrame, models: list[str] | None = None) -> pd.DataFrame:
    """The findings for reading: one row per verdict row (claim × model), in six short columns (:data:`ROW_COLUMNS`):
    the claim with its paper figure and the paper's side; the model; its verdict (for a row that is not testable,
    why, shortened by :func:`short`; where the row is counted otherwise, how: "no valid control", "not
    discriminating"; "not counted" for a row outside the headline); the statistic with its 95 % interval and n; the
    control with its own verdict by the same rule (shown, not deciding); and the discrimination test (model −
    control with its paired 95 % interval and the side the model lies on, a permutation null's central 95 %, or
    why there is no valid control).

    Nothing is pivoted or merged: the table has exactly the rows of ``verdicts`` (grouped by claim in the order
    given, the rows of ``models`` first in that order, then any other subject), so no row is lost or shown twice.
    A verdict CSV written before the paired test reads too (:func:`normalized`: what it lacks reads "not
    recorded" or "—").
    """
    if verdicts.empty:
        return pd.DataFrame(columns=list(ROW_COLUMNS))
    v = _in_table_order(normalized(verdicts), models)
    rows = list(v.itertuples())
    return pd.DataFrame({
        ROW_COLUMNS[0]: [f"{r.claim} ({r.figure}; {r.rule})" if r.figure else f"{r.claim} ({r.rule})" for r in rows],
        ROW_COLUMNS[1]: v["model"].astype(str),
        ROW_COLUMNS[2]: [_verdict_text(r) for r in rows],
        ROW_COLUMNS[3]: [f"{interval(r.estimate, r.ci_low, r.ci_high)}, n = "
                         + (f"{int(r.n)}" if np.isfinite(r.n) else "—") for r in rows],
        ROW_COLUMNS[4]: [_control_text(r) for r in rows],
        ROW_COLUMNS[5]: [_difference_text(r) for r in rows],
    })


def row_chapters(verdicts: pd.DataFrame, models: list[str] | None = None) -> list[str]:
    """The chapter that checks the claim of each row of :func:`row_table` (its registered chapter, e.g. "norms"), in
    the table's order: the findings page links each row there."""
    if verdicts.empty:
        return []
    return [REGISTRY[c].chapter for c in _in_table_order(normalized(verdicts), models)["claim_id"]]


def _in_table_order(v: pd.DataFrame, models: list[str] | None) -> pd.DataFrame:
    """``v`` grouped by claim in its own order, the rows of ``models`` first in that order, then any other subject."""
    subjects = list(dict.fromkeys(v["model"]))
    order = [m for m in (models or []) if m in subjects] + [s for s in subjects if s not in (models or [])]
    claims = list(dict.fromkeys(v["claim_id"]))
    return v.assign(_c=v["claim_id"].map(claims.index), _m=v["model"].map(order.index)).sort_values(
        ["_c", "_m"], kind="stable", ignore_index=True)


def state_counts(verdicts: pd.DataFrame) -> pd.DataFrame:
    """Headline verdict rows per state (columns, in :data:`HEADLINE_STATES` order) per model (rows), plus a total."""
    v = verdicts[verdicts["headline"].astype(bool)]
    table = pd.crosstab(v["model"], v["counted_as"]).reindex(columns=list(HEADLINE_STATES), fill_value=0)
    table.loc["all models"] = table.sum()
    return table.rename_axis(index="model", columns=None).reset_index()


def headline(verdicts: pd.DataFrame) -> str:
    """Markdown: the verdict counts per state over all (claim × model) rows, never "N of M agree" alone."""
    c = state_counts(verdicts).set_index("model").loc["all models"]
    return ("Over the registered claims, (claim × model) verdicts: "
            + ", ".join(f"**{int(c[s])} {s}**" for s in HEADLINE_STATES)
            + f" — {int(c.sum())} in all. Rows without a valid control, rows whose paired interval (real − "
            "control) contains 0 or whose statistic lies inside its permutation null, and agreements explained by "
            "their control (the control — an untrained twin, a random nudge — shows the pattern at least as "
            "strongly: it comes with the architecture or the measurement, and training weakens it) are shown but "
            "not counted as agreement or disagreement."
            + _beyond(verdicts) + fragile_sentence(verdicts))


def fragile_sentence(verdicts: pd.DataFrame) -> str:
    """How many counted agreements and disagreements are fragile: their statistic lands on the other side of the
    rule with layers 0–1 kept or by the paper's own aggregation (one sentence; "" for a record without the
    column)."""
    if "fragile" not in verdicts.columns:
        return ""
    v = normalized(verdicts)
    decided = v[v["headline"] & v["counted_as"].isin(["agrees", "disagrees"])]
    n = int((decided["fragile"] != "").sum())
    return (f" {n} of the {len(decided)} counted agreements and disagreements {'is' if n == 1 else 'are'} fragile: "
            "the statistic lands on the other side of the threshold with layers 0–1 kept or with the paper's own "
            "aggregation.")


def _beyond(verdicts: pd.DataFrame) -> str:
    """Where the counted agreements lie relative to their controls: beyond them on the paper's side, short of them
    (the control — an untrained twin, a random nudge — shows the pattern more strongly), earlier or
    later (a window rule), beyond an alternative inside the statistic, or outside a permutation null (chapter 07's
    comparisons of trained runs)."""
    agree = verdicts[verdicts["headline"].astype(bool) & (verdicts["counted_as"] == "agrees")]
    if agree.empty:
        return ""
    side = agree["side"].map(side_of)
    shorter = " (the control, e.g. an untrained twin or a random nudge, shows the pattern more strongly)"
    groups = [(side.eq(Side.BEYOND).sum(), "lies beyond its control on the paper's side",
               "lie beyond their control on the paper's side"),
              (side.eq(Side.SHORT).sum(), "falls short of its control" + shorter, "fall short of their control" + shorter),
              (side.isin([Side.EARLIER, Side.LATER]).sum(), "settles earlier or later than its control (a window "
               "rule)", "settle earlier or later than their control (a window rule)"),
              (side.isin([Side.BEYOND_ALTERNATIVE, Side.SHORT_OF_ALTERNATIVE]).sum(),
               "beats the alternative the statistic itself compares with",
               "beat the alternative the statistic itself compares with"),
              (side.eq(Side.OUTSIDE_NULL).sum(), "lies outside its permutation null", "lie outside their permutation null"),
              (side.eq(Side.EVERY_SEED).sum(), "holds in every training seed (a seed-level test)",
               "hold in every training seed (a seed-level test)")]
    rest = len(agree) - sum(int(n) for n, _, _ in groups)
    parts = [_count(int(n), one, many) for n, one, many in groups if n] + ([f"{rest} other"] if rest else [])
    return f" Of the {_count(len(agree), 'agreement', 'agreements')}, " + ", ".join(parts) + "."


def _claims_by_state(verdicts: pd.DataFrame, state: str) -> str:
    rows = verdicts[verdicts["counted_as"] == state]
    by_claim = rows.groupby("claim", sort=False)["model"].apply(lambda m: ", ".join(m))
    return "; ".join(f"*{c}* ({m})" for c, m in by_claim.items()) or "none"


def _count(n: int, one: str, many: str) -> str:
    """``n`` and the words that agree with it: ``one`` for 1, else ``many`` ("1 is", "3 are")."""
    return f"{n} {one if n == 1 else many}"


def numberless(verdicts: pd.DataFrame) -> pd.Series:
    """Per verdict row: not testable and without a statistic to place (a model that does not do the task, too few
    units) — what the findings page's forest plot leaves out, one line per chapter instead (:func:`numberless_line`).
    A not-testable row that has a number (a prerequisite not met, a saturated statistic) stays drawn."""
    v = normalized(verdicts)
    return pd.Series((v["state"] == "not testable").to_numpy() & ~np.isfinite(v["estimate"].to_numpy(dtype=float)),
                     index=verdicts.index)


def numberless_line(verdicts: pd.DataFrame) -> str:
    """Markdown: how many :func:`numberless` rows each chapter has ("" when none)."""
    rows = normalized(verdicts)[numberless(verdicts).to_numpy()]
    if rows.empty:
        return ""
    per = rows.groupby("chapter", sort=False).size()
    return ("*Not drawn (not testable here, no statistic to place):* "
            + "; ".join(f"{chapter}: {_count(n, 'check', 'checks')}" for chapter, n in per.items()) + ".")


def intro_summary(verdicts: pd.DataFrame, profile: str) -> str:
    """Markdown for the book's introduction: what this build found, with the counts per state (computed by the build
    from the verdicts the chapters saved; nothing here is written by hand). The answers per question come before it
    (:func:`lmdepth.claims.answers.landing_md`)."""
    if verdicts.empty:
        return (f"*No verdicts are recorded for the `{profile}` profile yet: `lmdepth book --profile {profile}` "
                "executes the chapters and fills this paragraph.*")
    v = verdicts[verdicts["headline"].astype(bool)]
    c = v["counted_as"].value_counts().reindex(list(HEADLINE_STATES), fill_value=0)
    return (f"**What this build found** (`{profile}` profile, recomputed whenever the book is built). Of the "
            f"{len(v)} (claim × model) checks of the claims registry, **{_count(c['agrees'], 'agrees', 'agree')}** "
            f"with the paper, **{_count(c['disagrees'], 'disagrees', 'disagree')}**, "
            f"{_count(c['inconclusive'], 'is', 'are')} inconclusive, {_count(c['not testable'], 'is', 'are')} not "
            f"testable here (a model that does not do the task, a saturated statistic or a prerequisite that could "
            f"not be decided; checks on fewer than 10 units are shown in their chapters but not counted), "
            f"{_count(c['no valid control'], 'has', 'have')} no valid control (not run, one that cannot vary, or one "
            f"without the pattern the claim locates), and {_count(c['not discriminating'], 'does', 'do')} not "
            f"discriminate (the paired interval of the trained model minus its control contains 0, so they measure "
            f"the architecture or the data rather than training), and "
            f"{_count(c['explained by its control'], 'agreement is', 'agreements are')} explained by the control "
            f"(an untrained twin or a random nudge shows the pattern at least as strongly: training weakens it)."
            f"{_beyond(verdicts)}{fragile_sentence(verdicts)} Agree: {_claims_by_state(v, 'agrees')}. Disagree: "
            f"{_claims_by_state(v, 'disagrees')}."
            + (f" No valid control: {_claims_by_state(v, 'no valid control')}." if c["no valid control"] else "")
            + " The [findings page](90_across_models.ipynb) shows every verdict "
            "with its interval, sample size and control.")
