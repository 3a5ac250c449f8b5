"""How well a from-scratch model answers DeepMind-Mathematics questions (chapter 07): teacher-forced exact match
(the paper's sequence-level accuracy), per-split accuracy tables and greedy answers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from lmdepth.data.dm_math import MathExample
from lmdepth.data.dm_tokens import CharTokenizer, collate
from lmdepth.scratch.models import ScratchLM


@torch.no_grad()
def answer_scores(model: ScratchLM, tok: CharTokenizer, examples: list[MathExample], batch_size: int = 64,
                  device: str = "cpu") -> tuple[np.ndarray, np.ndarray]:
    """Teacher-forced scores of the answers (answer characters and the EOS).

    Returns:
        (correct [N] bool: every answer token predicted by argmax, which equals greedy exact match;
         nll [N] float: mean cross-entropy per answer token in nats, a continuous measure that still separates
         runs when few answers are exactly right).
    """
    model.eval()
    order = sorted(range(len(examples)), key=lambda i: len(examples[i].question))  # similar lengths per batch
    ok_out, nll_out = np.zeros(len(examples), dtype=bool), np.zeros(len(examples))
    for i in range(0, len(order), batch_size):
        chunk = order[i : i + batch_size]
        b = collate(tok, [examples[j] for j in chunk])
        logits = model(b.ids.to(device)).logits[:, :-1].float().cpu()  # [B, T−1, V]
        target, mask = b.ids[:, 1:], b.answer_mask[:, 1:]
        ok_out[chunk] = ((logits.argmax(-1) == target) | ~mask).all(-1).numpy()
        ce = F.cross_entropy(logits.transpose(1, 2), target, reduction="none")  # [B, T−1]
        nll_out[chunk] = ((ce * mask).sum(-1) / mask.sum(-1)).numpy()
    return ok_out, nll_out


def exact_match(model: ScratchLM, tok: CharTokenizer, examples: list[MathExample], batch_size: int = 64,
                device: str = "cpu") -> np.ndarray:
    """[N] bool: every answer token and the EOS predicted by argmax under teacher forcing (= greedy exact match)."""
    return answer_scores(model, tok, examples, batch_size, device)[0]


def evaluate(model: ScratchLM, tok: CharTokenizer, examples: list[MathExample], batch_size: int = 64,
             device: str = "cpu") -> pd.DataFrame:
    """One row per example: ``split, module, n_operations, question, answer, correct, answer_nll``."""
    ok, nll = answer_scores(model, tok, examples, batch_size, device)
    return pd.DataFrame({"split": [e.split for e in examples], "module": [e.module for e in examples],
                         "n_operations": [e.n_operations for e in examples], "question": [e.question for e in examples],
                         "answer": [e.answer for e in examples], "correct": ok, "answer_nll": nll})


def accuracy_table(per_example: pd.DataFrame) -> pd.DataFrame:
    """Accuracy per (split, module) plus an ``all`` row per split: ``split, module, n, accuracy``."""
    by_mod = per_example.groupby(["split", "module"])["correct"].agg(n="size", accuracy="mean").reset_index()
    overall = per_example.groupby("split")["correct"].agg(n="size", accuracy="mean").reset_index()
    overall["module"] = "all"
    return pd.concat([by_mod, overall[by_mod.columns]], ignore_index=True)


@torch.no_grad()
def greedy_answer(model: ScratchLM, tok: CharTokenizer, question: str, max_new_tokens: int = 40,
                  device: str = "cpu") -> str:
    """Greedy decoding after ``" Q: {q} A:"`` until EOS; returns the answer without its leading space."""
    model.eval()
    ids, _ = tok.encode_example(question)
    out = model(torch.tensor([ids], device=device), use_cache=True, logits_to_keep=1)
    cache, gen = out.past_key_values, []
    for _ in range(max_new_tokens):
        nxt = int(out.logits[0, -1].argmax())
        if nxt == tok.eos_id:
            break
        gen.append(nxt)
        out = model(torch.tensor([[nxt]], device=device), past_key_values=cache, use_cache=True)
    return tok.decode(gen).removeprefix(" ")
