"""The count-bigram baseline of chapter 04: how close to the model's output a predictor gets that sees only the
current token.

A lens that "settles" must beat it to mean anything: at layer 0 the tuned lens *is* a bigram model (it maps the
embedding of the current token to a next-token distribution), so its top-5 overlap with the output starts at the
bigram baseline's, not at 0. The counts come from the tuned lens' own training text (the train split), the
evaluation uses the lens run's positions of the lens run's problems, and the metrics are the lens metrics
(:func:`lmdepth.metrics.distributions.lens_metrics`): KL(P_bigram ‖ P_final), KL(P_final ‖ P_bigram), top-5
overlap.

Smoothing: p(v | a) = (c(a, v) + μ·p_uni(v)) / (c(a) + μ) with μ = 1 and an add-one unigram p_uni, so unseen
pairs back off to the unigram distribution.
"""

from __future__ import annotations

import warnings
from collections import Counter, defaultdict
from typing import Any

import numpy as np
import pandas as pd
import torch

from lmdepth.analyses.lens import LensParams, sample_positions
from lmdepth.analyses.run import Job, per_unit, resolved
from lmdepth.analyses.run import run_many as many
from lmdepth.analyses.tuned_lens import train_examples
from lmdepth.data.datasets import dataset_id, load_examples
from lmdepth.metrics.distributions import LENS_METRICS, FinalDistribution, lens_metrics
from lmdepth.model.registry import ModelRef, load_model
from lmdepth.results import RunResult, RunStore

ANALYSIS = "bigram_baseline"
MU = 1.0  # Dirichlet smoothing towards the unigram distribution
class BigramCounts:
    """Next-token counts c(a, v) and unigram counts c(v) over a token stream."""

    def __init__(self, sequences: list[list[int]], vocab: int):
        self.vocab = vocab
        self.pairs: dict[int, Counter] = defaultdict(Counter)
        self.unigram = np.ones(vocab)  # add-one
        for seq in sequences:
            for a, b in zip(seq[:-1], seq[1:]):
                self.pairs[a][b] += 1
            np.add.at(self.unigram, np.asarray(seq[1:], dtype=np.int64), 1)
        self.unigram /= self.unigram.sum()

    def logprobs(self, prev: torch.Tensor) -> torch.Tensor:
        """[T] current tokens → [T, vocab] fp32 log-probabilities of the next token."""
        uni = torch.as_tensor(self.unigram, dtype=torch.float64)
        rows = []
        for a in prev.tolist():
            c = self.pairs.get(a, Counter())
            row = MU * uni.clone()
            if c:
                idx = torch.tensor(list(c.keys()))
                row[idx] += torch.tensor(list(c.values()), dtype=torch.float64)
            rows.append(torch.log(row / (sum(c.values()) + MU)))
        return torch.stack(rows).float()


def run(params: LensParams | ModelRef | str | None = None, **kwargs: Any) -> RunResult:
    """The baseline's lens metrics per problem, at the positions the lens run of the same parameters evaluates.

    Args:
        params: the chapter's :class:`~lmdepth.analyses.lens.LensParams` (its data, positions and tuned-lens
            training budget are used; the lenses themselves are not).

    Returns:
        Tidy table (``model, metric, value``: means over problems) and the per-problem table (``units``:
        ``model, unit, metric, value`` with ``model`` = the lens model's name).
    """
    p, ref = resolved(LensParams, params, kwargs)
    examples = load_examples(p.dataset, n_examples=p.n_examples, seed=p.seed, selection=p.selection)
    key = dict(dataset=dataset_id(p.dataset), n_examples=p.n_examples, seed=p.seed, selection=p.selection,
               include_bos=p.include_bos, dtype=p.dtype, positions_per_example=p.positions_per_example,
               n_train_tokens=p.n_train_tokens, mu=MU)
    item_key = {k: v for k, v in key.items() if k not in ("n_examples", "selection")}
    return Job(ANALYSIS, p, key, item_key, refs=ref).execute(lambda store: _compute(p, ref, key, examples, store))


