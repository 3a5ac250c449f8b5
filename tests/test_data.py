import pytest

from lmdepth.data.datasets import GSM8K_INSTRUCTION, load_examples, selection_record
from lmdepth.errors import DataError

pytestmark = pytest.mark.unit


def test_gsm8k_uses_the_papers_prompt_format():
    ex = load_examples("gsm8k", n_examples=1, selection="first")[0]
    assert ex.id == "gsm8k/test/0"
    assert ex.prompt.startswith("Given the following problem, reason and give a final answer")
    assert "Problem: Janet" in ex.prompt and ex.prompt.endswith("to the problem.\n\n")
    # the solution keeps its calculator notes; the final answer follows the fixed phrase
    assert "<<16-3-4=9>>" in ex.answer
    assert ex.answer.endswith("\nThe final answer is 18")
    assert ex.meta == {"steps": 2, "final_answer": "18"}
    head, tail = GSM8K_INSTRUCTION.split("{question}")
    assert ex.prompt.startswith(head + "Janet") and ex.prompt.endswith(tail + "\n")


def test_random_selection_is_seeded_and_recorded():
    a = load_examples("gsm8k", n_examples=5, seed=1)
    b = load_examples("gsm8k", n_examples=5, seed=1)
    c = load_examples("gsm8k", n_examples=5, seed=2)
    assert [e.id for e in a] == [e.id for e in b] != [e.id for e in c]
    rec = selection_record("gsm8k", "random", 1, a)
    assert rec["ids"] == [e.id for e in a] and rec["n"] == 5


def test_first_selection_is_file_order():
    assert [e.id for e in load_examples("gsm8k", n_examples=3, selection="first")] == [f"gsm8k/test/{i}" for i in range(3)]


def test_math_filters_by_subject_and_level():
    exs = load_examples("math", n_examples=5, subject="intermediate_algebra", level=5)
    assert len(exs) == 5
    assert all(e.meta["level"] == 5 and e.meta["subject"] == "Intermediate Algebra" for e in exs)
    assert all(e.prompt.startswith("Problem: ") and e.prompt.endswith("\nAnswer:") for e in exs)


def test_user_file_text_and_prompt_answer(jsonl):
    p = jsonl(['{"text": "hello"}', "", '{"prompt": "2+2=", "answer": "4", "level": 1}'])
    exs = load_examples(str(p), n_examples=2, selection="first")
    assert [e.text for e in exs] == ["hello", "2+2=4"]
    with pytest.raises(DataError, match="has only 2 examples: set n_examples to at most 2"):
        load_examples(str(p), n_examples=50)  # never silently fewer than asked
    assert exs[1].id == "data.jsonl:3" and exs[1].meta == {"level": 1}


@pytest.mark.parametrize(
    "lines, message",
    [
        (['{"text": "ok"}', "{not json"], r"data.jsonl:2: not valid JSON"),
        (['{"text": "ok"}', '{"question": "x"}'], r"data.jsonl:2: expected a non-empty string field 'text'"),
        (["[1, 2]"], r"data.jsonl:1: expected a JSON object"),
        ([], r"contains no examples"),
    ],
)
def test_malformed_user_files_name_the_line(jsonl, lines, message):
    with pytest.raises(DataError, match=message):
        load_examples(str(jsonl(lines)), n_examples=3)


def test_unknown_dataset_and_missing_file():
    with pytest.raises(DataError, match="Unknown dataset 'mquake'"):
        load_examples("mquake")
    with pytest.raises(DataError, match="does not exist"):
        load_examples("no/such/file.jsonl")
