"""Reference check for the chain pilots: is it our scratch model, or the task, that keeps one-hop lookups unlearned?

A plain torch Transformer (``nn.TransformerEncoderLayer``, pre-LN, causal mask, learned absolute positions, none
of :mod:`lmdepth.scratch.models`) trained on the pilot's one-hop chain questions with the same tokenizer, the same
answer-only loss mask, batch 32 and AdamW at 1e-3. It prints the held-out accuracy of the answer digit (200
questions) every 500 steps: if this model learns the lookup where ``scripts/pilot_chain_recipe.py`` does not, the
scratch model is at fault; if neither does, the task's supervision is.

``--lr``, ``--batch`` and ``--warmup`` set the optimiser (a linear warm-up, then constant); ``--adjacent`` writes each
assignment without its ``=`` (``m4;cm``: name and value side by side, one offset fewer for the lookup to learn).

``--solved N`` writes N fillers' lookups out before the query (``x?4;e?2.``) and puts the loss on their digits too
(only on them and the answer: an MQAR-style dense signal without the random names' noise).

Usage: ``OMP_NUM_THREADS=1 python scripts/pilot_reference_recall.py --layers 2 --steps 6000 --statements 4``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time

import torch
import torch.nn.functional as F
from torch import nn

from lmdepth.data.dm_tokens import CharTokenizer, collate
from lmdepth.scratch.training import loss_mask
from pilot_chain_recipe import problems  # the pilot's own questions (scripts/ is on the path of a script run)


class PlainLM(nn.Module):
    """Token + learned position embeddings → ``layers`` pre-LN encoder layers under a causal mask → LN → logits."""

    def __init__(self, vocab: int, layers: int, d: int = 128, heads: int = 4, d_ff: int = 256, max_len: int = 256):
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.layers = nn.ModuleList([nn.TransformerEncoderLayer(d, heads, d_ff, dropout=0.0, batch_first=True,
                                                                norm_first=True) for _ in range(layers)])
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, T] → logits [B, T, V]."""
        T = ids.shape[1]
        h = self.emb(ids) + self.pos(torch.arange(T))
        mask = nn.Transformer.generate_square_subsequent_mask(T)
        for layer in self.layers:
            h = layer(h, src_mask=mask, is_causal=True)
        return self.head(self.norm(h))


def targets(tok: CharTokenizer, ids: torch.Tensor) -> torch.Tensor:
    """[B, T - 1] True where the next token is a written-out lookup's digit (the token after a ``?``)."""
    return ids[:, :-1] == tok.stoi["?"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--statements", type=int, default=4)
    ap.add_argument("--solved", type=int, default=0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--adjacent", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    tok = CharTokenizer()
    model = PlainLM(tok.vocab_size, args.layers)
    opt = torch.optim.AdamW(model.parameters(), args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, args.warmup)))

    def draw(n: int, seed: int):
        items = problems(n, 1, args.solved, args.statements, seed=seed)
        if args.adjacent:
            items = [dataclasses.replace(p, question=p.question.replace("=", "")) for p in items]
        return collate(tok, items)

    check = draw(200, 2)
    rng, t0 = random.Random(1), time.process_time()
    rows = torch.arange(len(check.a_start))
    for step in range(1, args.steps + 1):
        batch = draw(args.batch, rng.getrandbits(32))
        logits = model(batch.ids)[:, :-1]
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch.ids[:, 1:].reshape(-1), reduction="none")
        mask = (loss_mask(batch, "answer_only") | targets(tok, batch.ids)).reshape(-1).float()
        loss = (ce * mask).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 500 == 0:
            with torch.no_grad():  # the digit is predicted at the answer's first token (its leading space)
                pred = model(check.ids)[rows, check.a_start].argmax(-1)
            acc = float((pred == check.ids[rows, check.a_start + 1]).float().mean())
            print(json.dumps({"layers": args.layers, "statements": args.statements, "solved": args.solved,
                              "lr": args.lr, "batch": args.batch, "adjacent": args.adjacent,
                              "step": step, "digit_acc": acc, "loss": round(loss.item(), 4),
                              "cpu_s": round(time.process_time() - t0)}), flush=True)


if __name__ == "__main__":
    main()
