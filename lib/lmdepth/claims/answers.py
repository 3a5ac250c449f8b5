"""The book's answer to each question of the paper: one plain sentence per question, computed from its verdict rows.

A reader should not need the seven technical states (:class:`~lmdepth.claims.report.Counted`) to get an answer
right, so each row is read in a reader's words (:class:`Reading`, a fixed mapping: :data:`READING_OF`), a question's
reading follows from the readings of the rows of the claims that state it (:func:`question_reading`), and its
sentence names the models and the numbers that decide it (:func:`answer`). The logic works on codes; English is
written only by the ``_render`` and ``*_md`` functions. The landing page (``book/findings.md``) and the CSV beside the
verdicts (:func:`answers_table`) are both this module's output, so neither can say what the rows do not
(book/method.md#method-verdicts).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import pandas as pd

from lmdepth.claims import REGISTRY
from lmdepth.claims.findings_claims import intro_summary, normalized, short
from lmdepth.claims.report import HEADLINE_STATES, Counted
from lmdepth.claims.spec import BUILT_IN, PERMUTATION, SEEDS
from lmdepth.metrics.verdicts import SEED_ALPHA


class Reading(StrEnum):
    """What a verdict row, or a question's rows together, say to a reader (the value is the words the pages print).
    The first six are what one row can say (:data:`READING_OF`); the last three describe a question's rows together."""

    SUPPORTED = "supported"
    CONTRADICTED = "contradicted"
    CONTROL_TOO = "can't tell: an untrained twin or a random control shows it too"
    NO_CONTROL = "can't tell: no control to compare with"
    TOO_FEW = "can't tell: too few units or seeds"
    NOT_TESTABLE = "not testable on these models"
    MIXED = "mixed across models"
    NOWHERE = "supported on no model"
    NOT_CHECKED = "not checked in this build"


#: How a reader reads each state a row can be counted as. "Explained by its control" is a can't-tell, never a kind of
#: agreement: the control shows the pattern at least as strongly, so training did not make it.
READING_OF: dict[Counted, Reading] = {
    Counted.AGREES: Reading.SUPPORTED,
    Counted.DISAGREES: Reading.CONTRADICTED,
    Counted.INCONCLUSIVE: Reading.TOO_FEW,
    Counted.NOT_TESTABLE: Reading.NOT_TESTABLE,
    Counted.NO_VALID_CONTROL: Reading.NO_CONTROL,
    Counted.NOT_DISCRIMINATING: Reading.CONTROL_TOO,
    Counted.EXPLAINED: Reading.CONTROL_TOO,
}
#: The can't-tell readings, in the order a tie between them is broken (:func:`question_reading`).
UNDECIDED: tuple[Reading, ...] = (Reading.CONTROL_TOO, Reading.NO_CONTROL, Reading.TOO_FEW, Reading.NOT_TESTABLE)

#: Each state in plain words: the one definition the landing page and the Method page both show (:func:`states_md`).
STATE_MEANING: dict[Counted, str] = {
    Counted.AGREES: "the whole 95 % interval of the statistic lies on the paper's side of its threshold, and the "
                    "model is told apart from its control (an untrained twin, the alternative the statistic compares "
                    "with, a permutation null, the training seeds) on that side",
    Counted.DISAGREES: "the whole 95 % interval lies on the other side of the threshold, and the model can be told "
                       "apart from its control",
    Counted.INCONCLUSIVE: "the interval straddles the threshold, or there are too few training seeds for the "
                          f"seed-level test to reach p ≤ {SEED_ALPHA:g}: more units or seeds could decide it",
    Counted.NOT_TESTABLE: "a precondition failed: too few units, a statistic stuck at a bound (saturated), a model "
                          "that does not do the task, or a claim this one needs that does not hold",
    Counted.NO_VALID_CONTROL: "the control was not run, cannot vary, is saturated, or lacks the pattern the claim "
                              "locates, so there is nothing to compare the model with",
    Counted.NOT_DISCRIMINATING: "the paired interval of model minus control contains 0: the untrained twin (or "
                                "random control) gives the same value, so the check measures the architecture or "
                                "the data, not training",
    Counted.EXPLAINED: "the model is on the paper's side, but its control (an untrained twin, a random nudge) shows "
                       "the pattern at least as strongly: it comes with the architecture or the measurement, and "
                       "training weakens it; not an agreement",
}


