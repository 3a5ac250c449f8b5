"""Live explorer: one prompt, one model, one layer — its residual contributions, logit-lens tokens and skip effect.

The compute functions are plain (testable on tiny models); :func:`explorer_widget` wraps them in ipywidgets for a
live Jupyter or Colab kernel. Everything is computed on the spot through chapter 03's remote-ready skip session
(:func:`lmdepth.traces.skip_effects.skip_effects`), in the loaded model's ``remote_mode`` (here, on NDIF, or under the
strict offline simulation of NDIF; :func:`load`): its clean pass also reduces the contributions (chapter 01's
relative contributions) and the logit lens' top tokens (chapter 04's lens), and the chosen layer alone is skipped
(all tokens, whole layer). One explore is one request and two forward passes — the clean pass and the skipped one:
a reader explores a hosted 70B model live from a notebook.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import torch

from lmdepth.charts.explorer_charts import Exploration, exploration_charts
from lmdepth.metrics.residual_stats import RESIDUAL_METRICS
from lmdepth.model.registry import LoadedModel, load_model
from lmdepth.params import check_remote
from lmdepth.traces.residual_metrics import TapPaths
from lmdepth.traces.skip_effects import session_forwards, skip_effects

#: What one explore costs: requests (one nnsight session) and forward passes (the skip session of one layer, all
#: tokens: the clean pass and the skipped pass).
EXPLORE_REQUESTS, EXPLORE_FORWARDS = 1, session_forwards(1, 0, True)


@torch.no_grad()
def _readings(lm: LoadedModel, ids: torch.Tensor, layer: int | None = None, position: int | None = None,
              k: int = 5, contributions: bool = False) -> dict[tuple[str, str], tuple[torch.Tensor, ...]]:
    """One skip session (one request): the clean pass, with the readings asked for, and the pass skipping
    ``layer`` (all tokens, whole layer) when it is given."""
    if layer is not None and not 0 <= layer < lm.adapter.n_layers:
        raise ValueError(f"layer must be in 0..{lm.adapter.n_layers - 1} for {lm.name}, got {layer}")
    return skip_effects(lm.nn, TapPaths.of(lm.adapter), ids, parts=("layer",), local=False, current=layer is not None,
                        config=lm.model.config, remote=lm.remote_mode, skipped=[] if layer is None else [layer],
                        contributions=contributions, lens=None if position is None else (position % ids.shape[1], k))


def _contribution_frame(values: torch.Tensor) -> pd.DataFrame:
    """[L, 3, T] relative contributions → ``layer, component, value``, the mean over the prompt's tokens."""
    names = [c for m, c in RESIDUAL_METRICS if m == "relative_contribution"]
    vals = values.mean(-1).T  # [3, L]
    return pd.DataFrame([dict(layer=l, component=n, value=float(vals[i, l]))
                         for l in range(vals.shape[1]) for i, n in enumerate(names)])


def _lens_frame(lm: LoadedModel, probs: torch.Tensor, top: torch.Tensor) -> pd.DataFrame:
    """[L + 1, k] probabilities and token ids → ``layer, rank, token, token_id, prob``."""
    return pd.DataFrame([dict(layer=l, rank=r + 1, token=lm.tokenizer.decode([int(top[l, r])]), token_id=int(top[l, r]),
                              prob=float(probs[l, r])) for l in range(top.shape[0]) for r in range(top.shape[1])])


def _skip_frame(lm: LoadedModel, E: torch.Tensor, O: torch.Tensor, layer: int) -> tuple[pd.DataFrame, float]:
    return pd.DataFrame({"layer": range(lm.adapter.n_layers), "relative_change": E[layer].numpy()}), float(O[layer])


def contributions(lm: LoadedModel, ids: torch.Tensor) -> pd.DataFrame:
    """Relative contributions of every layer, mean over the prompt's tokens (chapter 01's metrics on one prompt;
    one request, one forward pass).

    Args:
        ids: [1, T] token ids.
    """
    return _contribution_frame(_readings(lm, ids, contributions=True)["clean", "contributions"][0])


def lens_top_tokens(lm: LoadedModel, ids: torch.Tensor, position: int = -1, k: int = 5) -> pd.DataFrame:
    """Logit-lens top-k tokens at one position, for the residual entering every layer and for the output (one
    request, one forward pass: only [L + 1, k] numbers come back)."""
    return _lens_frame(lm, *_readings(lm, ids, position=position, k=k)["clean", "lens"])


def skip_effect(lm: LoadedModel, ids: torch.Tensor, layer: int) -> tuple[pd.DataFrame, float]:
    """Effect of skipping ``layer`` at every position ≥ 1 on every layer's contribution (chapter 03, all tokens,
    whole layer: its skip session for this skipped layer alone, i.e. the clean pass and one intervened pass).

    Returns:
        (``layer, relative_change`` with the largest change over positions, output change ‖P − P′‖₂).
    """
    return _skip_frame(lm, *_readings(lm, ids, layer=layer)["current", "layer"][:2], layer)


