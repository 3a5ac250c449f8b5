"""The text corpus of the cross-model linear maps (chapter 06): which texts each split reads and which token
positions of every model align (tokenizers only, no model)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from lmdepth.data.alignment import Doc, align, eligible_count, general_docs, interleave, math_docs, token_ends
from lmdepth.errors import DataError

SPLITS = ("train", "val", "test")


@dataclass
class CorpusPlan:
    """Which texts each split reads and which positions of each model align.

    Attributes:
        models: model names, in the order of ``ids`` and ``positions``.
        docs: the texts read, test texts first, then validation, then training.
        ids: per doc, per model, the token ids.
        positions: per doc, per model, the aligned token indices (same length for every model).
        split_rows: split → slice of the rows (aligned positions, in doc order) of the residual arrays.
        split_docs: split → number of texts.
        eligible: per model, tokens that could align (not special, not position 0) in the texts read.
    """

    models: list[str]
    docs: list[Doc]
    ids: list[list[list[int]]]
    positions: list[list[np.ndarray]]
    split_rows: dict[str, slice]
    split_docs: dict[str, int]
    eligible: list[int]

    @property
    def n_rows(self) -> int:
        return max(s.stop for s in self.split_rows.values())

    def coverage(self) -> dict[str, float]:
        """Fraction of each model's eligible tokens that align with every other model."""
        return {m: self.n_rows / e if e else float("nan") for m, e in zip(self.models, self.eligible)}

    def record(self) -> dict[str, Any]:
        src = pd.Series([d.source for d in self.docs])
        rows = {k: s.stop - s.start for k, s in self.split_rows.items()}
        return {"aligned_tokens": rows, "texts": self.split_docs, "coverage": self.coverage(),
                "eligible_tokens": dict(zip(self.models, self.eligible)),
                "texts_by_source": src.value_counts().to_dict(), "doc_ids": [d.id for d in self.docs]}


def plan_corpus(
    tokenizers: dict[str, Any],
    docs: list[Doc],
    n_tokens: dict[str, int],
    max_tokens: dict[str, int | None] | None = None,
) -> CorpusPlan:
    """Tokenize texts in order with every tokenizer, align, and fill test → val → train up to the budgets.

    Args:
        tokenizers: model name → tokenizer (fast, with offsets).
        docs: candidate texts in reading order (see :func:`lmdepth.data.alignment.interleave`).
        n_tokens: split → minimum number of aligned positions.
        max_tokens: model name → context length (longer texts are skipped).

    Raises:
        DataError: the texts run out before the budgets are met.
    """
    models = list(tokenizers)
    chosen: list[Doc] = []
    ids_all, pos_all = [], []
    eligible = [0] * len(models)
    counts = {k: 0 for k in SPLITS}
    n_docs = {k: 0 for k in SPLITS}
    order = ("test", "val", "train")
    split_i = 0
    for doc in docs:
        while split_i < len(order) and counts[order[split_i]] >= n_tokens[order[split_i]]:
            split_i += 1
        if split_i == len(order):
            break
        toks = [token_ends(tokenizers[m], doc.text) for m in models]
        if max_tokens and any(max_tokens.get(m) and len(t[0]) > max_tokens[m] for m, t in zip(models, toks)):
            continue
        _, positions = align([t[1] for t in toks])
        if len(positions[0]) == 0:
            continue
        chosen.append(doc)
        ids_all.append([t[0] for t in toks])
        pos_all.append(positions)
        for i, t in enumerate(toks):
            eligible[i] += eligible_count(t[1])
        counts[order[split_i]] += len(positions[0])
        n_docs[order[split_i]] += 1
    short = {k: (counts[k], n_tokens[k]) for k in SPLITS if counts[k] < n_tokens[k]}
    if short:
        raise DataError(f"The texts ran out before the token budgets were met (aligned, asked): {short}. Lower "
                        "n_train_tokens / n_val_tokens / n_test_tokens, or add text (general_text, dataset).")
    rows, start = {}, 0
    for k in order:
        rows[k] = slice(start, start + counts[k])
        start += counts[k]
    return CorpusPlan(models, chosen, ids_all, pos_all, rows, n_docs, eligible)


def corpus_docs(dataset: str, general_text: str, general_fraction: float, max_doc_chars: int, seed: int) -> list[Doc]:
    """The candidate texts in reading order: general text and word problems interleaved (seeded)."""
    general = general_docs(max_doc_chars) if general_text == "python-docs" and general_fraction > 0 else []
    math = math_docs(dataset, max_doc_chars) if general_fraction < 1 else []
    return interleave(general, math, general_fraction, seed)
