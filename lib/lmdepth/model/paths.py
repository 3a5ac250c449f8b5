"""Dotted module paths: how the family specs name modules inside a model (or an nnsight envoy of it)."""

from __future__ import annotations

from typing import Any

from lmdepth.kernels.outputs import unwrap


def resolve(root: Any, path: str) -> Any:
    """Follow a dotted path (digits index into lists) on a module or an nnsight envoy."""
    obj = root
    for part in path.split("."):
        obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
    return obj


def take(output: Any, index: int | None) -> Any:
    """Select ``output[index]`` when a module returns a tuple (e.g. ``self_attn`` returns (out, weights))."""
    return output if index is None else unwrap(output, index)
