"""The correctness check of chapter 05 as remote-ready traces: does the model answer an item greedily?

Two forms, as :mod:`lmdepth.model.generate` (their plain reference, which the tests hold them to):

* :func:`greedy_matches` — a short answer is right when greedy decoding reproduces its tokens exactly, which is
  one teacher-forced forward pass (the comparison is made inside the trace; one boolean leaves it);
* :func:`greedy_continuations` — long answers are generated: greedy decoding of a left-padded batch through
  nnsight's ``generate``; only the new token ids leave it. The reference stops a sequence once its text contains
  a stop string (a library object the server cannot import); here the ids run to ``max_new_tokens`` or EOS and the
  caller cuts the text at the first stop string, which gives the same text: a stopped sequence is only padded,
  and a sequence's tokens do not depend on its batch mates'.

The blocks read only torch, the model's envoys and plain data.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lmdepth.model.generate import _cut_at_stop
from lmdepth.traces.remote import trace_kwargs

#: Where a generated solution ends: the next few-shot problem, or a run of blank lines.
STOP = ("\nProblem:", "\n\n\n")


def greedy_matches(nn_model: Any, input_ids: torch.Tensor, a_start: int, remote: bool | str = False) -> bool:
    """Whether greedy decoding of ``input_ids[:, :a_start]`` reproduces ``input_ids[:, a_start:]``.

    Args:
        nn_model: the remotable nnsight wrapper (``LoadedModel.nn``).
        input_ids: [1, T] prompt + answer.
        a_start: index of the first answer token.
        remote: ``False`` (here), ``True`` (NDIF) or ``"local"`` (strict simulation).
    """
    n = int(input_ids.shape[1]) - a_start
    target = input_ids[0, a_start:]
    with torch.no_grad(), nn_model.trace(input_ids, logits_to_keep=n + 1, **trace_kwargs(nn_model, remote)):
        logits = nn_model.output.logits[0, :-1]  # [n, V]: the predictions of the answer tokens
        match = (logits.argmax(-1) == target.to(logits.device)).all().cpu().save()
    return bool(match)


def greedy_continuations(nn_model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
                         pad_token_id: int, remote: bool | str = False) -> torch.Tensor:
    """Greedy continuations of a left-padded batch (up to ``max_new_tokens`` or EOS; then padded).

    Args:
        nn_model: the remotable nnsight wrapper (``LoadedModel.nn``).
        input_ids, attention_mask: [B, T] left-padded prompts.
        max_new_tokens: the generation budget.
        pad_token_id: the id written after a sequence ends.
        remote: ``False`` (here), ``True`` (NDIF) or ``"local"`` (strict simulation).

    Returns:
        [B, ≤ max_new_tokens] int64 new token ids, on CPU.
    """
    width = int(input_ids.shape[1])
    with torch.no_grad(), nn_model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                                            do_sample=False, pad_token_id=pad_token_id,
                                            **trace_kwargs(nn_model, remote)) as tracer:
        new = tracer.result[:, width:].cpu().clone().save()  # a slice's clone: not the prompt's storage
    return new


def greedy_texts(nn_model: Any, tokenizer: Any, prompts: Sequence[str], max_new_tokens: int,
                 device: torch.device | None = None, remote: bool | str = False, batch_size: int = 8,
                 stop: Sequence[str] = STOP) -> list[str]:
    """Greedy continuations of ``prompts`` as text (:func:`lmdepth.model.generate.generate_greedy`'s result): left-padded
    batches of ``batch_size`` through :func:`greedy_continuations`, one request each, cut at the first stop string.

    Args:
        device: where the prompts go (the model's device here; None keeps them on the CPU, as for NDIF).
    """
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    outs: list[str] = []
    try:
        for i in range(0, len(prompts), batch_size):
            enc = tokenizer(list(prompts[i: i + batch_size]), return_tensors="pt", padding=True)
            ids, mask = (enc.input_ids, enc.attention_mask) if device is None else \
                (enc.input_ids.to(device), enc.attention_mask.to(device))
            new = greedy_continuations(nn_model, ids, mask, max_new_tokens, pad, remote)
            outs += tokenizer.batch_decode(new, skip_special_tokens=True)
    finally:
        tokenizer.padding_side = side
    return [_cut_at_stop(o, stop) for o in outs]


__all__ = ["STOP", "greedy_matches", "greedy_continuations", "greedy_texts"]
