"""The findings page for reading (:func:`lmdepth.claims.findings_claims.row_table`) and its layout: every verdict row once,
in six short columns, and the page opening with the headline bar and the forest plot, the states as a short legend
linked to the method page."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import jupytext
import pandas as pd
import pytest

from lmdepth.book.defects import MAX_COLUMNS_UNSCROLLED
from lmdepth.claims import REGISTRY
from lmdepth.claims.findings_claims import ROW_COLUMNS, row_table, saved_verdicts, short
from lmdepth.claims.report import HEADLINE_STATES
from lmdepth.claims.scratch_claims import SUBJECT
from test_findings_chart import verdicts  # noqa: F401  (the fixture: rows of every kind)

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "notebooks" / "90_across_models.py"
CLAIM, MODEL, VERDICT, STATISTIC, CONTROL, DIFFERENCE = ROW_COLUMNS
CLAIMS = [spec.claim for spec in REGISTRY.values()]


def keys(verdicts: pd.DataFrame) -> Counter:  # noqa: F811 (the fixture's name)
    """(claim, model, statistic) of each verdict row: what identifies it in the table."""
    return Counter((c, m, f"{e:.3g}" if e == e else "—") for c, m, e in
                   zip(verdicts["claim"], verdicts["model"], verdicts["estimate"]))


def claim_of(label: str) -> str:
    """The registered claim a table row's first cell names (``claim (figure; the paper's side)``)."""
    return max((c for c in CLAIMS if label.startswith(c + " (")), key=len)


def table_keys(table: pd.DataFrame) -> Counter:
    return Counter((claim_of(c), m, s.split(" [")[0].split(",")[0])
                   for c, m, s in zip(table[CLAIM], table[MODEL], table[STATISTIC]))


def test_every_verdict_row_is_in_the_table_once(verdicts):  # noqa: F811
    t = row_table(verdicts)
    assert list(t.columns) == list(ROW_COLUMNS) and len(ROW_COLUMNS) <= MAX_COLUMNS_UNSCROLLED
    assert len(t) == len(verdicts) and table_keys(t) == keys(verdicts)
    assert not t.isna().any().any() and not t.isin(["", "nan", "None"]).any().any()
    # a row lost or repeated upstream is lost or repeated here too: nothing is pivoted, merged or deduplicated
    twice = pd.concat([verdicts, verdicts.iloc[[0]]], ignore_index=True)
    assert len(row_table(twice)) == len(verdicts) + 1 and table_keys(row_table(twice)) == keys(twice)
    assert table_keys(row_table(verdicts.iloc[1:])) == keys(verdicts.iloc[1:])
    assert list(row_table(verdicts.iloc[:0]).columns) == list(ROW_COLUMNS)


def test_rows_follow_the_claims_then_the_page_model_order(verdicts):  # noqa: F811
    t = row_table(verdicts, ["s", "x", "m"])
    assert list(dict.fromkeys(map(claim_of, t[CLAIM]))) == list(dict.fromkeys(verdicts["claim"]))
    norms = t[t[MODEL].isin(["m", "s", "x", "y"])]
    assert list(norms[MODEL][:4]) == ["s", "x", "m", "y"]  # the page's models first, then the rest


def test_cells_say_state_interval_n_control_and_the_paired_difference(verdicts):  # noqa: F811
    t = row_table(verdicts)
    t = t.assign(claim=t[CLAIM].map(claim_of)).set_index(["claim", MODEL])
    at = lambda cid, model: t.loc[(REGISTRY[cid].claim, model)]  # noqa: E731
    vm = verdicts[(verdicts.claim_id == "norms.second_half_less") & (verdicts.model == "m")].iloc[0]
    m = at("norms.second_half_less", "m")
    assert m[VERDICT] == vm.state
    assert m[STATISTIC] == f"{vm.estimate:.3g} [{vm.ci_low:.3g}, {vm.ci_high:.3g}], n = {vm.n}"
    assert m[CONTROL] == f"random-init twin: {vm.control_state}"
    assert m[DIFFERENCE].startswith(f"{vm.paired_diff:.3g} [{vm.paired_low:.3g}, {vm.paired_high:.3g}]: ")
    s, y, x = (at("norms.second_half_less", k) for k in "syx")
    assert "counted as not discriminating" in s[VERDICT] and s[DIFFERENCE].endswith(": contains 0")
    assert "counted as no valid control" in y[VERDICT] and y[DIFFERENCE].startswith("no valid control")
    assert x[VERDICT].startswith("not testable: ") and x[VERDICT].endswith("; not counted")
    assert x[CONTROL] == x[DIFFERENCE] == "—"
    positive = at("complexity.arith_depth_flat", "m")  # a positive control, built into the statistic
    assert positive[CONTROL] == "positive control disagrees" and positive[DIFFERENCE].endswith(
        ": apart from its positive control")
    seeds = at("moeut.exact_match_gain", SUBJECT)
    assert seeds[CONTROL] == "training seeds, sign-flip p = 0.12" and seeds[DIFFERENCE].startswith("seeds ")
    assert seeds[DIFFERENCE].endswith(": too few seeds") and seeds[VERDICT].startswith("inconclusive")


def test_long_reasons_are_cut_to_a_label_or_a_clause():
    assert short("saturated: 87% of the values in one compared group are at the clip 1 (≥ 50%)") == "saturated"
    assert short("competent on 0 levels, at least 3 needed; not above the constant-answer baseline: level 1 …") == (
        "competent on 0 levels, at least 3 needed")
    note = "No per-problem kl_final_lens of tuned_lens for 'random-init:m' (run the lens chapter with tuned_lens=True)."
    assert short(note) == "No per-problem kl_final_lens of tuned_lens for 'random-init:m'."
    assert len(short("x" * 300)) == 90 and short("x" * 300).endswith("…")


def test_an_old_verdict_record_gives_every_row(verdicts, tmp_path):  # noqa: F811
    old = verdicts.drop(columns=["paired_diff", "paired_low", "paired_high", "p_value", "side", "control_valid",
                                 "control_note", "control_kind", "at_bound", "control_model"])
    record = tmp_path / "book" / "default" / "norms" / "verdicts"
    record.mkdir(parents=True)
    old.to_csv(record / "all.csv", index=False)
    t = row_table(saved_verdicts(tmp_path, "default"))
    assert len(t) == len(verdicts) and table_keys(t) == keys(verdicts)
    assert set(t[CONTROL]) <= {"not recorded", "—"} and set(t[DIFFERENCE]) == {"—"}


def test_the_findings_page_opens_with_the_pictures_and_a_short_legend():
    cells = jupytext.read(PAGE).cells
    first = lambda pattern: next(i for i, c in enumerate(cells) if re.search(pattern, c.source, re.M))  # noqa: E731
    bar, forest = first(r"^headline_bar\(verdicts\)"), first(r"^claims_forest\(verdicts")
    legend, rows = first(r"method-verdicts"), first(r"row_table\(")
    assert bar < forest < legend < rows
    assert cells[bar].cell_type == cells[forest].cell_type == "code"
    # nothing long before the pictures: the title, a short lede, the section heading
    before = [c.source for c in cells[:bar] if c.cell_type == "markdown"]
    assert all(len(src.split()) < 60 for src in before), [len(s.split()) for s in before]
    assert not any(re.search(r"\bmd\(", c.source) for c in cells[:bar] if c.cell_type == "code" and
                   "Nothing has been run" not in c.source)
    # the legend: one line per state, a link to the method page's section on verdicts (an anchor that exists)
    text = cells[legend].source
    assert all(f"**{s}**" in text for s in HEADLINE_STATES)
    assert "{ref}`" in text and "(method-verdicts)=" in (REPO / "book" / "method.md").read_text()
    assert len(text.split()) < 200
    # the wide claim × model matrices are gone from the page
    assert not any("verdict_matrices" in c.source for c in cells)


def test_the_row_table_is_sortable_in_the_book_and_the_same_table_elsewhere(verdicts):  # noqa: F811
    from lmdepth.book.notebook import styled
    from lmdepth.book.table_sort import SORTABLE_CLASS

    t = row_table(verdicts)
    plain, sortable = styled(t).to_html(), styled(t, sortable=True).to_html()
    tag = re.search(r"<table[^>]*>", sortable)[0]
    assert re.fullmatch(rf'<table id="T_[0-9a-f]+" class="{SORTABLE_CLASS}">', tag)
    assert SORTABLE_CLASS not in plain
    assert sortable.replace(f' class="{SORTABLE_CLASS}"', "", 1) == plain  # same cells, order and ids: only the class
    # the findings page asks for it; the JS that reads the class ships with the book (no CDN, no dependency)
    assert re.search(r"^\s*show_table\(findings\.row_table\(verdicts, shown\), sortable=True,", PAGE.read_text(), re.M)


def test_each_row_links_to_its_chapters_claim_check(verdicts):  # noqa: F811
    """A row's claim cell links to the chapter that checks it, at an anchor that chapter's source defines; the
    link follows the row wherever the table order puts it (rows given shuffled, chapters interleaved)."""
    from lmdepth.book.chapters import CHAPTERS
    from lmdepth.book.notebook import styled
    from lmdepth.claims.findings_claims import row_chapters

    models = ["s", "x", "m"]
    mixed = verdicts.sample(frac=1, random_state=0).set_index(pd.Index([7] * len(verdicts)))  # one repeated label
    t, chapters = row_table(mixed, models), row_chapters(mixed, models)
    assert len(chapters) == len(t) and set(chapters) == set(verdicts["chapter"])
    assert chapters != list(mixed["chapter"])  # the table reorders the rows: the links must follow
    by_row = {(claim_of(c), m, s.split(" [")[0].split(",")[0]): ch
              for c, m, s, ch in zip(t[CLAIM], t[MODEL], t[STATISTIC], chapters)}
    truth = {(c, m, f"{e:.3g}" if e == e else "—"): ch for c, m, e, ch in
             zip(verdicts["claim"], verdicts["model"], verdicts["estimate"], verdicts["chapter"])}
    assert by_row == truth
    links = [f"{CHAPTERS[c]}.html#claims-{c}" for c in chapters]
    html = styled(t.set_index(pd.Index([3] * len(t))), sortable=True, links=links).to_html()  # labels repeated
    cells = re.findall(r'<td id="T_\w+_row(\d+)_col0"[^>]*><a href="([^"]+)">', html)
    assert [(int(i), h) for i, h in cells] == list(enumerate(links))
    assert len(re.findall(r"<a href", html)) == len(t)  # one link per row, in the first cell only
    # the link text is the cell's text, escaped; an address is escaped as an attribute
    odd = styled(pd.DataFrame({"claim": ["ratio < 1"], "n": [1]}), links=['p.html?a=1&b="2"']).to_html()
    assert '<a href="p.html?a=1&amp;b=&quot;2&quot;">ratio &lt; 1</a>' in odd
    with pytest.raises(ValueError, match="one per row"):
        styled(t, links=links[1:])
    with pytest.raises(ValueError, match="unique names"):
        styled(pd.DataFrame([[1, 2]], columns=["a", "a"]), links=["p.html"])
    # the anchor each link names exists in its chapter, right above the claim check's heading
    for key in set(chapters) | {"norms", "cosine", "skipping", "lens", "complexity", "maps", "moeut"}:
        source = (REPO / "notebooks" / f"{CHAPTERS[key]}.py").read_text()
        assert re.search(rf"^# \(claims-{key}\)=\n# ## Does the", source, re.M), key
    assert row_chapters(verdicts.iloc[:0]) == []


def test_the_sort_script_ships_with_every_html_build(tmp_path):
    import yaml

    from lmdepth.book import table_sort

    class App:  # what setup() asks of Sphinx
        outdir, js, css, hooks = tmp_path / "html", [], [], {}
        builder = type("Builder", (), {"format": "html"})()
        add_js_file = lambda self, name: self.js.append(name)  # noqa: E731
        add_css_file = lambda self, name: self.css.append(name)  # noqa: E731
        connect = lambda self, event, fn: self.hooks.setdefault(event, fn)  # noqa: E731

    app = App()
    assert table_sort.setup(app)["parallel_read_safe"]
    app.hooks["builder-inited"](app)
    assert app.js == [table_sort.JS_NAME] and app.css == [table_sort.CSS_NAME]
    js = (app.outdir / "_static" / table_sort.JS_NAME).read_text()
    assert f"table.{table_sort.SORTABLE_CLASS}" in js and "http" not in js  # attaches by the class, fetches nothing
    assert f"table.{table_sort.SORTABLE_CLASS}" in (app.outdir / "_static" / table_sort.CSS_NAME).read_text()
    config = yaml.safe_load((REPO / "_config.yml").read_text())
    assert "lmdepth.book.table_sort" in config["sphinx"]["extra_extensions"]


def test_the_headline_says_where_each_agreement_lies_relative_to_its_control():
    """Each counted agreement falls in exactly one group of the headline's sentence, by the side its row records."""
    from lmdepth.claims.findings_claims import headline

    sides = ["beyond its control (the paper's side)", "beyond its control (the paper's side)", "short of its control",
             "earlier than its control", "beyond the alternative (the paper's side)", "outside its permutation null",
             "a side no group names"]
    rows = pd.DataFrame({"claim": [f"c{i}" for i in range(7)], "model": "m", "state": "agrees",
                         "counted_as": "agrees", "headline": True, "side": sides})
    text = headline(rows)
    assert ("Of the 7 agreements, 2 lie beyond their control on the paper's side, 1 falls short of its control" in text
            and "1 settles earlier or later" in text and "1 beats the alternative the statistic itself compares with"
            in text and "1 lies outside its permutation null" in text and "1 other" in text), text


