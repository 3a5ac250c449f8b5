"""Benchmark: each chapter's nnsight trace (:mod:`lmdepth.traces`, the one path every analysis runs through, here and
on NDIF) against the plain-hook code it replaced (kept as the tests' reference), on the chapter's own default-profile
inputs, in one process.

Per measurement both paths run on the SAME inputs, with the batch sizes, positions and cut points the chapter's
default run uses (``profiles/default.yaml`` and the chapters' parameters), for the first ``--problems`` problems of
the chapter's own selection (chapter 05: spread over its difficulty levels):

* 01–02 residual metrics: :func:`~lmdepth.traces.residual_metrics.residual_metrics` vs
  :func:`~lmdepth.model.taps.hooked_residuals` + :func:`~lmdepth.metrics.residual_stats.residual_token_metrics`;
* 03 skipping, all tokens and future tokens (parts layer/attention/mlp + local; 4 cut points from every 8th
  token; the trace with the chapter's robust statistic, ``floor`` 0.1, which the reference does not compute):
  :func:`~lmdepth.traces.skip_effects.skip_effects` vs the plain-hook fast path
  :func:`~lmdepth.hooks.skip_hooks.prompt_effects` (E and O compared);
* 04 logit lens and tuned lens applied (64 sampled positions, fp32 unembedding): :func:`~lmdepth.traces.lens_trace
  .lens_readings` vs :func:`lmdepth.hooks.lens_hooks.prompt_lens`. No translators are stored with the results (they
  are large and regenerable), so the tuned lens applies random translators of the trained shape ([L, d, d]): the
  same work, other numbers;
* 05 the depth score's skip session (whole layer, 2 cut points from every 4th answer token, 64 answer tokens kept;
  MATH and the variable-chain ladder), the correctness check (greedy generation of 128 tokens for MATH, one batch;
  teacher-forced match for the ladder) and residual erasure (means over the first 10 GSM8K problems; maps of the
  case studies, 32 rows per pass): :func:`~lmdepth.traces.skip_effects.skip_effects`, :mod:`lmdepth.traces.generation`
  and :mod:`lmdepth.traces.erasure_trace` vs :func:`~lmdepth.hooks.skip_hooks.prompt_effects`,
  :mod:`lmdepth.model.generate`, :func:`~lmdepth.hooks.stack.mean_residuals` and :func:`~lmdepth.hooks.stack.erasure_map`;
* 07 the depth of the comparison runs (MoEUT answer-only seed 0, trained from scratch; the first ``--problems`` of
  the chapter's four probes, which need no generated data): the skip session of the depth score (whole layer, cut
  at the first answer token) and the erasure map (positions 1 … T − 2, the mean residual of the chapter's reference
  problem) through the traces on a generic ``NNsight`` wrapper (:func:`lmdepth.analyses.scratch.traced`) vs
  :func:`~lmdepth.hooks.skip_hooks.prompt_effects` and :func:`~lmdepth.hooks.stack.erasure_map`;
* 06 boundary-residual collection (the chapter's texts, batches of up to 2,048 padded tokens, every aligned
  position — planned for this one model, so every eligible token aligns):
  :func:`~lmdepth.traces.boundary_residuals.boundary_residuals_at` vs :func:`~lmdepth.hooks.stack.boundary_residuals`.

Each pair runs in up to ``--repeats`` interleaved rounds (the order alternates; fewer once another round would take
the pair past ``--budget`` seconds: the skip sessions cost minutes a round on a CPU). The first round's results are
compared (max abs difference ≤ ``--tol``, else the script exits non-zero with one line) and its forward passes of the
decoder counted by a hook. The table gives the median CPU seconds (process time, robust to other jobs on a shared
machine) and wall seconds of each path over all its problems, and the ratio trace / reference; the load average is
printed at the start and the end. The defaults (one problem a chapter: the skip sessions alone are ~10 minutes) took
16 minutes on a loaded 2-core CPU (load average ~3); ``--chapters`` runs a subset. Run with one thread:

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_traces.py --model smollm2-135m --problems 1 --repeats 3

``--ceiling`` also prints one JSON line per trace on the loaded model (chapters 01–06) with its efficiency against
the exact-work ceiling: ``{"path", "efficiency", "forwards", "plain_forward_s"}``, where ``forwards`` is the work the
trace's decoder layers did, counted by hooks on every layer as token rows (batch × new tokens, summed over layer
calls) and expressed in plain forwards of the first problem (its tokens × the layers), ``plain_forward_s`` that
forward's median CPU seconds (``logits_to_keep=1``), measured in the same process just before, and
the rows the trace's head (the unembedding) multiplied beyond one per forward, counted by a hook on the head
(``head_rows``), with that head's median CPU seconds a row (``plain_head_row_s``, timed on 256 random rows at a
time) plus the plain cost a row of the path's reduction of those logits (``plain_reduction_row_s``: the lens' KLs
and top-k, :func:`plain_lens_reduction`; 0 where not counted), and ``plain_extra_s``, the arithmetic a path must do
beyond the forward, timed in plain torch on residuals captured before (the residual metrics of every layer and
token, layer by layer; 0 elsewhere): ``efficiency = (plain_forward_s × forwards + (plain_head_row_s +
plain_reduction_row_s) × head_rows + plain_extra_s) / the trace's median CPU seconds``. The attention over a reused
prefix and a skip's distances are not counted, so those figures are conservative.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lmdepth.analyses.lens import TOP_K, sample_positions
from lmdepth.data.corpus import corpus_docs, plan_corpus
from lmdepth.data.datasets import load_examples
from lmdepth.data.difficulty import analysis_input, answer_start, difficulty_examples
from lmdepth.hooks.lens_hooks import prompt_lens
from lmdepth.hooks.skip_hooks import PARTS, draw_cuts, prompt_effects
from lmdepth.hooks.stack import AdapterStack, boundary_residuals, erasure_map, mean_residuals
from lmdepth.kernels.residual_kernels import token_metrics
from lmdepth.metrics.residual_stats import residual_token_metrics
from lmdepth.model.generate import generate_greedy, teacher_forced_correct
from lmdepth.model.registry import LoadedModel, load_model
from lmdepth.model.taps import hooked_residuals
from lmdepth.model.translators import Translators
from lmdepth.model.unembed import Unembedding
from lmdepth.traces.boundary_residuals import boundary_residuals_at
from lmdepth.traces.erasure_trace import boundary_sums, erasure_effects
from lmdepth.traces.generation import greedy_matches, greedy_texts
from lmdepth.traces.lens_trace import lens_readings
from lmdepth.traces.residual_metrics import TapPaths, residual_metrics
from lmdepth.traces.skip_effects import skip_effects

CHAPTERS = ("01-02", "03", "04", "05", "06", "07")
SEED = 0  # the default profile's seed
#: One entry per forward pass of a model's decoder since the last clear (a pre-hook, :func:`count_forward`).
FORWARDS: list[int] = []


def count_forward(module: torch.nn.Module, args: Any) -> None:
    """Forward pre-hook of a decoder: count one pass."""
    FORWARDS.append(1)


#: Token rows (batch × new tokens) the loaded model's decoder layers processed since the last clear, one entry per
#: layer call (:func:`count_rows`).
LAYER_ROWS: list[int] = []


def count_rows(module: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
    """Forward pre-hook of a decoder layer: the token rows of this call (its hidden states [B, T, d])."""
    h = args[0] if args else kwargs["hidden_states"]
    LAYER_ROWS.append(h.shape[0] * h.shape[1])


#: Token rows the loaded model's head (the unembedding) multiplied since the last clear, one entry per call
#: (:func:`count_head_rows`): the lens and the skip sessions read logits at many positions.
HEAD_ROWS: list[int] = []


def count_head_rows(module: torch.nn.Module, args: Any) -> None:
    """Forward pre-hook of the head: the rows of this call (its input [..., d])."""
    HEAD_ROWS.append(args[0].numel() // args[0].shape[-1])


def plain_head_row_s(lm: LoadedModel, rows: int = 256, repeats: int = 5) -> float:
    """Median CPU seconds of the head on one row, timed on ``rows`` random rows at a time (a lens block's size)."""
    head = lm.model.get_output_embeddings()
    x = torch.randn(rows, lm.adapter.d_model, dtype=head.weight.dtype)
    with torch.no_grad():
        head(x)  # warm-up
        return statistics.median(timed(lambda: head(x))[1] for _ in range(repeats)) / rows


def plain_reduction_row_s(lm: LoadedModel, reduction: Callable[[torch.Tensor], Callable[[], Any]], rows: int = 256,
                          repeats: int = 5) -> float:
    """Median CPU seconds of a path's reduction of one row of the head's logits, timed on ``rows`` rows at a time
    (``reduction(z)`` allocates its buffers and returns the work to time)."""
    head = lm.model.get_output_embeddings()
    with torch.no_grad():
        work = reduction(head(torch.randn(rows, lm.adapter.d_model, dtype=head.weight.dtype)).float())
        work()  # warm-up
        return statistics.median(timed(work)[1] for _ in range(repeats)) / rows


def plain_lens_reduction(z: torch.Tensor, k: int = TOP_K) -> Callable[[], torch.Tensor]:
    """What a lens must compute from rows of logits z [rows, V] against the output distribution (here the first
    row's, for every row), in plain torch with its buffers allocated once: the log-softmax and the probabilities,
    both KLs as row dot products (Σ p log p − Σ p log p_f and Σ p_f log p_f − Σ p_f log p) and the top-k overlap."""
    final_logp = torch.log_softmax(z[:1], -1).expand_as(z).contiguous()
    final_p, final_top = final_logp.exp(), z[:1].topk(k, -1).indices
    neg_entropy_f = (final_p * final_logp).sum(-1)
    logp, p = torch.empty_like(z), torch.empty_like(z)

    def dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.einsum("rv,rv->r", a, b)

    def work() -> torch.Tensor:
        torch.log_softmax(z, -1, out=logp)
        torch.exp(logp, out=p)
        kl, kl_final = dot(p, logp) - dot(p, final_logp), neg_entropy_f - dot(final_p, logp)
        overlap = (z.topk(k, -1).indices[:, :, None] == final_top[:, None, :]).any(-1).float().mean(-1)
        return torch.stack([kl, kl_final, overlap])

    return work


def plain_work_s(work: Callable[[], Any], repeats: int = 5) -> float:
    """Median CPU seconds of ``work()`` (warmed up once)."""
    work()
    return statistics.median(timed(work)[1] for _ in range(repeats))


def plain_forward_s(lm: LoadedModel, ids: torch.Tensor, repeats: int = 5) -> float:
    """Median CPU seconds of a plain forward of ``ids`` [1, T] (the last position's logits only)."""
    with torch.no_grad():
        lm.model(ids, logits_to_keep=1)  # warm-up
        return statistics.median(timed(lambda: lm.model(ids, logits_to_keep=1))[1] for _ in range(repeats))


@dataclass(frozen=True)
class Pair:
    """One measurement: the trace path and its plain-hook reference over the same inputs, and how far apart their
    results are (``diff(trace result, reference result)`` → max abs difference; inf for unequal discrete results)."""

    chapter: str
    measurement: str
    trace: Callable[[], Any]
    reference: Callable[[], Any]
    diff: Callable[[Any, Any], float]
    #: what the path must compute from each row of logits beyond the matmul, in plain torch (``[rows, V]`` logits
    #: → the work to time): counted in its ceiling at the CPU seconds it takes plainly (:func:`plain_reduction_row_s`);
    #: None: not counted (the skip sessions' distances: their figure is then conservative).
    row_reduction: Callable[[torch.Tensor], Callable[[], Any]] | None = None
    #: what the path must compute from the residuals beyond the forward, in plain torch on tensors captured before
    #: (the residual metrics of every layer and token): counted in its ceiling at the CPU seconds it takes
    #: (``plain_extra_s``); None: nothing beyond the forward.
    plain_extra: Callable[[], Any] | None = None


def _max_diff(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    return max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b, strict=True))


