"""Token alignment across tokenizers, and the text corpus of the cross-model linear maps (chapter 06).

Two models with different tokenizers have read *the same text* at a position where both tokenizers end a token
at the same character offset: the residual of each model there summarises exactly the same prefix. Those are the
positions the maps are fitted on (``return_offsets_mapping`` of the fast tokenizers gives the offsets).

Rules (book/method.md#method-maps, adapted to different tokenizers):

- special tokens (BOS, with an empty character span) never align;
- position 0 of every model is dropped (BOS or, for tokenizers without one, the first text token: the attention
  sink either way);
- when several tokens end at the same offset (byte-level BPE splits a multi-byte character into pieces that all
  report the character's span), the *last* one is used: only it has read the whole character.

The general-English text is the Python language reference shipped with CPython itself (``pydoc_data.topics``,
PSF License), so it is present wherever Python is; the mathematical text is GSM8K (or MATH, or a user file) via
:mod:`lmdepth.data.datasets`.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lmdepth.data.datasets import all_examples
from lmdepth.errors import DataError

# ---- alignment -------------------------------------------------------------------------------------------------

def token_ends(tokenizer: Any, text: str) -> tuple[list[int], np.ndarray]:
    """Token ids of ``text`` (the tokenizer's own BOS policy) and the character offset where each token ends.

    Returns:
        (ids, ends): ``ends[i]`` is the end offset of token i, or -1 for special tokens (empty span).

    Raises:
        DataError: the tokenizer is not a "fast" tokenizer and cannot report offsets.
    """
    try:
        enc = tokenizer(text, return_offsets_mapping=True)
    except NotImplementedError:
        raise DataError(f"{type(tokenizer).__name__} cannot return character offsets (return_offsets_mapping); "
                        "the linear maps need a fast (Rust) tokenizer to align tokens across models.") from None
    ends = np.array([e if e > s else -1 for s, e in enc["offset_mapping"]], dtype=np.int64)
    return list(enc["input_ids"]), ends


def ends_to_positions(ends: np.ndarray, drop_first: bool = True) -> dict[int, int]:
    """Map end offset → index of the last token that ends there (specials and, by default, position 0 left out)."""
    out: dict[int, int] = {}
    for i, e in enumerate(ends.tolist()):
        if e < 0 or (drop_first and i == 0):
            continue
        out[e] = i  # a later token with the same end overwrites: the last piece of a split character
    return out


def eligible_count(ends: np.ndarray, drop_first: bool = True) -> int:
    """Tokens that could align at all: not special and not position 0."""
    mask = ends >= 0
    if drop_first and len(mask):
        mask[0] = False
    return int(mask.sum())


def align(ends_list: list[np.ndarray], drop_first: bool = True) -> tuple[np.ndarray, list[np.ndarray]]:
    """Positions where *every* tokenization ends a token at the same character offset.

    Args:
        ends_list: per model, the token end offsets of the same text (see :func:`token_ends`).
        drop_first: leave out position 0 of every model (attention sink).

    Returns:
        (offsets, positions): the common end offsets, increasing, and per model the token index at each of them.
        Two identical tokenizations align to the identity (apart from position 0, specials and split characters).
    """
    maps = [ends_to_positions(e, drop_first) for e in ends_list]
    common = sorted(set.intersection(*(set(m) for m in maps))) if maps else []
    offsets = np.array(common, dtype=np.int64)
    return offsets, [np.array([m[e] for e in common], dtype=np.int64) for m in maps]


# ---- corpus ----------------------------------------------------------------------------------------------------

GENERAL_TEXTS = ("python-docs", "none")
_UNDERLINE = re.compile(r"^\s*([*=\-~^\"'#])\1{2,}\s*$")


@dataclass(frozen=True)
class Doc:
    """One text the models read in a single forward pass.

    Attributes:
        id: stable identifier, e.g. ``"python-docs/if/0"`` or ``"gsm8k/train/17"``.
        text: the text.
        source: ``"general"`` or ``"math"``.
    """

    id: str
    text: str
    source: str
    meta: dict[str, Any] = field(default_factory=dict)


def _paragraphs(topic_text: str) -> list[str]:
    """Paragraphs of a pydoc topic: prose lines re-joined (the file is hard-wrapped), code blocks kept as is."""
    out = []
    for block in re.split(r"\n\s*\n", topic_text):
        lines = [ln for ln in block.split("\n") if ln.strip() and not _UNDERLINE.match(ln)]
        if not lines:
            continue
        if all(not ln.startswith(" ") for ln in lines):
            out.append(" ".join(ln.strip() for ln in lines))
        else:
            out.append("\n".join(ln.rstrip() for ln in lines))
    return out


def general_docs(max_chars: int = 1200) -> list[Doc]:
    """English prose (with some code) from the Python language reference shipped with CPython.

    ``pydoc_data.topics`` holds the text of ``help('if')`` and friends: ~80 topics, ~460k characters, PSF License.
    Paragraphs of a topic are grouped into documents of at most ``max_chars`` characters (a longer paragraph is
    its own document, cut at ``max_chars``).
    """
    from pydoc_data.topics import topics

    docs = []
    for name in sorted(topics):
        cur: list[str] = []
        k = 0
        for par in _paragraphs(topics[name]) + [None]:  # type: ignore[list-item]
            if par is None or (cur and sum(len(p) + 2 for p in cur) + len(par) > max_chars):
                if cur:
                    docs.append(Doc(f"python-docs/{name}/{k}", "\n\n".join(cur)[:max_chars], "general"))
                    k += 1
                cur = []
            if par is not None:
                cur.append(par)
    return docs


def general_text_id() -> str:
    """Which copy of the general text: Python version plus a digest (the topics change between Python releases)."""
    import platform
    from pydoc_data.topics import topics

    h = hashlib.sha256("\x00".join(f"{k}\x01{topics[k]}" for k in sorted(topics)).encode()).hexdigest()[:12]
    return f"pydoc_data.topics (Python {platform.python_version()}, sha256 {h})"


def math_docs(dataset: str = "gsm8k", max_chars: int = 1200) -> list[Doc]:
    """Word problems with their worked solutions (train split of a named set, or every line of a user file).

    GSM8K's fixed instruction (the book's prompt format) is left out here: repeated verbatim in every problem it
    would make a quarter of the tokens the same sentence.
    """
    split = "train" if dataset in ("gsm8k", "math") else "test"
    out = []
    for e in all_examples(dataset, split=split):
        text = e.text
        if e.id.startswith("gsm8k/"):
            q = e.prompt.split("Problem: ", 1)[-1].split("\nYour response", 1)[0]
            text = q.strip() + "\n" + e.answer
        out.append(Doc(e.id, text[:max_chars], "math"))
    if not out:
        raise DataError(f"No texts in {dataset!r}.")
    return out


def interleave(general: list[Doc], math: list[Doc], general_fraction: float, seed: int) -> list[Doc]:
    """Both sources shuffled (seeded) and merged so that every prefix holds ~``general_fraction`` general text,
    counted in characters. The splits are consecutive runs of this order, so each gets both kinds of text."""
    rng = random.Random(seed)
    g, m = list(general), list(math)
    rng.shuffle(g)
    rng.shuffle(m)
    if general_fraction <= 0 or not g:
        return m
    if general_fraction >= 1 or not m:
        return g
    out, n_g, n_m, i, j = [], 0, 0, 0, 0
    while i < len(g) or j < len(m):
        take_general = j >= len(m) or (i < len(g) and n_g * (1 - general_fraction) <= n_m * general_fraction)
        if take_general:
            out.append(g[i]); n_g += len(g[i].text); i += 1  # noqa: E702
        else:
            out.append(m[j]); n_m += len(m[j].text); j += 1  # noqa: E702
    return out


__all__ = ["token_ends", "ends_to_positions", "eligible_count", "align", "Doc", "general_docs", "general_text_id",
           "math_docs", "interleave", "GENERAL_TEXTS"]
