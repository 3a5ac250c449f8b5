"""Greedy decoding: does the model solve an item (teacher-forced for short answers, generated for long ones)?"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lmdepth.model.registry import LoadedModel


@torch.no_grad()
def teacher_forced_correct(lm: LoadedModel, ids: torch.Tensor, a_start: int) -> bool:
    """Greedy decoding reproduces the answer tokens exactly (for short answers this *is* greedy generation)."""
    n = ids.shape[1] - a_start
    logits = lm.model(ids, logits_to_keep=n + 1).logits[0, :-1]
    return bool((logits.argmax(-1) == ids[0, a_start:]).all())


@torch.no_grad()
def generate_greedy(lm: LoadedModel, prompts: Sequence[str], max_new_tokens: int, batch_size: int = 8,
                    stop: Sequence[str] = ("\nProblem:", "\n\n\n")) -> list[str]:
    """Greedy continuations of ``prompts`` (left-padded batches, stop at EOS or a stop string)."""
    tok = lm.tokenizer
    side, tok.padding_side = tok.padding_side, "left"
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    outs: list[str] = []
    try:
        for i in range(0, len(prompts), batch_size):
            enc = tok(list(prompts[i : i + batch_size]), return_tensors="pt", padding=True).to(lm.device)
            gen = lm.model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad,
                                    stopping_criteria=[_StopOnText(tok, stop, enc.input_ids.shape[1])])
            outs += tok.batch_decode(gen[:, enc.input_ids.shape[1]:], skip_special_tokens=True)
    finally:
        tok.padding_side = side
    return [_cut_at_stop(o, stop) for o in outs]


class _StopOnText:
    """Stop a sequence once its generated text contains a stop string (works with any tokenizer, unlike
    ``generate(stop_strings=...)``, which needs a BPE-style vocabulary)."""

    def __init__(self, tokenizer: Any, stop: Sequence[str], start: int):
        self.tokenizer, self.stop, self.start = tokenizer, tuple(stop), start

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        texts = self.tokenizer.batch_decode(input_ids[:, self.start:], skip_special_tokens=True)
        return torch.tensor([any(s in t for s in self.stop) for t in texts], device=input_ids.device)


def _cut_at_stop(text: str, stop: Sequence[str]) -> str:
    ends = [text.find(s) for s in stop if s in text]
    return text[: min(ends)] if ends else text