@dataclass(frozen=True)
class Question:
    """One question of the paper and the registered claims that state it.

    Attributes:
        key: stable identifier (the answers CSV's ``question``).
        text: the paper's finding, in a phrase.
        where: the chapters that check it, in words.
        chapters: the chapter keys whose counted rows the folded counts give (the chapters' other claims too).
        claims: the claim ids whose counted rows decide the answer.
        noun: what its subjects are called ("models", "model pairs").
    """

    key: str
    text: str
    where: str
    chapters: tuple[str, ...]
    claims: tuple[str, ...]
    noun: str = "models"

    @property
    def anchor(self) -> str:
        """The label of the claim check its answer rests on (each chapter's ``(claims-<chapter>)=``)."""
        return f"claims-{REGISTRY[self.claims[0]].chapter}"


def _of(chapter: str) -> tuple[str, ...]:
    return tuple(cid for cid, spec in REGISTRY.items() if spec.chapter == chapter)


#: Chapter 07's rows on the §5 contrast: depth grows from scratch, not after fine-tuning, and the positive control
#: (shown, not counted) that says whether the depth score could see it grow.
_FROM_SCRATCH = ("moeut.depth_grows", "moeut.finetuned_flat", "moeut.chain_depth_grows")

#: The paper's five findings, its §5 contrast of models trained from scratch with pretrained ones (the same chapter as
#: the MoEUT experiment, but a question of its own: "depth grows" and "more input-dependent" answer different
#: things), and its MoEUT experiment, in its order. Which claims state each is a choice of the book
#: (the paper's title claim for the first; chapter 03's claims on later layers and future tokens, not on the output,
#: for the second), made here once.
QUESTIONS: tuple[Question, ...] = (
    Question("second_half", "the second half contributes less", "chapters 01–02", ("norms", "cosine"),
             ("norms.second_half_less",)),
    Question("skipping", "skipping a second-half layer changes later layers and future tokens little", "chapter 03",
             ("skipping",), ("skipping.current_later_small", "skipping.future_later_small")),
    Question("lens", "the prediction settles from mid-depth on", "chapter 04", ("lens",),
             ("lens.logit_overlap_mid", "lens.logit_kl_mid", "lens.tuned_over_bigram_mid")),
    Question("difficulty", "the depth used does not grow with problem difficulty", "chapter 05", ("complexity",),
             _of("complexity")),
    Question("stretch", "a deeper model stretches a shallower one's computation", "chapter 06", ("maps",),
             ("maps.relative_beats_absolute", "maps.best_near_equal_depth"), noun="model pairs"),
    Question("from_scratch", "models trained from scratch use more depth for more steps; fine-tuning does not",
             "chapter 07", ("moeut",), _FROM_SCRATCH, noun="recipes"),
    Question("moeut", "a MoEUT trained without a loss on the question uses more of its depth (exploratory)",
             "chapter 07", ("moeut",), tuple(c for c in _of("moeut") if c not in _FROM_SCRATCH),
             noun="runs and comparisons"),
)


@dataclass(frozen=True)
class Answer:
    """A question's answer: its reading, the sentence (``lead — details.``) and the rows it reads."""

    question: Question
    reading: Reading
    lead: str
    details: str
    rows: tuple[str, ...]  # "<claim id> @ <model>" of every row the answer reads

    @property
    def sentence(self) -> str:
        return f"{self.lead} — {self.details}." if self.details else f"{self.lead}."


def subject_reading(readings: Sequence[Reading]) -> Reading:
    """One model's rows read together: supported or contradicted where some of its checks are and none says the
    opposite, mixed where both occur, else the can't-tell kind most of them share (:func:`_most`)."""
    found = set(readings)
    if Reading.SUPPORTED in found:
        return Reading.MIXED if Reading.CONTRADICTED in found else Reading.SUPPORTED
    if Reading.CONTRADICTED in found:
        return Reading.CONTRADICTED
    return _most(readings)