def _same(a: Any, b: Any) -> float:
    return 0.0 if a == b else float("inf")


# ---- the chapters' inputs and pairs -----------------------------------------------------------------------------------

def gsm8k_problems(lm: LoadedModel, n: int) -> list[tuple[str, torch.Tensor]]:
    """The first ``n`` of the default profile's 20 GSM8K problems (random selection, seed 0): (id, ids [1, T])."""
    return [(e.id, lm.encode(e.text)) for e in load_examples("gsm8k", n_examples=20, seed=SEED, selection="random")[:n]]


def residual_pairs(lm: LoadedModel, n: int) -> list[Pair]:
    paths, adapter, problems = TapPaths.of(lm.adapter), lm.adapter, gsm8k_problems(lm, n)

    def trace():
        return [residual_metrics(lm.nn, paths, ids) for _, ids in problems]

    def reference():
        out = []
        for _, ids in problems:
            r = hooked_residuals(adapter, ids, logits_to_keep=1)
            out.append(torch.stack([residual_token_metrics(r["resid_pre"][l], r["attn_out"][l], r["mlp_out"][l],
                                                            r["resid_post"][l]) for l in range(adapter.n_layers)]))
        return out

    taps: list[dict[str, torch.Tensor]] = []  # captured on the first call: only --ceiling times the metrics

    def metrics() -> list[torch.Tensor]:  # the 11 metrics of every layer and token, from captured residuals
        if not taps:
            taps.extend(hooked_residuals(adapter, ids, logits_to_keep=1) for _, ids in problems)
        # layer by layer: one call over all layers is 3x slower (its intermediates leave the cache)
        return [token_metrics(r["resid_pre"][l], r["attn_out"][l], r["mlp_out"][l], r["resid_post"][l])
                for r in taps for l in range(adapter.n_layers)]

    return [Pair("01-02", "residual metrics", trace, reference, _max_diff, plain_extra=metrics)]


