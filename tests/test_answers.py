"""The answer per question of the paper (:mod:`lmdepth.claims.answers`), on fabricated verdict rows: every state has a
reader category, an agreement that only its control explains never reads as support, a question's category follows
from its rows by the rule the page states, and each sentence names its models and the numbers that decide it."""

from __future__ import annotations

import colorsys

import numpy as np
import pandas as pd
import pytest

from lmdepth.charts.findings_charts import STATE_COLORS
from lmdepth.claims import REGISTRY
from lmdepth.claims import answers as A
from lmdepth.claims.answers import QUESTIONS, READING_OF, STATE_MEANING, Reading, answer, question_reading
from lmdepth.claims.findings_claims import shown
from lmdepth.claims.report import HEADLINE_STATES, Counted
from lmdepth.claims.spec import SEEDS

pytestmark = pytest.mark.unit
Q = {q.key: q for q in QUESTIONS}
TITLE = "norms.second_half_less"


def row(model: str, counted: str, estimate: float, claim_id: str = TITLE, **kw) -> dict:
    """One verdict row as the chapters save it (only what the answers read)."""
    state = kw.pop("state", {"explained by its control": "agrees", "not discriminating": "agrees",
                             "no valid control": "agrees"}.get(counted, counted))
    return {"chapter": REGISTRY[claim_id].chapter, "claim_id": claim_id, "claim": REGISTRY[claim_id].claim,
            "figure": REGISTRY[claim_id].figure, "rule": "ratio < 1", "model": model, "state": state,
            "counted_as": counted, "headline": True, "estimate": estimate, "ci_low": estimate - 0.01,
            "ci_high": estimate + 0.01, "control_model": f"random-init:{model}", "control_kind": "paired",
            "control_valid": True, **kw}


def rows(*r: dict) -> pd.DataFrame:
    return pd.DataFrame(list(r))


def test_every_state_has_one_reader_category_and_a_plain_definition():
    assert set(READING_OF) == set(Counted) == set(STATE_MEANING) and len(HEADLINE_STATES) == 7
    assert READING_OF[Counted.EXPLAINED] is READING_OF[Counted.NOT_DISCRIMINATING] is Reading.CONTROL_TOO
    assert READING_OF[Counted.AGREES] is Reading.SUPPORTED and READING_OF[Counted.DISAGREES] is Reading.CONTRADICTED
    # the question-only readings are never a row's
    assert not {Reading.MIXED, Reading.NOWHERE, Reading.NOT_CHECKED} & set(READING_OF.values())


def test_a_question_is_read_from_its_rows_by_the_stated_rule():
    S, C, T, N = Reading.SUPPORTED, Reading.CONTRADICTED, Reading.CONTROL_TOO, Reading.NOT_TESTABLE
    assert question_reading([]) is Reading.NOT_CHECKED
    assert question_reading([("a", S), ("b", S), ("b", T)]) is S  # every model has an agreeing check, none disagrees
    assert question_reading([("a", S), ("b", T)]) is Reading.MIXED  # one model agrees, the other cannot tell
    assert question_reading([("a", S), ("b", C)]) is Reading.MIXED
    assert question_reading([("a", S), ("a", C), ("b", S)]) is Reading.MIXED  # a disagreement anywhere: not supported
    assert question_reading([("a", C), ("b", C), ("b", N)]) is C
    assert question_reading([("a", T), ("b", T), ("c", C)]) is Reading.NOWHERE
    # nothing decided: the can't-tell kind most checks share (ties by UNDECIDED's order)
    assert question_reading([("a", N), ("b", T), ("c", T)]) is T
    assert question_reading([("a", N), ("b", Reading.TOO_FEW)]) is Reading.TOO_FEW
    assert question_reading([("a", N), ("b", N)]) is N


def test_agreements_explained_by_their_control_are_not_support():
    """The paper's title claim as the book found it: two models on the paper's side whose untrained twins show the
    drop more strongly, and one on the other side: supported on no model, and the sentence says why with numbers."""
    v = rows(row("g", "explained by its control", 0.656, control_estimate=0.586),
             row("q", "explained by its control", 0.928, control_estimate=0.528),
             row("s", "disagrees", 1.15, control_estimate=0.46))
    a = answer(v, Q["second_half"])
    assert a.reading is Reading.NOWHERE
    assert a.sentence.startswith("Supported on none of the 3 models — ")
    for text in ("0.656", "0.928", "0.586", "0.528", "1.15", "untrained twins show it at least as strongly",
                 "on s the statistic is 1.15, on the other side of ratio < 1"):
        assert text in a.sentence, (text, a.sentence)
    assert a.rows == (f"{TITLE} @ g", f"{TITLE} @ q", f"{TITLE} @ s")
    # only explained agreements, nothing contradicting: still can't tell, never supported
    only = answer(v.iloc[:2], Q["second_half"])
    assert only.reading is Reading.CONTROL_TOO and "upported" not in only.lead
    # the same rows counted as agreements read as support on all of them
    plain = answer(v.assign(counted_as="agrees", state="agrees"), Q["second_half"])
    assert plain.reading is Reading.SUPPORTED and plain.sentence.startswith("Supported on all 3 models — ")


def test_only_the_questions_counted_rows_are_read():
    v = rows(row("g", "agrees", 0.5), row("q", "disagrees", 1.2, headline=False),
             row("s", "disagrees", 1.3, claim_id="norms.attention_drops_most"))
    a = answer(v, Q["second_half"])
    assert a.reading is Reading.SUPPORTED and a.rows == (f"{TITLE} @ g",) and "q" not in a.sentence.split(" — ")[0]
    assert answer(v, Q["skipping"]).sentence == "Not checked in this build."


