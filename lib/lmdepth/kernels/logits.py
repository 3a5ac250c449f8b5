"""Logits of a residual: the model's own head and final norm, and its logit soft-capping (Gemma 2/3)."""

from __future__ import annotations

from typing import Callable

import torch

from lmdepth.kernels.outputs import stack_on


def softcap(z: torch.Tensor, cap: float | None) -> torch.Tensor:
    """``cap·tanh(z/cap)`` in fp32; ``z`` in fp32 when ``cap`` is None or 0. [..., V] → [..., V]."""
    z = z.float()
    return torch.tanh(z / cap) * cap if cap else z


def softcap_(z: torch.Tensor, cap: float | None) -> torch.Tensor:
    """:func:`softcap` in place on an fp32 ``z`` (no second [..., V] buffer); returns ``z``."""
    return z.div_(cap).tanh_().mul_(cap) if cap else z


def unembed(head: Callable[[torch.Tensor], torch.Tensor], norm: Callable[[torch.Tensor], torch.Tensor],
            h: torch.Tensor, cap: float | None) -> torch.Tensor:
    """[..., D] raw residuals → [..., V] fp32 soft-capped logits, by calling the model's final norm and head (in a
    trace, their envoys: a hosted model's weights are never read)."""
    return softcap(head(norm(h)), cap)


def linear_logits(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cap: float | None) -> torch.Tensor:
    """[..., d] normed residuals → [..., V] fp32 soft-capped logits with an unembedding read here (the lens' own
    copy, in its dtype): the matmul in ``weight``'s dtype, the bias (fp32) and the soft-cap in fp32."""
    z = torch.nn.functional.linear(x.to(weight.device, weight.dtype), weight).float()
    return softcap(z + bias if bias is not None else z, cap)


def linear_logits_into(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cap: float | None,
                       z: torch.Tensor, z_mm: torch.Tensor) -> torch.Tensor:
    """:func:`linear_logits` of [n, d] written into the reused buffers: ``z`` [≥ n, V] fp32 (returned, its first n
    rows) and ``z_mm`` [≥ n, V] in ``weight``'s dtype (``z`` itself when that is fp32). A fresh [n, V] tensor per
    block would cost more in page faults than the matmul."""
    n = x.shape[0]
    torch.matmul(x.to(weight.device, weight.dtype), weight.T, out=z_mm[:n])
    out = z[:n]
    if z_mm is not z:
        out.copy_(z_mm[:n])
    if bias is not None:
        out.add_(bias)
    return softcap_(out, cap)


def lens_logits(head: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, dtype: torch.dtype,
                weight: torch.Tensor | None, bias: torch.Tensor | None, cap: float | None, z: torch.Tensor | None,
                z_mm: torch.Tensor | None) -> torch.Tensor:
    """[n, d] normed residuals → [n, V] fp32 soft-capped lens logits: by calling the model's head on ``x`` in
    ``dtype``, the head's own (``weight`` None: a hosted model's weights are never read), else
    :func:`linear_logits_into` with the lens' own copy of the weight in another dtype, through the buffers."""
    if weight is None:
        return softcap_(head(x.to(dtype)).float(), cap)  # a fresh tensor, whatever the dtype: capped in place
    return linear_logits_into(x, weight, bias, cap, z, z_mm)


def top_tokens(head: Callable[[torch.Tensor], torch.Tensor], norm: Callable[[torch.Tensor], torch.Tensor],
               hs: list[torch.Tensor], cap: float | None, k: int) -> torch.return_types.topk:
    """The logit lens' top-k tokens of residuals [D] each (possibly on several devices; moved to the last one's):
    ``(values [n, k] fp32 probabilities, indices [n, k])``, best first."""
    x = stack_on(hs, hs[-1].device)
    return unembed(head, norm, x, cap).softmax(-1).topk(k, dim=-1)


__all__ = ["softcap", "softcap_", "unembed", "linear_logits", "linear_logits_into", "lens_logits", "top_tokens"]
