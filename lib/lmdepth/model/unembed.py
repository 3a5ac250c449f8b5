"""The one unembedding: ``lm_head(final_norm(h))`` with the model's logit soft-capping.

Every reading of a residual as a distribution (the logit and tuned lenses, the output change of layer skipping,
erasure and integrated gradients, the explorer) goes through :class:`Unembedding`: the adapter's
:meth:`~lmdepth.model.families.ModelAdapter.unembed` is an :class:`Unembedding` in the model's own dtype, the
lens builds one in its lens dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import torch
from torch import nn

from lmdepth.kernels.logits import linear_logits, linear_logits_into, softcap
from lmdepth.metrics.distributions import Scratch
from lmdepth.model.paths import resolve
from lmdepth.runtime import DTYPES

# fp32: bf16 (the paper's models) is fast on GPUs but several times slower than fp32 on CPUs without bf16 units
DEFAULT_LENS_DTYPE = "float32"


@dataclass
class Unembedding:
    """``lm_head(final_norm(h))`` with the model's logit soft-capping — :meth:`ModelAdapter.unembed` with the
    matmul in a chosen dtype (a bf16 copy of the unembedding is ~5× faster on CPUs with bf16 support).

    Attributes:
        norm: the final norm; an nnsight envoy inside traces (an ad hoc call that leaves the trace alone),
            the module itself outside.
        weight: [vocab, d_model] unembedding in the lens dtype.
        bias: [vocab] or None.
        softcap: the model's ``final_logit_softcapping`` or None.
        head: remote models only: the ``lm_head`` envoy (weight is None then; the matmul runs on the server).
        remote_vocab: remote models only: the vocabulary size.
    """

    norm: Callable[[torch.Tensor], torch.Tensor]
    weight: torch.Tensor | None
    bias: torch.Tensor | None = None
    softcap: float | None = None
    head: Callable[[torch.Tensor], torch.Tensor] | None = None
    remote_vocab: int = 0

    @classmethod
    def of(cls, lm: Any, dtype: str = DEFAULT_LENS_DTYPE, traced: bool = True) -> "Unembedding":
        """Build from a loaded model. ``traced``: take the final norm's nnsight envoy (for use inside traces).

        ``lm`` is a :class:`lmdepth.model.registry.LoadedModel` (its ``model``, ``adapter``, ``nn`` and ``remote``
        are read); typed loosely because the registry imports the adapters, which import this module."""
        softcap = getattr(lm.model.config, "final_logit_softcapping", None) or None
        if lm.remote:  # the weights live on the server: call its lm_head (in the model's dtype) inside the trace
            fam = lm.adapter.family
            return cls(resolve(lm.nn, fam.final_norm), None, softcap=softcap, head=resolve(lm.nn, fam.lm_head),
                       remote_vocab=int(lm.model.config.vocab_size))
        head = lm.adapter.lm_head
        norm = resolve(lm.nn, lm.adapter.family.final_norm) if traced else lm.adapter.final_norm
        bias = getattr(head, "bias", None)
        weight = head.weight.detach().to(DTYPES[dtype])
        return cls(norm, weight, None if bias is None else bias.detach().float(), softcap)

    @classmethod
    def of_modules(cls, final_norm: nn.Module, lm_head: nn.Module, config: Any) -> "Unembedding":
        """The model's own unembedding, in its own dtype (what :meth:`ModelAdapter.unembed` uses)."""
        bias = getattr(lm_head, "bias", None)
        return cls(final_norm, lm_head.weight.detach(), None if bias is None else bias.detach().float(),
                   getattr(config, "final_logit_softcapping", None) or None)

    @property
    def vocab(self) -> int:
        return int(self.weight.shape[0]) if self.weight is not None else self.remote_vocab

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32 if self.weight is None else self.weight.dtype

    def rows(self, rows: torch.Tensor) -> "Unembedding":
        """This unembedding restricted to the vocabulary ``rows`` [n] (their weight and bias gathered once, for
        several readings on one subset: the tuned lens' sampled softmax). Local models only."""
        if self.weight is None:
            raise ValueError("a remote model's unembedding has no weight to take rows of")
        return replace(self, weight=self.weight[rows], bias=None if self.bias is None else self.bias[rows])

    def logits_of_normed(self, x: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of already-normed residuals (differentiable). x: [..., d]; ``rows``: optional vocabulary subset
        → [..., |rows|] fp32."""
        if self.weight is None:
            return self.softcapped(self.head(x).float())
        bias = self.bias if self.bias is None or rows is None else self.bias[rows]
        return linear_logits(x, self.weight if rows is None else self.weight[rows], bias, self.softcap)

    def softcapped(self, z: torch.Tensor) -> torch.Tensor:
        """The model's logit soft-capping on raw ``lm_head`` logits, in fp32 (:func:`softcap`)."""
        return softcap(z, self.softcap)

    def __call__(self, h: torch.Tensor, scratch: Scratch | None = None) -> torch.Tensor:
        """[tokens, d] raw residual → [tokens, vocab] fp32 logits; written into ``scratch.z`` when given.

        The final norm is applied with the residual's own dtype; the matmul runs in the lens dtype.
        """
        x = self.norm(h)
        if scratch is None or self.weight is None:
            return self.logits_of_normed(x)
        return linear_logits_into(x, self.weight, self.bias, self.softcap, scratch.z, scratch.z_mm)
