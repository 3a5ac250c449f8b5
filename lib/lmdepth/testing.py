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


# ---- a device proxy: the placement of a GPU (or of several), on a CPU ------------------------------------------------

class MetaValues(torch.overrides.TorchFunctionMode):
    """Reading the values of a ``meta`` tensor gives zeros (``.cpu()``, ``.to("cpu")``, ``.tolist()``, ``.item()``,
    ``int()``) or True (``bool()``), so a trace over a model on ``meta`` runs to its end. Every other op keeps
    torch's own device checks, which on ``meta`` are CUDA's: a CPU tensor meeting a ``meta`` activation fails."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        t = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if t is not None and t.device.type == "meta":
            to_cpu = func is torch.Tensor.to and any(a in ("cpu", torch.device("cpu")) for a in (*args[1:2],
                                                                                             kwargs.get("device")))
            if func is torch.Tensor.cpu or to_cpu:
                return torch.zeros(t.shape, dtype=t.dtype)
            if func is torch.Tensor.tolist:
                return torch.zeros(t.shape, dtype=t.dtype).tolist()
            if func in (torch.Tensor.item, torch.Tensor.__float__):
                return 0.0
            if func in (torch.Tensor.__int__, torch.Tensor.__index__):
                return 0
            if func is torch.Tensor.__bool__:  # e.g. "no padding" in transformers' mask code
                return True
        return func(*args, **kwargs)


def _moved(x, device: torch.device):
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, (tuple, list)):
        return type(x)(_moved(v, device) for v in x)
    if isinstance(x, dict):
        return {k: _moved(v, device) for k, v in x.items()}
    return x


def place_on_meta(model: torch.nn.Module, first_layer: int = 0) -> None:
    """Move a loaded model's weights to ``meta`` in place, as a device map would place them on a GPU.

    ``first_layer=0``: the whole model (one GPU: feed it ids on ``meta``). ``0 < first_layer < L``: the embedding
    and decoder layers ``< first_layer`` stay on the CPU, the rest (with the final norm and the head) go to
    ``meta``, and each moved module moves its tensor inputs there first, as accelerate's hooks do between GPUs (two
    GPUs: a per-layer value combined with another layer's without a move fails). Wrap the model with nnsight
    before moving it (the wrapper copies weights), and run the trace under :class:`MetaValues`.
    """
    if first_layer == 0:
        model.to("meta")
        return
    decoder, meta = model.get_decoder(), torch.device("meta")  # transformers' own accessors: no family table
    if not 0 < first_layer < len(decoder.layers):
        raise ValueError(f"first_layer must be in 0..{len(decoder.layers) - 1}, got {first_layer}")
    for module in (*decoder.layers[first_layer:], decoder.norm, model.get_output_embeddings()):
        module.to(meta)
        module.register_forward_pre_hook(lambda m, args, kwargs: (_moved(args, meta), _moved(kwargs, meta)),
                                         with_kwargs=True)
