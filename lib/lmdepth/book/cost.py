"""What a profile costs to compute, per chapter and model, read from the runs a book build recorded.

Every run's sidecar keeps its units' own compute seconds (``unit_compute_s``: total, units, timed — see
:func:`lmdepth.analyses.run.per_unit`), whether the units were computed in that execution or read from their
checkpoints, and, for runs computed since 2026-12-02, their CPU seconds (``cpu_total``, ``cpu_timed``): the cost
free of whatever else the machine ran, which :func:`build_cost` prefers. A run without units (chapter 07's
comparison and untrained depth runs, the maps) keeps the CPU seconds of the execution that finished it and how many checkpoints that execution read
(:func:`lmdepth.analyses.run.execute`): with none, that is the run's cost. A unit computed before the timing existed
is untimed; the table then says how many are. Every sidecar also keeps ``wall_time_s``, the wall time of the
execution that finished the run: the one cost known for older runs without unit timings, but only a lower bound for
a run resumed from checkpoints.
"""

from __future__ import annotations

import ast
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from lmdepth.errors import LmDepthError
from lmdepth.results import RecordedCost, check_recorded, recorded_runs
from lmdepth.runtime import REPO_ROOT, commit_date

COLUMNS = ["chapter", "model", "runs", "units", "timed units", "s / unit", "profile total (min)", "run wall time (min)"]


def cost_table(results_dir: str | Path, profile: str) -> pd.DataFrame:
    """Per chapter and model of ``profile``'s book record: runs, units (problems, items — each analysis's own
    unit), how many were timed, seconds per timed unit, the profile's total when every unit was timed, and the sum
    of the runs' ``wall_time_s`` (NaN if a sidecar lacks it).

    NaN (the display reads "—") where no unit, or for the total not every unit, was timed: runs of one chapter
    can be different analyses, so untimed units are not extrapolated. Empty when there is no record.
    """
    root = Path(results_dir) / "book" / Path(profile).stem
    rows = []
    for chapter_dir in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        for run in sorted(recorded_runs(root, chapter_dir.name)):
            cost = RecordedCost.read(run)
            if cost is None:
                continue
            # a run without the record (older than the timing) has unknown units: NaN, not 0
            rows.append({"chapter": chapter_dir.name, "model": run.parent.name, "units": cost.units,
                         "timed": cost.timed, "seconds": cost.seconds, "wall": cost.wall_s})
    if not rows:
        return pd.DataFrame(columns=COLUMNS)
    g = pd.DataFrame(rows).groupby(["chapter", "model"], sort=False).agg(
        runs=("units", "size"), units=("units", lambda u: u.sum(min_count=len(u))), timed=("timed", "sum"),
        seconds=("seconds", "sum"), wall=("wall", lambda w: w.sum(min_count=len(w))))
    per_unit = (g.seconds / g.timed).where(g.timed > 0)
    complete = (g.timed == g.units) & (g.units > 0)
    return pd.DataFrame({"runs": g.runs, "units": g.units.round().astype("Int64"), "timed units": g.timed,
                         "s / unit": per_unit.round(2),
                         "profile total (min)": (g.seconds / 60).where(complete).round(1),
                         "run wall time (min)": (g.wall / 60).round(1)}).reset_index()[COLUMNS]


#: Parameters that do not select which runs a chapter computes: the profile's label, where results and pages are
#: read and written, the device.
NOT_RUN_SETTINGS = frozenset({"profile", "results_dir", "book_dir", "device"})
#: A recomputation estimated at least this long (minutes) is announced before it starts.
NOTICE_MINUTES = 3.0


