"""Charts of the verdicts (the findings page and the end of every chapter), built from verdict rows alone.

:func:`claims_forest` draws every (claim, model) verdict row as a forest plot: per claim, on the claim's own scale,
the statistic with its 95 % interval against the paper's threshold (from the registry's rule), and beside it the
discrimination test (model − control with its paired interval against 0, or the real statistic against its
permutation null). :func:`headline_bar` draws :func:`lmdepth.claims.findings_claims.state_counts` as stacked bars.

Verdict CSVs written before the paired test (no ``paired_diff``, ``control_kind``, … columns, older state names) are
drawn too: a missing column reads as "not recorded", an unknown state keeps its name, in grey.
"""

from __future__ import annotations

import math

import altair as alt
import numpy as np
import pandas as pd

import lmdepth.charts.theme  # noqa: F401  (registers and enables the book's theme)
from lmdepth.analyses.atlas import CHAPTER_KEYS
from lmdepth.charts.erasure_charts import TEXT_WIDTH
from lmdepth.claims import REGISTRY
from lmdepth.claims.findings_claims import interval, normalized, state_counts
from lmdepth.claims.report import HEADLINE_STATES, side_text
from lmdepth.claims.spec import BUILT_IN, PAIRED, PERMUTATION, SEEDS

#: One hue per reader category (:data:`lmdepth.claims.answers.READING_OF`), none shared between two categories: the
#: two states a reader reads as "the control shows it too" are two shades of one blue, so "explained by its control"
#: never looks like a kind of agreement (green).
STATE_COLORS = {
    "agrees": "#1b7837",
    "disagrees": "#c51b7d",
    "inconclusive": "#e08214",
    "not testable": "#969696",
    "no valid control": "#8073ac",
    "not discriminating": "#2166ac",
    "explained by its control": "#92c5de",
}
OTHER_COLOR = "#bdbdbd"  # a state this version does not know (an old verdict CSV)
#: States drawn hollow whatever the row's headline flag: nothing was decided against a control.
HOLLOW_STATES = ("not testable", "no valid control", "explained by its control")
PANELS = ("statistic", "control")
STEP = 15  # px per verdict row
LABEL_PX = 240  # the model column: wide enough for a model pair's name whole (chapter 06's rows)
GAP = 0.14  # between the two panels, in panel widths
TICKS = " "  # the blank y category under each claim's rows that carries its tick labels
CHAPTER_TITLES = {key: nb.replace("_", " ") for nb, key in CHAPTER_KEYS.items()}

def _test(r) -> str:
    """The discrimination test in one line, for the tooltip."""
    if r.control_kind == PAIRED:
        return f"model − control {interval(r.paired_diff, r.paired_low, r.paired_high)}"
    if r.control_kind == PERMUTATION:
        return (f"real − null median {interval(r.paired_diff, np.nan, np.nan)}; null 95 % "
                f"[{r.control_ci_low:.3g}, {r.control_ci_high:.3g}], p = {r.p_value:.3g}")
    if r.control_kind == SEEDS:
        return (f"each training seed's own statistic − threshold: median {r.paired_diff:.3g}, range "
                f"[{r.paired_low:.3g}, {r.paired_high:.3g}]; sign-flip p = {r.p_value:.3g}")
    if r.control_kind == BUILT_IN:
        diff = "" if not np.isfinite(r.paired_diff) else (
            f"; {'real − alternative' if np.isfinite(r.control_estimate) else 'the statistic'} "
            f"{interval(r.paired_diff, r.paired_low, r.paired_high)}")
        return (r.control_state or BUILT_IN) + diff
    return "not recorded"


def _right_note(r) -> str:
    """What the control panel says where it has no difference to place."""
    if r.state == "not testable":
        return "not testable"
    if r.control_kind == BUILT_IN and r.control_valid:
        return "control built into the statistic"
    if r.control_kind == "":
        return "no paired test in this record"
    return "no valid control"


def _nice(lo: float, hi: float, n: int = 4) -> np.ndarray:
    """About ``n`` round ticks whose ends cover [lo, hi]."""
    if not hi > lo:
        pad = abs(lo) * 0.25 or 0.5
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / (n - 1)
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    ticks = np.arange(math.floor(lo / step), math.ceil(hi / step) + 1) * step
    return np.round(ticks, 12)


def _label(x: float) -> str:
    return f"{x:.3g}" if abs(x) >= 1e-12 else "0"


def _cells(v: pd.DataFrame) -> list[str]:
    """Each row's facet title, ``claim (figure)``, made unique per claim id (a facet cell holds one claim)."""
    title = {cid: f"{c} ({f})" if f else c for cid, c, f in zip(v["claim_id"], v["claim"], v["figure"])}
    seen = pd.Series(title).duplicated(keep=False)
    return [title[c] + (f" [{c}]" if seen[c] else "") for c in v["claim_id"]]