def test_the_introductions_paragraph_counts_each_state_and_names_the_rows_without_a_valid_control():
    """The counts come from the headline rows only, each with words that agree with it (1 agrees, 2 disagree), and
    a row without a valid control is named, so a reader can find it."""
    from lmdepth.claims.findings_claims import intro_summary

    states = ["agrees", "disagrees", "disagrees", "inconclusive", "not testable", "no valid control",
              "not discriminating", "agrees"]
    rows = pd.DataFrame({"claim": [f"claim {i}" for i in range(8)], "model": "m", "state": states,
                         "counted_as": states, "headline": [True] * 7 + [False],
                         "side": ["beyond its control (the paper's side)"] + [""] * 7})
    text = intro_summary(rows, "default")
    assert "Of the 7 (claim × model) checks" in text  # the eighth is not a headline row
    assert ("**1 agrees** with the paper, **2 disagree**, 1 is inconclusive, 1 is not testable" in text
            and "1 has no valid control" in text and "1 does not discriminate" in text), text
    assert "Of the 1 agreement, 1 lies beyond its control on the paper's side." in text
    assert "No valid control: *claim 5* (m)." in text and "claim 7" not in text
    rows["counted_as"] = rows["state"] = ["agrees"] * 8
    assert "No valid control" not in intro_summary(rows, "default")


