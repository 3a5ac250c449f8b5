"""Chapter 07's fine-tuned pretrained runs (``lmdepth.scratch.finetune.finetune_configs``): the packaged SmolLM2-135M
fine-tuned on the problems of the from-scratch runs, three seeds, so the chapter can ask the paper's contrast —
does fine-tuning a pretrained model make its depth grow with the number of operations, as training from scratch
does? Resumable across sessions: a checkpoint every 10 % of training (commit ``ckpt.pt`` with ``git add -f`` to
carry a run over to the next session), and a finished run is skipped.

At step 0 (the pretrained model) and at every checkpoint the script stores a **snapshot** beside the run,
``snapshot-<step>.npz``: exact match on the first 200 problems of each evaluation split, and the layer-skip
effects of the depth score (``analyses.scratch.skip_depth_effects``) on chapter 07's operation sample with the
correctness of each of its problems. Chapter 07 reads them as the depth score over training.

    .venv/bin/python scripts/finetune_runs.py                    # the queue, in order
    .venv/bin/python scripts/finetune_runs.py --list             # each run's state
    .venv/bin/python scripts/finetune_runs.py --only 1           # seed 1 alone
    .venv/bin/python scripts/finetune_runs.py --measure-step     # the cost of one training step, nothing written

One thread per run (``OMP_NUM_THREADS=1``); a step of 16 problems took ~4 s on one core of the 2-core machine
(measured with ``--measure-step``).
"""

from __future__ import annotations

import argparse
import fcntl
import time
from pathlib import Path

import numpy as np
import torch

from lmdepth.analyses.finetuned import finetune_states
from lmdepth.analyses.scratch import snapshot_writer as scratch_snapshots
from lmdepth.data.dm_tokens import collate
from lmdepth.errors import LmDepthError
from lmdepth.scratch.finetune import (
    FinetuneConfig,
    answer_loss,
    finetune_configs,
    finetune_dir,
    finetune_run,
    load_data,
    with_adapters,
)


def snapshot_writer(cfg: FinetuneConfig, out_dir: str, data_dir: str):
    """The ``on_snapshot`` of one run (``lmdepth.analyses.scratch.snapshot_writer``), measuring the base model under
    the adapters."""
    return scratch_snapshots(finetune_dir(cfg, out_dir), load_data(cfg, data_dir), base=lambda m: m.get_base_model())


def measure_step(cfg: FinetuneConfig, data_dir: str, n: int = 5) -> None:
    """Time ``n`` training steps (after one warm-up step) without writing anything."""
    torch.set_num_threads(cfg.threads or 1)
    data = load_data(cfg, data_dir)
    model, tok = with_adapters(cfg)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)
    model.train()
    times = []
    for i in range(n + 1):
        batch = collate(tok, data.train[i * cfg.batch_size:(i + 1) * cfg.batch_size])
        t0 = time.time()
        loss = answer_loss(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
        times.append(time.time() - t0)
    print(f"one step of {cfg.batch_size} problems: median {np.median(times[1:]):.2f} s over {n} steps "
          f"({torch.get_num_threads()} thread(s)); {cfg.steps} steps ≈ {np.median(times[1:]) * cfg.steps / 3600:.1f} h")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint-dir", default="checkpoints/dm_math_ft")
    ap.add_argument("--data-dir", default="results/dm_math_data")
    ap.add_argument("--list", action="store_true", help="print each run's state; train nothing")
    ap.add_argument("--only", type=int, action="append", metavar="SEED", help="train only these seeds")
    ap.add_argument("--measure-step", action="store_true", help="time a few training steps; write nothing")
    args = ap.parse_args()
    seeds = [c.seed for c in finetune_configs()]
    if args.only and set(args.only) - set(seeds):
        ap.error(f"--only names seeds of the queue, one of {seeds}; got {sorted(set(args.only) - set(seeds))}")
    queue = [c for c in finetune_configs() if not args.only or c.seed in args.only]
    if args.measure_step:
        measure_step(queue[0], args.data_dir)
        return
    for cfg in queue:
        rd = finetune_dir(cfg, args.checkpoint_dir)
        if args.list:
            snaps = sorted(rd.glob("snapshot-*.npz"))
            state = finetune_states(args.checkpoint_dir, [cfg]).iloc[0]
            print(f"seed {cfg.seed}: {rd.name} {state.state} ({state.steps}), {len(snaps)} snapshots")
            continue
        Path(args.checkpoint_dir).mkdir(parents=True, exist_ok=True)
        with open(Path(args.checkpoint_dir) / f".{rd.name}.lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                print(f"seed {cfg.seed}: {rd.name} is being trained by another process: skipped", flush=True)
                continue
            t0 = time.time()
            path = finetune_run(cfg, args.checkpoint_dir, args.data_dir,
                                on_snapshot=snapshot_writer(cfg, args.checkpoint_dir, args.data_dir), progress=False)
            print(f"seed {cfg.seed}: {path} ({time.time() - t0:.0f} s in this call)", flush=True)


if __name__ == "__main__":
    try:
        main()
    except LmDepthError as e:  # a damaged checkpoint, a full disk …: one line, nothing lost
        raise SystemExit(f"finetune_runs.py: {e}") from None