def _skip_pair(lm: LoadedModel, chapter: str, name: str, inputs: list[tuple[torch.Tensor, list[int]]],
               parts: Sequence[str], local: bool, current: bool, floor: float | None) -> Pair:
    paths = TapPaths.of(lm.adapter)
    analysis = "current" if current else "future"

    def trace():
        return [skip_effects(lm.nn, paths, ids, cuts=cuts, parts=parts, local=local, current=current,
                             config=lm.model.config, floor=floor) for ids, cuts in inputs]

    def reference():
        return [prompt_effects(lm.adapter, ids, cuts=cuts, parts=parts, local=local, current=current)
                for ids, cuts in inputs]

    def diff(got, ref):  # E and O of every variant (the reference has no robust statistics)
        return max(_max_diff(g[k][:2], r[k][:2]) for g, r in zip(got, ref) for k in r if k[0] == analysis)

    return Pair(chapter, name, trace, reference, diff)


def skipping_pairs(lm: LoadedModel, n: int) -> list[Pair]:
    problems = gsm8k_problems(lm, n)
    kw = dict(parts=PARTS, local=True, floor=0.1)  # chapter 03's main model: every part, the local variant, floor 0.1
    return [_skip_pair(lm, "03", "skip, all tokens", [(ids, []) for _, ids in problems], current=True, **kw),
            _skip_pair(lm, "03", "skip, future (4 cuts)",
                       [(ids, draw_cuts(ids.shape[1], 4, SEED, uid, 8)) for uid, ids in problems], current=False, **kw)]