def question_reading(rows: Sequence[tuple[str, Reading]]) -> Reading:
    """A question's reading from its rows' (subject, reading) pairs.

    Supported: some checks agree, none disagrees, and every model has an agreeing check; contradicted likewise.
    Mixed across models: checks agree and checks disagree, or some models agree and others cannot tell. Supported on
    no model: no check agrees, some disagree, and the other models cannot tell. Otherwise (nothing decided) the
    can't-tell kind most checks share. A row explained by its control is a can't-tell (:data:`READING_OF`), so
    agreements that only the control explains never read as support."""
    if not rows:
        return Reading.NOT_CHECKED
    per: dict[str, set[Reading]] = {}
    for subject, r in rows:
        per.setdefault(subject, set()).add(r)
    found = set().union(*per.values())
    yes, no = Reading.SUPPORTED in found, Reading.CONTRADICTED in found
    if yes and no:
        return Reading.MIXED
    if yes:
        return Reading.SUPPORTED if all(Reading.SUPPORTED in rs for rs in per.values()) else Reading.MIXED
    if no:
        return Reading.CONTRADICTED if all(Reading.CONTRADICTED in rs for rs in per.values()) else Reading.NOWHERE
    return _most([r for _, r in rows])


def _most(readings: Sequence[Reading]) -> Reading:
    """The can't-tell reading most of ``readings`` share (ties: :data:`UNDECIDED` order)."""
    n = Counter(readings)
    return max(UNDECIDED, key=lambda r: (n[r], -UNDECIDED.index(r)))


def deciding_rows(verdicts: pd.DataFrame, question: Question) -> pd.DataFrame:
    """The counted rows of ``question``'s claims (normalized), in registry then row order."""
    if not len(verdicts) or "claim_id" not in verdicts.columns:  # nothing recorded: no row answers it
        verdicts = pd.DataFrame(columns=["claim_id", "claim", "model", "state"])
    v = normalized(verdicts)
    rows = v[v["claim_id"].isin(question.claims) & v["headline"]]
    order = {cid: i for i, cid in enumerate(question.claims)}
    return rows.sort_values("claim_id", key=lambda c: c.map(order), kind="stable")


def answer(verdicts: pd.DataFrame, question: Question) -> Answer:
    """The answer to ``question`` from ``verdicts`` (every row the build saved; only the question's counted rows
    are read)."""
    rows = deciding_rows(verdicts, question)
    readings = [READING_OF.get(c, Reading.NOT_TESTABLE) for c in rows["counted_as"]]  # an unknown state: undecided
    pairs = list(zip(rows["model"], readings))
    reading = question_reading(pairs)
    lead, details = _render(question, reading, rows, pairs)
    return Answer(question, reading, lead, details,
                  tuple(f"{c} @ {m}" for c, m in zip(rows["claim_id"], rows["model"])))


def answers(verdicts: pd.DataFrame) -> list[Answer]:
    """Every question's answer (:data:`QUESTIONS` order)."""
    return [answer(verdicts, q) for q in QUESTIONS]


#: The columns of the answers CSV (:func:`answers_table`).
ANSWER_COLUMNS = ("question", "category", "sentence", "claim rows")


def answers_table(verdicts: pd.DataFrame) -> pd.DataFrame:
    """The answers as the CSV beside the verdicts stores them: question key, reader category, the sentence and the
    rows it reads ("; "-separated ``<claim id> @ <model>``)."""
    return pd.DataFrame([(a.question.key, a.reading.value, a.sentence, "; ".join(a.rows)) for a in answers(verdicts)],
                        columns=list(ANSWER_COLUMNS))


# ---- rendering: the only English ---------------------------------------------------------------------------------

#: A paired control in a reader's words (by the prefix of ``control_model``), as (one, several).
CONTROL_WORDS = {"random-init": ("its untrained twin", "their untrained twins"),
                 "random-nudge": ("a random nudge of the skip's size", "random nudges of the skip's size"),
                 "absolute-index": ("the alignment by layer index", "the alignments by layer index")}
#: The order the details give the states in: decided first, then why the others are not.
DETAIL_ORDER = (Counted.AGREES, Counted.EXPLAINED, Counted.DISAGREES, Counted.NOT_DISCRIMINATING,
                Counted.NO_VALID_CONTROL, Counted.INCONCLUSIVE, Counted.NOT_TESTABLE)