def stored_difference(chapter: str, params: Mapping[str, Any], profile: str = "default") -> dict[str, tuple]:
    """The chapter's parameters whose value in ``params`` differs from ``profile``'s (the notebook's default where
    the profile does not set it), as name → (given, profile's), leaving out :data:`NOT_RUN_SETTINGS`."""
    from lmdepth.book.chapters import declared_parameters, profile_params

    declared = declared_parameters(chapter)
    stored = {name: ast.literal_eval(spec.default) for name, spec in declared.items()}
    stored |= profile_params(profile, chapter)
    return {name: (params[name], stored.get(name)) for name in declared
            if name not in NOT_RUN_SETTINGS and name in params and params[name] != stored.get(name)}


@dataclass(frozen=True)
class BuildCost:
    """What computing a profile's recorded runs from scratch costs, from the runs' own timings (:func:`build_cost`).

    Attributes:
        minutes: compute minutes per chapter (its runs; chapters may share runs, as norms and cosine do).
        total_min: every recorded run counted once.
        lower_bound: the chapters with a run timed only by the wall time of a resumed execution (its cost is at least
            this).
        cpu_share: the share of ``total_min`` counted in CPU time (the rest: wall time, which on a loaded machine
            overstates the work).
        machines: where the runs were timed, as "a CPU (N torch threads)" or the CUDA device, each once.
        measured: the first and last day the runs were computed (their commits' dates); None outside a checkout.
    """

    minutes: dict[str, float]
    total_min: float
    lower_bound: tuple[str, ...]
    machines: tuple[str, ...]
    measured: tuple[str, str] | None
    cpu_share: float = 0.0

    def sentence(self) -> str:
        """The cost in one sentence, as the README and the Reproducibility page give it."""
        bound = (f"; a lower bound for {', '.join(self.lower_bound)} (some of their runs kept only the wall time of "
                 "an execution that may have resumed from checkpoints)" if self.lower_bound else "")
        when = f", computed between {self.measured[0]} and {self.measured[1]}" if self.measured else ""
        basis = (" (CPU time)" if self.cpu_share >= 0.995 else " (wall time)" if self.cpu_share <= 0.005 else
                 f" ({self.cpu_share:.0%} of it CPU time, the rest wall time)")
        return (f"computing every run of the record from scratch takes {self.total_min:.0f} min "
                f"({self.total_min / 60:.1f} h) on {' and '.join(self.machines) or 'an unrecorded machine'}: "
                f"the sum of the runs' own timings{basis}{when}{bound}")


def _run_minutes(run: Path) -> tuple[float, bool, bool] | None:
    """A recorded run's compute minutes, whether they are exact (every unit timed) rather than a wall time, and
    whether they are CPU time (every unit's CPU seconds kept)."""
    cost = RecordedCost.read(run)
    if cost is None:
        return None
    if cost.units > 0 and cost.cpu_timed == cost.units:
        return cost.cpu_seconds / 60, True, True
    if cost.units > 0 and cost.timed == cost.units:
        return cost.seconds / 60, True, False
    if math.isfinite(cost.whole_cpu_s):  # no units, computed in one execution: its CPU time is the run's
        return cost.whole_cpu_s / 60, True, True
    return (cost.wall_s / 60, False, False) if math.isfinite(cost.wall_s) else None


def _environment(run: Path) -> dict[str, Any]:
    return json.loads((run / "meta.json").read_text()).get("environment") or {}


def _machine(env: Mapping[str, Any]) -> str | None:
    if env.get("cuda"):
        return f"a GPU ({env['cuda']})"
    n = env.get("cpu_threads")
    return f"a CPU ({n} torch thread{'s' if n != 1 else ''})" if n else None