def _compute(p: LensParams, ref: ModelRef, key: dict[str, Any], examples: list, store: RunStore
             ) -> tuple[pd.DataFrame, dict[str, Any], pd.DataFrame]:
    lm = load_model(ref.here(), device=p.device, dtype=p.dtype)  # plain torch: the weights here
    train = train_examples(p.dataset, p.n_train_tokens, p.seed)
    seqs = [lm.tokenizer(e.text).input_ids for e in train[: len(train) // 2]]  # the tuned lens' training half
    budget, kept = p.n_train_tokens, []
    for s in seqs:  # the tuned lens' training budget of tokens, in the same order
        if budget <= 0:
            break
        kept.append(s[:budget])
        budget -= len(kept[-1])
    vocab = lm.model.get_output_embeddings().weight.shape[0]
    counts = BigramCounts(kept, vocab)
    encoded = [(e.id, lm.encode(e.text, label=f"Example {e.id}")) for e in examples]

    def one(uid: str, ids: Any) -> dict[str, np.ndarray]:
        pos = sample_positions(ids.shape[1], p.positions_per_example, f"{p.seed}:{uid}", p.include_bos)
        with torch.no_grad():  # the model's output logits (soft-capped by the model itself where it caps)
            final = lm.model(ids).logits[0, pos].float().cpu()
        vals = lens_metrics(counts.logprobs(ids[0, pos].cpu()), FinalDistribution.from_logits(final))
        return {"mean": vals.mean(-1).numpy()}

    items = per_unit(store, encoded, one, desc=f"{p.model_name}: bigram baseline")
    units = pd.DataFrame([{"model": p.model_name, "unit": uid, "metric": m, "value": float(it["mean"][j])}
                          for (uid, _), it in zip(encoded, items) for j, m in enumerate(LENS_METRICS)])
    table = units.groupby(["model", "metric"], as_index=False)["value"].mean()
    meta = {"parameters": {"model_name": p.model_name, **key}, "model": lm.provenance(),
            "n_train_tokens_counted": int(sum(len(s) for s in kept)), "n_contexts": len(counts.pairs)}
    return table, meta, units


def with_baseline(lens_units: pd.DataFrame, models: list[str], **kwargs: Any) -> pd.DataFrame:
    """Add the baseline to chapter 04's per-problem lens table, as a reference for the tuned-lens claim (which
    compares the tuned lens' overlap with it) and the charts — never as a control: flat over depth, it fixes every
    settling depth by construction.

    Returns:
        the lens table plus, per model, a ``bigram`` lens: the baseline's value on each problem, flat over the
        layers. No baseline for ``remote=True`` (its counts and the model's output are computed here, with weights
        that stay on NDIF): then ``lens_units`` unchanged. ``remote="local"`` (the offline simulation of NDIF) has
        the weights here, so its baseline is the local run's (the same cache entry: ``remote`` changes no number).

    Args:
        lens_units: the lens runs' per-problem table (:func:`lmdepth.analyses.lens.run_units`).
        kwargs: the lens run's parameters.
    """
    if kwargs.get("remote") is True:
        warnings.warn("No bigram baseline on NDIF (remote=true): it needs the model's weights here. Run the lens "
                      "chapter with remote=false for the chart's reference line.", stacklevel=2)
        return lens_units
    kwargs = {**kwargs, "remote": False}  # "local": the weights are here; the baseline's forward is plain torch
    flat = []
    for m, r in many(run, models, **kwargs).items():
        layers = pd.DataFrame({"layer": range(int(lens_units[lens_units.model == m]["layer"].max()) + 1)})
        flat.append(r.units.assign(lens="bigram").merge(layers, how="cross"))
    return pd.concat([lens_units, *flat], ignore_index=True)