def forest_table(verdicts: pd.DataFrame) -> pd.DataFrame:
    """What :func:`claims_forest` draws, one record per mark: ``kind`` "row" (one per verdict row and panel: a
    point with its interval, or a note where there is no number), "rule" (the paper's threshold, 0), "window" (a
    "between" rule's range), "tick" (a tick label on the row under the claim's rows).

    Each claim's two panels share one x axis: the statistic's scale mapped onto [0, 1], the control panel's onto
    [1 + GAP, 2 + GAP] (each with round ticks of its own), so a claim is one facet cell and the chart stays small.
    """
    v = normalized(verdicts)
    perm = v["control_kind"] == PERMUTATION
    tested = v["state"] != "not testable"
    stat = pd.DataFrame({"x": v["estimate"], "lo": v["ci_low"], "hi": v["ci_high"],
                         "band_lo": np.nan, "band_hi": np.nan,
                         "note": ["" if np.isfinite(e) else "not testable" for e in v["estimate"]]})
    # a comparison built into the statistic is itself a paired difference (or, with a positive control, real −
    # alternative on the same units): drawn like a twin's
    # a seed-level row: each seed's own statistic minus the threshold (median, and the range of the seeds)
    paired = v["control_kind"].isin([PAIRED, BUILT_IN, SEEDS]) & tested
    # a permutation row: the real statistic minus the null's median, and the null's central 95 % shifted likewise
    ctrl = pd.DataFrame({"x": v["paired_diff"].where((paired | perm) & tested),
                         "lo": v["paired_low"].where(paired), "hi": v["paired_high"].where(paired),
                         "band_lo": (v["control_ci_low"] - v["control_estimate"]).where(perm & tested),
                         "band_hi": (v["control_ci_high"] - v["control_estimate"]).where(perm & tested)})
    ctrl["note"] = ["" if np.isfinite(x) else _right_note(r) for x, r in zip(ctrl["x"], v.itertuples())]
    info = pd.DataFrame({
        "chapter": v["chapter"].astype(str), "claim_id": v["claim_id"].astype(str), "model": v["model"].astype(str),
        "cell": _cells(v),
        "counted_as": v["counted_as"], "solid": v["headline"] & ~v["counted_as"].isin(HOLLOW_STATES),
        # tooltip text, preformatted
        "claim": v["claim"], "statistic": [interval(*x) for x in zip(v["estimate"], v["ci_low"], v["ci_high"])],
        "n": v["n"].fillna(0).astype(int), "rule": v["rule"],
        "verdict": v["state"] + np.where(v["headline"], "", " (not counted)"),
        "test": [_test(r) for r in v.itertuples()], "side": [side_text(s) for s in v["side"]],
        "why": [r or n for r, n in zip(v["reason"], v["control_note"])], "control": v["control"],
    })
    parts = []
    for panel, p in zip(PANELS, (stat, ctrl)):
        parts.append(pd.concat([info, p], axis=1).assign(kind="row", panel=panel))
    rows = pd.concat(parts, ignore_index=True)
    marks = [rows]
    for cid in dict.fromkeys(rows["claim_id"]):
        marks += _scale_claim(rows, cid)
    # notes (no number to place) start at their panel's left edge
    noted = rows["note"] != ""
    rows.loc[noted, "x"] = np.where(rows.loc[noted, "panel"] == "statistic", 0.01, 1 + GAP + 0.01)
    out = pd.concat(marks, ignore_index=True)
    # the claim-level records carry their claim's cell, chapter and order
    first = rows.drop_duplicates("claim_id").set_index("claim_id")
    for col in ("cell", "chapter"):
        out[col] = out[col].fillna(out["claim_id"].map(first[col]))
    return out


def _scale_claim(rows: pd.DataFrame, claim_id: str) -> list[pd.DataFrame]:
    """Map the rows of ``claim_id`` onto the shared axis (in place in ``rows``) and return its rules, window and
    ticks."""
    spec = REGISTRY.get(claim_id)
    thr = (spec.rule.threshold, spec.rule.upper) if spec is not None else (None, None)
    out = []
    for i, panel in enumerate(PANELS):
        sel = (rows["claim_id"] == claim_id) & (rows["panel"] == panel)
        refs = [t for t in thr if t is not None] if panel == "statistic" else [0.0]
        values = rows.loc[sel, ["x", "lo", "hi", "band_lo", "band_hi"]].to_numpy(dtype=float).ravel()
        values = values[np.isfinite(values)]
        if panel == "control" and not len(values):  # nothing to compare: the notes say why
            continue
        ticks = _nice(*(lambda a: (a.min(), a.max()))(np.r_[values, refs]))
        a, b, offset = ticks[0], ticks[-1], i * (1 + GAP)
        to = lambda x: (np.asarray(x, dtype=float) - a) / (b - a) + offset  # noqa: E731
        for col in ("x", "lo", "hi", "band_lo", "band_hi"):
            rows.loc[sel, col] = to(rows.loc[sel, col])
        base = dict(claim_id=claim_id, panel=panel, model=TICKS)
        out.append(pd.DataFrame([dict(base, kind="tick", x=to(t), note=_label(t)) for t in ticks]))
        out.append(pd.DataFrame([dict(base, kind="rule", x=to(t), note=_label(t)) for t in refs]))
        if panel == "statistic" and len(refs) == 2:
            out.append(pd.DataFrame([dict(base, kind="window", x=to(refs[0]), lo=to(refs[0]), hi=to(refs[1]))]))
    return out


