"""Tiny seeded random-init models of every supported family, and a character tokenizer (no downloads).

Used by the test-suite and by anyone adding an architecture: ``save_tiny_model("gemma3", path)`` writes a
directory that :func:`lmdepth.model.registry.load_model` loads like any local model.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch

FAMILY_CONFIGS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 8}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"head_dim": 8, "sliding_window": 8}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
}
CHARS = string.printable[:95]  # digits, letters, punctuation, space


def tiny_tokenizer(max_length: int = 1024):
    """A character-level fast tokenizer with a BOS token (ids: 0 pad, 1 bos, 2 eos, 3 unk, then characters)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{c: i + 4 for i, c in enumerate(CHARS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>", model_max_length=max_length)


def tiny_model(family: str, seed: int = 0, n_layers: int = 4, max_positions: int = 1024):
    """A random-init causal LM of ``family`` with d_model 32 (fp32, eval mode)."""
    import transformers

    cfg_name, model_name, extra = FAMILY_CONFIGS[family]
    cfg = getattr(transformers, cfg_name)(
        vocab_size=len(CHARS) + 4, hidden_size=32, intermediate_size=64, num_hidden_layers=n_layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False, **extra,
    )
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(cfg).eval()
    # Random init leaves some norms at exactly 1 and biases at 0; perturb so every parameter matters in tests.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return model


def save_tiny_model(family: str, path: str | Path, seed: int = 0, **kwargs) -> Path:
    """Write a tiny model and its tokenizer to ``path`` (a local model directory)."""
    path = Path(path)
    tiny_model(family, seed, **kwargs).save_pretrained(path)
    tiny_tokenizer(kwargs.get("max_positions", 1024)).save_pretrained(path)
    return path
