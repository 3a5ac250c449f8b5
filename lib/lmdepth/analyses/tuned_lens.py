"""The tuned lens (Belrose et al. 2023) of chapter 04 as an analysis of its own: its parameters, its cached job (the
training curve, the sidecar and the translators, finished in one atomic step), fitted before the lens run that
applies it (:mod:`lmdepth.analyses.lens`), and what that run's sidecar says of it.

One affine translator per layer, ``h ↦ h + A_l h + s_l b_l`` (zero-initialised: it starts as the logit lens),
trained on the *train* split of the lens run's data set (GSM8K for a user file; never the evaluated problems) to
minimise ``KL(P_final ‖ P_tuned)``, with a sampled softmax. Where its parts live: the translators and their training,
:mod:`lmdepth.model.translators`; the training residuals, the remote-ready trace
:func:`lmdepth.traces.boundary_residuals.token_residuals` (reference twin :mod:`lmdepth.hooks.lens_hooks`); the sampled KL,
:mod:`lmdepth.metrics.distributions`; the lens trace that applies the translators, :mod:`lmdepth.traces.lens_trace`.

The job is filed under ``<results>/tuned_lens/<model>/<key>/``: ``table.csv`` (the training curve), ``meta.json``
and ``translators.npz``, an artifact that stored results omit (L × d² floats: large, and regenerable). A lens run
whose problems are all checkpointed needs only the curve and the sidecar; one that computes reads the translators,
and trains them again (replacing the entry) where the entry keeps none. The tuned lens is trained here only: a
remote lens run (``remote`` true or ``"local"``) that would train it is refused in one line.
"""

from __future__ import annotations

import sys
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from lmdepth.analyses.run import Job, resolved
from lmdepth.data.datasets import Example, load_examples
from lmdepth.errors import ParameterError
from lmdepth.model.registry import LoadedModel, ModelRef, load_model
from lmdepth.model.translators import Translators, TunedLensRecipe, residuals_until, train_translators
from lmdepth.model.unembed import DEFAULT_LENS_DTYPE
from lmdepth.params import DTYPE_NAMES, ModelParams, param
from lmdepth.results import RunResult, RunStore, read_artifact
from lmdepth.traces.boundary_residuals import token_residuals
from lmdepth.traces.residual_metrics import TapPaths

ANALYSIS = "tuned_lens"
TRANSLATORS = "translators.npz"
#: A loaded model, a function that loads it (called only when the translators must be trained), or None: loaded here.
ModelSource = LoadedModel | Callable[[], LoadedModel] | None


@dataclass(frozen=True)
class TunedLensParams(ModelParams):
    """Parameters of the tuned lens's job: the training budget (the rest of :class:`TunedLensRecipe` is fixed), the
    training text and the numerics. ``seed`` seeds the recipe (problem selection, shuffling, negatives)."""

    dataset: str = param("gsm8k", help="the lens run's data set: its train split is the training text (GSM8K for a "
                                       "user file)")
    lens_dtype: str = param(DEFAULT_LENS_DTYPE, choices=DTYPE_NAMES,
                            help="dtype of the unembedding matmul (log-softmax is always fp32)")
    n_train_tokens: int = param(TunedLensRecipe.n_tokens, lo=64, hi=10_000_000, help="tuned-lens training tokens")
    train_epochs: int = param(TunedLensRecipe.epochs, lo=1, hi=1000, help="tuned-lens training epochs")

    @property
    def recipe(self) -> TunedLensRecipe:
        return TunedLensRecipe(n_tokens=self.n_train_tokens, epochs=self.train_epochs, seed=self.seed)


def train_source(dataset: str) -> str:
    """The data set whose train split the tuned lens reads: the lens run's own where it has one, else GSM8K."""
    return dataset if dataset in ("gsm8k", "math") else "gsm8k"


