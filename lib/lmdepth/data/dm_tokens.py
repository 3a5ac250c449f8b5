"""The character tokenizer of the DeepMind-Mathematics experiment (chapter 07) and its batches.

A fixed vocabulary of the 95 printable ASCII characters covers every question the generator can emit (its
``QUESTION_CHARS``) and the paper's probes; the paper used a 512-piece SentencePiece model instead (a declared
deviation). Text: ``" Q: {q} A:"`` + ``" {a}"``, BOS first, EOS after the answer.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lmdepth.data.dm_math import MathExample, answer_text, prompt_text

CHARS = string.printable[:95]  # digits, letters, punctuation, space (the generator's QUESTION_CHARS)


class CharTokenizer:
    """Character tokenizer: ids 0 pad, 1 BOS, 2 EOS, 3 unknown, then the 95 printable ASCII characters."""

    pad_id, bos_id, eos_id, unk_id = 0, 1, 2, 3
    specials = ("<pad>", "<s>", "</s>", "<unk>")

    def __init__(self, chars: str = CHARS):
        self.chars = chars
        self.stoi = {c: i + len(self.specials) for i, c in enumerate(chars)}
        self.itos = list(self.specials) + list(chars)

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> list[int]:
        return [self.stoi.get(c, self.unk_id) for c in text]

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        out = []
        for i in ids:
            i = int(i)
            if i < len(self.specials):
                if not skip_special:
                    out.append(self.specials[i])
                continue
            out.append(self.itos[i])
        return "".join(out)

    def tokens(self, ids: Sequence[int]) -> list[str]:
        """Display labels of token ids (BOS shown as "BOS", like the paper's erasure plots)."""
        return ["BOS" if int(i) == self.bos_id else ("EOS" if int(i) == self.eos_id else self.itos[int(i)])
                for i in ids]

    def encode_example(self, question: str, answer: str | None = None, eos: bool = True) -> tuple[list[int], int]:
        """``[BOS] + prompt (+ answer (+ [EOS]))`` and the index of the first answer token.

        Training and exact match use ``eos=True``; analyses of the paper's probes may leave the EOS out.
        """
        ids = [self.bos_id] + self.encode(prompt_text(question))
        a_start = len(ids)
        if answer is not None:
            ids += self.encode(answer_text(answer)) + ([self.eos_id] if eos else [])
        return ids, a_start

    def to_dict(self) -> dict[str, Any]:
        return {"type": "char", "chars": self.chars}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CharTokenizer":
        return cls(d["chars"])


class PretrainedTokenizer:
    """A pretrained model's own tokenizer behind :class:`CharTokenizer`'s interface, so that batches, exact match,
    greedy answers and the skip analyses of chapter 07 run unchanged on a fine-tuned pretrained model.

    ``prompt`` is tokenised with the tokenizer's own BOS policy, the answer without special tokens, then the
    tokenizer's EOS: the same ids in training and evaluation (the answer is never merged into the prompt's last
    token). Padding uses the pad token, or the EOS where there is none (padding carries no loss and, the model being
    causal, changes no real position).
    """

    def __init__(self, hf_tokenizer: Any):
        self.hf = hf_tokenizer
        self.eos_id = int(hf_tokenizer.eos_token_id)
        self.bos_id = hf_tokenizer.bos_token_id
        pad = hf_tokenizer.pad_token_id
        self.pad_id = int(self.eos_id if pad is None else pad)

    def encode(self, text: str) -> list[int]:
        return list(self.hf(text, add_special_tokens=False).input_ids)

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def tokens(self, ids: Sequence[int]) -> list[str]:
        return [self.hf.decode([int(i)]) for i in ids]

    def encode_example(self, question: str, answer: str | None = None, eos: bool = True) -> tuple[list[int], int]:
        ids = list(self.hf(prompt_text(question)).input_ids)
        a_start = len(ids)
        if answer is not None:
            ids += self.encode(answer_text(answer)) + ([self.eos_id] if eos else [])
        return ids, a_start


@dataclass
class Batch:
    """A padded batch. ``ids`` [B, T]; ``answer_mask`` [B, T] True at answer tokens (answer + EOS);
    ``pad_mask`` [B, T] True at real tokens; ``a_start`` [B] first answer position."""

    ids: torch.Tensor
    answer_mask: torch.Tensor
    pad_mask: torch.Tensor
    a_start: torch.Tensor


def collate(tok: CharTokenizer, examples: Sequence[MathExample]) -> Batch:
    """Encode and right-pad a list of examples."""
    enc = [tok.encode_example(e.question, e.answer) for e in examples]
    T = max(len(ids) for ids, _ in enc)
    ids = torch.full((len(enc), T), tok.pad_id, dtype=torch.long)
    ans = torch.zeros(len(enc), T, dtype=torch.bool)
    pad = torch.zeros(len(enc), T, dtype=torch.bool)
    for b, (x, s) in enumerate(enc):
        ids[b, : len(x)] = torch.tensor(x)
        ans[b, s : len(x)] = True
        pad[b, : len(x)] = True
    return Batch(ids, ans, pad, torch.tensor([s for _, s in enc]))