def explore(lm: LoadedModel, text: str, layer: int, position: int = -1, k: int = 5) -> Exploration:
    """Everything the explorer shows, for one prompt: one skip session (:data:`EXPLORE_REQUESTS` request,
    :data:`EXPLORE_FORWARDS` forward passes), whose clean pass serves all three panels."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("The prompt is empty: type some text.")
    ids = lm.encode(text)
    tokens = [lm.tokenizer.decode([t]) for t in ids[0].tolist()]
    if not -len(tokens) <= position < len(tokens):
        raise ValueError(f"position must be in {-len(tokens)}..{len(tokens) - 1} for this prompt of {len(tokens)} "
                         f"tokens, got {position}")
    pos = position % len(tokens)
    got = _readings(lm, ids, layer=layer, position=pos, k=k, contributions=True)
    skip, out = _skip_frame(lm, *got["current", "layer"][:2], layer)
    return Exploration(lm.name, tokens, pos, layer, _contribution_frame(got["clean", "contributions"][0]),
                       _lens_frame(lm, *got["clean", "lens"]), skip, out)


def lens_token_table(x: Exploration) -> pd.DataFrame:
    """Top-k tokens per layer as one row per layer (for display)."""
    return (x.lens.assign(cell=[f"{t!r} {p:.2f}" for t, p in zip(x.lens.token, x.lens.prob)])
            .pivot(index="layer", columns="rank", values="cell").rename(columns=lambda r: f"top {r}").reset_index())


# ---- the widget (live kernels only) -----------------------------------------------------------------------------

def load(name: str, device: str = "cpu", dtype: str = "float32", remote: bool | str = False) -> LoadedModel:
    """The explorer's model: ``remote`` false (here), true (NDIF: a hosted hub id; checked by the NDIF preflight in
    seconds, before anything is loaded) or ``"local"`` (the strict offline simulation of NDIF).

    Raises:
        ParameterError: a bad ``remote`` or, with ``remote=True``, a name that is not a hub id;
        RemoteUnavailable: ``remote=True`` without an NDIF API key, the network, or the model hosted (one line).
    """
    check_remote(name, remote)
    return load_model(name, device=device, dtype=dtype, remote=remote)


_MODELS: dict[tuple[str, str, str, bool | str], LoadedModel] = {}


def _cached_model(name: str, device: str = "cpu", dtype: str = "float32", remote: bool | str = False) -> LoadedModel:
    key = (name, device, dtype, remote)
    if key not in _MODELS:
        if len(_MODELS) >= 2:  # keep at most two models in memory
            _MODELS.pop(next(iter(_MODELS)))
        _MODELS[key] = load(name, device, dtype, remote)
    return _MODELS[key]


def _prompt_box(prompt: str, **kw: Any) -> Any:
    """The prompt's text box, whose typed value reaches the kernel whatever it holds. ipywidgets echoes every value
    it receives before setting it, and the echo of a lone surrogate (half of an emoji, as a browser may send it)
    cannot be encoded: the value was dropped, and Run drew the previous prompt's output again, without a word.
    Without the echo the value arrives, and :func:`explore` refuses it in one line."""
    import ipywidgets as w
    import traitlets

    class PromptBox(w.Textarea):
        value = traitlets.Unicode(help="String value").tag(sync=True, echo_update=False)

    return PromptBox(value=prompt, **kw)


def explorer_widget(models: list[str], prompt: str, layer: int = 0, device: str = "cpu", dtype: str = "float32",
                    k: int = 5, loaded: LoadedModel | None = None, remote: bool | str = False):
    """Prompt box, model picker, layer slider and a Run button; results appear below. Returns the widget.

    ``loaded``: an already loaded model (one of ``models``, on ``device``/``dtype``, in mode ``remote``) to reuse
    instead of loading it again. ``remote``: where every model of the picker runs (:func:`load`); each name is
    checked for it before the widget is built, so a packaged name with ``remote=True`` stops here in one line."""
    import ipywidgets as w
    from IPython.display import display

    for name in models:
        check_remote(name, remote)
    if loaded is not None:
        _MODELS[loaded.name, device, dtype, remote] = loaded
    text = _prompt_box(prompt, layout=w.Layout(width="100%", height="80px"), description="Prompt")
    model = w.Dropdown(options=models, value=models[0], description="Model")
    first = _cached_model(models[0], device, dtype, remote)
    lay = w.IntSlider(value=layer, min=0, max=first.adapter.n_layers - 1, description="Skip layer")
    pos = w.IntText(value=-1, description="Position", layout=w.Layout(width="180px"))
    run = w.Button(description="Run", button_style="primary")
    out = w.Output()

    def on_model(change) -> None:
        try:
            lay.max = _cached_model(change["new"], device, dtype, remote).adapter.n_layers - 1
        except Exception as err:  # e.g. NDIF unreachable: one line in the output area, the widget stays usable
            out.clear_output()
            with out:
                print(f"{type(err).__name__}: {err}")

    def on_run(_) -> None:
        out.clear_output()
        with out:
            try:
                x = explore(_cached_model(model.value, device, dtype, remote), text.value, lay.value, pos.value, k)
            except Exception as err:  # shown to the user, the widget stays usable
                print(f"{type(err).__name__}: {err}")
                return
            display(exploration_charts(x))
            display(lens_token_table(x).style.hide(axis="index"))

    model.observe(on_model, names="value")
    run.on_click(on_run)
    return w.VBox([text, w.HBox([model, lay, pos, run]), out])


__all__ = ["EXPLORE_REQUESTS", "EXPLORE_FORWARDS", "contributions", "lens_top_tokens", "skip_effect", "explore",
           "lens_token_table", "load", "explorer_widget"]
