"""Architecture adapters: everything the library knows about where things live inside a model.

All architecture knowledge is in this module (as in tuned-lens' ``model_surgery``): the layer list, the
residual taps, which modules write the attention and MLP contributions into the residual stream, the final norm,
the unembedding and the BOS policy. One explicit ladder maps ``config.model_type`` to a family and raises on
anything unknown, so a new architecture fails loudly instead of producing silently wrong numbers.

Notation (book/method.md#method-models, pre-LN transformer), for layer l = 0..L-1::

    a_l = attention contribution, m_l = MLP contribution, h_{l+1} = h_l + a_l + m_l

For Llama/Qwen the contributions are the raw ``self_attn`` / ``mlp`` outputs. For Gemma 3 and OLMo 2 ("sandwich"
norms) they are the outputs of ``post_attention_layernorm`` / ``post_feedforward_layernorm``; the raw sublayer
outputs are wrong there by ~100 %. Same module name, different role: hence one spec per family.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from torch import nn

from lmdepth.errors import UnsupportedArchitectureError
from lmdepth.model.paths import resolve
from lmdepth.model.unembed import Unembedding


@dataclass(frozen=True)
class FamilySpec:
    """Module paths of one architecture family (relative to the causal-LM model, or to one decoder layer).

    Attributes:
        name: family name shown to users.
        model_types: ``config.model_type`` values that belong to this family.
        layers: path of the decoder-layer ``ModuleList``.
        final_norm: path of the norm applied before the unembedding.
        lm_head: path of the unembedding.
        attn_contrib: (path inside a layer, output index or None) of the module whose output is a_l.
        mlp_contrib: same for m_l.
        sandwich_norms: True when the contributions are the outputs of post-sublayer norms.
    """

    name: str
    model_types: tuple[str, ...]
    attn_contrib: tuple[str, int | None]
    mlp_contrib: tuple[str, int | None]
    layers: str = "model.layers"
    final_norm: str = "model.norm"
    lm_head: str = "lm_head"
    sandwich_norms: bool = False


_LLAMA_LIKE = dict(attn_contrib=("self_attn", 0), mlp_contrib=("mlp", None))
_SANDWICH = dict(
    attn_contrib=("post_attention_layernorm", None),
    mlp_contrib=("post_feedforward_layernorm", None),
    sandwich_norms=True,
)

FAMILIES: tuple[FamilySpec, ...] = (
    FamilySpec("llama", ("llama", "mistral"), **_LLAMA_LIKE),
    FamilySpec("qwen2", ("qwen2",), **_LLAMA_LIKE),
    FamilySpec("qwen3", ("qwen3",), **_LLAMA_LIKE),
    FamilySpec("gemma3", ("gemma3_text", "gemma2"), **_SANDWICH),
    FamilySpec("olmo2", ("olmo2",), **_SANDWICH),
)


def supported_model_types() -> list[str]:
    """All ``config.model_type`` values with an adapter."""
    return sorted(t for f in FAMILIES for t in f.model_types)


def family_for(model_type: str) -> FamilySpec:
    """Return the family of a ``config.model_type``; raise a clear error for unknown architectures."""
    for fam in FAMILIES:
        if model_type in fam.model_types:
            return fam
    raise UnsupportedArchitectureError(
        f"No adapter for architecture {model_type!r}. Supported: {', '.join(supported_model_types())}. "
        "To add one, append a FamilySpec to lmdepth.model.families.FAMILIES naming the modules whose outputs are "
        "added to the residual stream; the additivity self-check then verifies it on load."
    )


@dataclass
class ModelAdapter:
    """Typed access to one model's residual stream.

    Attributes:
        model: the causal LM (``...ForCausalLM``).
        family: the family spec it was matched to.
    """

    model: nn.Module
    family: FamilySpec

    @classmethod
    def for_model(cls, model: nn.Module) -> "ModelAdapter":
        """Build the adapter from ``model.config.model_type``."""
        return cls(model=model, family=family_for(model.config.model_type))

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def d_model(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def layers(self) -> nn.ModuleList:
        return resolve(self.model, self.family.layers)

    @property
    def final_norm(self) -> nn.Module:
        return resolve(self.model, self.family.final_norm)

    @property
    def lm_head(self) -> nn.Module:
        return resolve(self.model, self.family.lm_head)

    def layer_path(self, layer: int) -> str:
        return f"{self.family.layers}.{layer}"

    def attn_path(self, layer: int) -> str:
        return f"{self.layer_path(layer)}.{self.family.attn_contrib[0]}"

    def mlp_path(self, layer: int) -> str:
        return f"{self.layer_path(layer)}.{self.family.mlp_contrib[0]}"

    @cached_property
    def unembedding(self) -> Unembedding:
        """The model's unembedding (final norm, ``lm_head``, soft-capping), in the model's dtype."""
        return Unembedding.of_modules(self.final_norm, self.lm_head, self.model.config)

    def unembed(self, resid: torch.Tensor) -> torch.Tensor:
        """Logit lens on a raw residual: ``lm_head(final_norm(h))`` with the model's logit soft-capping.

        Args:
            resid: [..., d_model] residual stream (raw, before the final norm).

        Returns:
            [..., vocab] fp32 logits.
        """
        return self.unembedding(resid)
