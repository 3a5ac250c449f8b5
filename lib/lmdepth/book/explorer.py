"""Live explorer: one prompt, one model, one layer — its residual contributions, logit-lens tokens and skip effect.

The compute functions are plain (testable on tiny models); :func:`explorer_widget` wraps them in ipywidgets for a
live Jupyter or Colab kernel. Everything is computed on the spot: one hooked pass for the contributions, one clean
pass (residuals, output distribution) shared by the lens and the skip effect, and one intervened pass.
"""

from __future__ import annotations

import pandas as pd
import torch

from lmdepth.charts.explorer import Exploration, exploration_charts
from lmdepth.hooks.skipping import CleanPass, Row, clean_pass, run_rows
from lmdepth.metrics.residual import RESIDUAL_METRICS, residual_token_metrics
from lmdepth.model.registry import LoadedModel, load_model
from lmdepth.model.taps import hooked_residuals


@torch.no_grad()
def contributions(lm: LoadedModel, ids: torch.Tensor) -> pd.DataFrame:
    """Relative contributions of every layer, mean over the prompt's tokens (chapter 01's metrics on one prompt).

    Args:
        ids: [1, T] token ids.
    """
    taps = hooked_residuals(lm.adapter, ids, logits_to_keep=1)  # {tap: [L, 1, T, D]}
    names = [c for m, c in RESIDUAL_METRICS if m == "relative_contribution"]
    vals = residual_token_metrics(taps["resid_pre"][:, 0], taps["attn_out"][:, 0], taps["mlp_out"][:, 0],
                                  taps["resid_post"][:, 0])[: len(names)].mean(-1)  # [3, L]
    return pd.DataFrame([dict(layer=l, component=n, value=float(vals[i, l]))
                         for l in range(vals.shape[1]) for i, n in enumerate(names)])


@torch.no_grad()
def lens_top_tokens(lm: LoadedModel, ids: torch.Tensor, position: int = -1, k: int = 5,
                    clean: CleanPass | None = None) -> pd.DataFrame:
    """Logit-lens top-k tokens at one position, for the residual entering every layer and for the output.

    Only [L + 1, vocab] logits of one position exist at once. ``clean``: a clean pass of ``ids`` to reuse.
    """
    clean = clean or clean_pass(lm.adapter, ids)
    resid = torch.cat([clean.resid_in[:, position], clean.resid_out[-1:, position]])  # [L+1, D]
    probs = lm.adapter.unembed(resid).float().softmax(-1)  # [L+1, V]
    top = probs.topk(k, dim=-1)
    rows = []
    for l in range(resid.shape[0]):
        for r in range(k):
            tid = int(top.indices[l, r])
            rows.append(dict(layer=l, rank=r + 1, token=lm.tokenizer.decode([tid]), token_id=tid,
                             prob=float(top.values[l, r])))
    return pd.DataFrame(rows)


@torch.no_grad()
def skip_effect(lm: LoadedModel, ids: torch.Tensor, layer: int,
                clean: CleanPass | None = None) -> tuple[pd.DataFrame, float]:
    """Effect of skipping ``layer`` at every position ≥ 1 on every layer's contribution (chapter 03, all tokens).

    ``clean``: a clean pass of ``ids`` with output probabilities to reuse.

    Returns:
        (``layer, relative_change`` with the largest change over positions, output change ‖P − P′‖₂).
    """
    if not 0 <= layer < lm.adapter.n_layers:
        raise ValueError(f"layer must be in 0..{lm.adapter.n_layers - 1} for {lm.name}, got {layer}")
    clean = clean if clean is not None and clean.probs is not None else clean_pass(lm.adapter, ids, with_probs=True)
    E, O, _ = run_rows(lm.adapter, ids, clean, [Row(s=layer)])  # the fast path of chapter 03, one intervention
    return pd.DataFrame({"layer": range(lm.adapter.n_layers), "relative_change": E[0].numpy()}), float(O[0])


def explore(lm: LoadedModel, text: str, layer: int, position: int = -1, k: int = 5) -> Exploration:
    """Everything the explorer shows, for one prompt."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("The prompt is empty: type some text.")
    ids = lm.encode(text)
    tokens = [lm.tokenizer.decode([t]) for t in ids[0].tolist()]
    if not -len(tokens) <= position < len(tokens):
        raise ValueError(f"position must be in {-len(tokens)}..{len(tokens) - 1} for this prompt of {len(tokens)} "
                         f"tokens, got {position}")
    pos = position % len(tokens)
    clean = clean_pass(lm.adapter, ids, with_probs=True)  # shared by the lens and the skip effect
    skip, out = skip_effect(lm, ids, layer, clean)
    return Exploration(lm.name, tokens, pos, layer, contributions(lm, ids), lens_top_tokens(lm, ids, pos, k, clean),
                       skip, out)


def lens_token_table(x: Exploration) -> pd.DataFrame:
    """Top-k tokens per layer as one row per layer (for display)."""
    return (x.lens.assign(cell=[f"{t!r} {p:.2f}" for t, p in zip(x.lens.token, x.lens.prob)])
            .pivot(index="layer", columns="rank", values="cell").rename(columns=lambda r: f"top {r}").reset_index())


# ---- the widget (live kernels only) -----------------------------------------------------------------------------

_MODELS: dict[tuple[str, str, str], LoadedModel] = {}


def _cached_model(name: str, device: str = "cpu", dtype: str = "float32") -> LoadedModel:
    if (name, device, dtype) not in _MODELS:
        if len(_MODELS) >= 2:  # keep at most two models in memory
            _MODELS.pop(next(iter(_MODELS)))
        _MODELS[name, device, dtype] = load_model(name, device=device, dtype=dtype)
    return _MODELS[name, device, dtype]


def explorer_widget(models: list[str], prompt: str, layer: int = 0, device: str = "cpu", dtype: str = "float32",
                    k: int = 5, loaded: LoadedModel | None = None):
    """Prompt box, model picker, layer slider and a Run button; results appear below. Returns the widget.

    ``loaded``: an already loaded model (one of ``models``, on ``device``/``dtype``) to reuse instead of loading it
    again."""
    import ipywidgets as w
    from IPython.display import display

    if loaded is not None:
        _MODELS[loaded.name, device, dtype] = loaded
    text = w.Textarea(value=prompt, layout=w.Layout(width="100%", height="80px"), description="Prompt")
    model = w.Dropdown(options=models, value=models[0], description="Model")
    lay = w.IntSlider(value=layer, min=0, max=_cached_model(models[0], device, dtype).adapter.n_layers - 1, description="Skip layer")
    pos = w.IntText(value=-1, description="Position", layout=w.Layout(width="180px"))
    run = w.Button(description="Run", button_style="primary")
    out = w.Output()

    def on_model(change) -> None:
        lay.max = _cached_model(change["new"], device, dtype).adapter.n_layers - 1

    def on_run(_) -> None:
        out.clear_output()
        with out:
            try:
                x = explore(_cached_model(model.value, device, dtype), text.value, lay.value, pos.value, k)
            except Exception as err:  # shown to the user, the widget stays usable
                print(f"{type(err).__name__}: {err}")
                return
            display(exploration_charts(x))
            display(lens_token_table(x).style.hide(axis="index"))

    model.observe(on_model, names="value")
    run.on_click(on_run)
    return w.VBox([text, w.HBox([model, lay, pos, run]), out])


__all__ = ["contributions", "lens_top_tokens", "skip_effect", "explore",
           "lens_token_table", "explorer_widget"]