def test_a_row_whose_alternative_aggregation_lands_on_the_other_side_is_fragile_and_counted_as_such():
    """fragile(): an 'agrees' whose statistic with layers 0–1 kept (or by the paper's aggregation) misses the
    paper's side, or a 'disagrees' whose alternative meets it; never an undecided row. The headline, the
    introduction and the row table say so."""
    from lmdepth.claims.findings_claims import headline, intro_summary
    from lmdepth.claims.spec import PAPER_AGGREGATION, WITH_EARLY, fragile
    from lmdepth.metrics.verdicts import Rule

    below = Rule(0.5, "below")
    assert fragile(below, "agrees", {WITH_EARLY: 0.6, PAPER_AGGREGATION: 0.4}) == WITH_EARLY
    assert fragile(below, "disagrees", {WITH_EARLY: 0.6, PAPER_AGGREGATION: 0.4}) == PAPER_AGGREGATION
    assert fragile(below, "agrees", {WITH_EARLY: float("nan"), PAPER_AGGREGATION: 0.1}) == ""
    assert fragile(below, "inconclusive", {WITH_EARLY: 0.9}) == ""
    window = Rule(0.3, "between", 0.7)
    assert fragile(window, "agrees", {WITH_EARLY: 0.8, PAPER_AGGREGATION: 0.2}) == f"{WITH_EARLY}; {PAPER_AGGREGATION}"
    rows = pd.DataFrame({"claim": ["a", "b", "c", "d"], "model": "m", "state": ["agrees", "disagrees", "agrees", "agrees"],
                         "counted_as": ["agrees", "disagrees", "agrees", "agrees"], "headline": [True, True, True, False],
                         "side": "beyond its control (the paper's side)",
                         "fragile": [WITH_EARLY, "", "", PAPER_AGGREGATION], "estimate": 0.1, "rule": "x < 0.5",
                         "claim_id": list(REGISTRY)[0]})
    for text in (headline(rows), intro_summary(rows, "default")):
        assert "1 of the 3 counted agreements and disagreements is fragile" in text, text
    cells = row_table(rows)[VERDICT].tolist()
    assert cells[0] == f"agrees; fragile: the other side {WITH_EARLY}" and "fragile" not in cells[1]


