"""Fine-tuning a packaged pretrained model on DeepMind Mathematics (chapter 07, "Does depth grow with the problem?";
the paper's appendix fine-tunes Llama-3.2-3B on DM math and finds its depth use unchanged).

The paper fine-tunes every weight. Here the trainable weights are LoRA adapters on every linear map of every layer
(:data:`LORA_TARGETS`, via ``peft``), merged into the base weights before any analysis: a run spans several
sessions of a 2-core CPU, and its resume checkpoint must be committed between them — the full model's weights and
AdamW moments are 1.6 GB, the adapters' 29 MB. The difference is stated on the chapter's page.

* Objective: the loss on the answer tokens and the EOS only (the authors' ``hf.target_only``), on the problems and
  batches of chapter 07's default runs (:func:`lmdepth.scratch.training.batch_indices`, the same warm-up and cosine
  schedule :func:`~lmdepth.scratch.training.lr_at`).
* Resumable to the same bytes: model adapters, optimiser, step, loss history and every RNG state are checkpointed
  atomically every ``ckpt_every`` steps; the batch of step i is a pure function of (seed, i).
* Snapshots over training: at step 0 (the pretrained model) and every ``ckpt_every`` steps, ``on_snapshot(step,
  model)`` is called with the merged-in-place model in eval mode (chapter 07 measures exact match and the depth
  score there; :mod:`scripts/finetune_runs.py`); what it stores is the run's own business.
* The finished run is ``<out_dir>/<model>-ft-<key>/adapter.pt`` (adapter weights, configuration, loss history,
  provenance) beside ``meta.json``; :func:`load_finetuned` returns the base model with the adapters merged.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from lmdepth import COMPUTE_VERSION
from lmdepth.data.dm_math import MathData, load_or_generate, small_module_settings
from lmdepth.data.dm_tokens import PretrainedTokenizer, collate
from lmdepth.errors import MissingPackageError
from lmdepth.model.registry import load_model
from lmdepth.results import atomic_write, atomic_write_text, discard, slug
from lmdepth.runtime import environment
from lmdepth.scratch.training import (
    _progress_bar,
    _rng_state,
    _set_rng_state,
    _tick,
    batch_indices,
    guarded_step,
    lr_at,
    resume_state,
    safe_load,
    whole,
)

#: Every linear map of a Llama-family layer (attention and MLP): the adapters reach every weight matrix a full
#: fine-tune of the layers would change (not the embeddings, the norms or the tied unembedding).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: Bump when a change to this code changes the trained adapters; part of every run key.
FINETUNE_VERSION = 1

Snapshot = Callable[[int, torch.nn.Module, PretrainedTokenizer], None]


@dataclass(frozen=True)
class FinetuneConfig:
    """Everything that determines one fine-tuned model.

    Attributes:
        model: a packaged model's short name (or any name :func:`lmdepth.model.registry.load_model` takes).
        rank, alpha: LoRA rank and scale (``alpha / rank`` multiplies the adapter's output).
        steps, batch_size, lr, warmup, min_lr_ratio, weight_decay, grad_clip, betas: AdamW on the adapters with
            linear warm-up and cosine decay; ``batch_size`` problems per step.
        seed: adapter initialisation and batch order.
        modules, n_train_per_module, n_eval_per_module, data_seed: the generated data (chapter 07's default runs').
        ckpt_every: steps between resume checkpoints and snapshots (~10 % of training).
        threads: torch CPU threads (None: leave as is).
    """

    model: str = "smollm2-135m"
    rank: int = 8
    alpha: float = 16.0
    steps: int = 1000
    batch_size: int = 16
    lr: float = 1e-3
    warmup: int = 50
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    betas: tuple[float, float] = (0.9, 0.98)
    seed: int = 0
    modules: tuple[str, ...] = ("add_sub_multiple_small",)
    n_train_per_module: int = 200_000
    n_eval_per_module: int = 500
    data_seed: int = 0
    ckpt_every: int = 100
    threads: int | None = None

    @property
    def name(self) -> str:
        """``<model>-ft``, the model's folder name where it is a local directory."""
        return f"{slug(Path(self.model).name)}-ft"

    def key(self) -> str:
        d = asdict(self)
        for k in ("ckpt_every", "threads"):
            d.pop(k)
        d.update(modules=list(self.modules), betas=list(self.betas), module_settings=small_module_settings(self.modules),
                 finetune_version=FINETUNE_VERSION, compute_version=COMPUTE_VERSION)
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


#: Chapter 07's fine-tuned runs: three seeds of the default configuration.
FINETUNE_SEEDS = (0, 1, 2)


def finetune_configs() -> list[FinetuneConfig]:
    """The fine-tuned runs chapter 07 reads, in training order (``scripts/finetune_runs.py`` trains them)."""
    return [FinetuneConfig(seed=s, threads=1) for s in FINETUNE_SEEDS]


def finetune_dir(cfg: FinetuneConfig, out_dir: str | Path) -> Path:
    """A fine-tuning run's folder: ``<out_dir>/<model>-ft-<key>``."""
    return Path(out_dir) / f"{cfg.name}-{cfg.key()}"


def load_data(cfg: FinetuneConfig, cache_dir: str | Path) -> MathData:
    return load_or_generate(cache_dir, cfg.modules, cfg.n_train_per_module, cfg.n_eval_per_module, cfg.data_seed)


def with_adapters(cfg: FinetuneConfig) -> tuple[Any, PretrainedTokenizer]:
    """The base model with freshly initialised adapters (seeded) and its tokenizer."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise MissingPackageError("Fine-tuning needs the package 'peft': pip install peft") from None
    lm = load_model(cfg.model, check=False)
    torch.manual_seed(cfg.seed)
    model = get_peft_model(lm.model, LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=0.0,
                                                target_modules=list(LORA_TARGETS)))
    return model, PretrainedTokenizer(lm.tokenizer)


def _adapter_state(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def answer_loss(model: Any, batch: Any) -> torch.Tensor:
    """Token-mean cross-entropy on the answer tokens and the EOS; the unembedding is applied at those positions only
    (the vocabulary of a pretrained model makes full logits the costliest part of a step)."""
    body = model.get_base_model().model
    hidden = body(input_ids=batch.ids, attention_mask=batch.pad_mask.long()).last_hidden_state[:, :-1]  # [B, T−1, D]
    mask = batch.answer_mask[:, 1:]
    logits = model.get_base_model().lm_head(hidden[mask])  # [answer tokens, V]
    return F.cross_entropy(logits.float(), batch.ids[:, 1:][mask])


def finetune_run(cfg: FinetuneConfig, out_dir: str | Path, data_dir: str | Path, on_snapshot: Snapshot | None = None,
                 stop_after: int | None = None, progress: bool = True) -> Path | None:
    """Fine-tune one run, resuming from its checkpoint; a no-op when ``adapter.pt`` exists.

    Args:
        stop_after: train at most this many steps in this call, then checkpoint and return None.
        on_snapshot: called as ``on_snapshot(step, model, tok)`` at step 0 and at every checkpoint step, the model
            in eval mode (the adapters active), before the checkpoint is written; an interrupted run calls it again
            for a step whose checkpoint was not written.

    Returns:
        The finished ``adapter.pt``, or None if the call stopped before the last step.
    """
    rd = finetune_dir(cfg, out_dir)
    final, ckpt = rd / "adapter.pt", rd / "ckpt.pt"
    if final.exists():
        return whole(final)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    data = load_data(cfg, data_dir)
    model, tok = with_adapters(cfg)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    step, history, wall, cpu, skipped = 0, [], 0.0, 0.0, []
    state = resume_state(ckpt)
    if state is not None:
        model.load_state_dict(state["adapters"], strict=False)
        opt.load_state_dict(state["optimizer"])
        step, history, wall, cpu, skipped = (state["step"], state["history"], state["wall_time_s"], state["cpu_time_s"],
                                             state["skipped_updates"])
        _set_rng_state(state["rng"])
    rd.mkdir(parents=True, exist_ok=True)

    def snapshot() -> None:
        if on_snapshot is not None:
            model.eval()
            with torch.no_grad():
                on_snapshot(step, model, tok)
            model.train()

    def save_ckpt() -> None:
        state = {"adapters": _adapter_state(model), "optimizer": opt.state_dict(), "step": step, "history": history,
                 "wall_time_s": wall, "cpu_time_s": cpu, "rng": _rng_state(), "skipped_updates": skipped}
        atomic_write(ckpt, lambda tmp: torch.save(state, tmp))

    if step == 0:
        snapshot()
    model.train()
    end = cfg.steps if stop_after is None else min(cfg.steps, step + stop_after)
    bar = _progress_bar(cfg.steps, step, f"{cfg.name} seed {cfg.seed}") if progress else None
    t0, c0 = time.time(), time.process_time()
    try:
        while step < end:
            idx = batch_indices(step, len(data.train), cfg.batch_size, cfg.seed)
            batch = collate(tok, [data.train[i] for i in idx.tolist()])
            for g in opt.param_groups:
                g["lr"] = lr_at(step, cfg)
            loss = answer_loss(model, batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            guarded_step(opt, trainable, cfg.grad_clip, step, skipped, cfg.name, ckpt)
            step += 1
            history.append((step, loss.item()))
            _tick(bar, loss.item())
            if step % cfg.ckpt_every == 0 or step == end:
                wall, cpu = wall + time.time() - t0, cpu + time.process_time() - c0
                if step % cfg.ckpt_every == 0 or step == cfg.steps:
                    snapshot()
                if step < cfg.steps:
                    save_ckpt()
                t0, c0 = time.time(), time.process_time()
    finally:
        if bar is not None:
            bar.close()
    if step < cfg.steps:
        return None
    meta = {"run": cfg.name, "key": cfg.key(), "finetune_config": {**asdict(cfg), "modules": list(cfg.modules)},
            "n_trainable": sum(p.numel() for p in trainable), "wall_time_s": round(wall, 1), "cpu_time_s": round(cpu, 1),
            "skipped_updates": skipped, "data": data.meta, "environment": environment()}
    atomic_write(final, lambda tmp: torch.save({"adapters": _adapter_state(model), "history": history, "meta": meta},
                                               tmp))
    atomic_write_text(rd / "meta.json", json.dumps(meta, indent=2, default=str))
    discard(ckpt)  # unless git tracks it
    return final


def load_finetuned(path: str | Path, cfg: FinetuneConfig) -> tuple[torch.nn.Module, PretrainedTokenizer, dict[str, Any]]:
    """A finished run: (the base model with its adapters merged into the weights, in eval mode — a plain
    transformers model that every analysis of the book takes —, its tokenizer, meta with the loss ``history``)."""
    state = safe_load(Path(path))
    model, tok = with_adapters(cfg)
    model.load_state_dict(state["adapters"], strict=False)
    return model.merge_and_unload().eval(), tok, {**state["meta"], "history": state["history"]}


__all__ = ["FinetuneConfig", "LORA_TARGETS", "FINETUNE_SEEDS", "finetune_configs", "finetune_dir", "finetune_run",
           "load_finetuned", "answer_loss"]
