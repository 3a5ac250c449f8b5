"""The findings page's view of the verdicts: what the book build saved, as a claim × model matrix and counts.

Nothing here decides anything: the chapters decided and saved their verdict rows (:func:`lmdepth.claims.report.save`);
this module reads them back and arranges them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from lmdepth.claims import REGISTRY
from lmdepth.claims.report import HEADLINE_STATES, control_cell


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


def shown(verdicts: pd.DataFrame, models: list[str]) -> pd.DataFrame:
    """The rows of ``models``, and of subjects that are not one model (a map ``A → B`` between two of them,
    ``MoEUT vs Transformer``)."""
    def keep(subject: str) -> bool:
        if subject in models:
            return True
        if "→" in subject:
            return all(m.strip() in models for m in subject.split("→"))
        return " vs " in subject
    return verdicts[verdicts.model.map(keep)]


def _cell(r) -> str:
    counted = "" if r.headline else " · not counted"
    if r.state == "not testable":
        return f"not testable: {r.reason} (n {r.n}){counted}"
    ci = f" [{r.ci_low:.3g}, {r.ci_high:.3g}]" if np.isfinite(r.ci_low) else ""
    tag = {"not discriminating": " ⊘", "no valid control": " ∅"}.get(r.counted_as, "")
    return f"{r.state}{tag} · {r.estimate:.3g}{ci} · n {r.n} · {control_cell(r)}{counted}"


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
            + f" — {int(c.sum())} in all. Rows without a valid control, and rows whose paired interval (real − "
            "control) contains 0, are shown but not counted as agreement or disagreement."
            + _beyond(verdicts))


def _beyond(verdicts: pd.DataFrame) -> str:
    """Where the counted agreements lie relative to their controls: beyond them on the paper's side, short of them
    (the untrained control shows the pattern more strongly, so training alone does not produce it), earlier or
    later (a window rule), or decided against an alternative inside the statistic."""
    agree = verdicts[verdicts["headline"].astype(bool) & (verdicts["counted_as"] == "agrees")]
    if agree.empty:
        return ""
    side = agree["side"].fillna("").astype(str)
    groups = [(side.str.startswith("beyond").sum(), "lie beyond their control on the paper's side"),
              (side.str.startswith("short").sum(), "short of it (the untrained control shows the pattern more "
                                                     "strongly)"),
              (side.str.match(r"(earlier|later) than").sum(), "settle earlier or later than their control "
                                                                "(a window rule)")]
    rest = len(agree) - sum(int(n) for n, _ in groups)
    parts = [f"{int(n)} {what}" for n, what in groups if n] + (
        [f"{rest} rest on a statistic that is itself the comparison with its alternative, or on a control that "
         "lacks the pattern the claim needs"] if rest else [])
    return f" Of the {len(agree)} agreements, " + ", ".join(parts) + "."


def _claims_by_state(verdicts: pd.DataFrame, state: str) -> str:
    rows = verdicts[verdicts["counted_as"] == state]
    by_claim = rows.groupby("claim", sort=False)["model"].apply(lambda m: ", ".join(m))
    return "; ".join(f"*{c}* ({m})" for c, m in by_claim.items()) or "none"


def intro_summary(verdicts: pd.DataFrame, profile: str) -> str:
    """Markdown for the book's introduction: what this build found, with the counts per state (computed by the
    build from the verdicts the chapters saved; nothing here is written by hand)."""
    if verdicts.empty:
        return (f"*No verdicts are recorded for the `{profile}` profile yet: `lmdepth book --profile {profile}` "
                "executes the chapters and fills this paragraph.*")
    v = verdicts[verdicts["headline"].astype(bool)]
    c = v["counted_as"].value_counts().reindex(list(HEADLINE_STATES), fill_value=0)
    return (f"**What this build found** (`{profile}` profile, recomputed whenever the book is built). Of the "
            f"{len(v)} (claim × model) checks of the claims registry, **{c['agrees']} agree** with the paper, "
            f"**{c['disagrees']} disagree**, {c['inconclusive']} are inconclusive, {c['not testable']} are not "
            f"testable here (a model that does not do the task, a saturated statistic or a prerequisite that could "
            f"not be decided; checks on fewer than 10 units are shown in their chapters but not counted), "
            f"{c['no valid control']} have no valid control (not run, or one that cannot vary), and "
            f"{c['not discriminating']} do not discriminate (the paired interval of the trained model minus its "
            f"control contains 0, so they measure the architecture or the data rather than training)."
            f"{_beyond(verdicts)} Agree: {_claims_by_state(v, 'agrees')}. Disagree: "
            f"{_claims_by_state(v, 'disagrees')}. The [findings page](90_across_models.ipynb) shows every verdict "
            "with its interval, sample size and control.")
