"""What every chapter does in its hidden setup cell, and small display helpers for computed prose."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any

import pandas as pd

from lmdepth.runtime import seed_everything


def setup(seed: int = 0) -> None:
    """Offline chart renderer, quiet library logging, seeds.

    Progress bars of transformers are turned off when ``LMDEPTH_PROGRESS=0`` (book builds), because carriage
    returns in stored stream output make executed notebooks large and unreadable.
    """
    from lmdepth.charts import vega_offline

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
    """The claims as a table; with ``chapter`` and ``results_dir`` also saved, one file per model, as
    ``results/claims/<chapter>/<model>.csv`` — the findings table of the atlas chapter reads them."""
    df = pd.DataFrame([c.row() for c in claims])
    if chapter is not None and results_dir is not None and len(df):
        from pathlib import Path

        from lmdepth.results import atomic_write_text, slug

        for model, rows in df.groupby("model", sort=False):
            atomic_write_text(Path(results_dir) / "claims" / chapter / f"{slug(model)}.csv", rows.to_csv(index=False))
    return df


def show_table(df: pd.DataFrame):
    """A table without its integer index, for display."""
    return df.style.hide(axis="index")