def _colors(states: list[str]) -> alt.Scale:
    extra = [s for s in dict.fromkeys(states) if s not in STATE_COLORS]
    return alt.Scale(domain=[*HEADLINE_STATES, *extra], range=[*STATE_COLORS.values(), *[OTHER_COLOR] * len(extra)])


_TOOLTIP = [alt.Tooltip("claim:N"), alt.Tooltip("model:N"), alt.Tooltip("counted_as:N", title="counted as"),
            alt.Tooltip("verdict:N"), alt.Tooltip("statistic:N", title="statistic [95 % CI]"), alt.Tooltip("n:Q"),
            alt.Tooltip("rule:N", title="the paper's side"), alt.Tooltip("test:N", title="control test"),
            alt.Tooltip("side:N", title="relative to the control"), alt.Tooltip("why:N"), alt.Tooltip("control:N")]


def _cell(models: list[str], scale: alt.Scale, width: int) -> alt.LayerChart:
    """One claim's facet cell: a row per model (in ``models``' order), both panels on the cell's normalised x."""
    shared = alt.Scale(domain=[0, 2 + GAP], nice=False, zero=False)
    x = alt.X("x:Q", axis=None, scale=shared)
    y = alt.Y("model:N", sort=[*models, TICKS], title=None,
              axis=alt.Axis(labelLimit=LABEL_PX - 12, labelFontSize=10, grid=False, ticks=False, domain=False))
    colour = alt.Color("counted_as:N", scale=scale, title="Counted as",
                       legend=alt.Legend(orient="top", columns=3, symbolType="circle"))
    kind = lambda k: alt.Chart().transform_filter(alt.datum.kind == k)  # noqa: E731
    row = kind("row")
    placed = row.transform_filter("isValid(datum.x) && datum.note == ''")
    mark = alt.Description("label:N")
    layers = [
        kind("window").mark_rect(color="#deebf7").encode(x=x, x2="hi:Q"),
        kind("tick").mark_rule(color="#eeeeee").encode(x=x),
        kind("rule").mark_rule(color="#333", strokeWidth=1.2).encode(
            x=x, strokeDash=alt.condition("datum.panel == 'statistic'", alt.value([4, 3]), alt.value([1, 0]))),
        # tick labels on a white halo, so a reference line crossing the tick row does not strike them through
        kind("tick").mark_text(fontSize=9, stroke="white", strokeWidth=4).encode(x=x, y=y, text="note:N"),
        kind("tick").mark_text(fontSize=9, color="#666").encode(x=x, y=y, text="note:N"),
        placed.transform_filter("isValid(datum.band_lo)").mark_bar(color="#cccccc", height=STEP - 6).encode(
            x=alt.X("band_lo:Q", scale=shared, axis=None), x2="band_hi:Q", y=y, tooltip=_TOOLTIP),
        placed.transform_filter("isValid(datum.lo) && isValid(datum.hi)").mark_rule(strokeWidth=2).encode(
            x=alt.X("lo:Q", scale=shared, axis=None), x2="hi:Q", y=y, color=colour, tooltip=_TOOLTIP),
        placed.mark_point(shape="circle", size=55, strokeWidth=1.8, opacity=1).encode(
            x=x, y=y, stroke=alt.Stroke("counted_as:N", scale=scale, legend=None),
            fill=alt.condition("datum.solid", alt.Fill("counted_as:N", scale=scale, legend=None),
                               alt.value("white")),
            tooltip=_TOOLTIP, description=mark),
        row.transform_filter("datum.note != ''").mark_text(align="left", fontSize=9, color="#555").encode(
            x=x, y=y, text="note:N", tooltip=_TOOLTIP, description=mark),
    ]
    return alt.layer(*layers).transform_calculate(
        label="datum.model + ' · ' + datum.claim + ' · ' + datum.panel + ': ' + datum.counted_as"
    ).properties(width=width, height=alt.Step(STEP))