def build_cost(results_dir: str | Path, profile: str = "default") -> BuildCost:
    """The cost of computing ``profile``'s recorded runs (``results_dir/book/<profile>``) from scratch: per run, its
    units' CPU seconds where every unit has them, else their compute (wall) seconds where every unit was timed, else
    the CPU seconds of one execution that computed the whole run, else the wall time of the execution that finished
    it. The one source of the README's cold-build figure, the chapters' announcements (:func:`chapter_minutes`) and
    the Reproducibility page. Chapter 07's depth runs are in the record; its training is not (its page and scripts
    time it)."""
    record = Path(results_dir) / "book" / Path(profile).stem
    minutes: dict[str, float] = {}
    per_run: dict[Path, float] = {}
    cpu_runs: set[Path] = set()
    bound, machines, commits = set(), [], set()
    for chapter_dir in sorted(p for p in record.iterdir() if p.is_dir()) if record.is_dir() else []:
        for run in sorted(recorded_runs(record, chapter_dir.name)):
            got = _run_minutes(run)
            if got is None:
                continue
            minutes[chapter_dir.name] = minutes.get(chapter_dir.name, 0.0) + got[0]
            per_run[run] = got[0]
            if got[2]:
                cpu_runs.add(run)
            if not got[1]:
                bound.add(chapter_dir.name)
            env = _environment(run)
            if (m := _machine(env)) and m not in machines:
                machines.append(m)
            commits.add(env.get("git_commit"))
    days = sorted(filter(None, (commit_date(c) for c in commits if c)))
    total = sum(per_run.values())
    return BuildCost(minutes, total, tuple(sorted(bound)), tuple(machines), (days[0], days[-1]) if days else None,
                     sum(per_run[r] for r in cpu_runs) / total if total else 0.0)


def chapter_minutes(chapter: str, results_dirs: list[str | Path], profile: str = "default") -> tuple[float, Path] | None:
    """Compute minutes of ``chapter`` at ``profile`` (:func:`build_cost`) from the first of ``results_dirs`` whose
    record has the chapter, with the results folder it came from. None where no record has it."""
    for root in results_dirs:
        found = build_cost(root, profile).minutes.get(chapter)
        if found is not None:
            return found, Path(root)
    return None


def cost_notice(chapter: str, params: Mapping[str, Any], results_dir: str | Path = "results",
                profile: str = "default") -> str | None:
    """What a chapter prints before it computes for more than :data:`NOTICE_MINUTES`: the estimated cost and how to
    run a smaller profile; None when it reads ``profile``'s stored runs or the computation is short.

    The chapter reads stored runs when its parameters are ``profile``'s (:func:`stored_difference`) and the book's
    record of the chapter's runs under ``results_dir`` is present and intact. Otherwise the estimate is the
    chapter's compute time at ``profile`` (:func:`chapter_minutes`, from ``results_dir`` or the repository's
    ``results/``): the runs' own timings, not a prediction for other sizes or hardware.
    """
    differ = stored_difference(chapter, params, profile)
    record = Path(results_dir) / "book" / Path(profile).stem / chapter
    if not differ:
        if (record / "runs.jsonl").is_file():
            try:
                check_recorded(record.parent, [chapter])
                return None  # the stored runs are read
            except LmDepthError:
                pass
        why = f"the {profile} profile's runs of this chapter are not stored (intact) under {results_dir}"
    else:
        shown = ", ".join(f"{k}={v!r} (stored: {w!r})" for k, (v, w) in list(differ.items())[:4])
        why = f"these parameters differ from the {profile} profile's stored runs: {shown}"
    found = chapter_minutes(chapter, [results_dir, REPO_ROOT / "results"], profile)
    if found is not None and found[0] < NOTICE_MINUTES:
        return None
    default = None if found or profile == "default" else chapter_minutes(chapter, [REPO_ROOT / "results"])
    cost = (f"at the {profile} profile its runs took {found[0]:.0f} min to compute (their own timings, recorded in "
            f"{found[1]}; the Reproducibility page's cost table), and larger samples take longer" if found else
            f"unknown for the {profile} profile (no timed record of it); the default profile's runs of this chapter "
            f"took {default[0]:.0f} min" if default else
            f"unknown for the {profile} profile (no timed record of this chapter)")
    from lmdepth.book.chapters import profile_params

    quick = {k: v for k, v in profile_params("quick", chapter).items() if k != "profile"}
    smaller = ("" if all(params.get(k) == v for k, v in quick.items()) else
               f" For a smaller run, set the quick profile's parameters "
               f"({', '.join(f'{k}={v!r}' for k, v in quick.items())}) or run `lmdepth run {chapter} --profile quick`.")
    return (f"lmdepth: this chapter computes what is not stored: {why}. Estimated cost: {cost}.{smaller} "
            "Finished units are checkpointed: an interrupted run resumes.")