def random_translators(lm: LoadedModel) -> Translators:
    """Translators of the trained shape, away from the identity (so the tuned lens reads differently)."""
    g = torch.Generator().manual_seed(SEED)
    L, d = lm.n_layers, lm.adapter.d_model
    tr = Translators(L, d, scale=torch.rand(L, generator=g) + 0.5)
    with torch.no_grad():
        tr.A.copy_(0.05 * torch.randn(tr.A.shape, generator=g) / d ** 0.5)
        tr.b.copy_(0.3 * torch.randn(tr.b.shape, generator=g))
    return tr


def lens_pairs(lm: LoadedModel, n: int) -> list[Pair]:
    paths, problems = TapPaths.of(lm.adapter), gsm8k_problems(lm, n)
    inputs = [(ids, sample_positions(ids.shape[1], 64, f"{SEED}:{uid}", True)) for uid, ids in problems]
    softcap = getattr(lm.model.config, "final_logit_softcapping", None) or None
    unembed = Unembedding.of(lm, "float32")
    pairs = []
    for name, tr in (("logit lens", None), ("logit + tuned lens (random translators)", random_translators(lm))):
        tensors = None if tr is None else (tr.A.detach(), tr.b.detach(), tr.scale.detach())

        def trace(tensors=tensors):
            return [lens_readings(lm.nn, paths, ids, pos, "float32", softcap, tensors, TOP_K) for ids, pos in inputs]

        def reference(tr=tr):
            return [prompt_lens(lm, ids, pos, unembed, tr, TOP_K) for ids, pos in inputs]

        def diff(got, ref):
            return max(max(float((g[0] - r[0]).abs().max()), abs(g[1] - r[1])) for g, r in zip(got, ref))

        pairs.append(Pair("04", name, trace, reference, diff, plain_lens_reduction))
    return pairs