_LISTED = 3  # at most this many values are listed; more are given as a range


def _num(x: float) -> str:
    return f"{x:.3g}".replace("-", "−")


def _values(xs: Sequence[float]) -> str:
    xs = [x for x in xs if np.isfinite(x)]
    if len(xs) <= _LISTED:
        return ", ".join(_num(x) for x in xs)
    return f"{_num(min(xs))} to {_num(max(xs))}"


def _intervals(rows: pd.DataFrame, est: str, lo: str, hi: str) -> str:
    if len(rows) <= _LISTED - 1:
        return ", ".join(f"{_num(e)} [{_num(a)}, {_num(b)}]" for e, a, b in zip(rows[est], rows[lo], rows[hi]))
    return _values(list(rows[est]))


def _and(items: Sequence[str]) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _subjects(subjects: Sequence[str], every: Sequence[str], noun: str) -> str:
    """The subjects named: all of them by count where they are every subject of the question, up to three by name,
    more by count."""
    subjects = list(dict.fromkeys(subjects))
    if len(subjects) > 1 and set(subjects) == set(every):
        return f"both {noun}" if len(subjects) == 2 else f"all {len(subjects)} {noun}"
    return _and(subjects) if len(subjects) <= _LISTED else f"{len(subjects)} {noun}"


def _where(g: pd.DataFrame, rows: pd.DataFrame, noun: str) -> str:
    """"on <subjects>", with how many checks where a subject has several ("all 9 checks of all 3 models")."""
    every = list(dict.fromkeys(rows["model"]))
    names = _subjects(list(g["model"]), every, noun)
    if len(g) <= g["model"].nunique():
        return f"on {names}"
    if len(g) < len(rows):
        return f"on {len(g)} checks of {names}"
    return f"on both checks of {names}" if len(g) == 2 else f"on all {len(g)} checks of {names}"


def _control(g: pd.DataFrame) -> str:
    """The group's paired control in a reader's words (:data:`CONTROL_WORDS`), plural for several models."""
    first = g["control_model"].iloc[0]
    one, several = CONTROL_WORDS.get(first.split(":")[0] if ":" in first else "", ("its control", "their controls"))
    return several if g["model"].nunique() > 1 else one


def _reasons(texts: Sequence[str]) -> str:
    """Distinct reasons, shortened (:func:`~lmdepth.claims.findings_claims.short`), with how many rows give each."""
    n = Counter(short(t) for t in texts if t)
    parts = [f"{t} ({c} {'check' if c == 1 else 'checks'})" if len(n) > 1 else t for t, c in n.most_common(_LISTED)]
    rest = len(n) - _LISTED
    return "; ".join(parts) + (f"; and {rest} other {'reason' if rest == 1 else 'reasons'}" if rest > 0 else "")


def _clause(state: Counted, g: pd.DataFrame, rows: pd.DataFrame, noun: str, bare: bool) -> str:
    """One group of rows (one state; one rule where numbers are compared with it) in words, the models first;
    ``bare``: the lead has said the state already (the question's only group)."""
    where, rule, stats = _where(g, rows, noun), g["rule"].iloc[0], _values(list(g["estimate"]))
    several = g["model"].nunique() > 1
    if state is Counted.AGREES:
        return f"{where} the statistic is {stats}, on the paper's side of {rule}"
    if state is Counted.DISAGREES:
        return f"{where} the statistic is {stats}, on the other side of {rule}"
    if state is Counted.EXPLAINED:
        return (f"{where} the statistic is {stats}, on the paper's side of {rule}, but {_control(g)} "
                f"{'show' if several else 'shows'} it at least as strongly ({_values(list(g['control_estimate']))}), "
                "so it comes with the architecture, not from training")
    if state is Counted.NOT_DISCRIMINATING:
        if (g["control_kind"] == PERMUTATION).all():
            return f"{where} the statistic lies inside its permutation null"
        what = "the alternative" if (g["control_kind"] == BUILT_IN).all() else _control(g)
        return (f"{where} {what} cannot be told apart from the model (model − control "
                f"{_intervals(g, 'paired_diff', 'paired_low', 'paired_high')}, an interval containing 0)")
    if state is Counted.NO_VALID_CONTROL:
        return f"{where}{':' if bare else ' there is no control to compare with:'} {_reasons(list(g['control_note']))}"
    if state is Counted.INCONCLUSIVE:
        if (g["control_kind"] == SEEDS).all():
            return (f"{where} the sign-flip test over training seeds reaches p = {_num(g['p_value'].min())} at best, "
                    f"and p ≤ {SEED_ALPHA:g} is needed")
        return (f"{where} the interval straddles the threshold ({rule}: "
                f"{_intervals(g, 'estimate', 'ci_low', 'ci_high')})")
    return f"{where}{':' if bare else ' it is not testable:'} {_reasons(list(g['reason']))}"


