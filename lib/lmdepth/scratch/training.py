"""Training MoEUT and the dense baseline from scratch on DeepMind Mathematics (paper Fig. 9; book/method.md#method-moeut).

Introduced in chapter 07. One call trains one run (architecture × objective) or returns its cached checkpoint::

    cfg = run_config("default", "moeut", "answer_only")
    path = train_run(cfg, out_dir="results/scratch")          # no-op if results/scratch/<run>/model.pt exists
    model, tok, meta = load_trained(path)
    acc = evaluate(model, tok, load_data(cfg, "results/scratch").extrapolate)

* Objectives: ``"lm"`` — loss on every token ("question modelled"); ``"answer_only"`` — loss on the answer tokens
  only ("question not modelled", the authors' ``dm_math.loss_on_target_only``).
* Resumable: a checkpoint (model, optimiser, step, loss history, RNG states) is written atomically every
  ``ckpt_every`` steps and when a call stops early (``stop_after``); the next call continues from it. The batch of
  step i and the learning rate are pure functions of (seed, i) (with a curriculum, of the stages reached too,
  which the checkpoint stores), so an interrupted run ends bit-identical to an uninterrupted one.
* An update whose gradient is not finite is skipped (as AMP's ``GradScaler`` does) and its step recorded
  (``skipped_updates``); :data:`MAX_CONSECUTIVE_SKIPS` in a row stop the run with an error, its last checkpoint intact.
* The finished run is ``<out_dir>/<run name>-<key>/model.pt`` (weights, config, tokenizer, loss history,
  provenance); the key hashes every parameter that changes the weights.

Evaluation is sequence-level exact match: all answer tokens (and the EOS after them) predicted by argmax under
teacher forcing, which is exactly greedy decoding's exact match (the authors' ``GroupLmTestState.accuracy``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import random
import sys
import time
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from lmdepth import COMPUTE_VERSION
from lmdepth.data.dm_math import (
    ARITHMETIC_MODULES,
    DEFAULT_MODULES,
    TRAIN_LEVELS,
    MathData,
    load_or_generate,
    small_module_settings,
)
from lmdepth.data.dm_tokens import CharTokenizer, collate
from lmdepth.errors import DamagedFile, DataError, ParameterError, TrainingDiverged
from lmdepth.results import atomic_write, atomic_write_text, discard, git_tracked
from lmdepth.runtime import environment
from lmdepth.scratch.curriculum import Curriculum
from lmdepth.scratch.evaluate import exact_match
from lmdepth.scratch.models import (
    DenseConfig,
    MoEUTConfig,
    ScratchLM,
    active_parameters,
    build_model,
    config_from_dict,
    count_parameters,
)

ARCHS = ("moeut", "transformer")
OBJECTIVES = ("lm", "answer_only")
OBJECTIVE_LABELS = {"lm": "question modelled", "answer_only": "question not modelled"}
MAX_CONSECUTIVE_SKIPS = 20  # non-finite updates in a row that end a run (one now and then is skipped)
#: Bump when a change to the training code changes the trained weights; part of every run key.
TRAIN_VERSION = 1


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines one trained model.

    Attributes:
        arch: ``"moeut"`` or ``"transformer"``.
        objective: ``"lm"`` (question modelled) or ``"answer_only"`` (question not modelled).
        model: keyword arguments of :class:`~lmdepth.scratch.models.MoEUTConfig` / ``DenseConfig`` (vocab size is
            set from the tokenizer).
        steps, batch_size, lr, warmup, min_lr_ratio, weight_decay, grad_clip, betas: AdamW with linear warm-up and
            cosine decay to ``min_lr_ratio · lr``; ``batch_size`` problems per step, one per row.
        seed: model initialisation and batch order.
        modules, n_train_per_module, n_eval_per_module, data_seed, train_levels: the generated data (see
            :func:`lmdepth.data.dm_math.load_or_generate`).
        ckpt_every: steps between resume checkpoints.
        eval_every: steps between learning-curve points (exact match on the first ``n_curve`` interpolate and
            extrapolate problems; 0: none). Evaluation leaves the weights and every RNG untouched.
        n_curve: problems per split in each learning-curve point.
        threads: torch CPU threads during training (None: leave as is).
        curriculum_gate: train shortest problems first, admitting the next length once the held-out problems of
            the longest admitted one reach this exact match (:mod:`lmdepth.scratch.curriculum`); None: no
            curriculum, every batch drawn from the whole training set.
        curriculum_every: steps between the curriculum's checks (part of the key with a curriculum: when the next
            length is admitted changes the weights).
    """

    arch: str
    objective: str
    model: dict[str, Any]
    steps: int = 2000
    batch_size: int = 32
    lr: float = 2e-3
    warmup: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    betas: tuple[float, float] = (0.9, 0.98)
    seed: int = 0
    modules: tuple[str, ...] = DEFAULT_MODULES
    n_train_per_module: int = 20_000
    n_eval_per_module: int = 250
    data_seed: int = 0
    train_levels: tuple[str, ...] = TRAIN_LEVELS
    ckpt_every: int = 200
    eval_every: int = 0
    n_curve: int = 200
    threads: int | None = None
    curriculum_gate: float | None = None
    curriculum_every: int = 500

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ParameterError(f"arch must be one of {list(ARCHS)}, got {self.arch!r}.")
        if self.objective not in OBJECTIVES:
            raise ParameterError(f"objective must be one of {list(OBJECTIVES)}, got {self.objective!r}.")

    @property
    def name(self) -> str:
        return f"{self.arch}-{self.objective}"

    def key_params(self) -> dict[str, Any]:
        """The parameters that change the trained weights (not ``ckpt_every``, the learning curve or ``threads``)."""
        d = asdict(self)
        for k in ("ckpt_every", "eval_every", "n_curve", "threads"):
            d.pop(k)
        d["modules"] = list(self.modules)
        if tuple(self.train_levels) == TRAIN_LEVELS:
            d.pop("train_levels")  # the default leaves the run keys unchanged
        else:
            d["train_levels"] = list(self.train_levels)
        d["betas"] = list(self.betas)
        if self.curriculum_gate is None:
            d.pop("curriculum_gate"), d.pop("curriculum_every")  # no curriculum: the run keys as before
        return d

    def key(self) -> str:
        settings = small_module_settings(self.modules)
        extra = {"module_settings": settings} if settings else {}  # the release's modules: keys as before
        blob = json.dumps({**self.key_params(), **extra, "train_version": TRAIN_VERSION,
                           "compute_version": COMPUTE_VERSION}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def model_config(self, vocab_size: int) -> MoEUTConfig | DenseConfig:
        cls = MoEUTConfig if self.arch == "moeut" else DenseConfig
        return cls(vocab_size=vocab_size, **self.model)


# ---- presets -------------------------------------------------------------------------------------------------

#: Run settings per profile.
#:
#: * ``smoke``: seconds; tests and CI.
#: * ``default``: ~1M parameters per model, 16,000 steps of 32 problems (2.6 epochs of 200k generated problems) of
#:   ``add_sub_multiple_small`` (answers in [−49, 49], 2–4 operations; :data:`~lmdepth.data.dm_math.SMALL_MODULES`).
#:   On the release's ``add_sub_multiple``, 1,500 steps left every run at the constant-answer baseline; on the small
#:   module the dense answer-only run sat at 17–20 % exact match from step 1,000 to 6,000, then rose to 52 % by step
#:   13,000 (learning curve in its checkpoint). Sized for a 2-core CPU, one thread per run, two runs side by side:
#:   CPU time per run 3,300–3,460 s for the Transformer and 6,840–6,850 s for MoEUT (5.7 CPU-hours for all four).
#: * ``paper``: the public MoEUT_244M configuration (d_model 1024, 18 depth steps, G = 2, 4 heads of 128, 387 σ-MoE
#:   experts of 128 with top-16, 10 SwitchHead experts with top-2; ≈ 227M parameters with the 99-symbol vocabulary)
#:   and a dense pre-LN baseline of about the same size (18 layers, d_model 1024, d_ff 4096, 16 heads of 64), on
#:   every arithmetic module. The optimiser settings (steps, batch, lr, clipping) are the MoEUT paper's language-model
#:   recipe, not confirmed for the DM-math runs [INFER]; 500k training problems per module instead of v1.0's ~2M.
#:   For a GPU (``device="cuda"``).
PRESETS: dict[str, dict[str, Any]] = {
    "smoke": dict(
        moeut=dict(d_model=32, n_layers=4, n_heads=2, d_head=16, group_size=2, ff_n_experts=8, ff_expert_size=16,
                   ff_k=2, att_n_experts=2, att_k=1),
        transformer=dict(d_model=32, n_layers=4, n_heads=2, d_head=16, d_ff=96),
        train=dict(steps=30, batch_size=8, lr=3e-3, warmup=5, n_train_per_module=120, n_eval_per_module=12,
                   ckpt_every=10),
    ),
    "default": dict(
        moeut=dict(d_model=128, n_layers=8, n_heads=4, d_head=32, group_size=2, ff_n_experts=44, ff_expert_size=32,
                   ff_k=4, att_n_experts=4, att_k=2),
        transformer=dict(d_model=128, n_layers=8, n_heads=4, d_head=32, d_ff=256),
        train=dict(steps=16_000, batch_size=32, lr=2e-3, warmup=200, modules=("add_sub_multiple_small",),
                   n_train_per_module=200_000, n_eval_per_module=500, ckpt_every=500, eval_every=1000, n_curve=200),
        # MoEUT's residual is not normalised between layers (peri-LN): at lr 2e-3 its largest activation grew
        # ~10x per layer (1.4e10 at the last layer by step 1,000) and overflowed at step 3,239; at 1e-3: 20.
        train_moeut=dict(lr=1e-3),
    ),
    "paper": dict(
        moeut=dict(d_model=1024, n_layers=18, n_heads=4, d_head=128, group_size=2, ff_n_experts=387,
                   ff_expert_size=128, ff_k=16, att_n_experts=10, att_k=2),
        transformer=dict(d_model=1024, n_layers=18, n_heads=16, d_head=64, d_ff=4096),
        train=dict(steps=100_000, batch_size=64, lr=2.5e-4, warmup=4000, weight_decay=0.01, grad_clip=0.25,
                   modules=ARITHMETIC_MODULES, n_train_per_module=500_000, n_eval_per_module=834, ckpt_every=1000),
    ),
}
PRESETS["quick"] = PRESETS["default"]  # the `quick` book profile reads the default runs (nothing to train)


def run_config(profile: str, arch: str, objective: str, **overrides: Any) -> TrainConfig:
    """The :class:`TrainConfig` of one run of a profile (``smoke``, ``default``, ``paper``), with overrides.

    ``overrides`` may set any :class:`TrainConfig` field; ``model={...}`` updates the model keywords. A preset's
    ``train_<arch>`` block overrides its ``train`` block for that architecture.
    """
    if profile not in PRESETS:
        raise ParameterError(f"profile must be one of {list(PRESETS)}, got {profile!r}.")
    p = PRESETS[profile]
    model = {**p[arch], **overrides.pop("model", {})} if arch in p else overrides.pop("model", {})
    return TrainConfig(arch=arch, objective=objective, model=model,
                       **{**p["train"], **p.get(f"train_{arch}", {}), **overrides})


#: Chapter 07's comparison runs (:func:`matched_configs`): one learning rate for both architectures (1e-3, the
#: largest at which MoEUT trains without overflowing; the ``default`` preset trains the Transformer at 2e-3) and three
#: training seeds per (architecture, objective), so that the claims compare architectures, not learning rates or
#: one lucky seed.
MATCHED_LR = 1e-3
MATCHED_SEEDS = (0, 1, 2)
#: Every recipe gets two more seeds: chapter 07's rows are decided by a sign-flip test over seeds, whose p-value
#: cannot go below 1/8 with three seeds (1/32 with five). The question-not-modelled runs got them first (the
#: MoEUT − Transformer depth rows); the question-modelled ones follow (2026-12-01), so that no row of the chapter is
#: inconclusive only for lack of seeds.
PAIR_SEEDS = MATCHED_SEEDS + (3, 4)
SEEDS_OF = {"answer_only": PAIR_SEEDS, "lm": PAIR_SEEDS}


def matched_configs(profile: str = "default") -> list[TrainConfig]:
    """Chapter 07's comparison runs of ``profile``, in training order: answer-only first (the objective of the
    chapter's headline rows), then seed by seed (:data:`SEEDS_OF`), the Transformer before MoEUT. In the ``default``
    profile MoEUT's seed-0 runs are the chapter's own runs. Trained by ``scripts/train_matched_runs.py`` (hours on a
    CPU), never by the book."""
    return [run_config(profile, arch, objective, lr=MATCHED_LR, seed=seed, threads=1)
            for objective in ("answer_only", "lm") for seed in SEEDS_OF[objective] for arch in ("transformer", "moeut")]


#: The depth score's positive control (chapter 07; :mod:`lmdepth.data.op_chains`): chapter 07's answer-only
#: Transformer on chains of 1 … 6 operations mod 10 instead of sums, with a curriculum over lengths
#: (:mod:`lmdepth.scratch.curriculum`: the next length joins once 90 % of 100 held-out problems of the longest
#: admitted one are answered, checked every 250 steps), 128 problems a step, every training problem drawn about once.
#: History, each change made before any depth of a chain run was measured:
#:
#: * 2026-12-01: pointer chains (:mod:`lmdepth.data.chains`), 32 problems a step, 30,000 steps;
#: * 2026-12-02: the curriculum over hops (gate 0.9; seed 0 without it at step 9,000: 32.5 % interpolation exact
#:   match, the twin-guessing level about 44 %); that run never passed one-hop chains by step 20,500;
#: * 2026-12-03: operation chains instead (no pointer-chain recipe piloted learned one-hop lookups above 35 %), 128
#:   problems a step (at 32 a step the pilot took 12,000 steps to reach two operations at 76 %; at 128 it had every
#:   length by step 7,000), checks every 250 steps as in the pilot, 16,000 steps (~1.7 CPU-hours at 0.37 CPU-s a
#:   step, one thread), 1,000,000 training problems.
CHAIN_MODULE = "op_chain"
CHAIN_STEPS = {"default": 16_000, "quick": 16_000, "smoke": 30}  # the paper profile has none (no GPU run planned)
_CHAIN_TRAIN = dict(batch_size=128, n_train_per_module=1_000_000, curriculum_every=250)
CHAIN_TRAIN = {"default": _CHAIN_TRAIN, "quick": _CHAIN_TRAIN, "smoke": {}}  # the smoke preset's own sizes
CHAIN_SEEDS = PAIR_SEEDS
CHAIN_ARCHS = ("transformer",)  # MoEUT once the Transformer's seeds are in
CHAIN_CURRICULUM_GATE = 0.9
#: Snapshots over training: the depth score at ~10 % steps (scripts/train_matched_runs.py writes them).
SNAPSHOTS_PER_RUN = 10


def chain_configs(profile: str = "default", archs: tuple[str, ...] = CHAIN_ARCHS) -> list[TrainConfig]:
    """The positive-control runs of ``profile`` (answer-only, :data:`MATCHED_LR`, :data:`CHAIN_SEEDS`, the curriculum
    of :data:`CHAIN_CURRICULUM_GATE`), seed by seed (none for a profile without :data:`CHAIN_STEPS`)."""
    if profile not in CHAIN_STEPS:
        return []
    return [run_config(profile, arch, "answer_only", lr=MATCHED_LR, seed=seed, threads=1, modules=(CHAIN_MODULE,),
                       steps=CHAIN_STEPS[profile], curriculum_gate=CHAIN_CURRICULUM_GATE, **CHAIN_TRAIN[profile])
            for seed in CHAIN_SEEDS for arch in archs]


# ---- data ------------------------------------------------------------------------------------------------------

def load_data(cfg: TrainConfig, cache_dir: str | Path) -> MathData:
    """The run's generated data (cached under ``cache_dir/dm_math``)."""
    return load_or_generate(cache_dir, cfg.modules, cfg.n_train_per_module, cfg.n_eval_per_module, cfg.data_seed,
                            cfg.train_levels)


def batch_indices(step: int, n: int, batch_size: int, seed: int) -> torch.Tensor:
    """Example indices of training step ``step``: epochs are seeded permutations, so this needs no state."""
    start = step * batch_size
    out = []
    while len(out) < batch_size:
        epoch, offset = divmod(start, n)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))
        take = perm[offset : offset + batch_size - len(out)].tolist()
        out += take
        start += len(take)
    return torch.tensor(out)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to ``lr``, then cosine decay to ``min_lr_ratio · lr`` at ``steps``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


