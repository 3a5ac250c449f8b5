"""Residual erasure and integrated gradients of chapter 05's case-study prompts (paper Figs. 6a/6b): the cached run.

The erasure is a remote-ready session (:mod:`lmdepth.traces.erasure_trace`: here, on NDIF or under its offline
simulation); integrated gradients take gradients through plain hooks (:mod:`lmdepth.hooks.stack`), so they run here
only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from lmdepth.analyses.run import Job, RunSummary, resolved
from lmdepth.data.datasets import Example, load_examples
from lmdepth.errors import ParameterError
from lmdepth.hooks.stack import AdapterStack, IGResult, integrated_gradients
from lmdepth.model.registry import LoadedModel, ModelRef, load_model
from lmdepth.params import ModelParams, Params, check_remote, param
from lmdepth.results import RunResult, RunStore
from lmdepth.runtime import progress
from lmdepth.traces.erasure_trace import boundary_sums, erasure_effects
from lmdepth.traces.generation import greedy_matches
from lmdepth.traces.residual_metrics import TapPaths

ANALYSIS = "erasure_ig"

#: Case-study prompts (name, prompt, answer): the paper's manual prompts and a DM-math probe (book/method.md#method-data), a short
#: synthetic variable chain (a=3, b=5, c=1, d=6) where a compositional model would show a staircase, and one more
#: two-hop fact and one shorter sum, so that every model gets at least 5 prompts (book/method.md#method-verdicts: the smallest sample
#: for a reading across prompts is 10 units; five maps are a case study, not a verdict).
CASE_STUDIES: tuple[tuple[str, str, str], ...] = (
    ("two-hop fact", "The spouse of the performer of Imagine is", " Yoko Ono"),
    ("arithmetic", "5 + 7 + 5 + 3 + 1 + 7 = ", "28"),
    ("variable chain (synthetic)", "a=3\nb=a+2\nc=b-4\nd=c+5\nd=", "6"),
    ("DM-math", "Q: What is the value of -24 + -10 + 22 + 1 + 1 + 25? A: ", "-15"),
    ("two-hop fact (Eiffel Tower)", "The capital of the country where the Eiffel Tower stands is", " Paris"),
    ("arithmetic (4 terms)", "3 + 9 + 4 + 8 = ", "24"),
)


def token_labels(tokenizer: Any, ids: torch.Tensor) -> list[str]:
    """Readable, unique labels "position: token" (BOS → "BOS", newline → "⏎", leading space → "␣")."""
    out = []
    for p, i in enumerate(ids[0].tolist()):
        text = "BOS" if i == tokenizer.bos_token_id and p == 0 else tokenizer.decode([i])
        text = text.replace("\n", "⏎").replace(" ", "␣") or "∅"
        out.append(f"{p}: {text}")
    return out


@dataclass(frozen=True)
class ErasureParams(ModelParams):
    """Parameters of the erasure / integrated-gradients run (chapter 05)."""

    n_case_studies: int = param(4, lo=1, hi=len(CASE_STUDIES), help="how many of CASE_STUDIES (in order)")
    n_mean_examples: int = param(10, lo=1, hi=1000,
                                 help="GSM8K test problems (the first N, as the authors' code) whose mean is erased in")
    ig_steps: int = param(64, lo=0, hi=4096, help="integrated-gradients Riemann steps (the paper: 256; 0: none)")
    ig_prompts: int | None = param(None, lo=0, hi=1000, nullable=True,
                                   help="integrated gradients for the first this many prompts only (None: all)")
    ig_rule: str = param("left", choices=("left", "midpoint"),
                         help="'left' (the paper's left Riemann sum) or 'midpoint' (more accurate for few steps)")
    ig_batch: int = param(16, lo=1, hi=1024, help="interpolation steps per forward/backward pass")
    erasure_batch: int = param(32, lo=2, hi=4096, help="erased positions per forward pass (+ the clean copy)")
    remote: bool | str = param(False, help="false: here; true: on NDIF (hub ids only; erasure only, ig_steps=0); "
                                            "'local': the offline simulation of NDIF")

    def check_consistency(self) -> None:
        check_remote(self.model_name, self.remote)
        refuse_remote_ig(self.remote, self.ig_steps, self.ig_prompts)


def refuse_remote_ig(remote: bool | str, ig_steps: int, ig_prompts: int | None) -> None:
    """Integrated gradients run here only: one line for a remote run (NDIF or its simulation) that asks for them.

    Raises:
        ParameterError: ``remote`` is not false while ``ig_steps`` and ``ig_prompts`` (None: all) ask for any.
    """
    if remote is not False and ig_steps and ig_prompts != 0:
        raise ParameterError(
            f"remote={remote!r}: integrated gradients run here only (they backpropagate through the model "
            "with plain hooks, not an nnsight trace, so NDIF cannot run them); set ig_steps=0 (or ig_prompts=0) "
            "for the erasure alone, or remote=false.")


def run(params: ErasureParams | ModelRef | str | None = None, lm: LoadedModel | Any = None, **kwargs: Any) -> RunResult:
    """Erasure maps and integrated gradients of the case-study prompts for one model (cached per prompt).

    Args:
        params: an :class:`ErasureParams`, or its fields as keyword arguments.
        lm: an already loaded model or a function that loads it (see :func:`lmdepth.analyses.complexity.model_loader`).

    Returns:
        Table ``model, prompt, method ("erasure" | "ig"), layer, position, token, is_answer, value`` (erasure rows
        are boundaries 0..L, IG rows blocks 0..L−1) and a sidecar whose ``summary`` holds per prompt the answer
        start, f(X), f(B_l), the completeness error per layer and whether the model's greedy answer is right.
    """
    p, ref = resolved(ErasureParams, params, kwargs)
    studies = CASE_STUDIES[:p.n_case_studies]
    n_ig = len(studies) if p.ig_prompts is None else min(p.ig_prompts, len(studies))
    key = dict(prompts=[list(c) for c in studies], n_mean_examples=p.n_mean_examples, ig_steps=p.ig_steps,
               ig_rule=p.ig_rule, ig_prompts=n_ig, dtype=p.dtype)
    per_item = {k: v for k, v in key.items() if k not in ("prompts", "ig_prompts")}
    return Job(ANALYSIS, p, key, per_item, refs=ref).execute(lambda store: _compute(p, ref, lm, studies, n_ig, key, store))


def _compute(p: ErasureParams, ref: ModelRef, lm: Any, studies: tuple[tuple[str, str, str], ...], n_ig: int, key: dict[str, Any],
             store: RunStore) -> tuple[pd.DataFrame, dict[str, Any]]:
    lm = lm() if callable(lm) else (lm or load_model(ref, device=p.device, dtype=p.dtype))
    stack, paths = AdapterStack(lm.adapter), TapPaths.of(lm.adapter)
    softcap = getattr(lm.model.config, "final_logit_softcapping", None) or None
    means = store.load_item("means")
    if means is None:  # token-weighted mean residual per boundary over the texts (BOS included)
        encoded = [lm.encode(e.text) for e in load_examples("gsm8k", n_examples=p.n_mean_examples, selection="first")]
        total = sum(boundary_sums(lm.nn, paths, ids, lm.remote_mode) for ids in encoded)
        means = {"mu": (total / sum(ids.shape[0] * ids.shape[1] for ids in encoded)).numpy()}
        store.save_item("means", means)
    mu = torch.from_numpy(means["mu"])
    rows, summary = [], {}
    for k, (name, prompt, answer) in enumerate(progress(studies, desc=f"{p.model_name}: erasure and IG")):
        want_ig = bool(p.ig_steps) and k < n_ig
        ids = lm.encode(prompt + answer)
        head = lm.tokenizer(prompt, return_tensors="pt").input_ids[0]
        a = len(head) if torch.equal(ids[0, : len(head)].cpu(), head) else ids.shape[1] - len(
            lm.tokenizer(answer, add_special_tokens=False).input_ids)
        unit = Example(name, prompt, answer).content_name  # the name and the text: an edited prompt is a new unit
        item = store.load_item(unit)
        if item is not None and want_ig and "ig" not in item:
            item = None  # computed earlier without integrated gradients
        if item is None:
            er = erasure_effects(lm.nn, paths, ids, a, mu, p.erasure_batch, softcap, lm.remote_mode)
            item = {"erasure": er.numpy(), "correct": np.array(int(greedy_matches(lm.nn, ids, a, lm.remote_mode)))}
            if want_ig:
                ig = integrated_gradients(stack, ids, a, n_steps=p.ig_steps, batch_size=p.ig_batch, rule=p.ig_rule)
                item |= {"ig": ig.ig, "f_x": np.array(ig.f_x), "f_baseline": ig.f_baseline}
            store.save_item(unit, item)
        labels = token_labels(lm.tokenizer, ids)
        T = ids.shape[1]
        has_ig = want_ig and "ig" in item
        maps = [("erasure", item["erasure"])] + ([("ig", item["ig"])] if has_ig else [])
        for method, m in maps:
            rows += [{"model": p.model_name, "prompt": name, "method": method, "layer": l, "position": t,
                      "token": labels[t], "is_answer": t >= a, "value": float(m[l, t])}
                     for l in range(m.shape[0]) for t in range(T)]
        info = {"a_start": a, "n_tokens": T, "tokens": labels, "correct": int(item["correct"])}
        if has_ig:
            res = IGResult(item["ig"], float(item["f_x"]), item["f_baseline"], p.ig_steps, p.ig_rule)
            info |= {"f_x": res.f_x, "f_baseline": res.f_baseline.tolist(),
                     "ig_sum": res.ig.sum(1).tolist(), "completeness_error": res.completeness_error.tolist()}
        summary[name] = info
    meta = {"parameters": {"model_name": p.model_name, **key, "device": p.device, "remote": p.remote},
            "model": lm.provenance(), "summary": {"n_layers": lm.n_layers, "prompts": summary}}
    return pd.DataFrame(rows), meta


@dataclass(frozen=True)
class CasePrompt:
    """One case-study prompt of an erasure run.

    Attributes:
        a_start: position of the first answer token; ``n_tokens``: prompt + answer tokens.
        tokens: the readable token labels (:func:`token_labels`).
        correct: whether the model's greedy answer is right.
        f_x: f(X), the sum of the answer tokens' probabilities on the clean input (None without integrated
            gradients).
        completeness_error: per layer, |Σ_t IG − (f(X) − f(B))| / |f(X) − f(B)| (None without integrated gradients).
    """

    a_start: int
    n_tokens: int
    tokens: tuple[str, ...]
    correct: bool
    f_x: float | None
    completeness_error: tuple[float, ...] | None


@dataclass(frozen=True)
class ErasureSummary(RunSummary):
    """What chapter 05 reads of an erasure / integrated-gradients run (:meth:`of`).

    Attributes:
        n_layers: the model's layers.
        ig_steps: integrated-gradients steps; ``ig_rule``: their quadrature rule.
        prompts: case-study name → :class:`CasePrompt`, in the run's order.
    """

    n_layers: int
    ig_steps: int
    ig_rule: str
    prompts: dict[str, CasePrompt]

    @classmethod
    def of(cls, result: RunResult) -> ErasureSummary:
        p, s = result.meta["parameters"], result.meta["summary"]
        ce = (lambda v: None if "completeness_error" not in v else tuple(float(x) for x in v["completeness_error"]))
        prompts = {name: CasePrompt(a_start=int(v["a_start"]), n_tokens=int(v["n_tokens"]), tokens=tuple(v["tokens"]),
                                    correct=bool(v["correct"]), f_x=v.get("f_x"), completeness_error=ce(v))
                   for name, v in s["prompts"].items()}
        return cls(**cls.fields_of(result), n_layers=int(s["n_layers"]), ig_steps=int(p["ig_steps"]),
                   ig_rule=str(p["ig_rule"]), prompts=prompts)


# ---- chapter 05: the case-study runs and their summaries ------------------------------------------------------------


@dataclass(frozen=True)
class CaseStudyParams(Params):
    """Chapter 05's case-study counts (:func:`run_case_studies`) that no single run's :class:`ErasureParams` holds by
    these names (the runs' own fields go through that class); 0 skips what it counts."""

    n_case_studies_compare: int = param(6, lo=0, hi=len(CASE_STUDIES), help="case studies per comparison model")
    n_ig_prompts: int = param(5, lo=0, hi=len(CASE_STUDIES),
                              help="of the main model's case studies, how many also get integrated gradients")
    n_ig_prompts_compare: int = param(0, lo=0, hi=len(CASE_STUDIES),
                                      help="of each comparison model's case studies, how many get integrated gradients")


def check_chapter_parameters(*, n_case_studies: int, n_case_studies_compare: int, n_ig_prompts: int, ig_steps: int,
                             ig_rule: str, n_ig_prompts_compare: int = 0, remote: bool | str = False) -> dict[str, Any]:
    """Check chapter 05's erasure parameters before any model loads: the chapter's own counts (0 skips the
    comparison models / integrated gradients), then the main run's fields through :class:`ErasureParams`, and that a
    remote run asks for no integrated gradients (:func:`refuse_remote_ig`, here instead of after the ladders).

    Returns:
        The parameters, checked, as keyword arguments of :func:`run_case_studies`.

    Raises:
        ParameterError: naming the parameter, the value given and what is allowed.
    """
    CaseStudyParams(n_case_studies_compare=n_case_studies_compare, n_ig_prompts=n_ig_prompts,
                    n_ig_prompts_compare=n_ig_prompts_compare)
    ErasureParams(n_case_studies=n_case_studies, ig_steps=ig_steps, ig_rule=ig_rule)
    refuse_remote_ig(remote, ig_steps, max(n_ig_prompts, n_ig_prompts_compare if n_case_studies_compare else 0))
    return dict(n_case_studies=n_case_studies, n_case_studies_compare=n_case_studies_compare, ig_steps=ig_steps,
                n_ig_prompts=n_ig_prompts, ig_rule=ig_rule, n_ig_prompts_compare=n_ig_prompts_compare)


def run_case_studies(models: list[str], n_case_studies: int, n_case_studies_compare: int, ig_steps: int,
                     n_ig_prompts: int | None, ig_rule: str, loaders: dict[str, Any] | None = None,
                     n_ig_prompts_compare: int = 0, **kwargs: Any) -> dict[str, RunResult]:
    """:func:`run` for the main model (``models[0]``, integrated gradients on its first ``n_ig_prompts``) and,
    unless ``n_case_studies_compare`` is 0, for each comparison model on its first case studies (integrated
    gradients on the first ``n_ig_prompts_compare``: they cost ~L × N / 16 forward-backward passes per prompt).

    Args:
        loaders: model name → model or loader (see :func:`lmdepth.analyses.complexity.model_loaders`).
        **kwargs: further :class:`ErasureParams` fields (n_mean_examples, device, dtype, results_dir, use_cache).

    Returns:
        ``{model: RunResult}``, the main model first.
    """
    loaders = loaders or {}
    main = models[0]
    case = {main: run(main, n_case_studies=n_case_studies, ig_steps=ig_steps, ig_prompts=n_ig_prompts, ig_rule=ig_rule,
                      lm=loaders.get(main), **kwargs)}
    if n_case_studies_compare:
        for m in models[1:]:
            case[m] = run(m, n_case_studies=n_case_studies_compare, ig_steps=ig_steps if n_ig_prompts_compare else 0,
                          ig_prompts=n_ig_prompts_compare, ig_rule=ig_rule, lm=loaders.get(m), **kwargs)
    return case


def last_layer_that_matters(table: pd.DataFrame, frac: float = 0.1) -> pd.DataFrame:
    """Per (model, prompt) erasure map: the highest layer boundary at which erasing a token still moves the answer
    prediction by at least ``frac`` of the map's largest effect, for the first and the last token that reach it.

    Position 0 (BOS / attention sink) and the last token (it feeds no answer prediction) are left out.

    Returns:
        ``model, prompt, first token, last prompt token`` (boundary, or None if no token reaches the threshold),
        ``tokens`` (how many do) and ``of layers`` (the highest boundary).
    """
    out = []
    for (m, p), d in table[table.method == "erasure"].groupby(["model", "prompt"]):
        d = d[(d.position < d.position.max()) & (d.position > 0)]
        thr = frac * d.value.max()
        top = d[d.value >= thr].groupby("position").layer.max()
        out.append({"model": m, "prompt": p, "first token": int(top.iloc[0]) if len(top) else None,
                    "last prompt token": int(top.iloc[-1]) if len(top) else None,
                    "tokens": len(top), "of layers": int(d.layer.max())})
    return pd.DataFrame(out)


__all__ = ["ANALYSIS", "CASE_STUDIES", "ErasureParams", "ErasureSummary", "CasePrompt", "CaseStudyParams", "token_labels", "run", "check_chapter_parameters", "refuse_remote_ig", "run_case_studies", "last_layer_that_matters"]
