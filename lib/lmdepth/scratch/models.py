"""Models trained from scratch in chapter 07 (paper Fig. 9; book/method.md#method-moeut): MoEUT and a dense pre-LN Transformer.

Plain PyTorch, no custom kernels; CPU and GPU.

**MoEUT** (Csordás et al. 2024, "MoEUT: Mixture-of-Experts Universal Transformers"): a shared-layer Universal
Transformer. ``group_size`` (G) distinct layers form a group that is applied ``n_layers / G`` times (layers
A B A B …). Each layer has

* SwitchHead attention: per head, ``att_n_experts`` value and output projections; each token picks ``att_k`` of
  them with a sigmoid gate (selection from the normalised input) and mixes them with the gate values;
* a σ-MoE feed-forward block: ``ff_n_experts`` experts of size ``ff_expert_size``, top-``ff_k`` by a sigmoid gate,
  output ``Σ_e s_e · W2_e ReLU(W1_e x)``;
* "peri-LN": LayerNorm only where a linear map feeds a softmax/sigmoid, i.e. the attention queries/keys and the
  expert selections. Values and expert inputs read the un-normalised residual. A final LayerNorm precedes the
  unembedding;
* an entropy regulariser on the batch-averaged expert-selection distribution (``entropy_reg`` for the σ-MoE,
  ``att_entropy_reg`` for SwitchHead) that keeps experts in use.

Experts run as a gather/scatter grouped matmul (:class:`Dispatch`): the (token, choice) slots are sorted by expert,
each expert multiplies its contiguous block of gathered rows, and the results are scattered back to slot order
(``moe_impl="loop"``, the CPU default) or go through a padded [experts, capacity, d] buffer and one ``bmm``
(``"bmm"``, the CUDA default). Only the selected experts are computed.

**Dense baseline**: a pre-LN RoPE Transformer (``h += Attn(LN(h)); h += MLP(LN(h))``) with ``n_layers`` distinct
layers.

**Residual taps.** Both expose the layout of the pretrained-model adapters (``lmdepth.model.families``):
``model.model.embed_tokens``, ``model.model.layers`` (one module per depth step), ``model.model.norm``,
``model.lm_head``, and in every layer ``self_attn`` / ``mlp`` whose outputs are the contributions a_l, m_l with
``h_{l+1} = h_l + a_l + m_l``. For MoEUT ``model.model.layers[l]`` is a parameter-free :class:`LayerApplication`:
the l-th *application* of shared layer ``l % G``, so a forward hook on it fires once per depth step; the shared
weights live once in ``model.model.shared_layers``. The forward accepts ``past_key_values`` (a transformers
``DynamicCache``), ``use_cache`` and ``logits_to_keep`` like a Hugging Face causal LM, so the skipping code's KV
prefix reuse works unchanged. :func:`adapter_for` returns a :class:`lmdepth.model.families.ModelAdapter`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache, PreTrainedConfig
from transformers.modeling_outputs import CausalLMOutputWithPast

from lmdepth.model.families import FamilySpec, ModelAdapter
from lmdepth.scratch.layers import AuxSink, SigmaMoE, SwitchHeadAttention, attend, cached_kv, rope

# ---- configs -----------------------------------------------------------------------------------------------------


class _ScratchConfig(PreTrainedConfig):
    """Shared fields. ``n_layers`` counts depth steps (layer applications for MoEUT)."""

    def __init__(self, vocab_size: int = 99, d_model: int = 128, n_layers: int = 8, n_heads: int = 4,
                 d_head: int | None = None, rope_base: float = 10_000.0, max_position_embeddings: int = 1024,
                 bos_token_id: int = 1, eos_token_id: int = 2, pad_token_id: int = 0, **kwargs: Any):
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.n_layers = n_layers
        self.n_heads = n_heads
        self.d_head = d_head or d_model // n_heads
        self.rope_base = rope_base
        self.max_position_embeddings = max_position_embeddings
        # the names the adapters and transformers' cache read
        self.hidden_size = d_model
        self.num_hidden_layers = n_layers
        self.num_attention_heads = n_heads
        self.head_dim = self.d_head
        super().__init__(bos_token_id=bos_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id, **kwargs)


class MoEUTConfig(_ScratchConfig):
    """MoEUT hyper-parameters (defaults: a tiny model; see ``lmdepth.scratch.training.PRESETS`` for the real ones)."""

    model_type = "moeut"

    def __init__(self, group_size: int = 2, ff_n_experts: int = 16, ff_expert_size: int = 32, ff_k: int = 4,
                 att_n_experts: int = 4, att_k: int = 2, entropy_reg: float = 0.01, att_entropy_reg: float = 0.001,
                 moe_impl: str = "auto", **kwargs: Any):
        self.group_size = group_size
        self.ff_n_experts = ff_n_experts
        self.ff_expert_size = ff_expert_size
        self.ff_k = ff_k
        self.att_n_experts = att_n_experts
        self.att_k = att_k
        self.entropy_reg = entropy_reg
        self.att_entropy_reg = att_entropy_reg
        self.moe_impl = moe_impl  # Dispatch kernel: "auto", "loop", "bmm" (same results)
        super().__init__(**kwargs)
        if self.n_layers % group_size:
            raise ValueError(f"n_layers ({self.n_layers}) must be a multiple of group_size ({group_size}).")


class DenseConfig(_ScratchConfig):
    """Dense pre-LN Transformer hyper-parameters."""

    model_type = "pre_ln_transformer"

    def __init__(self, d_ff: int = 512, **kwargs: Any):
        self.d_ff = d_ff
        super().__init__(**kwargs)


# ---- shared pieces -----------------------------------------------------------------------------------------------


# ---- MoEUT -------------------------------------------------------------------------------------------------------


class MoEUTLayer(nn.Module):
    """One shared layer (owns the weights); applied several times through :class:`LayerApplication`."""

    def __init__(self, cfg: MoEUTConfig):
        super().__init__()
        self.attention = SwitchHeadAttention(cfg.d_model, cfg.n_heads, cfg.d_head, cfg.att_n_experts, cfg.att_k,
                                             cfg.rope_base, cfg.att_entropy_reg, cfg.moe_impl)
        self.ffn = SigmaMoE(cfg.d_model, cfg.ff_n_experts, cfg.ff_expert_size, cfg.ff_k, cfg.entropy_reg, cfg.moe_impl)


class SharedCall(nn.Module):
    """Parameter-free handle that calls a module owned elsewhere, so hooks on it fire for one application only."""

    def __init__(self, target: nn.Module):
        super().__init__()
        object.__setattr__(self, "target", target)  # not registered: the weights are counted once

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.target(*args, **kwargs)


class LayerApplication(nn.Module):
    """Depth step ``index`` of MoEUT: shared layer ``index % G`` applied to the residual.

    ``h_mid = h + self_attn(h)``; ``h_out = h_mid + mlp(h_mid)``.
    """

    def __init__(self, shared: MoEUTLayer, index: int, group_size: int):
        super().__init__()
        self.index, self.group_index, self.repeat = index, index % group_size, index // group_size
        self.self_attn = SharedCall(shared.attention)
        self.mlp = SharedCall(shared.ffn)
        object.__setattr__(self, "shared", shared)

    def forward(self, x: torch.Tensor, cache: DynamicCache | None = None, pos_offset: int = 0, **_: Any) -> torch.Tensor:
        h = x + self.self_attn(x, cache=cache, layer_idx=self.index, pos_offset=pos_offset)
        return h + self.mlp(h)

    def extra_repr(self) -> str:
        return f"index={self.index}, shared_layer={self.group_index}, repeat={self.repeat}"


# ---- dense baseline ----------------------------------------------------------------------------------------------


class DenseAttention(nn.Module):
    """Pre-LN multi-head attention with RoPE: ``Attn(LN(h))`` (the attention contribution a_l)."""

    def __init__(self, cfg: DenseConfig):
        super().__init__()
        d, H, dh = cfg.d_model, cfg.n_heads, cfg.d_head
        self.n_heads, self.d_head, self.rope_base = H, dh, cfg.rope_base
        self.norm = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * H * dh, bias=False)
        self.o_proj = nn.Linear(H * dh, d, bias=False)

    def forward(self, x: torch.Tensor, cache: DynamicCache | None = None, layer_idx: int = 0, pos_offset: int = 0,
                **_: Any) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.qkv(self.norm(x)).view(B, T, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
        pos = torch.arange(pos_offset, pos_offset + T, device=x.device)
        q, k = rope(q, pos, self.rope_base), rope(k, pos, self.rope_base)
        k, v = cached_kv(k, v, cache, layer_idx)
        return self.o_proj(attend(q, k, v).transpose(1, 2).reshape(B, T, -1))


class DenseMLP(nn.Module):
    """Pre-LN feed-forward block ``W2 ReLU(W1 LN(h))`` (the MLP contribution m_l)."""

    def __init__(self, cfg: DenseConfig):
        super().__init__()
        self.norm = nn.LayerNorm(cfg.d_model)
        self.up = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, **_: Any) -> torch.Tensor:
        return self.down(F.relu(self.up(self.norm(x))))


class DenseLayer(nn.Module):
    """``h_mid = h + self_attn(h)``; ``h_out = h_mid + mlp(h_mid)``."""

    def __init__(self, cfg: DenseConfig, index: int):
        super().__init__()
        self.index = index
        self.self_attn = DenseAttention(cfg)
        self.mlp = DenseMLP(cfg)

    def forward(self, x: torch.Tensor, cache: DynamicCache | None = None, pos_offset: int = 0, **_: Any) -> torch.Tensor:
        h = x + self.self_attn(x, cache=cache, layer_idx=self.index, pos_offset=pos_offset)
        return h + self.mlp(h)


# ---- the language models ---------------------------------------------------------------------------------------


class ScratchBody(nn.Module):
    """embed_tokens → layers → norm (the names the adapters use)."""

    def __init__(self, cfg: _ScratchConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        if isinstance(cfg, MoEUTConfig):
            self.shared_layers = nn.ModuleList([MoEUTLayer(cfg) for _ in range(cfg.group_size)])
            self.layers = nn.ModuleList(
                [LayerApplication(self.shared_layers[i % cfg.group_size], i, cfg.group_size) for i in range(cfg.n_layers)]
            )
        else:
            self.layers = nn.ModuleList([DenseLayer(cfg, i) for i in range(cfg.n_layers)])
        self.norm = nn.LayerNorm(cfg.d_model)


class ScratchLM(nn.Module):
    """A causal LM with a Hugging Face-like interface: ``model(input_ids).logits``.

    Attributes:
        config: :class:`MoEUTConfig` or :class:`DenseConfig`.
        model: the body (``embed_tokens``, ``layers``, ``norm``).
        lm_head: the unembedding.
    """

    def __init__(self, config: _ScratchConfig):
        super().__init__()
        self.config = config
        self.model = ScratchBody(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self._sink = AuxSink()
        for m in self.modules():
            if isinstance(m, (SigmaMoE, SwitchHeadAttention)):
                m.sink = self._sink
        self.reset_parameters()

    @property
    def arch(self) -> str:
        return "moeut" if isinstance(self.config, MoEUTConfig) else "transformer"

    @torch.no_grad()
    def reset_parameters(self) -> None:
        cfg = self.config
        scale = math.sqrt(2 / cfg.n_layers)  # as MoEUT: std shrinks with the number of depth steps
        d = cfg.d_model
        nn.init.normal_(self.model.embed_tokens.weight, 0, 1 / math.sqrt(d))
        nn.init.normal_(self.lm_head.weight, 0, 1 / math.sqrt(d))
        for m in self.modules():
            if isinstance(m, (SigmaMoE, SwitchHeadAttention)):
                m.reset_parameters(scale)
            elif isinstance(m, nn.LayerNorm):
                m.reset_parameters()
            elif isinstance(m, DenseAttention):
                nn.init.normal_(m.qkv.weight, 0, scale / math.sqrt(d))
                nn.init.normal_(m.o_proj.weight, 0, scale / math.sqrt(m.o_proj.in_features))
            elif isinstance(m, DenseMLP):
                nn.init.normal_(m.up.weight, 0, scale / math.sqrt(d))
                nn.init.normal_(m.down.weight, 0, scale / math.sqrt(m.down.in_features))

    def aux_loss(self) -> torch.Tensor:
        """Sum of the expert-balance regularisers of the last forward pass (0 for the dense model / in eval)."""
        losses = self._sink.losses
        return torch.stack(losses).sum() if losses else torch.zeros(())

    def forward(self, input_ids: torch.Tensor, past_key_values: DynamicCache | None = None, use_cache: bool = False,
                logits_to_keep: int = 0, **_: Any) -> CausalLMOutputWithPast:
        """Args:
            input_ids: [B, T] token ids (positions continue after any cached prefix).
            past_key_values: a ``DynamicCache`` holding a prefix, or None.
            use_cache: return the keys/values (a new ``DynamicCache`` if none was given).
            logits_to_keep: 0 → logits of every position; n → of the last n.

        Returns:
            ``CausalLMOutputWithPast`` with ``logits`` [B, T or n, V] and ``past_key_values``.
        """
        self._sink.losses = []
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache(config=self.config)
        pos_offset = past_key_values.get_seq_length() if past_key_values is not None else 0
        h = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            h = layer(h, cache=past_key_values, pos_offset=pos_offset)
        if logits_to_keep:
            h = h[:, -logits_to_keep:]
        logits = self.lm_head(self.model.norm(h))
        return CausalLMOutputWithPast(logits=logits, past_key_values=past_key_values if use_cache else None)


def build_model(config: _ScratchConfig, seed: int = 0) -> ScratchLM:
    """A freshly initialised model (seeded)."""
    torch.manual_seed(seed)
    return ScratchLM(config)


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (shared MoEUT weights counted once)."""
    return sum(p.numel() for p in model.parameters())