def _chapter(cell: alt.LayerChart, data: pd.DataFrame, chapter: str, width: int, title: bool) -> alt.FacetChart:
    """One facet cell per claim of ``chapter`` (``data``: its records of :func:`forest_table`)."""
    cells = list(dict.fromkeys(data.loc[data.kind == "row", "cell"]))
    return cell.facet(
        data=data.drop(columns=["claim_id", "chapter"]).round(5),
        facet=alt.Facet("cell:N", sort=cells, title=None, header=alt.Header(
            labelAnchor="start", labelFontSize=11, labelLimit=width + LABEL_PX, labelPadding=2)),
        columns=1, spacing=6,
        title=(alt.Title(CHAPTER_TITLES.get(chapter, chapter), fontSize=12, anchor="start", offset=4)
               if title else ""),
    ).resolve_scale(y="independent")


def claims_forest(verdicts: pd.DataFrame, width: int = TEXT_WIDTH - 40) -> alt.TopLevelMixin | None:
    """Every verdict row as a forest plot: claims grouped by chapter, one facet cell per claim, one line per model.

    Left, on the claim's own scale: the statistic with its 95 % bootstrap interval; dashed, the paper's threshold
    (shaded, the window of a "between" rule). Right, on a scale of its own: model − control with its paired 95 %
    interval, 0 marked (for a comparison built into the statistic: the statistic itself, or real − its positive
    control); for a permutation null, the real statistic minus the null's median, with the null's central 95 % in grey
    around 0; where there is no difference to place (a missing or invalid control, a check that is not testable, a
    record without a paired difference) a note says so. Colour: how the row is counted on the findings
    page; hollow: not counted (a chapter-only claim, a sample below its size rule), not testable, or no valid
    control. Hover a mark for n, the rule, the control test and the reason.

    Args:
        verdicts: verdict rows (:func:`lmdepth.claims.report.check`, or as saved and read back by
            :func:`lmdepth.claims.findings_claims.saved_verdicts`), of one chapter or of all.
        width: the whole chart's width in px (the model labels and both panels).

    Returns:
        The chart (one facet chart per chapter, stacked), or None without verdict rows.
    """
    if verdicts.empty:
        return None
    d = forest_table(verdicts)
    rows = d[d.kind == "row"]
    scale = _colors(list(rows["counted_as"]))
    chapters = list(dict.fromkeys(rows["chapter"]))
    # one cell spec for every chapter (altair builds layers slowly): the y order lists every model of the chart
    cell = _cell(list(dict.fromkeys(rows["model"])), scale, width - LABEL_PX)
    charts = [_chapter(cell, d[d.chapter == ch], ch, width - LABEL_PX, title=len(chapters) > 1) for ch in chapters]
    chart = charts[0] if len(charts) == 1 else alt.vconcat(*charts, spacing=18)
    return chart.properties(title=alt.Title(
        "The statistic against the paper's threshold (dashed) │ the model minus its control (0)",
        fontSize=11, fontWeight="normal", anchor="start", offset=6))


def headline_bar(verdicts: pd.DataFrame, width: int = TEXT_WIDTH - 290) -> alt.Chart | None:
    """The headline as a picture: counted verdict rows per state, stacked, one bar per model or subject (the
    numbers of :func:`lmdepth.claims.findings_claims.state_counts`, its total row left out). None without counted rows."""
    counts = state_counts(verdicts) if len(verdicts) else pd.DataFrame()
    counts = counts[counts["model"] != "all models"] if len(counts) else counts
    if counts.empty:
        return None
    subjects = list(dict.fromkeys(verdicts["model"]))  # the page's order, not the alphabet
    counts = counts.set_index("model").loc[[m for m in subjects if m in set(counts["model"])]].reset_index()
    long = counts.melt(id_vars="model", var_name="state", value_name="rows")
    long = long[long["rows"] > 0].assign(
        order=lambda t: t["state"].map(HEADLINE_STATES.index),
        label=lambda t: t["model"] + " · " + t["state"] + ": " + t["rows"].astype(str))
    return alt.Chart(long).mark_bar(height=STEP - 2).encode(
        x=alt.X("rows:Q", title="(claim × model) verdicts counted", axis=alt.Axis(tickMinStep=1)),
        y=alt.Y("model:N", sort=list(counts["model"]), title=None,
                axis=alt.Axis(labelLimit=LABEL_PX, labelFontSize=10)),  # a model pair's name whole
        color=alt.Color("state:N", scale=_colors([]), title=None, legend=alt.Legend(orient="top", columns=3)),
        order=alt.Order("order:Q"),
        tooltip=["model:N", "state:N", "rows:Q"], description="label:N",
    ).properties(width=width, height=alt.Step(STEP + 3))


__all__ = ["STATE_COLORS", "HOLLOW_STATES", "normalized", "forest_table", "claims_forest", "headline_bar"]