def loss_mask(batch: Any, objective: str) -> torch.Tensor:
    """[B, T−1] bool: which next-token targets carry loss. ``lm``: every real token after BOS; ``answer_only``: the
    answer tokens and the EOS."""
    return (batch.pad_mask if objective == "lm" else batch.answer_mask)[:, 1:]


def lm_loss(model: ScratchLM, batch: Any, objective: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-mean cross-entropy over the objective's targets, and the expert-balance regulariser.

    Returns:
        (task loss, auxiliary loss), scalars.
    """
    logits = model(batch.ids).logits[:, :-1]
    mask = loss_mask(batch, objective)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), batch.ids[:, 1:].reshape(-1), reduction="none")
    task = (ce * mask.reshape(-1)).sum() / mask.sum().clamp_min(1)
    return task, model.aux_loss().to(task)


# ---- checkpoints -----------------------------------------------------------------------------------------------

def run_dir(cfg: TrainConfig, out_dir: str | Path) -> Path:
    """A training run's folder under ``out_dir``: ``<name>-<key>``, the key a digest of its settings."""
    return Path(out_dir) / f"{cfg.name}-{cfg.key()}"


def _rng_state() -> dict[str, Any]:
    """Every RNG's state as tensors and plain numbers, so checkpoints load with ``weights_only=True``."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                      "has_gauss": int(has_gauss), "gauss": float(gauss)}}


def _set_rng_state(s: dict[str, Any]) -> None:
    torch.set_rng_state(s["torch"])
    random.setstate(s["python"])
    n = s["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))


def safe_load(path: Path, device: str | torch.device = "cpu") -> dict[str, Any]:
    """``torch.load`` that never executes code from the file (``weights_only=True``): a checkpoint holding
    anything but tensors, numbers, strings and containers is refused with a clear error."""
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as e:
        raise DataError(f"{path} is not a plain checkpoint of tensors and numbers (it would run code when "
                        f"loaded), so it is refused: {str(e).splitlines()[0]}. Retrain it, or use the committed "
                        "checkpoints.") from None
    except (RuntimeError, EOFError, OSError) as e:  # a cut or empty file: torch's zip reader or the unpickler
        if not Path(path).exists():
            raise
        raise DamagedFile(f"{path} is damaged and cannot be read ({Path(path).stat().st_size:,} bytes; "
                          f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'ends early'}).") from None


def readable(path: Path) -> bool:
    """Whether ``path`` is a whole checkpoint file: torch saves a zip, whose directory sits at its end, so a cut or
    empty file is told apart without loading it."""
    return zipfile.is_zipfile(path)


def resume_state(ckpt: Path, device: str | torch.device = "cpu") -> dict[str, Any] | None:
    """A resume checkpoint's contents; None when there is none, or when it is damaged (cut, empty) and untracked:
    then it is moved aside (:func:`set_aside`, one line says so) and the run starts from step 0. A damaged checkpoint
    that git tracks is refused in one line (restoring it is its owner's call)."""
    if not ckpt.exists():
        return None
    try:
        return safe_load(ckpt, device)
    except DamagedFile as e:
        tracked = git_tracked(ckpt.parent)
        if tracked is None or ckpt.name in tracked:
            raise DamagedFile(f"{e} It is tracked by git (or git cannot be asked): restore it with `git checkout -- "
                              f"{ckpt}`, or remove it with `git rm` to train the run from step 0.") from None
        print(f"lmdepth: {e} Moved aside to {set_aside(ckpt).name}; training the run from step 0.", file=sys.stderr,
              flush=True)
        return None


def whole(final: Path) -> Path:
    """A finished run's ``model.pt``, refused in one line when it is damaged (a cut file is not a finished run)."""
    if not readable(final):
        raise DamagedFile(f"{final} is damaged (cut or empty: {final.stat().st_size:,} bytes), so the run is not "
                          f"finished; restore it (`git checkout -- {final}` where git tracks it) or delete it to "
                          "train the run again.")
    return final


def set_aside(path: Path) -> Path:
    """Move a damaged, untracked file aside as a hidden ``.<name>.damaged-<UTC time>`` beside it (git ignores it,
    nothing is deleted); returns where it went."""
    aside = path.with_name(f".{path.name}.damaged-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}")
    os.rename(path, aside)
    return aside


def _progress_bar(total: int, initial: int, desc: str, show: bool = True):
    if not show or os.environ.get("LMDEPTH_PROGRESS", "1") == "0":
        return None
    from tqdm.std import tqdm

    return tqdm(total=total, initial=initial, desc=desc, file=sys.stderr, mininterval=2.0, dynamic_ncols=True)


def _tick(bar: Any, loss: float | None) -> None:
    """One step on the progress bar (None: no bar), with the running loss beside it."""
    if bar is not None:
        bar.update(1)
        bar.set_postfix(loss="nan" if loss is None else f"{loss:.3f}", refresh=False)


def guarded_step(opt: torch.optim.Optimizer, params: list[torch.nn.Parameter], grad_clip: float | None, step: int,
                 skipped: list[int], name: str, ckpt: Path) -> None:
    """Clip the gradient (``grad_clip`` None or 0: not at all) and step the optimiser — unless the gradient's norm
    is not finite (a NaN/inf loss or gradient): one poisoned update would make every later weight NaN, so the step
    is recorded in ``skipped`` instead, and :data:`MAX_CONSECUTIVE_SKIPS` in a row end the run with
    :class:`TrainingDiverged` (its last checkpoint, ``ckpt``, kept)."""
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip or math.inf)  # max_norm inf: the gradient as it is
    if torch.isfinite(norm):
        opt.step()
        return
    skipped.append(step)
    if skipped[-MAX_CONSECUTIVE_SKIPS:] == list(range(step - MAX_CONSECUTIVE_SKIPS + 1, step + 1)):
        raise TrainingDiverged(f"{name}: {MAX_CONSECUTIVE_SKIPS} non-finite gradients in a row up to step {step}; the "
                               f"last checkpoint ({ckpt}) is kept. Lower the learning rate (`lr`) or raise `warmup`.")


#: ``on_snapshot(step, model, tok)``: called with the model in eval mode and gradients off (see :func:`train_run`).
Snapshot = Callable[[int, ScratchLM, CharTokenizer], None]


def _optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on the matrices but the embeddings (biases, norms and embeddings undecayed)."""
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=cfg.betas)


def _resume(ckpt: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, device: str
            ) -> tuple[int, list, list, float, float, list, dict[str, list]]:
    """Load a resume checkpoint into ``model``, ``opt`` and the RNGs (nothing when there is none); returns (step,
    loss history, learning curve, wall s, CPU s, skipped updates, the curriculum's record: its stages and checks)."""
    state = resume_state(ckpt, device)
    if state is None:
        return 0, [], [], 0.0, 0.0, [], {"stages": [], "checks": []}
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    _set_rng_state(state["rng"])
    return (state["step"], state["history"], state.get("curve", []), state["wall_time_s"], state.get("cpu_time_s", 0.0),
            state.get("skipped_updates", []),
            {"stages": state.get("curriculum", []), "checks": state.get("curriculum_checks", [])})


def _batch_of(step: int, cfg: TrainConfig, n: int, course: Curriculum | None) -> torch.Tensor:
    """[batch_size] indices of step ``step``'s problems: from all ``n`` training problems, or from the curriculum
    stage's pool, its epochs counted from the stage's first step."""
    if course is None:
        return batch_indices(step, n, cfg.batch_size, cfg.seed)
    first, pool = course.stage_of(step)
    return pool[batch_indices(step - first, len(pool), cfg.batch_size, cfg.seed)]


def _due(step: int, cfg: TrainConfig, snapshot_every: int) -> tuple[bool, bool, bool]:
    """Whether a learning-curve point, a snapshot and a resume checkpoint are due after ``step``."""
    return (bool(cfg.eval_every) and (step % cfg.eval_every == 0 or step == cfg.steps),
            bool(snapshot_every) and step % snapshot_every == 0,
            step % cfg.ckpt_every == 0 and step < cfg.steps)


def train_run(
    cfg: TrainConfig,
    out_dir: str | Path,
    data_dir: str | Path | None = None,
    stop_after: int | None = None,
    progress: bool = True,
    device: str = "cpu",
    on_snapshot: Snapshot | None = None,
    snapshot_every: int = 0,
) -> Path | None:
    """Train one run, resuming from its checkpoint; a no-op when the finished model already exists.

    Args:
        cfg: the run.
        out_dir: where runs live (``<out_dir>/<arch>-<objective>-<key>/``).
        data_dir: cache of the generated data (default: ``out_dir``).
        stop_after: train at most this many steps in this call, then checkpoint and return None (to spread a
            long run over several calls; the next call resumes).
        progress: show a text progress bar with the running loss (off when ``LMDEPTH_PROGRESS=0``).
        device: ``"cpu"`` or ``"cuda"``.
        on_snapshot, snapshot_every: called at step 0 and at every multiple of ``snapshot_every`` steps (the last
            step too when ``steps`` is a multiple), outside the run's timed training; it must leave every RNG
            untouched (an evaluation does), so that the weights are those of a run without snapshots. A run resumed
            at a multiple calls it again there (a writer that keeps what it has already written makes that free).

    Returns:
        The path of the finished ``model.pt``, or None if the call stopped before the last step.
    """
    rd = run_dir(cfg, out_dir)
    final, ckpt = rd / "model.pt", rd / "ckpt.pt"
    if final.exists():
        return whole(final)
    torch.set_num_threads(cfg.threads or torch.get_num_threads())
    data = load_data(cfg, data_dir or out_dir)
    tok = CharTokenizer()
    model = build_model(cfg.model_config(tok.vocab_size), seed=cfg.seed).to(device).train()
    opt = _optimizer(model, cfg)
    step, history, curve, wall, cpu, skipped, record = _resume(ckpt, model, opt, device)
    probes = {s: data.split(s)[: cfg.n_curve] for s in ("interpolate", "extrapolate")}
    course = Curriculum.of(cfg.curriculum_gate, data.train, record["stages"], record["checks"])  # keeps both lists
    # the curriculum's record travels with the run only when there is one
    taught = {} if course is None else {"curriculum": course.stages, "curriculum_checks": course.checks_made}

    def curve_point() -> None:
        """(step, interpolate exact match, extrapolate exact match) on the fixed learning-curve problems."""
        model.eval()
        ems = [float(exact_match(model, tok, ex, device=device).mean()) for ex in probes.values()]
        model.train()
        curve.append((step, *ems))

    def save_ckpt() -> None:
        state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step, "history": history,
                 "curve": curve, "wall_time_s": wall, "cpu_time_s": cpu, "rng": _rng_state(), "train_config": cfg.key_params(),
                 "skipped_updates": skipped, **taught}
        atomic_write(ckpt, lambda tmp: torch.save(state, tmp))

    def snapshot() -> None:
        model.eval()
        with torch.no_grad():
            on_snapshot(step, model, tok)
        model.train()

    every = snapshot_every if on_snapshot else 0
    if _due(step, cfg, every)[1]:
        snapshot()
    end = cfg.steps if stop_after is None else min(cfg.steps, step + stop_after)
    bar = _progress_bar(cfg.steps, step, cfg.name, show=progress)
    t0, c0 = time.time(), time.process_time()  # wall and this process's CPU time (all threads)

    def lap() -> None:
        """Add the time since the last lap to the run's wall and CPU time."""
        nonlocal wall, cpu, t0, c0
        wall, cpu = wall + time.time() - t0, cpu + time.process_time() - c0
        t0, c0 = time.time(), time.process_time()

    def between_steps() -> None:
        """The learning curve, snapshots and checkpoints due after this step (none of it is training time)."""
        nonlocal t0, c0
        lap()
        course and course.check_due(step, cfg.curriculum_every, cfg.steps, model, tok, device)  # before the ckpt
        for go, act in zip(_due(step, cfg, every), (curve_point, snapshot, save_ckpt)):
            if go:
                act()
        t0, c0 = time.time(), time.process_time()

    running = None
    try:
        while step < end:
            idx = _batch_of(step, cfg, len(data.train), course)
            batch = collate(tok, [data.train[i] for i in idx.tolist()])
            batch = type(batch)(*(t.to(device) for t in (batch.ids, batch.answer_mask, batch.pad_mask, batch.a_start)))
            for g in opt.param_groups:
                g["lr"] = lr_at(step, cfg)
            task, aux = lm_loss(model, batch, cfg.objective)
            opt.zero_grad(set_to_none=True)
            (task + aux).backward()
            guarded_step(opt, list(model.parameters()), cfg.grad_clip, step, skipped, cfg.name, ckpt)
            step += 1
            value = task.item()
            if math.isfinite(value):
                running = value if running is None else 0.98 * running + 0.02 * value
            history.append((step, value))
            _tick(bar, running)
            between_steps()
    finally:
        if bar is not None:
            bar.close()
    lap()
    if step < cfg.steps:
        save_ckpt()
        return None

    meta = {"run": cfg.name, "key": cfg.key(), "train_config": cfg.key_params(), "n_parameters": count_parameters(model),
            "active_parameters": active_parameters(model.config), "wall_time_s": round(wall, 1), "cpu_time_s": round(cpu, 1),
            "steps_per_s": round(cfg.steps / wall, 3) if wall else None, "skipped_updates": skipped, "data": data.meta,
            **taught,
            "objective_label": OBJECTIVE_LABELS[cfg.objective], "environment": environment()}
    trained = {"config": model.config.to_dict(), "state_dict": model.state_dict(), "tokenizer": tok.to_dict(),
               "history": history, "curve": curve, "meta": meta}
    atomic_write(final, lambda tmp: torch.save(trained, tmp))
    atomic_write_text(rd / "meta.json", json.dumps(meta, indent=2, default=str))
    discard(ckpt)  # unless git tracks it
    return final


def load_trained(path: str | Path, device: str = "cpu") -> tuple[ScratchLM, CharTokenizer, dict[str, Any]]:
    """Load a finished run: (model in eval mode, tokenizer, meta including the loss ``history``)."""
    state = safe_load(Path(path), device)
    model = ScratchLM(config_from_dict(state["config"])).to(device)
    model.load_state_dict(state["state_dict"])
    return model.eval(), CharTokenizer.from_dict(state["tokenizer"]), {**state["meta"], "history": state["history"],
                                                                       "curve": state.get("curve", [])}


# ---- evaluation --------------------------------------------------------------------------------------------------


def train_all(profile: str, out_dir: str | Path, archs=ARCHS, objectives=OBJECTIVES, device: str = "cpu",
              data_dir: str | Path | None = None, progress: bool = True, stop_after: int | None = None,
              **overrides: Any) -> dict[str, Path | None]:
    """:func:`train_run` for every (arch, objective) of a profile; returns ``{run name: model.pt}``.

    ``device``, ``data_dir``, ``progress`` and ``stop_after`` go to :func:`train_run`; ``overrides`` to the configs."""
    out = {}
    for arch in archs:
        for obj in objectives:
            cfg = run_config(profile, arch, obj, **overrides)
            out[cfg.name] = train_run(cfg, out_dir, data_dir=data_dir, stop_after=stop_after, progress=progress,
                                      device=device)
    return out


__all__ = ["TrainConfig", "PRESETS", "ARCHS", "OBJECTIVES", "OBJECTIVE_LABELS", "run_config", "train_run",
           "train_all", "load_trained", "load_data", "lm_loss", "loss_mask", "batch_indices", "lr_at", "run_dir"]