def test_the_introduction_answers_per_question_of_the_paper_from_the_rows():
    """Each question of the paper gets one line with the states of its chapters' counted rows (only those that
    occur) and how many more are shown but not counted; a question with no row says it was not checked."""
    from lmdepth.claims.answers import QUESTIONS, landing_md, per_question

    ids = {"norms": next(c for c in REGISTRY if c.startswith("norms.")),
           "complexity": next(c for c in REGISTRY if c.startswith("complexity."))}
    rows = pd.DataFrame({"claim": ["a", "b", "c", "d"], "model": "m", "claim_id": [ids["norms"]] * 2 + [ids["complexity"]] * 2,
                         "figure": "Fig. x", "state": ["agrees", "disagrees", "not testable", "not testable"],
                         "counted_as": ["agrees", "disagrees", "not testable", "not testable"],
                         "headline": [True, True, True, False], "side": ""})
    text = per_question(rows)
    lines = text.splitlines()[2:]
    assert len(lines) == len(QUESTIONS)
    assert lines[0].endswith("(chapters 01–02): agrees 1, disagrees 1.")
    assert lines[3].endswith("(chapter 05): not testable 1; 1 more shown, not counted.")
    assert all(line.endswith("not checked in this build.") for i, line in enumerate(lines) if i not in (0, 3))
    assert text in landing_md(rows, "default")


