"""The four residual taps of every layer captured with plain forward hooks: the additivity self-check that
:func:`lmdepth.model.registry.load_model` runs on every model it loads, and the reference that the remote-ready
traces (:mod:`lmdepth.traces`) are held to in the tests. The analyses themselves run as nnsight traces.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from lmdepth.errors import UnsupportedArchitectureError
from lmdepth.kernels.outputs import unwrap
from lmdepth.kernels.residual_kernels import relative_norm
from lmdepth.model.families import ModelAdapter
from lmdepth.model.paths import resolve, take

#: The four taps of every layer l: h_l, a_l, m_l, h_{l+1} (TransformerLens' resid_pre/attn_out/mlp_out/resid_post).
TAPS = ("resid_pre", "attn_out", "mlp_out", "resid_post")


def layer_output(output: Any) -> torch.Tensor:
    """The hidden state [B, T, D] in a decoder layer's output (the tensor, or a tuple's [0])."""
    # transformers v5 decoder layers return a tensor; older ones a tuple whose [0] is the hidden state.
    return unwrap(output)


@contextmanager
def forward_hooks(hooks: list[tuple[torch.nn.Module, Callable]]) -> Iterator[None]:
    """Register forward hooks for the duration of a ``with`` block and always remove them."""
    handles = [module.register_forward_hook(fn) for module, fn in hooks]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def hooked_residuals(adapter: ModelAdapter, input_ids: torch.Tensor, **forward_kwargs: Any) -> dict[str, torch.Tensor]:
    """Capture h_l, a_l, m_l, h_{l+1} of every layer with plain PyTorch forward hooks.

    Args:
        adapter: the model's adapter.
        input_ids: [batch, tokens] token ids.

    Returns:
        ``{tap: [layers, batch, tokens, d_model]}`` for the four :data:`TAPS`, in the model's dtype.
    """
    store: dict[str, list[torch.Tensor | None]] = {t: [None] * adapter.n_layers for t in TAPS}
    fam = adapter.family
    hooks: list[tuple[torch.nn.Module, Callable]] = []
    for l, layer in enumerate(adapter.layers):
        def on_layer(mod, args, out, l=l):
            store["resid_pre"][l] = args[0].detach()
            store["resid_post"][l] = layer_output(out).detach()

        def on_attn(mod, args, out, l=l):
            store["attn_out"][l] = take(out, fam.attn_contrib[1]).detach()

        def on_mlp(mod, args, out, l=l):
            store["mlp_out"][l] = take(out, fam.mlp_contrib[1]).detach()

        hooks += [
            (layer, on_layer),
            (resolve(layer, fam.attn_contrib[0]), on_attn),
            (resolve(layer, fam.mlp_contrib[0]), on_mlp),
        ]
    with forward_hooks(hooks):
        adapter.model(input_ids, **forward_kwargs)
    return {t: torch.stack(v) for t, v in store.items()}  # type: ignore[arg-type]


def additivity_error(adapter: ModelAdapter, input_ids: torch.Tensor) -> float:
    """Max over layers and tokens of ||h_{l+1} − (h_l + a_l + m_l)|| / ||h_{l+1}||, computed in fp32."""
    r = {k: v.float() for k, v in hooked_residuals(adapter, input_ids, logits_to_keep=1).items()}
    resid = r["resid_post"] - (r["resid_pre"] + r["attn_out"] + r["mlp_out"])
    return float(relative_norm(resid, r["resid_post"]).max())


def check_additivity(adapter: ModelAdapter, input_ids: torch.Tensor, tol: float | None = None) -> float:
    """Verify the residual decomposition the analyses rely on; refuse the model if it does not hold.

    Args:
        adapter: the model's adapter.
        input_ids: [1, tokens] a short input.
        tol: relative tolerance; defaults to 1e-4 in fp32 and 2e-2 in half precision.

    Returns:
        The measured relative error.

    Raises:
        UnsupportedArchitectureError: h_{l+1} ≠ h_l + a_l + m_l, e.g. for a post-LN model whose norm sits on the
            residual stream itself.
    """
    dtype = next(adapter.model.parameters()).dtype
    tol = tol if tol is not None else (1e-4 if dtype == torch.float32 else 2e-2)
    err = additivity_error(adapter, input_ids)
    if not err <= tol:
        raise UnsupportedArchitectureError(
            f"The residual stream of this {adapter.family.name!r}-type model is not additive: "
            f"max ||h_(l+1) - (h_l + a_l + m_l)|| / ||h_(l+1)|| = {err:.3g} > {tol:g}. The paper's analyses assume a "
            "pre-LN layout where each layer adds its attention and MLP outputs to the residual. Post-LN models "
            "(a norm applied to the residual after the add) do not have this form and are not supported. If the "
            "architecture is pre-LN, its FamilySpec names the wrong contribution modules (lmdepth.model.families)."
        )
    return err
