"""Chapter 07's comparison runs for a fair MoEUT-vs-Transformer check (``lmdepth.scratch.training.matched_configs``):
one learning rate for both architectures (1e-3, the largest at which MoEUT trains without overflowing) and three
training seeds per (architecture, objective), in the default recipe otherwise; chapter 07 reads every finished one.
Resumable: each run checkpoints every 500 steps and a finished run is skipped, so the script can be stopped and
started again across sessions.

    .venv/bin/python scripts/train_matched_runs.py            # the whole queue, in order
    .venv/bin/python scripts/train_matched_runs.py --list     # each run's key and state, nothing trained
    .venv/bin/python scripts/train_matched_runs.py --only transformer:answer_only:2   # that run alone
    .venv/bin/python scripts/train_matched_runs.py --task chains   # the depth score's positive control (operation chains)

``--task chains`` trains the positive control of the depth score (``lmdepth.scratch.training.chain_configs``:
the same answer-only Transformer on operation chains of 1 … 6 operations with a curriculum, five seeds, 16,000 steps
of 128 problems, ~1.7 h each on one thread) into
``checkpoints/chains``. Every run stores a snapshot of its depth score at step 0 and every 10 % of training
(``snapshot-<step>.npz`` beside the run; ``lmdepth.analyses.scratch.snapshot_writer``); a run resumed from a
checkpoint stores the snapshots still ahead of it.

Two processes may share the queue (one core each): a run being trained holds a lock beside its folder, and the
other process skips it.

Runs one thread each (a second process on a 2-core machine oversubscribes the cores: pause it, or use ``nice``,
while timing anything else). MoEUT takes ~2.3 h and the Transformer ~1.2 h per run on one quiet core. MoEUT seed 0
at 1e-3 is the default run already committed. Finished runs land in ``checkpoints/dm_math`` (commit
``model.pt`` and ``meta.json``).
"""

from __future__ import annotations

import argparse
import fcntl
import time
from pathlib import Path

from lmdepth.analyses.scratch import run_state, snapshot_writer
from lmdepth.errors import LmDepthError
from lmdepth.scratch.training import (
    CHAIN_ARCHS,
    SNAPSHOTS_PER_RUN,
    chain_configs,
    load_data,
    matched_configs,
    run_dir,
    train_run,
)

#: (arch, objective, seed, config) in training order per task: for the comparison, answer-only first (the objective
#: of the chapter's headline rows), the Transformer first (it decides whether the arms reach matched competence at
#: this learning rate); the positive control seed by seed, the Transformer's (the chapter's) and then MoEUT's, which
#: chapter 07 reads once ``CHAIN_ARCHS`` names it (when its five seeds are in).
QUEUES = {"comparison": [(c.arch, c.objective, c.seed, c) for c in matched_configs("default")],
          "chains": [(c.arch, c.objective, c.seed, c) for c in chain_configs("default", archs=CHAIN_ARCHS)]
          + [(c.arch, c.objective, c.seed, c) for c in chain_configs("default", archs=("moeut",))]}
CHECKPOINT_DIRS = {"comparison": "checkpoints/dm_math", "chains": "checkpoints/chains"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=tuple(QUEUES), default="comparison")
    ap.add_argument("--checkpoint-dir", help="default: checkpoints/dm_math (comparison), checkpoints/chains (chains)")
    ap.add_argument("--data-dir", default="results/dm_math_data")
    ap.add_argument("--list", action="store_true", help="print each run's key and state; train nothing")
    ap.add_argument("--only", action="append", metavar="ARCH:OBJECTIVE:SEED",
                    help="train only these runs of the queue (repeatable), e.g. transformer:answer_only:2")
    args = ap.parse_args()
    args.checkpoint_dir = args.checkpoint_dir or CHECKPOINT_DIRS[args.task]
    queue = QUEUE = QUEUES[args.task]
    if args.only:
        wanted = {tuple(o.split(":")) for o in args.only}
        queue = [r for r in QUEUE if (r[0], r[1], str(r[2])) in wanted]
        if len(queue) != len(wanted):
            ap.error(f"--only names runs of the queue as ARCH:OBJECTIVE:SEED, one of: "
                     f"{', '.join(f'{a}:{o}:{s}' for a, o, s, _ in QUEUE)}")
    for _, _, seed, cfg in queue:
        rd = run_dir(cfg, args.checkpoint_dir)
        if args.list:  # the states chapter 07 shows
            state, step, _ = run_state(cfg, args.checkpoint_dir)
            print(f"{cfg.name} seed {seed}: {rd.name} {state} (step {step:,} of {cfg.steps:,})")
            continue
        Path(args.checkpoint_dir).mkdir(parents=True, exist_ok=True)
        with open(Path(args.checkpoint_dir) / f".{rd.name}.lock", "w") as lock:
            try:  # released when the process ends, however it ends
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                print(f"{cfg.name} seed {seed}: {rd.name} is being trained by another process: skipped", flush=True)
                continue
            t0 = time.time()
            on_snapshot = snapshot_writer(rd, load_data(cfg, args.data_dir))
            path = train_run(cfg, args.checkpoint_dir, data_dir=args.data_dir, progress=False,
                             on_snapshot=on_snapshot, snapshot_every=cfg.steps // SNAPSHOTS_PER_RUN)
            print(f"{cfg.name} seed {seed}: {path} ({time.time() - t0:.0f} s in this call)", flush=True)


if __name__ == "__main__":
    try:
        main()
    except LmDepthError as e:  # a damaged checkpoint, a full disk …: one line, nothing lost
        raise SystemExit(f"train_matched_runs.py: {e}") from None