def _spread(items: list, n: int) -> list:
    """``n`` items spread evenly over the list (the difficulty levels are in order)."""
    step = max(1, len(items) // n)
    return items[::step][:n]


def complexity_pairs(lm: LoadedModel, n: int) -> list[Pair]:
    from lmdepth.analyses.erasure import CASE_STUDIES

    tok, paths, adapter = lm.tokenizer, TapPaths.of(lm.adapter), lm.adapter
    stack = AdapterStack(adapter)
    softcap = getattr(lm.model.config, "final_logit_softcapping", None) or None
    pairs = []
    # the depth score's skip session, per the chapter: MATH (2 cuts, 64 answer tokens) and a synthetic ladder
    math = _spread(difficulty_examples("math", None, 2, SEED), n)
    ladder = _spread(difficulty_examples("vars", None, 20, SEED), n)
    for source, exs, name in (("math", math, "MATH"), ("vars", ladder, "ladder items (variable chains)")):
        skip_inputs = []
        for ex in exs:
            full = tok(ex.text, return_tensors="pt").input_ids
            ids, cuts, _ = analysis_input(tok, ex, full, source, SEED, 2, 4, 64, "predict")
            skip_inputs.append((ids, cuts))
        pairs.append(_skip_pair(lm, "05", f"depth score: skip session, {name}", skip_inputs, ("layer",), False,
                                False, None))
    # the correctness check: MATH generated (128 tokens, one batch of up to 8), the ladder teacher-forced
    prompts = [e.prompt for e in math]
    pairs.append(Pair("05", "correctness: greedy generation", lambda: greedy_texts(lm.nn, tok, prompts, 128, lm.device),
                      lambda: generate_greedy(lm, prompts, 128), _same))
    forced = []
    for ex in ladder:
        full = tok(ex.text, return_tensors="pt").input_ids
        forced.append((full, answer_start(tok, ex, full)))
    pairs.append(Pair("05", "correctness: teacher-forced match", lambda: [greedy_matches(lm.nn, x, a) for x, a in forced],
                      lambda: [teacher_forced_correct(lm, x, a) for x, a in forced], _same))
    # erasure: the means over the first 10 GSM8K problems, then the case studies' maps (32 rows per pass)
    texts = [lm.encode(e.text) for e in load_examples("gsm8k", n_examples=10, selection="first")]
    n_tokens = sum(t.shape[1] for t in texts)
    pairs.append(Pair("05", "erasure: mean residuals (10 texts)",
                      lambda: [sum(boundary_sums(lm.nn, paths, t) for t in texts) / n_tokens],
                      lambda: [mean_residuals(stack, texts)], _max_diff))
    mu = mean_residuals(stack, texts)
    cases = []
    for _, prompt, answer in CASE_STUDIES[:n]:
        ids = lm.encode(prompt + answer)
        head = tok(prompt, return_tensors="pt").input_ids[0]
        a = len(head) if torch.equal(ids[0, : len(head)], head) else ids.shape[1] - len(
            tok(answer, add_special_tokens=False).input_ids)
        cases.append((ids, a))
    pairs.append(Pair("05", "erasure: maps (case studies)",
                      lambda: [erasure_effects(lm.nn, paths, ids, a, mu, 32, softcap) for ids, a in cases],
                      lambda: [erasure_map(stack, ids, a, mu, batch_size=32) for ids, a in cases], _max_diff))
    return pairs


def maps_pairs(lm: LoadedModel, n: int) -> list[Pair]:
    """The first ``n`` batches of chapter 06's collection (the batching of :func:`lmdepth.analyses.maps.collect`)."""
    docs = corpus_docs("gsm8k", "python-docs", 0.5, 1200, SEED)
    plan = plan_corpus({lm.name: lm.tokenizer}, docs, {"test": 2048 * n, "val": 0, "train": 0},
                       {lm.name: lm.max_tokens})
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    batches, cur = [], []
    for k, ids in enumerate(plan.ids):
        longest = max([len(plan.ids[j][0]) for j in cur] + [len(ids[0])])
        if cur and longest * (len(cur) + 1) > 2048:
            batches.append(cur)
            cur = []
        cur.append(k)
    batches.append(cur)
    inputs = []
    for batch in batches[:n]:
        seqs = [plan.ids[k][0] for k in batch]
        width = max(len(q) for q in seqs)
        ids = torch.tensor([q + [pad] * (width - len(q)) for q in seqs])
        pos = [torch.as_tensor(plan.positions[k][0], dtype=torch.long) for k in batch]
        rows = torch.cat([torch.full((len(p),), b, dtype=torch.long) for b, p in enumerate(pos)])
        inputs.append((ids, rows, torch.cat(pos)))
    paths, stack = TapPaths.of(lm.adapter), AdapterStack(lm.adapter)
    return [Pair("06", "boundary residuals (batches of 2,048 tokens)",
                 lambda: [boundary_residuals_at(lm.nn, paths, ids, r, p) for ids, r, p in inputs],
                 lambda: [boundary_residuals(stack, ids).float()[:, r, p] for ids, r, p in inputs], _max_diff)]


def scratch_pairs(lm: LoadedModel, n: int) -> list[Pair]:
    """Chapter 07 on its own MoEUT run (``lm`` is not used: the chapter's models are trained from scratch)."""
    from lmdepth.analyses.scratch import reference_mean, traced
    from lmdepth.data.dm_math import PROBES
    from lmdepth.runtime import REPO_ROOT
    from lmdepth.scratch.models import adapter_for
    from lmdepth.scratch.training import load_trained, matched_configs, run_dir

    cfg = next(c for c in matched_configs("default") if (c.arch, c.objective, c.seed) == ("moeut", "answer_only", 0))
    model, tok, _ = load_trained(run_dir(cfg, REPO_ROOT / "checkpoints" / "dm_math") / "model.pt")
    model.model.embed_tokens.register_forward_pre_hook(count_forward)  # one call per forward pass
    inputs = []
    for q, answer in PROBES[:n]:
        ids, a = tok.encode_example(q, answer, eos=False)
        inputs.append((torch.tensor([ids]), a))
    adapter = adapter_for(model)
    stack, (nn_model, paths) = AdapterStack(adapter), traced(model)
    mu = reference_mean(model, tok)
    skip = Pair("07", "depth: skip session (scratch MoEUT)",
                lambda: [skip_effects(nn_model, paths, x, cuts=[a], parts=("layer",), local=False, current=False,
                                      config=model.config)["future", "layer"] for x, a in inputs],
                lambda: [prompt_effects(adapter, x, cuts=[a], parts=("layer",), local=False,
                                        current=False)["future", "layer"] for x, a in inputs],
                lambda got, ref: max(_max_diff(g, r) for g, r in zip(got, ref)))
    erase = Pair("07", "depth: erasure map (scratch MoEUT)",
                 lambda: [erasure_effects(nn_model, paths, x, a, mu, positions=range(1, x.shape[1] - 1))
                          for x, a in inputs],
                 lambda: [erasure_map(stack, x, a, mu, positions=range(1, x.shape[1] - 1)) for x, a in inputs],
                 _max_diff)
    return [skip, erase]


def tuned_lens_step_ceiling(lm: LoadedModel, repeats: int, steps: int = 8) -> dict[str, Any]:
    """Chapter 04's tuned-lens training step (:func:`lmdepth.model.translators.training_step`, the default recipe:
    64 tokens a step, every layer, the vocabulary head of the top-16 final tokens plus 2,048 sampled negatives) on
    the residuals of GSM8K *train* problems, against the work any implementation of it must do, timed plainly on
    tensors of its shapes in the same process: the matrix products — forward, the translators ([L, 64, d] ×
    [L, d, d]) and the head's rows on the candidates ([64 (L + 1), d] × [d, |S|]); backward, the residual gradient
    through the head ([64 L, |S|] × [|S|, d]) and the translators' ([L, d, 64] × [L, 64, d]) —, the softmax over S
    and its gradient ([64 L, |S|]), and one fused Adam update of the translators. The final norm, the gather of the
    candidates' rows and the importance weights are not counted, so the figure is conservative."""
    from lmdepth.hooks.lens_hooks import collect_residuals_hooked
    from lmdepth.model.translators import (
        Translators,
        TunedLensRecipe,
        final_targets,
        frozen,
        optimizer,
        sample_candidates,
        training_step,
        vocabulary_split,
    )

    cfg = TunedLensRecipe()
    B, L, d = cfg.batch_tokens, lm.n_layers, lm.adapter.d_model
    exs = load_examples("gsm8k", split="train", n_examples=40, seed=SEED, selection="first")
    h = collect_residuals_hooked(lm, exs, B * (steps + 1))  # [tokens, L + 1, d]
    unembed = Unembedding.of(lm, "float32", traced=False)
    lse, top = final_targets(unembed, h[:, -1], cfg.head_k)
    head, tail = vocabulary_split(top, unembed.vocab)
    gen = torch.Generator().manual_seed(SEED)
    cands = [sample_candidates(head, tail, min(cfg.n_negatives, len(tail)), gen) for _ in range(steps + 1)]
    tr = Translators(L, d)  # the residuals' scale changes the numbers, not the work
    opt = optimizer(tr, cfg.lr)

    def step(i: int) -> None:
        training_step(tr, opt, unembed, h[i * B:(i + 1) * B], lse[i * B:(i + 1) * B], *cands[i], cfg.lr)

    with torch.enable_grad(), frozen(lm.model):  # as train_translators runs it
        S = len(cands[0][0])
        W = unembed.weight[cands[0][0]].float()  # [|S|, d]
        x, y, A = torch.randn(L, B, d), torch.randn(B * (L + 1), d), torch.randn(L, d, d)
        g, z = torch.randn(B * L, S), torch.randn(B * L, S, requires_grad=True)
        plain_tr = Translators(L, d)
        plain_opt = optimizer(plain_tr, cfg.lr)
        for q in plain_tr.parameters():
            q.grad = torch.randn_like(q)

        def work() -> None:
            torch.bmm(x, A.transpose(1, 2))
            y @ W.T
            g @ W
            torch.bmm(x.transpose(1, 2), x)
            z.grad = None
            torch.logsumexp(z, -1).sum().backward()
            plain_opt.step()

        step(steps)  # warm-up
        work()
        path, plain = [], []
        for _ in range(max(repeats, 5)):  # interleaved, as the pairs are
            path.append(timed(lambda: [step(i) for i in range(steps)])[1] / steps)
            plain.append(timed(lambda: [work() for _ in range(steps)])[1] / steps)
        path_s, plain_s = statistics.median(path), statistics.median(plain)
    return {"path": "04 tuned lens: a training step", "efficiency": round(plain_s / path_s, 3),
            "candidates": S, "plain_work_s": float(f"{plain_s:.4g}"), "trace_cpu_s": float(f"{path_s:.4g}")}


BUILDERS = {"01-02": residual_pairs, "03": skipping_pairs, "04": lens_pairs, "05": complexity_pairs, "06": maps_pairs,
            "07": scratch_pairs}


# ---- timing -----------------------------------------------------------------------------------------------------------

def timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    c0, w0 = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - c0, time.perf_counter() - w0


def measure(pair: Pair, repeats: int, tol: float, forwards: list[int], budget_s: float) -> dict[str, Any]:
    """Up to ``repeats`` interleaved rounds of both paths (the order alternates), fewer once another round would
    take this pair past ``budget_s`` seconds (at least one). The first round's results are compared and its
    forward passes (and the trace's layer rows, :data:`LAYER_ROWS`) counted."""
    cpu: dict[str, list[float]] = {"reference": [], "trace": []}
    wall: dict[str, list[float]] = {"reference": [], "trace": []}
    out, fw = {}, {}
    t0 = time.perf_counter()
    with torch.no_grad():
        for r in range(repeats):
            spent = time.perf_counter() - t0
            if r and spent + spent / r > budget_s:
                break
            for path in (("reference", "trace") if r % 2 == 0 else ("trace", "reference")):
                forwards.clear()
                LAYER_ROWS.clear()
                HEAD_ROWS.clear()
                res, c, w = timed(pair.reference if path == "reference" else pair.trace)
                cpu[path].append(c)
                wall[path].append(w)
                if r == 0:
                    out[path], fw[path] = res, len(forwards)
                    if path == "trace":
                        rows, head_rows = sum(LAYER_ROWS), sum(HEAD_ROWS)
            if r == 0:
                worst = pair.diff(out["trace"], out["reference"])
                if not worst <= tol:
                    raise SystemExit(f"{pair.chapter} {pair.measurement}: the trace and its reference differ by "
                                     f"{worst:.3g} (> {tol})")
                out.clear()
    med = {k: statistics.median(v) for k, v in cpu.items()}
    return {"chapter": pair.chapter, "measurement": pair.measurement, "ref_cpu": med["reference"],
            "trace_cpu": med["trace"], "ratio": med["trace"] / med["reference"],
            "ref_wall": statistics.median(wall["reference"]), "trace_wall": statistics.median(wall["trace"]),
            "runs": len(cpu["trace"]), "ref_fw": fw["reference"], "trace_fw": fw["trace"], "diff": worst,
            "trace_rows": rows, "head_rows": head_rows, "row_reduction": pair.row_reduction,
            "plain_extra": pair.plain_extra}


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="any name load_model accepts (short name, hub id, dir)")
    ap.add_argument("--problems", type=int, default=1, help="problems (texts, batches) per chapter")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each path at most (median)")
    ap.add_argument("--budget", type=float, default=60.0, metavar="S",
                    help="no further round of a pair once it would take the pair past S seconds (one round at least)")
    ap.add_argument("--chapters", default=",".join(CHAPTERS), help=f"a subset of {','.join(CHAPTERS)}")
    ap.add_argument("--tol", type=float, default=1e-5, help="largest allowed difference of trace and reference")
    ap.add_argument("--ceiling", action="store_true",
                    help="also print each trace's efficiency against its exact-work ceiling, one JSON line each")
    args = ap.parse_args(argv)
    chapters = args.chapters.split(",")
    bad = [c for c in chapters if c not in BUILDERS]
    if bad or args.problems < 1 or args.repeats < 1:
        raise SystemExit(f"--chapters must be within {','.join(CHAPTERS)} (got {','.join(bad)}); --problems and "
                         "--repeats at least 1")

    with torch.no_grad():  # not torch.set_grad_enabled(False): main() is also called in-process (the tests)
        return bench(args, chapters)


