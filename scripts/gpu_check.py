"""Timings of the book's two heaviest traces on a GPU, on random-init models of the paper's shapes: chapter 03's skip
session (all tokens and future tokens, the parts layer / attention / MLP and the local variant, the robust
statistic) and chapter 04's logit lens, each against a plain forward pass of the same prompt, with the forward
passes of the decoder counted. One JSON object per line (and all of them in ``--out``):

    {"path": "skip session", "shape": "llama-3.1-8b", "tokens": 256, "seconds": ..., "forwards": ...,
     "plain_forward_s": ..., "efficiency": ...}

``efficiency`` = plain-forward seconds × forwards counted / the path's seconds (1.0: the path costs exactly the
forwards it runs). Random weights cost what trained ones do; only the shapes matter here. ``--shape tiny`` runs the
same code on a tiny Llama on the CPU (the tests do), so the script is exercised where no GPU is.

    .venv/bin/python scripts/gpu_check.py --out results/gpu_check.json      # on a CUDA machine (gpu_check.sh)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from lmdepth.analyses.scratch import traced
from lmdepth.traces.lens_trace import lens_readings
from lmdepth.traces.skip_effects import skip_effects

#: Llama-family shapes (transformers' LlamaConfig keywords): the paper's Llama 3.1 8B, and a tiny one for the CPU.
SHAPES = {
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=256, max_position_embeddings=512),
}


def build(shape: str, device: str, dtype: torch.dtype) -> torch.nn.Module:
    """A random-init Llama of ``shape`` on ``device`` (weights drawn there: an 8B model is not built on the CPU)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**SHAPES[shape])
    with torch.device(device):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).to(dtype)
    return model.eval()


class ForwardCounter:
    """Counts calls of the first decoder layer: one per forward pass of the decoder, whatever runs it."""

    def __init__(self, model: torch.nn.Module):
        self.n = 0
        self.handle = model.model.layers[0].register_forward_hook(self._count)

    def _count(self, *_: object) -> None:
        self.n += 1


def timed(fn, device: str) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - t0


@torch.no_grad()
def measure(shape: str, device: str, tokens: int, problems: int) -> list[dict]:
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = build(shape, device, dtype)
    nn_model, paths = traced(model)
    counter = ForwardCounter(model)
    rows = []
    for i in range(problems):
        ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(i)).to(device)
        model(ids)  # warm-up (kernels, allocator)
        plain = min(timed(lambda: model(ids), device) for _ in range(3))
        cuts = list(range(8, tokens, max(8, tokens // 4)))[:4]  # 4 cut points from every 8th token, as chapter 03
        paths_of = {
            "skip session": lambda: skip_effects(nn_model, paths, ids, cuts=cuts, config=model.config, floor=0.1),
            "logit lens": lambda: lens_readings(nn_model, paths, ids, torch.arange(0, tokens, max(1, tokens // 64))),
        }
        for name, run in paths_of.items():
            counter.n = 0
            seconds = timed(run, device)
            rows.append({"path": name, "shape": shape, "device": device, "tokens": tokens, "problem": i,
                         "seconds": round(seconds, 4), "forwards": counter.n, "plain_forward_s": round(plain, 5),
                         "efficiency": round(plain * counter.n / seconds, 3) if seconds else None})
    counter.handle.remove()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=tuple(SHAPES), default="llama-3.1-8b")
    ap.add_argument("--device", default="cuda", help="cuda (the check), or cpu with --shape tiny")
    ap.add_argument("--tokens", type=int, default=256, help="prompt length")
    ap.add_argument("--problems", type=int, default=2)
    ap.add_argument("--out", type=Path, help="also write the rows here as a JSON list")
    args = ap.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("no CUDA device here (run with --device cpu --shape tiny to exercise the script)")
    if args.shape != "tiny" and not args.device.startswith("cuda"):
        ap.error(f"the {args.shape} shape needs a GPU; use --shape tiny on a CPU")
    rows = measure(args.shape, args.device, args.tokens, args.problems)
    for row in rows:
        print(json.dumps(row), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"rows": rows, "torch": torch.__version__,
                                        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None},
                                       indent=1))


if __name__ == "__main__":
    main()
