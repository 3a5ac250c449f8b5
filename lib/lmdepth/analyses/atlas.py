"""The atlas: every chapter's saved results for every model that has them, reduced to a few numbers on relative depth.

Nothing here computes a model: the atlas reads ``results/<analysis>/<model>/<key>/{table.csv,meta.json}`` written by
the chapters (the verdicts each chapter saved are read by :mod:`lmdepth.claims.findings_claims`). Adding a model to the
atlas means running the chapters for it (``lmdepth run …``) and rebuilding the book.

When a model has several finished runs of one analysis (e.g. a smoke run and the book's run), the atlas uses the
one with the most problems (held-out tokens for the linear maps), and among equals the most recent one; the sample used is shown next to every number.

One relative-depth axis for every measure: block k of an L-layer model spans [k/L, (k+1)/L]; a measure that names a
layer (the cosine transition, the skipping cutoff, the depth score's mean layer) sits at the layer's centre
(k + 0.5)/L, and one that names a residual boundary h_l (where a lens settles) at l/L.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import nbformat
import pandas as pd

from lmdepth.analyses import complexity, lens, residual
from lmdepth.analyses import maps as linear_maps
from lmdepth.analyses import skipping as skip_analysis
from lmdepth.analyses.complexity import ComplexitySummary
from lmdepth.analyses.lens import LensSummary
from lmdepth.analyses.maps import MapsSummary
from lmdepth.analyses.residual import ResidualSummary
from lmdepth.analyses.run import RunSummary, SampleSummary
from lmdepth.analyses.skipping import SkipSummary
from lmdepth.claims.spec import EARLY_LAYERS
from lmdepth.errors import DataError
from lmdepth.params import check_type
from lmdepth.results import RunResult, book_record_dir, check_recorded, damage, recorded_runs

ATLAS_COLUMNS = ["model", "n_layers", "chapter", "measure", "layer", "rel_depth", "rel_low", "rel_high", "value",
                 "sample"]


# ---- reading finished runs ---------------------------------------------------------------------------------------

#: The chapters whose runs and claims the summary pages read from the book record.
RECORDED_CHAPTERS = ("norms", "cosine", "skipping", "lens", "complexity", "maps", "moeut")


def book_runs(results_dir: str | Path, profile: str) -> set[Path]:
    """The runs the book build recorded for ``profile`` (:func:`lmdepth.results.record_run`), checked complete
    and intact.

    Raises:
        DataError: a chapter has no record (never executed by the book build on this machine, or ``results/`` is
            missing), or a recorded run is missing or damaged (:func:`lmdepth.results.check_recorded`): the page
            would otherwise publish fewer rows than the profile defines.
    """
    root = Path(results_dir) / "book" / Path(profile).stem
    missing = [c for c in RECORDED_CHAPTERS if not (root / c).is_dir()]
    if missing:
        raise DataError(f"The summary pages read the book's own runs of the {profile!r} profile, recorded when "
                        f"`lmdepth book` executes each chapter; nothing is recorded under {root} for: "
                        f"{', '.join(missing)}. Run `lmdepth book --profile {profile} --force` to execute them.")
    check_recorded(root)
    return recorded_runs(root)


@dataclass(frozen=True)
class SummarySource:
    """Which runs a summary page reads: ``only`` (None = every finished run under the results directory), the
    profile whose verdicts it shows (None = runs outside the book), and a note for the page ("" for the book's
    own record)."""

    only: set[Path] | None
    profile: str | None
    note: str


def summary_source(results_dir: str | Path, profile: str) -> SummarySource:
    """The book build's record of ``profile`` when there is one (strictly inside a build: an incomplete record
    raises, see :func:`book_runs`); elsewhere (Colab, a chapter run by hand) the finished runs under
    ``results_dir``, said so on the page."""
    root = Path(results_dir) / "book" / Path(profile).stem
    complete = all((root / c).is_dir() for c in RECORDED_CHAPTERS)
    if book_record_dir() is not None or complete:
        return SummarySource(book_runs(results_dir, profile), profile, "")
    return SummarySource(None, None, (
        f"*No complete book build of the {profile!r} profile is recorded under `{results_dir}`, so this page "
        "summarises every finished run there, including runs made outside the book. `lmdepth book` records the "
        "book's own runs.*"))


def finished_runs(results_dir: str | Path, analysis: str, only: set[Path] | None = None) -> list[RunResult]:
    """Every finished run of one analysis (directories with both files; ``.partial`` checkpoints are skipped);
    with ``only``, just those runs (e.g. :func:`book_runs`). A run whose files or sidecar no longer match their
    digests (:func:`lmdepth.results.damage`) is left out with one line: its sidecar's sample size or model could be
    an edit, and the atlas shows the sample beside every number."""
    runs = []
    for meta_path in sorted(Path(results_dir, analysis).glob("*/*/meta.json")):
        table_path = meta_path.with_name("table.csv")
        if meta_path.parent.name.endswith(".partial") or not table_path.exists():
            continue
        if only is not None and meta_path.parent.resolve() not in only:
            continue
        problem = damage(meta_path.parent)
        if problem:
            print(f"lmdepth: the atlas leaves out {meta_path.parent}: {problem}", file=sys.stderr, flush=True)
            continue
        runs.append(RunResult(pd.read_csv(table_path), json.loads(meta_path.read_text()), meta_path.parent,
                              from_cache=True))
    return runs


S = TypeVar("S", bound=RunSummary)


def best_runs(runs: list[tuple[RunResult, S]], group: Callable[[S], Any] = lambda s: s.model,
              size: Callable[[S], int] = lambda s: s.n_examples) -> list[tuple[RunResult, S]]:
    """One (run, summary) per group (default: per model): the largest sample (``size``, default the problems asked
    for), then the most recently written sidecar."""
    best: dict[Any, tuple[RunResult, S, tuple[int, float]]] = {}
    for r, s in runs:
        k = group(s)
        score = (size(s) or 0, (Path(r.path) / "meta.json").stat().st_mtime)
        if k not in best or score > best[k][2]:
            best[k] = (r, s, score)
    return [(r, s) for r, s, _ in best.values()]


def _plural(n: Any, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _sample(s: SampleSummary) -> str:
    return _plural(s.n_examples, f"{s.dataset} problem")


# ---- per-analysis summaries --------------------------------------------------------------------------------------

def _row(model: str, n_layers: int, chapter: str, measure: str, sample: str, layer: float | None = None,
         rel_depth: float | None = None, value: float | None = None, rel_low: float | None = None,
         rel_high: float | None = None) -> dict[str, Any]:
    return dict(model=model, n_layers=n_layers, chapter=chapter, measure=measure, layer=layer, rel_depth=rel_depth,
                rel_low=rel_low, rel_high=rel_high, value=value, sample=sample)


def layer_depth(k: float | None, n_layers: int) -> float | None:
    """Relative depth of layer (block) k: its centre, (k + 0.5) / L (None stays None)."""
    return None if k is None or pd.isna(k) else (k + 0.5) / n_layers


def residual_rows(results_dir: str | Path, only: set[Path] | None = None) -> list[dict[str, Any]]:
    """Chapters 01–02 (one shared run): the cosine phase transition t (the mean cosine is positive from layer t on;
    :func:`lmdepth.analyses.residual.cosine_transition_layer`) at t / L, and the second-half / first-half ratio of
    the whole layer's relative contribution without layers 0–1 (a ratio, not a depth)."""

    rows = []
    runs = [(r, ResidualSummary.of(r)) for r in finished_runs(results_dir, residual.ANALYSIS, only)]
    for r, s in best_runs(runs):
        t = r.table
        model, L = s.model, int(t["n_layers"].iloc[0])
        tr = residual.cosine_transition_layer(t)
        rows.append(_row(model, L, "02_cosine_similarity", "cosine phase transition", _sample(s), layer=tr,
                         rel_depth=layer_depth(tr, L)))
        ratio = residual.half_ratio(residual.select(t, "relative_contribution", "layer"), skip_first=EARLY_LAYERS)
        rows.append(_row(model, L, "01_residual_norms", "contribution ratio 2nd/1st half (without layers 0–1)",
                         _sample(s), value=ratio))
    return rows


