"""A module's output as a tensor, and back: transformers' attention returns ``(out, weights)``, older decoder
layers ``(hidden, ...)``, newer ones the tensor itself."""

from __future__ import annotations

from typing import Any

import torch


def unwrap(output: Any, index: int = 0) -> torch.Tensor:
    """``output[index]`` when the module returned a tuple or list, else ``output``; ``index < 0``: the output as
    it is (a module known to return the tensor)."""
    return output[index] if index >= 0 and isinstance(output, (tuple, list)) else output


def rewrap(output: Any, value: torch.Tensor, index: int = 0) -> Any:
    """``output`` with the tensor :func:`unwrap` reads replaced by ``value`` (the same container type)."""
    if index >= 0 and isinstance(output, (tuple, list)):
        return type(output)(value if i == index else v for i, v in enumerate(output))
    return value


def stack_on(values: list[torch.Tensor], device: torch.device | str = "cpu", dim: int = 0) -> torch.Tensor:
    """Per-layer values, each on its own layer's device (a device map spreads a model's layers over GPUs), moved to
    one ``device`` and stacked along ``dim``."""
    return torch.stack([v.to(device) for v in values], dim)


__all__ = ["unwrap", "rewrap", "stack_on"]
