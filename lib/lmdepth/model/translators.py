"""The tuned lens's translators (Belrose et al. 2023): one affine map per layer that carries a residual to where the
final layer's unembedding reads it. Trained by :mod:`lmdepth.scratch.tuned_lens`, stored as arrays by
:mod:`lmdepth.analyses.lens`, applied by :mod:`lmdepth.hooks.lens` (and, as its three tensors, by the lens trace
:mod:`lmdepth.traces.lens`).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


class Translators(nn.Module):
    """One affine translator per layer, ``h ↦ h + A_l h + s_l b_l``; zero-initialised, i.e. the identity.

    Attributes:
        A: [layers, d, d]; b: [layers, d]; scale: [layers] buffer (mean RMS of h_l on the training tokens).
    """

    def __init__(self, n_layers: int, d_model: int, scale: torch.Tensor | None = None):
        super().__init__()
        self.A = nn.Parameter(torch.zeros(n_layers, d_model, d_model))
        self.b = nn.Parameter(torch.zeros(n_layers, d_model))
        self.register_buffer("scale", torch.ones(n_layers) if scale is None else scale.float().clone())

    def forward(self, h: torch.Tensor, layer: int | None = None) -> torch.Tensor:
        """Translate one layer's residuals (``layer`` given: h [..., d]) or all layers (h [..., layers, d])."""
        h = h.float()
        if layer is not None:
            return h + h @ self.A[layer].T + self.scale[layer] * self.b[layer]
        return h + torch.einsum("...ld,led->...le", h, self.A) + self.scale[:, None] * self.b

    def state_arrays(self) -> dict[str, np.ndarray]:
        return {k: v.detach().cpu().numpy() for k, v in self.state_dict().items()}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> "Translators":
        n_layers, d_model, _ = arrays["A"].shape
        t = cls(n_layers, d_model)
        t.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in arrays.items()})
        return t