def skipping_rows(results_dir: str | Path, only: set[Path] | None = None) -> list[dict[str, Any]]:
    """Chapter 03: the future-token cutoff — the first layer after which skipping any later layer changes no later
    layer's future computation by more than the threshold — with its bootstrap interval over problems."""

    runs = [(r, s) for r in finished_runs(results_dir, skip_analysis.ANALYSIS, only)
            for s in [SkipSummary.of(r)] if s.analysis == "future"]
    rows = []
    for _, s in best_runs(runs):
        c = s.cutoffs.get("layer")
        if c is None:
            continue
        L = int(c.n_layers)
        rows.append(_row(s.model, L, "03_layer_skipping",
                         f"future-effect cutoff (< {c.threshold:g})", _sample(s) + f", {s.n_cuts} cuts each",
                         layer=c.cutoff, rel_depth=layer_depth(c.cutoff, L), rel_low=layer_depth(c.ci_low, L),
                         rel_high=layer_depth(c.ci_high, L)))
    return rows


def lens_rows(results_dir: str | Path, only: set[Path] | None = None) -> list[dict[str, Any]]:
    """Chapter 04: where the logit lens and the tuned lens settle (first layer with top-5 overlap > 0.2; first layer
    with KL below 10 % of its maximum), at l / L."""

    rows = []
    runs = [(r, LensSummary.of(r)) for r in finished_runs(results_dir, lens.ANALYSIS, only)]
    for r, run in best_runs(runs):
        summary = lens.settling_summary(r.table)
        for _, s in summary.iterrows():
            if s["criterion"] == lens.SHARED_KL_CRITERION:
                continue
            name = f"{s['lens'].replace('_', ' ')}: {s['criterion']}"
            rows.append(_row(s["model"], int(s["n_layers"]), "04_logit_lens", name, _sample(run), layer=s["layer"],
                             rel_depth=s["rel_depth"]))
    return rows