def train_examples(dataset: str, n_tokens: int, seed: int) -> list[Example]:
    """Held-out training text: the *train* split of :func:`train_source`, in random order.

    Twice as many problems as ~100 tokens each would need (GSM8K and MATH problems are longer): the first half
    is for training, the second for the held-out curve.
    """
    return load_examples(train_source(dataset), n_examples=2 * (n_tokens // 100 + 5), seed=seed, selection="random",
                         split="train")


@torch.no_grad()
def collect_residuals(lm: LoadedModel, examples: list[Example], n_tokens: int,
                      remote: bool | str | None = None) -> torch.Tensor:
    """Residuals h_0..h_L of every position of the examples, in order, until ``n_tokens`` tokens: one remote-ready
    trace per example (:func:`lmdepth.traces.boundary_residuals.token_residuals`), here, on NDIF or under its
    offline simulation (``remote``; default ``lm.remote_mode``). The translators themselves are trained here.

    Returns:
        [n_tokens, layers + 1, d_model] fp32 on the model's device (the last row is the last layer's output h_L).
    """
    paths = TapPaths.of(lm.adapter)
    mode = lm.remote_mode if remote is None else remote
    return residuals_until(lm, examples, n_tokens,
                           lambda ids: token_residuals(lm.nn, paths, ids, remote=mode).to(ids.device))


def refuse_remote_training(remote: bool | str) -> None:
    """Tuned-lens training runs here only: one line, before any work, for a remote run that would need it.

    Raises:
        ParameterError: ``remote`` is true or ``"local"``.
    """
    if remote is not False:
        raise ParameterError(
            f"remote={remote!r}: the tuned lens is trained here, not on NDIF (its translators are L x d^2 floats, "
            "~21 GB for a 70B model, fitted by thousands of optimiser steps); train them first with remote=false "
            "(a GPU for a large model; same model_name, dataset, dtype, lens_dtype, n_train_tokens, train_epochs and "
            "results_dir), then rerun: the stored translators are applied inside the trace. Or set tuned_lens=false.")


def job(p: TunedLensParams, ref: ModelRef) -> Job:
    """The tuned lens's job: keyed by the recipe, the training text, the numerics and the weights here (translators
    trained on other weights are never reused; a remote lens run uses the ones trained here on the same weights)."""
    key = {**asdict(p.recipe), "train_data": f"{train_source(p.dataset)}/train", "dtype": p.dtype,
           "lens_dtype": p.lens_dtype}
    return Job(ANALYSIS, p, key, refs=ref.here(), bare_weights=True, record=False)


def cache_key(p: TunedLensParams, ref: ModelRef) -> str:
    """The cache key of the tuned lens's entry (part of a lens run's key), without reading or computing anything."""
    return job(p, ref).store().key


def run(params: TunedLensParams | ModelRef | str | None = None, model: ModelSource = None,
        remote: bool | str = False, **kwargs: Any) -> RunResult:
    """The tuned lens's cached job: its entry served from the results, or the translators trained now.

    Args:
        params: a :class:`TunedLensParams`, its fields as keyword arguments, or the model already resolved.
        model: the model to train on (or a function that loads it); default: loaded here.
        remote: the remote mode of the run that asks for the tuned lens: training refuses anything but False,
            before it loads the model.

    Returns:
        The training curve (``model, split, step, tokens, layer, value``; :func:`train_translators`) and the sidecar
        (``training``: head size, negatives, steps, selected steps …); the translators as its artifact
        (:func:`translators_of`; a run served from stored results may keep none: run it with ``use_cache=False``
        to train them again).
    """
    p, ref = resolved(TunedLensParams, params, kwargs)
    j = job(p, ref)
    return j.execute(lambda store: _compute(p, j.ref, model, remote, store))


def _compute(p: TunedLensParams, ref: ModelRef, model: ModelSource, remote: bool | str, store: RunStore
             ) -> tuple[pd.DataFrame, dict[str, Any], None, dict[str, bytes]]:
    refuse_remote_training(remote)
    lm = model() if callable(model) else (model or load_model(ref, device=p.device, dtype=p.dtype))
    refuse_remote_training(lm.remote_mode)
    cfg = p.recipe
    exs = train_examples(p.dataset, cfg.n_tokens, cfg.seed)
    # Held-out problems are the last ones of the shuffled list: never read for training.
    n_val = max(1, int(cfg.n_tokens * cfg.val_fraction))
    train_h = collect_residuals(lm, exs[: len(exs) // 2], cfg.n_tokens)
    val_h = collect_residuals(lm, exs[len(exs) // 2 :], n_val)
    translators, curve, info = train_translators(lm, train_h, val_h, cfg, p.lens_dtype)
    curve.insert(0, "model", ref.name)
    meta = {"parameters": {"model_name": ref.name, **store.params}, "model": lm.provenance(), "training": info}
    return curve, meta, None, {TRANSLATORS: translators.to_npz()}


def translators_of(result: RunResult) -> Translators | None:
    """The translators a finished tuned-lens run keeps; None where it keeps none (stored results omit them) or they
    cannot be read (one line says so)."""
    data = read_artifact(result, TRANSLATORS)
    if data is None:
        return None
    try:
        return Translators.from_npz(data)
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as e:
        print(f"lmdepth: the translators {Path(result.path) / TRANSLATORS} cannot be read ({type(e).__name__})",
              file=sys.stderr, flush=True)
        return None


def has_translators(result: RunResult) -> bool:
    """Whether a finished tuned-lens run keeps its translators (without reading them)."""
    return (Path(result.path) / TRANSLATORS).exists()


# ---- what a lens run's sidecar says of its tuned lens ---------------------------------------------------------------

def sidecar(result: RunResult, p: TunedLensParams) -> dict[str, Any]:
    """The lens run's ``tuned_lens`` entry: where the tuned lens's entry is, whether it was served from the cache, the
    recipe and the training info."""
    return {"path": str(result.path), "cache_key": result.meta["cache_key"], "from_cache": result.from_cache,
            "recipe": asdict(p.recipe), **result.meta["training"]}


@dataclass(frozen=True)
class TunedLensTraining:
    """How a lens run's tuned-lens translators were obtained (its sidecar's ``tuned_lens``, :func:`sidecar`).

    Attributes:
        path: the translators' cache entry, as the sidecar recorded it (see :func:`training_curve`).
        from_cache: loaded from that entry (True) or trained by the lens run.
        train_time_s: seconds the training took (when it was trained).
        train_tokens: training tokens; ``epochs``: passes over them (the recipe's).
        head_size: the vocabulary head (top final tokens of the training tokens); ``n_negatives``: uniform
            negatives sampled per step; ``vocab``: the model's vocabulary.
        layers_kept_identity: layers whose translator the held-out selection left at the identity (step 0).
    """

    path: Path
    from_cache: bool
    train_time_s: float
    train_tokens: int
    epochs: int
    head_size: int
    n_negatives: int
    vocab: int
    layers_kept_identity: int

    @classmethod
    def of(cls, entry: dict[str, Any]) -> TunedLensTraining:
        """From a lens run's sidecar entry (:func:`sidecar`)."""
        return cls(path=Path(entry["path"]), from_cache=bool(entry["from_cache"]),
                   train_time_s=float(entry["train_time_s"]), train_tokens=int(entry["train_tokens"]),
                   epochs=int(entry["recipe"]["epochs"]), head_size=int(entry["head_size"]),
                   n_negatives=int(entry["n_negatives"]), vocab=int(entry["vocab"]),
                   layers_kept_identity=int(entry["layers_kept_identity"]))


def training_curve(lens_result: RunResult) -> pd.DataFrame:
    """The tuned-lens training curve of a lens run (read from the translators' cache entry named in its sidecar).

    The entry is looked up beside the lens run, in the same results folder (``<results>/tuned_lens/<model>/<key>``):
    the sidecar's path was written relative to the directory the run was computed from, so a results folder that
    was copied, moved or read from elsewhere would not find it there."""
    info = lens_result.meta.get("tuned_lens")
    if not info:
        return pd.DataFrame()
    stored = Path(info["path"])
    beside = Path(lens_result.path).parents[2] / ANALYSIS / stored.parent.name / stored.name
    return pd.read_csv((beside if beside.exists() else stored) / "table.csv")


__all__ = ["ANALYSIS", "TRANSLATORS", "TunedLensParams", "TunedLensTraining", "cache_key", "collect_residuals",
           "has_translators", "job", "refuse_remote_training", "run", "sidecar", "train_examples",
           "train_source", "training_curve", "translators_of"]