#: The states whose numbers are compared with the claim's rule: their groups never span two rules.
_BY_RULE = (Counted.AGREES, Counted.DISAGREES, Counted.EXPLAINED, Counted.NOT_DISCRIMINATING)


def _groups(rows: pd.DataFrame) -> list[tuple[Counted, pd.DataFrame]]:
    """The rows by state (:data:`DETAIL_ORDER`), and by rule where the numbers are compared with it (a range over
    two rules would mix scales); reasons and seed tests read alike across rules."""
    out = []
    for state in DETAIL_ORDER:
        g = rows[rows["counted_as"] == state]
        if g.empty:
            continue
        by_rule = state in _BY_RULE or (state is Counted.INCONCLUSIVE and not (g["control_kind"] == SEEDS).all())
        out += [(state, part) for _, part in g.groupby("rule", sort=False)] if by_rule else [(state, g)]
    return out


def _render(question: Question, reading: Reading, rows: pd.DataFrame,
            pairs: Sequence[tuple[str, Reading]]) -> tuple[str, str]:
    """(lead, details): the reading with the models it holds on, then each group of rows with its numbers (per claim,
    named, where the question's claims have different rules)."""
    if reading is Reading.NOT_CHECKED:
        return "Not checked in this build", ""
    every, noun = list(dict.fromkeys(rows["model"])), question.noun
    everyone = _subjects(every, every, noun)
    anyone = f"any of the {len(every)} {noun}" if len(every) > 1 else every[0]
    lead = {
        Reading.SUPPORTED: f"Supported on {everyone}",
        Reading.CONTRADICTED: f"Contradicted on {everyone}",
        Reading.NOWHERE: f"Supported on none of the {len(every)} {noun}",  # (one model that disagrees: contradicted)
        Reading.CONTROL_TOO: f"Can't tell on {anyone}: an untrained twin or a random control shows it too",
        Reading.NO_CONTROL: f"Can't tell on {anyone}: there is no control to compare with",
        Reading.TOO_FEW: f"Can't tell yet on {anyone}: too few units or seeds to decide",
        Reading.NOT_TESTABLE: f"Not testable on {anyone}",
    }.get(reading, "")
    if reading is Reading.MIXED:
        per: dict[str, list[Reading]] = {}
        for s, r in pairs:
            per.setdefault(s, []).append(r)
        by: dict[str, list[str]] = {}
        for s, rs in per.items():
            word = {Reading.SUPPORTED: "supported", Reading.CONTRADICTED: "contradicted", Reading.MIXED: "both ways",
                    Reading.NOT_TESTABLE: "not testable"}.get(subject_reading(rs), "can't tell")
            by.setdefault(word, []).append(s)
        lead = f"Mixed across {noun}: " + ", ".join(f"{w} on {_subjects(ss, every, noun)}" for w, ss in by.items())
    groups = _groups(rows)
    bare = len(groups) == 1 and READING_OF[groups[0][0]] is reading
    if bare or rows["rule"].nunique() <= 1:
        return lead, "; ".join(_clause(state, g, rows, noun, bare) for state, g in groups)
    clauses = []
    for claim in dict.fromkeys(rows["claim"]):
        said = [_clause(state, g, rows, noun, False) for state, g in _groups(rows[rows["claim"] == claim])]
        clauses.append(f"*{claim}*: " + "; ".join(said))
    return lead, "; ".join(clauses)