def test_mixed_names_which_models_go_which_way():
    ids = Q["skipping"].claims
    v = rows(*(row(m, c, e, claim_id=cid, rule="ratio < 0.5") for cid in ids
               for m, c, e in (("g", "agrees", 0.42), ("q", "disagrees", 0.74), ("s", "disagrees", 0.8))))
    a = answer(v, Q["skipping"])
    assert a.reading is Reading.MIXED
    assert a.lead == "Mixed across models: supported on g, contradicted on q and s"
    assert a.details == ("on 2 checks of g the statistic is 0.42, 0.42, on the paper's side of ratio < 0.5; on 4 checks "
                         "of q and s the statistic is 0.74 to 0.8, on the other side of ratio < 0.5")


def test_questions_without_a_decision_say_why_in_words():
    """Not testable: the reasons, shortened, with how many checks give each; too few seeds: the smallest p."""
    ids = Q["difficulty"].claims
    v = rows(*(row(m, "not testable", np.nan, claim_id=cid, reason=f"competent on {k} levels, at least 3 needed; "
                   "not above the constant-answer baseline") for cid in ids[:2] for m, k in (("g", 0), ("q", 1))))
    a = answer(v, Q["difficulty"])
    assert a.reading is Reading.NOT_TESTABLE and a.lead == "Not testable on any of the 2 models"
    assert "competent on 0 levels, at least 3 needed (2 checks)" in a.details and "baseline" not in a.details
    m = Q["moeut"].claims[:2]
    v = rows(row("MoEUT vs Transformer", "inconclusive", 0.1, claim_id=m[0], control_kind=SEEDS, p_value=0.125),
             row("MoEUT vs Transformer", "inconclusive", 0.2, claim_id=m[1], control_kind=SEEDS, p_value=0.0625))
    a = answer(v, Q["moeut"])
    assert a.reading is Reading.TOO_FEW and a.details == (
        "on both checks of MoEUT vs Transformer the sign-flip test over training seeds reaches p = 0.0625 at best, "
        "and p ≤ 0.05 is needed")


def test_the_answers_table_holds_every_question_once():
    t = A.answers_table(rows(row("g", "agrees", 0.5)))
    assert list(t.columns) == list(A.ANSWER_COLUMNS) and list(t["question"]) == [q.key for q in QUESTIONS]
    assert t.set_index("question").loc["second_half", "category"] == "supported"
    assert (t.set_index("question").drop(index="second_half")["sentence"] == "Not checked in this build.").all()


def test_every_question_names_registered_claims_and_its_chapters_anchor():
    for q in QUESTIONS:
        assert q.claims and all(c in REGISTRY for c in q.claims), q.key
        assert {REGISTRY[c].chapter for c in q.claims} <= set(q.chapters)
        assert q.anchor == f"claims-{REGISTRY[q.claims[0]].chapter}"
    assert len(QUESTIONS) == 7 and QUESTIONS[0].claims == (TITLE,)  # the five findings, §5 from scratch, MoEUT


def test_the_states_are_defined_once_grouped_by_what_a_reader_takes_from_them():
    text = A.states_md(rows(row("g", "explained by its control", 0.6)))
    bullets = [line for line in text.splitlines() if line.startswith("- ")]
    assert len(bullets) == len(set(READING_OF.values()))
    for state, reading in READING_OF.items():
        line = next(b for b in bullets if b.startswith(f"- **{reading}** — "))
        assert f"*{state}*: {STATE_MEANING[state]}" in line
    explained = next(b for b in bullets if "*explained by its control*" in b)
    assert "e.g. *second half contributes less* on g" in explained and not explained.startswith("- **supported")


def _hue(colour: str) -> tuple[float, float]:
    r, g, b = (int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    h, _, s = colorsys.rgb_to_hls(r, g, b)
    return h * 360, s


def test_no_two_reader_categories_share_a_hue():
    """"Explained by its control" must not look like a shade of agreement: states of different reader categories
    differ in hue by at least 30° (grey, without a hue, aside)."""
    for a, b in ((a, b) for a in STATE_COLORS for b in STATE_COLORS if a < b and READING_OF[a] is not READING_OF[b]):
        (ha, sa), (hb, sb) = _hue(STATE_COLORS[a]), _hue(STATE_COLORS[b])
        if sa < 0.1 or sb < 0.1:
            continue
        assert min(abs(ha - hb), 360 - abs(ha - hb)) >= 30, (a, b)


def test_the_findings_page_keeps_every_subject_that_is_not_an_unpicked_model():
    v = pd.DataFrame({"model": ["a", "b", "a → b", "b → c", "MoEUT vs Transformer", "MoEUT, question modelled",
                                "SmolLM2-135M fine-tuned"]})
    assert list(shown(v, ["a", "b", "c"], among={"a", "b", "c"})["model"]) == list(v["model"])
    assert list(shown(v, ["a", "b"], among={"a", "b", "c"})["model"]) == [
        "a", "b", "a → b", "MoEUT vs Transformer", "MoEUT, question modelled", "SmolLM2-135M fine-tuned"]


def test_the_findings_views_of_an_empty_record_keep_its_columns_and_draw():
    """No verdict saved yet (a page-90 run before any chapter): the rows shown keep the record's columns, so the
    views that read them (the headline bar, the forest of rows with a number) work on no rows."""
    from lmdepth.charts.findings_charts import claims_forest, headline_bar
    from lmdepth.claims.findings_claims import numberless, saved_verdicts

    empty = saved_verdicts("/nonexistent-results", profile="default")
    v = shown(empty, [], among={"a"})
    assert list(v.columns) == list(empty.columns) and v.empty
    headline_bar(v)
    claims_forest(v[~numberless(v)])
