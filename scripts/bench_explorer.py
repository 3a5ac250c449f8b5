"""Benchmark: one explore (chapter 91) against its three panels run one by one, in one process.

An explore (:func:`lmdepth.book.explorer.explore`) reads the contributions, the logit-lens top tokens and the skip
effect of one layer from one nnsight session: the clean pass once, plus the skipped pass. The baseline runs the three
panels as separate calls (:func:`~lmdepth.book.explorer.contributions`, :func:`~lmdepth.book.explorer.lens_top_tokens`,
:func:`~lmdepth.book.explorer.skip_effect`), each its own request with its own clean pass — how an explore ran
before. The script checks that both give the same numbers and prints, per path, the median CPU seconds (process
time, robust to other jobs) and wall seconds over ``--repeats`` runs, the forward passes of the model (counted by a
hook) and the requests (counted by the strict NDIF simulation, ``remote="local"``). Run with one thread:

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_explorer.py --model smollm2-135m
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from lmdepth.book import explorer
from lmdepth.model.registry import LoadedModel, load_model
from lmdepth.traces import server

PROMPT = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many "
          "clips did she sell in May? Half of 48 is")  # chapter 91's example prompt


def explore(lm: LoadedModel, layer: int, position: int, k: int) -> tuple:
    x = explorer.explore(lm, PROMPT, layer, position, k)
    return x.contributions, x.lens, x.skip, x.output_change


def panels(lm: LoadedModel, layer: int, position: int, k: int) -> tuple:
    ids = lm.encode(PROMPT)
    skip, out = explorer.skip_effect(lm, ids, layer)
    return (explorer.contributions(lm, ids), explorer.lens_top_tokens(lm, ids, position % ids.shape[1], k), skip,
            out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--layer", type=int, default=3)
    ap.add_argument("--position", type=int, default=-1)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()

    torch.set_grad_enabled(False)
    lm = load_model(args.model)
    sim = LoadedModel(lm.name, lm.model, lm.tokenizer, lm.adapter, lm.source, remote_mode="local")
    calls: list[int] = []
    lm.model.model.register_forward_pre_hook(lambda mod, a: calls.append(1))  # one per forward pass of the decoder
    paths = {"panels": panels, "explore": explore}
    got, report = {}, {"model": args.model, "layer": args.layer, "tokens": int(lm.encode(PROMPT).shape[1]),
                       "threads": torch.get_num_threads()}
    for name, fn in paths.items():
        fn(lm, args.layer, args.position, args.k)  # warm-up
        calls.clear()
        got[name] = fn(lm, args.layer, args.position, args.k)
        forwards = len(calls)
        before = len(server.REQUESTS)
        fn(sim, args.layer, args.position, args.k)
        requests = len(server.REQUESTS) - before
        cpu, wall = [], []
        for _ in range(args.repeats):
            c0, w0 = time.process_time(), time.perf_counter()
            fn(lm, args.layer, args.position, args.k)
            cpu.append(time.process_time() - c0)
            wall.append(time.perf_counter() - w0)
        report[name] = {"cpu_s_median": round(statistics.median(cpu), 3), "cpu_s": [round(c, 3) for c in cpu],
                        "wall_s_median": round(statistics.median(wall), 3), "forwards": forwards,
                        "requests": requests}
    a, b = got["panels"], got["explore"]
    report["max_abs_diff"] = max(float((a[0].value - b[0].value).abs().max()), float((a[1].prob - b[1].prob).abs().max()),
                                 float((a[2].relative_change - b[2].relative_change).abs().max()), abs(a[3] - b[3]))
    report["same_tokens"] = a[1].token_id.tolist() == b[1].token_id.tolist()
    report["cpu_ratio_explore_over_panels"] = round(report["explore"]["cpu_s_median"] / report["panels"]["cpu_s_median"], 3)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
