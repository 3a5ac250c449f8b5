"""What every chapter does in its hidden setup cell, and small display helpers for computed prose."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from lmdepth.runtime import seed_everything
from lmdepth.charts import vega_offline
from lmdepth.model.registry import current_weights_id
from lmdepth.params import check_type
from lmdepth.results import atomic_write_text, book_record_dir, slug


def setup(seed: int = 0) -> None:
    """Offline chart renderer, quiet library logging, seeds.

    Progress bars of transformers are turned off when ``LMDEPTH_PROGRESS=0`` (book builds), because carriage
    returns in stored stream output make executed notebooks large and unreadable.
    """

    vega_offline.enable()
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    import transformers

    transformers.logging.set_verbosity_error()
    if os.environ.get("LMDEPTH_PROGRESS", "1") == "0":
        transformers.utils.logging.disable_progress_bar()
    pd.set_option("display.precision", 3)
    pd.set_option("styler.format.precision", 3)  # show_table() renders through a Styler (default: 6 decimals)
    seed_everything(seed)


def chapter_models(model_name: str, compare_models: list[str]) -> list[str]:
    """The models a chapter shows: ``model_name`` first, then the comparison models (duplicates dropped).

    Checks the two parameters (a string where a list is expected is a common papermill slip) and every name, so a
    typo in the last comparison model stops the chapter before the first model runs.

    Raises:
        ParameterError: ``compare_models`` is not a list of strings; UnknownModelError: a name is not a model.
    """
    check_type("model_name", model_name, str)
    check_type("compare_models", compare_models, list)
    for m in compare_models:
        check_type("compare_models[]", m, str)
    models = list(dict.fromkeys([model_name, *compare_models]))
    for m in models:
        current_weights_id(m)
    return models


def md(text: str) -> None:
    """Display Markdown computed from results (numbers in prose always come from the run)."""
    from IPython.display import Markdown, display

    display(Markdown(text))


@dataclass
class Claim:
    """One testable statement of the paper, its operational criterion, and what a model showed."""

    claim: str
    criterion: str
    model: str
    measured: str
    holds: bool

    def row(self) -> dict[str, Any]:
        return {"claim": self.claim, "criterion": self.criterion, "model": self.model,
                "measured": self.measured, "agrees with paper": "yes" if self.holds else "NO"}


def claims_table(claims: list[Claim], chapter: str | None = None, results_dir: str | None = None) -> pd.DataFrame:
    """The claims as a table, also saved one file per model: inside a book build into the chapter's book record
    (``<results>/book/<profile>/<chapter>/claims/<model>.csv``, what the findings page reads), otherwise into
    ``<results_dir>/claims/<chapter>/`` (your own runs; never read by the book)."""
    df = pd.DataFrame([c.row() for c in claims])
    record = book_record_dir()
    target = record / "claims" if record is not None else (
        Path(results_dir) / "claims" / chapter if chapter is not None and results_dir is not None else None)
    if target is not None and len(df):
        for model, rows in df.groupby("model", sort=False):
            atomic_write_text(target / f"{slug(model)}.csv", rows.to_csv(index=False))
    return df


def show_table(df: pd.DataFrame):
    """A table without its integer index, for display; cell text is HTML-escaped (tokens such as ``<s>`` or
    ``<|endoftext|>`` are shown, not read as markup)."""
    return df.style.hide(axis="index").format(escape="html")