def bench(args: argparse.Namespace, chapters: list[str]) -> list[dict[str, Any]]:
    lm = load_model(args.model)
    forwards = FORWARDS
    lm.model.get_decoder().register_forward_pre_hook(count_forward)
    for layer in lm.adapter.layers:
        layer.register_forward_pre_hook(count_rows, with_kwargs=True)
    lm.model.get_output_embeddings().register_forward_pre_hook(count_head_rows)
    load0, t0, c0 = os.getloadavg(), time.perf_counter(), time.process_time()
    ref_ids = gsm8k_problems(lm, 1)[0][1]
    plain = plain_forward_s(lm, ref_ids) if args.ceiling else None
    head_s = plain_head_row_s(lm) if args.ceiling else None
    print(f"model {args.model} ({lm.n_layers} layers), problems/chapter {args.problems}, repeats {args.repeats}, "
          f"torch threads {torch.get_num_threads()}, load average at start {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}",
          flush=True)
    rows = []
    for chapter in chapters:
        for pair in BUILDERS[chapter](lm, args.problems):
            rows.append(measure(pair, args.repeats, args.tol, forwards, args.budget))
            r = rows[-1]
            print(f"  {r['chapter']} {r['measurement']}: reference {r['ref_cpu']:.2f} s, trace {r['trace_cpu']:.2f} s "
                  f"CPU ({r['ratio']:.2f}x, {r['runs']} runs), max diff {r['diff']:.1e}", flush=True)
    head = (f"{'chapter':7} {'measurement':44} {'ref CPU s':>9} {'trace CPU s':>11} {'trace/ref':>9} "
            f"{'ref wall s':>10} {'trace wall s':>12} {'runs':>4} {'forwards ref/trace':>18}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['chapter']:7} {r['measurement']:44} {r['ref_cpu']:9.2f} {r['trace_cpu']:11.2f} {r['ratio']:9.2f} "
              f"{r['ref_wall']:10.2f} {r['trace_wall']:12.2f} {r['runs']:4} {str(r['ref_fw']) + '/' + str(r['trace_fw']):>18}")
    if plain is not None:
        per_forward = ref_ids.shape[1] * lm.n_layers  # token rows of one plain forward of the first problem
        reduce_row_s: dict[Callable, float] = {}
        for r in rows:
            if r["trace_rows"]:  # chapter 07's traces run on its own scratch model, not this one
                fw = r["trace_rows"] / per_forward
                extra_rows = max(0.0, r["head_rows"] - fw)  # each plain forward's own one row is in `plain`
                reduction = r["row_reduction"]
                if reduction is not None and reduction not in reduce_row_s:  # timed once per reduction
                    reduce_row_s[reduction] = plain_reduction_row_s(lm, reduction)
                reduce_s = 0.0 if reduction is None else reduce_row_s[reduction]
                extra_s = 0.0 if r["plain_extra"] is None else plain_work_s(r["plain_extra"])
                r["efficiency"] = (plain * fw + (head_s + reduce_s) * extra_rows + extra_s) / r["trace_cpu"]
                print(json.dumps({"path": f"{r['chapter']} {r['measurement']}", "efficiency": round(r["efficiency"], 3),
                                  "forwards": round(fw, 2), "plain_forward_s": float(f"{plain:.4g}"),  # 4 digits:
                                  "head_rows": round(extra_rows, 2), "plain_head_row_s": float(f"{head_s:.4g}"),
                                  "plain_reduction_row_s": float(f"{reduce_s:.4g}"),
                                  "plain_extra_s": float(f"{extra_s:.4g}"),
                                  "trace_cpu_s": float(f"{r['trace_cpu']:.4g}")}))  # a tiny model's ms too
        if "04" in chapters:
            print(json.dumps(tuned_lens_step_ceiling(lm, args.repeats)))
    load1 = os.getloadavg()
    print(f"all equal within {args.tol:g} (largest difference {max(r['diff'] for r in rows):.1e}); "
          f"{time.perf_counter() - t0:.0f} s wall, {time.process_time() - c0:.0f} s CPU; load average at end "
          f"{load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    return rows


if __name__ == "__main__":
    main()
