"""The verdict charts (:mod:`lmdepth.charts.findings_charts`): built from verdict rows alone, drawn offline by Vega, every
row drawn once per panel, hollow where a row is not counted, the headline bar equal to ``state_counts``, and no
wider than the book's text column."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
import vl_convert as vlc

from lmdepth.charts.erasure_charts import TEXT_WIDTH
from lmdepth.charts.findings_charts import PANELS, STATE_COLORS, claims_forest, forest_table, headline_bar
from lmdepth.claims import REGISTRY, report
from lmdepth.claims.findings_claims import saved_verdicts, state_counts
from lmdepth.claims.scratch_claims import SUBJECT
from lmdepth.model.random_init import control_name
from test_claims import MA, MO, eval_units, item_units, rel, units

pytestmark = pytest.mark.unit
NORMS = "relative_contribution"


@pytest.fixture(scope="module")
def verdicts() -> pd.DataFrame:
    """Rows of every kind: paired controls that discriminate (m) and do not (s), a control that was not run (y),
    a sample below 10 units (x: not testable, not counted), a control built into the statistic, a seed-level test."""
    real = pd.concat([units("m", NORMS, rel(1.0, 0.3)), units("s", NORMS, rel(1.0, 1.5)),
                      units("y", NORMS, rel(1.0, 0.3)), units("x", NORMS, rel(1.0, 0.3), n=8)])
    twins = pd.concat([units(control_name("m"), NORMS, rel(1.0, 1.0), seed=3),
                       units(control_name("s"), NORMS, rel(1.0, 1.5), seed=4)])
    flat = lambda level, rng, i: 6  # noqa: E731
    return pd.concat([
        report.check("norms", real, ["m", "s", "y", "x"], twins),
        report.check("complexity", item_units("m", "arith", flat), ["m"], None, only=["complexity.arith_depth_flat"]),
        report.check("moeut", eval_units({MO: (0.2, 1), MA: (0.8, 1)}, n=100), [SUBJECT], None,
                     only=["moeut.exact_match_gain"]),
    ], ignore_index=True)


def svg_of(chart) -> str:
    return vlc.vegalite_to_svg(chart.to_dict())


def drawn(svg: str) -> list[tuple[str, str, str, str, str]]:
    """(model, claim, panel, counted as, fill) of every verdict mark (a point, or a note where there is no number),
    from the description each carries."""
    out = []
    for tag in re.findall(r'<(?:path|text)\b[^>]*aria-label="[^"]*"[^>]*>', svg):
        label = re.search(r'aria-label="([^"]*)"', tag).group(1)
        m = re.fullmatch(r"(.+) · (.+) · (statistic|control): (.+)", label)
        if m:
            fill = re.search(r'fill="([^"]*)"', tag)
            out.append((*m.groups(), fill.group(1) if fill else ""))
    return out


def test_every_row_is_drawn_once_per_panel(verdicts):
    assert set(verdicts.counted_as) >= {"agrees", "not testable", "no valid control", "not discriminating"}
    assert set(verdicts.control_kind) == {"paired", "built into the statistic", "seed-level"}
    marks = drawn(svg_of(claims_forest(verdicts)))
    want = sorted((r.model, r.claim, p, r.counted_as) for r in verdicts.itertuples() for p in PANELS)
    assert sorted(m[:4] for m in marks) == want and len(want) == 2 * len(verdicts) == 20
    # one chapter's rows give that chapter's chart, the same builder
    norms = verdicts[verdicts.chapter == "norms"]
    assert len(drawn(svg_of(claims_forest(norms)))) == 2 * len(norms)
    assert claims_forest(verdicts.iloc[:0]) is None


def test_points_sit_on_the_claims_own_scale_and_the_notes_say_why(verdicts):
    t = forest_table(verdicts)
    rows = t[t.kind == "row"]
    placed = rows[rows.note == ""]
    assert placed[placed.panel == "statistic"].x.between(0, 1).all()
    assert placed[placed.panel == "control"].x.between(1, 2.2).all()
    # each claim's threshold lies inside its panel's ticks, and 0 inside the control panel's
    rules = t[t.kind == "rule"]
    thresholds = {f"{REGISTRY[c].rule.threshold:.3g}" for c in verdicts.claim_id}  # from the rule, not its text
    assert set(rules[rules.panel == "statistic"].note) == thresholds
    assert set(rules[rules.panel == "control"].note) == {"0"}
    notes = dict(zip(zip(rows.model, rows.claim_id, rows.panel), rows.note))
    assert notes[("x", "norms.second_half_less", "statistic")] == "not testable"
    assert notes[("y", "norms.second_half_less", "control")] == "no valid control"
    # a positive control: real − the alternative on the same units, placed like a twin's difference
    built = rows[(rows.claim_id == "complexity.arith_depth_flat") & (rows.panel == "control")].iloc[0]
    row = verdicts[verdicts.claim_id == "complexity.arith_depth_flat"].iloc[0]
    assert built.note == "" and np.isfinite(row.paired_low) and row.paired_low <= row.paired_diff <= row.paired_high
    old = forest_table(verdicts.assign(paired_diff=np.nan))  # a record from before built-in rows had one
    old = old[(old.kind == "row") & (old.claim_id == "complexity.arith_depth_flat") & (old.panel == "control")]
    assert old.note.iloc[0] == "control built into the statistic"
    # a seed-level row: each training seed's own gain minus the threshold, its median and range (every seed's
    # gain is ≈ 0.6 here)
    seeds = rows[(rows.claim_id == "moeut.exact_match_gain") & (rows.panel == "control")].iloc[0]
    zero = rules[(rules.panel == "control") & (rules.claim_id == "moeut.exact_match_gain")].x.iloc[0]
    assert zero < seeds.lo <= seeds.x <= seeds.hi <= 2 + 0.14 and seeds.note == ""  # every seed's gain above 0


def test_rows_not_counted_are_hollow(verdicts):
    marks = {(m[0], m[1], m[2]): m[4] for m in drawn(svg_of(claims_forest(verdicts)))}
    claim = REGISTRY["norms.second_half_less"].claim
    assert marks[("m", claim, "statistic")] == STATE_COLORS["agrees"].lower()  # counted: filled in its colour
    assert marks[("y", claim, "statistic")] == "white"  # no valid control
    assert marks[("s", claim, "statistic")] == STATE_COLORS["not discriminating"].lower()
    few = verdicts.assign(headline=False)  # e.g. a chapter-only claim
    assert {m[4] for m in drawn(svg_of(claims_forest(few))) if m[2] == "statistic" and m[0] != "x"} == {"white"}


def test_the_headline_bar_draws_state_counts(verdicts):
    svg = svg_of(headline_bar(verdicts))
    bars = {(m, s): int(n) for m, s, n in re.findall(r'aria-label="([^"]+?) · ([^:"]+): (\d+)"', svg)}
    counts = state_counts(verdicts).set_index("model").drop("all models")
    want = {(m, s): int(n) for m, row in counts.iterrows() for s, n in row.items() if n}
    assert bars == want and sum(bars.values()) == int(verdicts.headline.sum())
    assert headline_bar(verdicts.assign(headline=False)) is None


def test_the_charts_fit_the_text_column(verdicts):
    wide = verdicts.assign(model=verdicts.model.where(verdicts.model != "m", "qwen2.5-coder-0.5b → smollm2-135m"))
    for chart in (claims_forest(wide), headline_bar(wide)):
        width = float(re.search(r'<svg[^>]*width="([\d.]+)"', svg_of(chart)).group(1))
        assert 300 < width <= TEXT_WIDTH


def test_an_old_verdict_record_is_drawn_without_its_missing_columns(verdicts, tmp_path):
    """A CSV from before the paired test: no paired or control-kind columns, an old state name."""
    old = verdicts.drop(columns=["paired_diff", "paired_low", "paired_high", "p_value", "side", "control_valid",
                                 "control_note", "control_kind", "at_bound"])
    old.loc[old.counted_as == "not discriminating", "counted_as"] = "non-discriminating"
    record = tmp_path / "book" / "default" / "norms" / "verdicts"
    record.mkdir(parents=True)
    old.to_csv(record / "all.csv", index=False)
    saved = saved_verdicts(tmp_path, "default")
    marks = drawn(svg_of(claims_forest(saved)))
    assert len(marks) == 2 * len(saved) == 2 * len(verdicts)
    assert {m[4] for m in marks if m[3] == "non-discriminating" and m[2] == "statistic"} == {"#bdbdbd"}
    rows = forest_table(saved).query("kind == 'row'")
    assert set(rows[rows.panel == "control"].note) == {"not testable", "no paired test in this record"}
    assert not np.isnan(rows.n).any()


def test_a_control_without_the_required_pattern_places_no_interval():
    """A twin without a sign change has no transition depth: the depth row has no valid control, so the forest plot
    places no difference for it (and never another claim's interval, on another scale), while the sign change's
    own row keeps its paired interval."""
    from test_claims import SCENARIOS

    metric, curves = SCENARIOS["cosine.mid_depth"]["agrees"]
    _, flat = SCENARIOS["cosine.sign_change"]["disagrees"]
    v = report.check("cosine", units("m", metric, curves), ["m"], units(control_name("m"), metric, flat, seed=1))
    t = forest_table(v)
    row = t[(t.kind == "row") & (t.claim_id == "cosine.mid_depth") & (t.panel == "control")].iloc[0]
    assert row.note == "no valid control" and not (np.isfinite(row.lo) or np.isfinite(row.hi))  # x: the note's place
    sign = t[(t.kind == "row") & (t.claim_id == "cosine.sign_change") & (t.panel == "control")].iloc[0]
    assert sign.note == "" and np.isfinite(sign.x)


def test_the_published_record_draws_every_row_with_a_statistic():
    """The findings page's forest on the committed default-profile record: every row with a number is drawn on
    both panels — chapter 07's per-recipe depth rows among them — and only numberless rows are left to the line
    below the chart."""
    from pathlib import Path

    from lmdepth.claims.findings_claims import numberless

    saved = saved_verdicts(Path(__file__).resolve().parents[1] / "results", "default")
    numbered = saved[~numberless(saved)]
    assert np.isfinite(numbered.estimate).all() and not np.isfinite(saved[numberless(saved)].estimate).any()
    marks = drawn(svg_of(claims_forest(numbered)))
    assert sorted(m[:3] for m in marks) == sorted((r.model, r.claim, p) for r in numbered.itertuples()
                                                  for p in PANELS)
    depth = numbered[numbered.claim_id == "moeut.depth_grows"]
    assert len(depth) == 4 and {(r.model, r.claim, "statistic") for r in depth.itertuples()} <= {m[:3] for m in marks}