def test_sides_are_codes_that_pages_render_and_old_records_still_read():
    """A row's side is a code (lmdepth.metrics.verdicts.Side) that counting reads; every code has its sentence, and a
    verdict CSV from before the codes (the sentence stored) reads as the same code."""
    from lmdepth.claims.report import SIDE_TEXT, side_of, side_text
    from lmdepth.metrics.verdicts import Side

    assert set(SIDE_TEXT) == set(Side) and len(set(SIDE_TEXT.values())) == len(Side)
    for side, text in SIDE_TEXT.items():
        assert side_of(side.value) is side and side_of(text) is side and side_text(side) == text
    assert side_of("something else") is Side.NONE and side_of(float("nan")) is Side.NONE


def test_the_introduction_leads_with_the_headline_picture_then_the_answers_then_the_counts(tmp_path, monkeypatch):
    """findings.md (included at the top of intro.md) opens with the headline bar drawn to headline.png, then the
    answer per question, then the paragraph; without counted rows there is no picture (none left from before)."""
    from lmdepth.book import build

    states = ["agrees", "disagrees", "inconclusive"]
    rows = pd.DataFrame({"claim_id": ["norms.second_half_less", "skipping.current_later_small", "lens.logit_overlap_mid"],
                         "claim": ["a", "b", "c"], "figure": ["2a", "3", "4"], "model": "m", "state": states,
                         "counted_as": states, "headline": True, "side": "", "rule": "x < 1", "estimate": 0.5})
    monkeypatch.setattr(build, "check_verdicts", lambda root: None)
    monkeypatch.setattr(build, "saved_verdicts", lambda results_dir, profile: rows)
    text = build.write_findings_summary(tmp_path, tmp_path, "default").read_text()
    picture, answers, states, counts, paragraph = (
        text.index("```{figure} headline.png"), text.index("**What the book answers**"),
        text.index("````{dropdown} What the seven verdict states mean"), text.index("**Per question of the paper**"),
        text.index("**What this build found**"))
    assert picture == 0 and picture < answers < states < counts < paragraph
    assert (tmp_path / "verdict_states.md").read_text().startswith("Each (claim × model) check is counted")
    assert list(pd.read_csv(tmp_path / "book" / "default" / "answers.csv")["category"])[:4] == [
        "supported", "contradicted", "can't tell: too few units or seeds", "not checked in this build"]
    png = (tmp_path / "headline.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 2000  # a drawn picture, not an empty one
    monkeypatch.setattr(build, "saved_verdicts", lambda results_dir, profile: rows.iloc[:0])
    text = build.write_findings_summary(tmp_path, tmp_path, "default").read_text()
    assert "headline.png" not in text and not (tmp_path / "headline.png").exists()
    assert not (tmp_path / "book" / "default" / "answers.csv").exists()  # none left from before


def test_checks_without_a_number_leave_the_forest_for_one_line_per_chapter():
    """A not-testable row with no statistic is counted in one line per chapter, not drawn; a not-testable row with a
    number (a prerequisite not met) and every decided row stay in the forest."""
    from lmdepth.claims.findings_claims import numberless, numberless_line

    rows = pd.DataFrame({"chapter": ["complexity", "complexity", "complexity", "lens"],
                         "claim_id": ["a", "b", "c", "d"], "model": "m",
                         "state": ["not testable", "not testable", "agrees", "not testable"],
                         "estimate": [float("nan"), 0.4, 0.5, float("nan")]})
    assert list(numberless(rows)) == [True, False, False, True]
    assert numberless_line(rows) == "*Not drawn (not testable here, no statistic to place):* complexity: 1 check; lens: 1 check."
    assert numberless_line(rows[~numberless(rows)]) == ""
