"""Pilot of the pointer-chain recipe: how fast each candidate learns one-hop lookups (the curriculum's stage 1).

The chain positive control's seed 0 never passed stage 1 (chains of one hop) in 15,000 steps, so its recipe is
changed again before any depth of a chain run is measured. This pilot measures only learning speed — held-out exact
match on one-hop questions — never a depth, for the candidates:

* ``baseline``: the failed recipe (answer only, learning rate 1e-3);
* ``lr3e-3``: the same at learning rate 3e-3;
* ``solved``: the question modelled (loss on every token) with two fillers' lookups written out before the query
  (``x?4;e?2.``): a denser signal for the lookup, and no help for the chain (only fillers are solved);
* ``solved-lr3e-3``: the same at learning rate 3e-3;
* ``dense``: eight fillers' lookups written out, learning rate 1e-3;
* ``four-lines``, ``eight-lines``: the baseline on questions of 4 or 8 assignments instead of 14;
* ``ops`` (the task chosen on 2026-12-03, :mod:`lmdepth.data.op_chains`; ``--pad`` as it is generated there): another sequential task, answer only: a digit and k = 1 … 6 operations applied left to right, mod 10
  (``Q: 7+3*3-4 A: 6``: ((7 + 3) · 3 − 4) mod 10). Each operation needs the previous result, and every one is a
  bijection of the digits (``+d``, ``-d``, ``*3``, ``*7``, ``*9``), so no operation erases the ones before it;
  the printed exact match is over all k, with one figure per k.

Usage: ``OMP_NUM_THREADS=1 python scripts/pilot_chain_recipe.py solved --steps 2500`` (one JSON line per check);
``--layers 2`` trains a shallower Transformer (does depth, not the data, stop the lookup from being learned?).
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch

from lmdepth.data.chains import chain_question
from lmdepth.data.dm_math import MathExample
from lmdepth.data.dm_tokens import CharTokenizer, collate
from lmdepth.scratch.evaluate import exact_match
from lmdepth.scratch.models import build_model
from lmdepth.scratch.training import lm_loss, lr_at, run_config

RECIPES = {"baseline": ("answer_only", 1e-3, 0, 14), "lr3e-3": ("answer_only", 3e-3, 0, 14),
           "solved": ("lm", 1e-3, 2, 14), "solved-lr3e-3": ("lm", 3e-3, 2, 14), "dense": ("lm", 1e-3, 8, 14),
           "four-lines": ("answer_only", 1e-3, 0, 4), "eight-lines": ("answer_only", 1e-3, 0, 8),
           "ops": ("answer_only", 1e-3, 0, 0)}
OPS_MAX = 6


def op_question(k: int, rng: random.Random, width: int = 0) -> MathExample:
    """A digit, then ``k`` operations applied left to right mod 10 (``+d``/``-d``, d = 1..9; ``*3``/``*7``/``*9``),
    left-padded with spaces to ``width`` characters (a length that does not tell k)."""
    value = rng.randrange(10)
    text = str(value)
    for _ in range(k):
        op = rng.choice("+-*")
        d = rng.choice("379") if op == "*" else str(rng.randint(1, 9))
        value = {"+": value + int(d), "-": value - int(d), "*": value * int(d)}[op] % 10
        text += op + d
    return MathExample(text.rjust(width), str(value), "op_chain", "train")


def op_problems(n: int, seed: int, max_k: int = OPS_MAX, width: int = 0) -> list[MathExample]:
    """``n`` operation chains, k uniform in 1 … ``max_k``, seeded."""
    rng = random.Random(seed)
    return [op_question(rng.randint(1, max_k), rng, width) for _ in range(n)]


def problems(n: int, k: int, solved: int, statements: int, seed: int) -> list[MathExample]:
    """``n`` questions of ``k`` hops and ``statements`` assignments (``solved`` of them written out), seeded."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p = chain_question(k, rng, statements, solved)
        out.append(MathExample(p.question, str(p.answer), "pointer_chain", "train"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("recipe", choices=RECIPES)
    ap.add_argument("--steps", type=int, default=2500)
    ap.add_argument("--every", type=int, default=500)
    ap.add_argument("--layers", type=int, default=None, help="depth of the Transformer (default: chapter 07's)")
    ap.add_argument("--max-k", type=int, default=OPS_MAX, help="ops: train on chains of 1 … this many operations")
    ap.add_argument("--curriculum", action="store_true",
                    help="ops: train on 1 … s operations, s = 1 first, s + 1 once a check answers 90 %% of s")
    ap.add_argument("--pad", action="store_true", help="ops: every question left-padded to one length")
    ap.add_argument("--lr", type=float, default=None, help="peak learning rate (default: the recipe's)")
    ap.add_argument("--batch", type=int, default=None, help="problems a step (default: chapter 07's 32)")
    args = ap.parse_args()
    objective, lr, solved, statements = RECIPES[args.recipe]
    lr = args.lr or lr
    torch.set_num_threads(1)
    overrides = {} if args.layers is None else {"model": {"n_layers": args.layers}}
    if args.batch:
        overrides["batch_size"] = args.batch
    cfg = run_config("default", "transformer", objective, lr=lr, seed=0, steps=30_000, **overrides)
    tok = CharTokenizer()
    model = build_model(cfg.model_config(tok.vocab_size), seed=0).train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0}],
                            lr=lr, betas=cfg.betas)
    if args.recipe == "ops":
        width = 1 + 2 * args.max_k if args.pad else 0
        train, check = [], op_problems(600, 2, args.max_k, width)
    else:
        train = problems(args.steps * cfg.batch_size, 1, solved, statements, seed=1)
        check = problems(100, 1, solved, statements, seed=2)
    ks = [e.n_operations for e in check]  # operations, or hops for a chain question
    stage, rng = (1 if args.curriculum else args.max_k), random.Random(3)
    t0 = time.process_time()
    for step in range(1, args.steps + 1):
        if args.recipe == "ops":  # drawn per step: the curriculum's stage sets the longest chain
            batch = collate(tok, [op_question(rng.randint(1, stage), rng, width) for _ in range(cfg.batch_size)])
        else:
            batch = collate(tok, train[(step - 1) * cfg.batch_size: step * cfg.batch_size])
        for g in opt.param_groups:
            g["lr"] = lr_at(step - 1, cfg)
        task, aux = lm_loss(model, batch, objective)
        opt.zero_grad(set_to_none=True)
        (task + aux).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        if step % args.every == 0:
            model.eval()
            with torch.no_grad():
                hits = exact_match(model, tok, check)
            model.train()
            by_k = {k: round(float(hits[[i for i, kk in enumerate(ks) if kk == k]].mean()), 3) for k in sorted(set(ks))}
            if args.curriculum and by_k.get(stage, 0) >= 0.9 and stage < args.max_k:
                stage += 1
            print(json.dumps({"recipe": args.recipe, "layers": cfg.model["n_layers"], "pad": args.pad, "step": step,
                              "em": round(float(hits.mean()), 3), "em_by_k": by_k if args.recipe == "ops" else None,
                              "stage": stage,
                              "loss": round(task.item(), 4), "cpu_s": round(time.process_time() - t0, 1)}), flush=True)


if __name__ == "__main__":
    main()