def announce_cost(chapter: str, params: Mapping[str, Any], profile: str | None = None) -> None:
    """Print :func:`cost_notice` (if any) for a chapter's parameters, read from its namespace (``globals()``), at
    ``profile`` (default: the chapter's own ``profile`` parameter, so ``--profile quick`` announces the quick
    profile's cost, not the default's). Silent inside a book build (``LMDEPTH_BOOK_BUILD=1``), which reports each
    page's time itself."""
    if os.environ.get("LMDEPTH_BOOK_BUILD") == "1":
        return
    profile = profile or str(params.get("profile") or "default")
    if profile.endswith((".yaml", ".yml")):  # a reader's own profile: its runs are compared with the default's
        profile = "default"
    text = cost_notice(chapter, params, params.get("results_dir", "results"), profile)
    if text:
        print(text, flush=True)


# ---- what a chapter costs on NDIF: requests and forward passes per prompt, counted from the traces ----------------

#: The paper's model and its decoder layers: ``num_hidden_layers`` of meta-llama/Llama-3.1-70B's ``config.json`` on the
#: Hugging Face hub (a gated repository, not readable offline, hence a constant; the Llama 3.1 model card gives the
#: same 80 layers for the 70B model).
PAPER_MODEL = "meta-llama/Llama-3.1-70B"
PAPER_LAYERS = 80
PAPER_D_MODEL = 8192  # its hidden_size (the same sources)
REMOTE_COLUMNS = ["chapter", "measurement", "the profile runs it", "requests / prompt", "forwards / prompt",
                  "rows / forward", "ships / request", "returns / request", "notes"]


def size(n_floats: float) -> str:
    """``n_floats`` fp32 numbers as bytes, in the unit that reads best ("2.6 MB")."""
    n = 4 * n_floats
    for unit, f in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if n >= f:
            return f"{n / f:.1f} {unit}"
    return f"{n:.0f} B"


def chapter_settings(chapter: str, profile: str) -> dict[str, Any]:
    """The chapter's parameters at ``profile``: the notebook's defaults, updated by the profile."""
    from lmdepth.book.chapters import declared_parameters, profile_params

    declared = {name: ast.literal_eval(spec.default) for name, spec in declared_parameters(chapter).items()}
    return {**declared, **profile_params(profile, chapter)}


def _default(fn: Any, name: str) -> Any:
    """A batching parameter's default in the code that uses it (what a chapter runs with: none of them is set)."""
    import inspect

    return inspect.signature(fn).parameters[name].default


def erasure_forwards(n_layers: int, n_tokens: int, batch_size: int) -> int:
    """Forward passes of one prompt's erasure session (:func:`lmdepth.traces.erasure_trace.erasure_effects`): the clean
    pass, then per boundary (L + 1 of them) one batched pass per group of ``batch_size − 1`` erased positions."""
    return 1 + (n_layers + 1) * math.ceil(n_tokens / (batch_size - 1))