def _mean_layer_effect(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows of a depth-score table (levels or slopes) that the atlas reads: layer effect, mean aggregation."""
    if frame.empty:
        return []
    return frame[(frame["aggregation"] == "mean") & (frame["metric"] == "layer_effect")].to_dict("records")


def complexity_rows(results_dir: str | Path, only: set[Path] | None = None) -> list[dict[str, Any]]:
    """Chapter 05, per data source: the depth score D (layer effect, mean aggregation, 0-based, averaged over the
    difficulty levels) at (D + 0.5)/L — the effect-weighted mean layer, placed at the centre of layer D, not an end
    point of the computation — and its fitted slope per difficulty level with the bootstrap interval (a
    value: the paper's claim is a slope near 0)."""

    rows = []
    runs = [(r, ComplexitySummary.of(r)) for r in finished_runs(results_dir, complexity.ANALYSIS, only)]
    # one run per (model, source), ranked by items per level
    for _, s in best_runs(runs, group=lambda s: (s.model, s.source), size=lambda s: s.n_per_level):
        L, src = s.n_layers, s.source
        sample = f"{_plural(s.n_per_level, 'item')} per level"
        d = pd.Series([x["depth_score"] for x in _mean_layer_effect(s.levels)], dtype=float).mean()
        if pd.notna(d):
            rows.append(_row(s.model, L, "05_depth_vs_complexity",
                             f"depth score ({src}; effect-weighted mean layer)", sample,
                             layer=d, rel_depth=layer_depth(d, L)))
        for x in _mean_layer_effect(s.slopes):
            rows.append(_row(s.model, L, "05_depth_vs_complexity", f"depth-score slope per level ({src})", sample,
                             value=x["slope"]))
    return rows


def maps_rows(results_dir: str | Path, only: set[Path] | None = None) -> list[dict[str, Any]]:
    """Chapter 06: for each fitted pair (rows under the *target* model), how closely the best source layer of each
    target layer follows equal relative depth — its correlation with relative depth and mean |offset| (values, not
    depths). Controls are left out."""

    rows = []
    runs = [(r, MapsSummary.of(r)) for r in finished_runs(results_dir, linear_maps.ANALYSIS, only)]
    # one run per model set, ranked by its held-out sample (maps runs have no problems)
    for _, run in best_runs(runs, group=lambda s: (s.model, s.compare_models), size=lambda s: s.n_test_tokens):
        sample = f"{run.n_test_tokens} held-out aligned tokens"
        for s in run.alignments.values():
            if s.kind != "main":
                continue
            for measure, value in (("corr of best source with depth", s.col_corr),
                                   ("mean |relative-depth offset|", s.col_mean_abs_offset)):
                rows.append(_row(s.target, s.n_target_layers, "06_linear_maps", f"maps from {s.source}: {measure}",
                                 sample, value=value))
    return rows


SUMMARIES: dict[str, Callable[[str | Path], list[dict[str, Any]]]] = {
    "residual": residual_rows,
    "skipping": skipping_rows,
    "lens": lens_rows,
    "complexity": complexity_rows,
    "maps": maps_rows,
}


def atlas_table(results_dir: str | Path, profile: str | None = None, only: set[Path] | None = None) -> pd.DataFrame:
    """All summaries of all models, one row per (model, measure); columns :data:`ATLAS_COLUMNS`. With ``profile``,
    only the runs the book build recorded for it (:func:`book_runs`); with ``only``, those runs."""
    only = only if profile is None else book_runs(results_dir, profile)
    rows = [row for summarise in SUMMARIES.values() for row in summarise(results_dir, only)]
    t = pd.DataFrame(rows, columns=ATLAS_COLUMNS)
    return t.sort_values(["n_layers", "model", "chapter", "measure"], kind="stable", ignore_index=True)


def display_table(table: pd.DataFrame) -> pd.DataFrame:
    """The atlas for reading: one row per (model, measure); layers as integers (or a mean layer to one decimal),
    relative depths and values to two decimals, "—" where a measure has no such number."""
    def num(x: Any, fmt: str) -> str:
        return "—" if pd.isna(x) else format(x, fmt)

    return pd.DataFrame({
        "model": table["model"], "chapter": table["chapter"], "measure": table["measure"],
        "layer": [str(int(x)) if pd.notna(x) and float(x).is_integer() else num(x, ".1f") for x in table["layer"]],
        "relative depth": [num(x, ".2f") for x in table["rel_depth"]],
        "value": [num(x, ".2f") for x in table["value"]],
        "of layers": table["n_layers"].astype(int), "sample": table["sample"]})


def shown_models(table: pd.DataFrame, models: list[str]) -> list[str]:
    """The models of an :func:`atlas_table` to show, shallowest first: ``models`` if given (checked), else all."""
    check_type("models", models, list)
    shown = list(dict.fromkeys(table.sort_values("n_layers", kind="stable")["model"]))
    shown = [m for m in shown if not models or m in models]
    if not shown and models:
        raise DataError(f"None of {models} has results to summarise; models with results: "
                        f"{sorted(set(table['model']))}.")
    return shown


# ---- findings: the paper's claims, checked per model ------------------------------------------------------------

@dataclass(frozen=True)
class Finding:
    """One finding of the paper, the figure that shows it, and the chapter (and its figure) that reproduces it."""

    finding: str
    paper_figure: str
    chapter: str  # notebook stem
    book_figure: str  # figure label in that chapter


FINDINGS = [
    Finding("Second-half layers contribute less to the residual", "Fig. 2a", "01_residual_norms", "fig-norms-relative"),
    Finding("Cosine of the writes changes sign near mid-depth", "Fig. 2b", "02_cosine_similarity", "fig-cos-components"),
    Finding("Skipping a second-half layer barely changes later computation", "Fig. 3a", "03_layer_skipping", "fig-skip-current"),
    Finding("… nor the computation of future tokens", "Fig. 3b", "03_layer_skipping", "fig-skip-future"),
    Finding("The logit-lens prediction settles from mid-depth on", "Fig. 4", "04_logit_lens", "fig-lens-layers"),
    Finding("Depth used does not grow with problem difficulty", "Figs. 5–6", "05_depth_vs_complexity",
            "fig-depth-level"),
    Finding("A deeper model stretches a shallower one's computation", "Fig. 8", "06_linear_maps", "fig-maps-heatmap"),
    Finding("Not modelling the question makes MoEUT use more depth", "Fig. 9", "07_moeut_vs_transformer",
            "fig-moeut-erasure"),
]
CHAPTER_KEYS = {"01_residual_norms": "norms", "02_cosine_similarity": "cosine", "03_layer_skipping": "skipping",
                "04_logit_lens": "lens", "05_depth_vs_complexity": "complexity",
                "06_linear_maps": "maps", "07_moeut_vs_transformer": "moeut"}


# ---- reproducibility: what the build did ------------------------------------------------------------------------

#: The name of an executed chapter notebook (``01_residual_norms``), not of a failed attempt (``….failed``).
CHAPTER_STEM = re.compile(r"\d\d_\w+")


def build_record(book_dir: str | Path) -> pd.DataFrame:
    """Per executed chapter notebook: profile, wall time, execution date and build hash (from its metadata)."""
    rows = []

    for path in sorted(Path(book_dir).glob("[0-9]*.ipynb")):
        if not CHAPTER_STEM.fullmatch(path.stem):  # e.g. a ``.failed`` notebook of an interrupted build
            continue
        meta = nbformat.read(path, as_version=4).metadata.get("lmdepth", {})
        rows.append({"chapter": path.stem, "profile": meta.get("profile"), "wall time (s)": meta.get("wall_s"),
                     "executed (UTC)": meta.get("executed_at"), "build hash": meta.get("build_hash")})
    # the columns even without a notebook (e.g. run outside the repository): the page then says so, not crashes
    return pd.DataFrame(rows, columns=["chapter", "profile", "wall time (s)", "executed (UTC)", "build hash"])


__all__ = ["ATLAS_COLUMNS", "FINDINGS", "Finding", "finished_runs", "best_runs", "residual_rows", "skipping_rows",
           "lens_rows", "complexity_rows", "maps_rows", "SUMMARIES", "atlas_table", "display_table", "build_record"]