def active_parameters(config: _ScratchConfig) -> int:
    """Parameters touched per token per depth step, summed over depth (a FLOP proxy; embeddings excluded)."""
    d, H, dh = config.d_model, config.n_heads, config.d_head
    if isinstance(config, MoEUTConfig):
        per = 2 * d * H * dh + 2 * H * config.att_k * d * dh + 2 * config.ff_k * config.ff_expert_size * d
    else:
        per = 4 * d * H * dh + 2 * d * config.d_ff
    return per * config.n_layers


# ---- adapters ----------------------------------------------------------------------------------------------------

MOEUT_FAMILY = FamilySpec("moeut", ("moeut",), attn_contrib=("self_attn", None), mlp_contrib=("mlp", None))
DENSE_FAMILY = FamilySpec("pre_ln_transformer", ("pre_ln_transformer",), attn_contrib=("self_attn", None),
                          mlp_contrib=("mlp", None))


def adapter_for(model: ScratchLM) -> ModelAdapter:
    """A :class:`~lmdepth.model.families.ModelAdapter` for a from-scratch model (layers = depth steps)."""
    return ModelAdapter(model=model, family=MOEUT_FAMILY if isinstance(model.config, MoEUTConfig) else DENSE_FAMILY)


def config_from_dict(d: dict[str, Any]) -> _ScratchConfig:
    """Rebuild a config from ``config.to_dict()`` (as stored in checkpoints)."""
    d = dict(d)
    cls = MoEUTConfig if d.get("model_type") == "moeut" else DenseConfig
    keep = {k: v for k, v in d.items() if k not in ("model_type", "transformers_version", "hidden_size",
                                                     "num_hidden_layers", "num_attention_heads", "head_dim")}
    return cls(**keep)


__all__ = ["MoEUTConfig", "DenseConfig", "ScratchLM", "LayerApplication", "build_model", "adapter_for", "count_parameters", "active_parameters",
           "config_from_dict", "MOEUT_FAMILY", "DENSE_FAMILY"]
