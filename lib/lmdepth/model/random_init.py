"""Random-init controls: a model of a named model's exact architecture whose weights were never trained.

``random-init:smollm2-135m`` has SmolLM2-135M's config and tokenizer and weights drawn by the family's own
initialiser (transformers' ``_init_weights``, seeded). A claim check that such a model also passes measures the
architecture (a residual stream that accumulates), not what training made of it (book/method.md#method-controls).
"""

from __future__ import annotations

from typing import Any

import torch

PREFIX = "random-init:"
SEED = 0  # fixed, so the control is the same model on every machine


def is_random_init(name: object) -> bool:
    """Whether ``name`` is a random-init control's name (``random-init:X``)."""
    return isinstance(name, str) and name.startswith(PREFIX)


def base_name(name: str) -> str:
    """``random-init:X`` → ``X``."""
    return name[len(PREFIX):]


def control_name(name: str) -> str:
    """The random-init control of a model name."""
    return f"{PREFIX}{name}"


def weights_id(base_weights_id: str) -> str:
    """Identifies the control's weights: the base config (through its weights id) and the seed."""
    return f"{PREFIX}{base_weights_id}:seed{SEED}"


def build(path: str, dtype: torch.dtype) -> Any:
    """A causal LM with the config found at ``path`` and freshly initialised weights (seed :data:`SEED`; the global
    RNG state is restored afterwards)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return AutoModelForCausalLM.from_config(config, dtype=dtype)