def answers_md(verdicts: pd.DataFrame) -> str:
    """Markdown: one line per question, its reading first, each linking to the claim check it rests on."""
    lines = [f"- *{a.question.text[0].upper() + a.question.text[1:]}* ({{ref}}`{a.question.where} "
             f"<{a.question.anchor}>`): **{a.lead}**" + (f" — {a.details}." if a.details else ".")
             for a in answers(verdicts)]
    return ("**What the book answers**, per question of the paper (each from the counted verdict rows of the claims "
            "that state it; the chapters' other claims are in the counts below):\n\n" + "\n".join(lines))


def per_question(verdicts: pd.DataFrame) -> str:
    """Markdown: per question of the paper, how the counted rows of its chapters came out (the states that occur,
    with their counts) and how many more rows are shown but not counted."""
    if "claim_id" not in verdicts.columns:
        return ""
    v = normalized(verdicts)
    lines = []
    for q in QUESTIONS:
        # a chapter that several questions share (07) counts each question's own claims only, so no row counts twice
        others = {c for o in QUESTIONS if o is not q and set(o.chapters) & set(q.chapters) for c in o.claims}
        rows = v[v["claim_id"].map(lambda c: c in REGISTRY and REGISTRY[c].chapter in q.chapters and c not in others)]
        counted = rows[rows["headline"]]
        states = counted["counted_as"].value_counts().reindex(list(HEADLINE_STATES)).dropna().astype(int)
        said = ", ".join(f"{s} {n}" for s, n in states.items()) or "no counted row"
        rest = len(rows) - len(counted)
        lines.append(f"- *{q.text}* ({q.where}): {said}" + (f"; {rest} more shown, not counted" if rest else "")
                     + ("." if len(rows) else " — not checked in this build."))
    return "**Per question of the paper** (counted rows of its chapters, per state):\n\n" + "\n".join(lines)


def states_md(verdicts: pd.DataFrame | None = None) -> str:
    """Markdown: the seven states in plain words (:data:`STATE_MEANING`), under the reader category each is read as,
    each with an example row of ``verdicts`` where one is counted so; and how a question is read from its rows."""
    v = normalized(verdicts) if verdicts is not None and len(verdicts) else None
    lines = []
    for reading in (r for r in Reading if r in READING_OF.values()):
        parts = []
        for state in (s for s in DETAIL_ORDER if READING_OF[s] is reading):
            example = ""
            if v is not None:
                hit = v[(v["counted_as"] == state) & v["headline"]]
                if len(hit):
                    example = f" (e.g. *{hit['claim'].iloc[0]}* on {hit['model'].iloc[0]})"
            parts.append(f"*{state}*: {STATE_MEANING[state]}{example}")
        lines.append(f"- **{reading}** — " + "; ".join(parts) + ".")
    return ("Each (claim × model) check is counted in one of seven states, read as one of six answers:\n\n"
            + "\n".join(lines)
            + "\n\nA question is **supported** when some of its checks agree, none disagrees and every model has an "
              "agreeing check (**contradicted** likewise); **mixed across models** when checks agree and others "
              "disagree, or some models agree and the others cannot tell; **supported on no model** when none agrees, "
              "some disagree and the other models cannot tell; otherwise it takes the can't-tell kind most of its "
              "checks share.")


#: The file, beside ``findings.md``, that holds :func:`states_md`: the landing page and the Method page include it,
#: so the states are defined in one place.
STATES_FILE = "verdict_states.md"


def landing_md(verdicts: pd.DataFrame, profile: str) -> str:
    """``book/findings.md`` below its picture: the answers, then, folded, the states (:data:`STATES_FILE`) and the
    counts per question, then what this build found (:func:`~lmdepth.claims.findings_claims.intro_summary`)."""
    if verdicts.empty:
        return intro_summary(verdicts, profile)
    return (f"{answers_md(verdicts)}\n\n"
            f"````{{dropdown}} What the seven verdict states mean\n```{{include}} {STATES_FILE}\n```\n````\n\n"
            f"````{{dropdown}} The counts behind the answers\n{per_question(verdicts)}\n````\n\n"
            f"{intro_summary(verdicts, profile)}")