def remote_cost(profile: str = "paper", n_layers: int = PAPER_LAYERS, d_model: int = PAPER_D_MODEL) -> pd.DataFrame:
    """What one prompt of each chapter costs on NDIF for a model of ``n_layers`` layers (default: Llama 3.1 70B),
    with ``profile``'s parameters: requests (one nnsight trace or session each), forward passes (a batched pass
    counts once), the rows of a batched pass, the tensors a request ships besides the block and the kernels (a few
    kB of source) and the saved values it brings back, for a model of ``d_model`` too. Counted from the traces'
    structure and the code's batching defaults, not measured; ``tests/test_cost.py`` holds the counts to the
    forward passes the traces make and the sizes to what the strict server records.

    The "the profile runs it" column says where ``profile`` runs the chapter (``remote``) and on which model: the
    counts are those of ``n_layers`` layers whatever model the profile names.
    """
    from lmdepth.analyses.erasure import ErasureParams
    from lmdepth.analyses.maps import collect
    from lmdepth.book.chapters import CHAPTERS
    from lmdepth.traces.generation import greedy_texts
    from lmdepth.traces.remote import NOT_REMOTE, REMOTE_READY
    from lmdepth.traces.server import MAX_RESULT, MAX_SHIPPED
    from lmdepth.traces.skip_effects import session_forwards

    L, d = n_layers, d_model
    rows: list[dict[str, Any]] = []

    def add(chapter: str, measurement: str, requests: Any, forwards: Any, batch: Any, notes: str, ships: str = "—",
            returns: str = "—") -> None:
        s = chapter_settings(chapter, profile)
        where = {True: "NDIF", False: "here (CPU/GPU)", "local": "the offline simulation"}.get(s.get("remote"), "—")
        rows.append({"chapter": chapter, "measurement": measurement,
                     "the profile runs it": f"{where}: {s['model_name']}" if "model_name" in s else where,
                     "requests / prompt": requests, "forwards / prompt": forwards, "rows / forward": batch,
                     "ships / request": ships, "returns / request": returns, "notes": notes})

    def norms() -> None:
        add("norms", "residual norms and contributions", 1, 1, 1,
            f"{chapter_settings('norms', profile)['n_examples']} problems", "nothing",
            f"L x 11 x T floats: {size(L * 11)} per token")

    def cosine() -> None:
        add("cosine", "cosines", 1, 1, 1, "the norms run itself (computed once for both chapters)", "nothing",
            "(the norms' request)")

    def skipping() -> None:
        s = chapter_settings("skipping", profile)
        variants = len(s["parts"]) + bool(s["local"])
        effects = f"B x L x (L + 1) floats: {size(variants * L * (L + 1))} (B = {variants}; twice with the robust statistics)"
        add("skipping", "all tokens (every layer skipped)", 1, session_forwards(L, 0, True), variants,
            f"{s['n_examples_current']} problems; one session: the clean pass + one pass per skipped layer, the "
            f"variants ({', '.join(s['parts'])}{', local' if s['local'] else ''}) as rows", "nothing", effects)
        add("skipping", "future tokens", 1, session_forwards(L, s["n_cuts"], False), variants,
            f"{s['n_examples']} problems x {s['n_cuts']} cut points; one pass per (skipped layer, cut point)",
            "nothing", effects)
        add("skipping", "all tokens, nudge control", 1, session_forwards(L, 0, True), 1,
            f"{s['n_examples_current']} problems (per comparison model {s['n_examples_compare']}); the output change's "
            "control: the clean pass + one pass per nudged layer", f"the directions, L x d floats: {size(L * d)}",
            f"L x (L + 1) floats: {size(L * (L + 1))}; twice with the robust statistics")

    def lens() -> None:
        s = chapter_settings("lens", profile)
        tuned = ("tuned lens off" if not s["tuned_lens"] else "tuned lens applied in the same pass (its "
                 "translators, trained here, travel with every request: L x d^2 floats)")
        translators = L * d * d + L * d + L
        ships = ("nothing" if not s["tuned_lens"] else f"the translators, L x d^2 floats: {size(translators)}"
                 + (f" — over the {size(MAX_SHIPPED / 4)} bound: refused, run tuned_lens false"
                    if 4 * translators > MAX_SHIPPED else ""))
        add("lens", "logit lens" + (" and tuned lens" if s["tuned_lens"] else ""), 1, 1, 1,
            f"{s['n_examples']} problems, " + ("every position" if not s["positions_per_example"] else
                                              f"{s['positions_per_example']} positions each") + f"; {tuned}",
            ships, f"{1 + bool(s['tuned_lens'])} x 3 x L x P floats: {size(3 * L * (1 + bool(s['tuned_lens'])))} per "
                   "position")

    def complexity() -> None:
        s = chapter_settings("complexity", profile)
        add("complexity", "depth score", 1,
            f"{session_forwards(L, s['n_cuts'], False)} (MATH, GSM8K: {s['n_cuts']} cut points) or "
            f"{session_forwards(L, 1, False)} (synthetic: 1 cut)", 1, "one session per item", "nothing",
            f"L x (L + 1) floats: {size(L * (L + 1))}")
        gen_batch = _default(greedy_texts, "batch_size")
        add("complexity", "correctness check", f"1 (synthetic) or 1/{gen_batch} (MATH, GSM8K)",
            f"1 (synthetic) or <= {s['gen_tokens']} (MATH, GSM8K: greedy generation)",
            f"1 or {gen_batch}", f"MATH and GSM8K items generate in batches of {gen_batch}, one request each",
            "nothing", "the answer's match (synthetic) or the generated token ids")
        b = ErasureParams().erasure_batch
        ig = s["ig_steps"] and s["n_ig_prompts"]
        add("complexity", "residual erasure", 1,
            f"1 + {L + 1} x ceil(T / {b - 1}) for T tokens (T = 40: {erasure_forwards(L, 40, b)})", f"<= {b}",
            f"{s['n_case_studies']} case studies; once per model {s['n_mean_examples']} requests of 1 pass (the mean "
            "residual); integrated gradients run here only (ig_steps 0 on NDIF)"
            + (f". This profile sets remote true with ig_steps {s['ig_steps']}: the chapter refuses before it starts "
               "(set remote false on a GPU, or ig_steps 0)" if s.get("remote") is True and ig else ""),
            f"the means, (L + 1) x d floats: {size((L + 1) * d)}", f"(L + 1) x T floats: {size(L + 1)} per token")

    def maps() -> None:
        tokens = _default(collect, "batch_tokens")
        per_request = MAX_RESULT // (4 * (L + 1) * d)
        add("maps", "residual collection", f"1 per batch of <= {tokens} tokens and <= {per_request} aligned tokens",
            "1 (a row of its batch)", f"texts of <= {tokens} padded tokens", "the maps are fitted here", "nothing",
            f"(L + 1) x d floats per aligned token ({size((L + 1) * d)}): <= {size(MAX_RESULT / 4)}")

    def explorer() -> None:
        add("explorer", "contributions, logit-lens tokens, one layer skipped", 1, session_forwards(1, 0, True), 1,
            "per explore: the skip session of the chosen layer alone, whose clean pass also reads the contributions "
            "and the logit-lens tokens", "nothing", f"L x 3 x T floats: {size(3 * L)} per token, and a few KB")

    counted = {"norms": norms, "cosine": cosine, "skipping": skipping, "lens": lens, "complexity": complexity,
               "maps": maps, "explorer": explorer}
    for chapter in CHAPTERS:
        if chapter in REMOTE_READY:
            counted[chapter]()  # a KeyError here: a chapter went remote-ready without its count
        else:
            rows.append({"chapter": chapter, "measurement": "—", "the profile runs it": "here",
                         "requests / prompt": "—", "forwards / prompt": "—", "rows / forward": "—",
                         "ships / request": "—", "returns / request": "—",
                         "notes": f"not on NDIF: {NOT_REMOTE[chapter]}"})
    return pd.DataFrame(rows, columns=REMOTE_COLUMNS)


__all__ = ["BuildCost", "build_cost", "NOTICE_MINUTES", "PAPER_D_MODEL", "PAPER_LAYERS", "PAPER_MODEL", "size", "announce_cost", "chapter_minutes", "chapter_settings",
           "cost_notice", "cost_table", "erasure_forwards", "remote_cost", "stored_difference"]
