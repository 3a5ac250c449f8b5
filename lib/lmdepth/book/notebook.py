"""What every chapter does in its hidden setup cell, and small display helpers for computed prose."""

from __future__ import annotations

import hashlib
import html
import os
import time
import warnings

import pandas as pd

from lmdepth.book.table_sort import SORTABLE_CLASS
from lmdepth.charts import vega_offline
from lmdepth.model.registry import current_weights_id
from lmdepth.params import check_type
from lmdepth.runtime import seed_everything


def setup(seed: int = 0) -> float:
    """Offline chart renderer, quiet library logging, seeds; returns the time it ran (``time.time()``), from which a
    page may report its wall time.

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
    return time.time()


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


def styled(df: pd.DataFrame, sortable: bool = False, links: list[str] | None = None):
    """A table without its integer index; cell text is HTML-escaped (tokens such as ``<s>`` or ``<|endoftext|>``
    are shown, not read as markup); a missing value reads "—", never "nan" or "None". The HTML element ids come
    from the table's columns and shape (pandas draws them at random), so re-rendering gives the same HTML and a
    changed number changes only its own cell's line in a diff of the executed notebook.

    ``sortable``: the ``<table>`` gets the class :data:`lmdepth.book.table_sort.SORTABLE_CLASS`, so in the book a
    click on a column header sorts the rows by it; elsewhere (Jupyter, Colab) it is the same table, unsorted.

    ``links``: one address per row, in the row order (e.g. ``03_layer_skipping.html#claims-skipping``, a page of the
    built book: in Jupyter or Colab such a link leads nowhere); the row's first cell becomes a link to it, its text
    still escaped (a missing first cell reads "—", without a link).

    Raises:
        ValueError: ``links`` does not have one address per row, or the table's columns are not uniquely named.
    """
    if links is not None:
        if len(links) != len(df):
            raise ValueError(f"links: {len(links)} addresses for a table of {len(df)} rows; give one per row")
        if not df.columns.is_unique:
            raise ValueError("links: the table's columns must have unique names (a link goes to the first column)")
        df = df.reset_index(drop=True)  # rows by position: a repeated index label would take one row's link twice
    digest = hashlib.sha1(repr((list(map(str, df.columns)), df.shape)).encode()).hexdigest()[:8]
    out = df.style.hide(axis="index").format(escape="html", na_rep="—").set_uuid(digest)
    for row, href in enumerate(links or []):  # the formatter receives the cell's text already escaped
        out = out.format(lambda text, href=html.escape(href): f'<a href="{href}">{text}</a>', escape="html",
                         na_rep="—", subset=pd.IndexSlice[[row], df.columns[:1]])
    return out.set_table_attributes(f'class="{SORTABLE_CLASS}"') if sortable else out


#: A table of more rows than this starts folded under its caption (about one screen of the verdict tables' rows, whose
#: claim cells wrap over two or three lines).
FOLD_ROWS = 10
#: The class of every folded block the page helpers make (an HTML ``<details>``): tables, prose, measurement code.
FOLD_CLASS = "lmdepth-folded"


def folded(caption: str, markdown: str) -> str:
    """Markdown that starts folded under ``caption``: the caption shows, a click opens the rest (an HTML
    ``<details>``, so also in Jupyter and Colab). The body stays Markdown — lists, emphasis, math — because blank
    lines separate it from the ``<details>`` tags (CommonMark ends an HTML block at a blank line). For a chapter's
    dated notes, variants and long caveats, off the reader path (:mod:`lmdepth.book.reading`)."""
    return (f'<details class="{FOLD_CLASS}"><summary>{html.escape(caption)}</summary>\n\n{markdown.strip()}\n\n'
            "</details>")


#: A chapter with more registered claims than this shows their list folded too (each claim is named, with its rule,
#: in the verdict tables that follow).
FOLD_CLAIMS = 6


def claims_md(chapter: str) -> str:
    """The chapter's registered claims for its page (:func:`lmdepth.claims.report.describe`, all of it): one line per
    claim on the reader path — its name, figure and statement — folded under its caption where there are more than
    :data:`FOLD_CLAIMS`; and, folded, each claim's statistic, rule and unit with how a verdict is decided, and the
    dated changes to the criteria made after their numbers were seen."""
    from lmdepth.claims import report

    specs = report.for_chapter(chapter)
    text = report.describe(chapter)
    rules, _, history = text.partition("\n\nChanges to the criteria after their numbers were seen:\n")
    lines = "\n".join(f"- **{s.claim}** ({s.figure}): {s.statement}" for s in specs)
    if len(specs) > FOLD_CLAIMS:
        lines = folded(f"The {len(specs)} claims checked here, each with its statement", lines)
    out = [lines, folded("Each claim's statistic, rule and unit, and how a verdict is decided", rules)]
    if history:
        n = history.count("\n- ") + history.startswith("- ")
        out.append(folded(f"Changes to the criteria after their numbers were seen ({n} dated notes)", history))
    return "\n\n".join(out)


def show_table(df: pd.DataFrame, sortable: bool = False, links: list[str] | None = None,
               caption: str | None = None, fold: bool | None = None) -> None:
    """Display :func:`styled` ``df`` now — wherever the call stands in its cell (a table returned by a cell's
    non-last line would otherwise never render); ``sortable``: its rows sort by a clicked column header in the book
    (:mod:`lmdepth.book.table_sort`); ``links``: one address per row, which its first cell links to; ``caption``:
    one line saying what the table holds (every table of the book has one). A table of more than :data:`FOLD_ROWS`
    rows starts folded: its caption and row count show, a click opens it (an HTML ``<details>``, so also in
    Jupyter and Colab). ``fold``: True folds the table whatever its length (a per-model or per-seed table off the
    reader path), False never folds it; None (the default) folds by length."""
    from IPython.display import HTML, display

    table = styled(df, sortable, links)
    if caption:
        table = table.set_caption(html.escape(caption))
    if not (len(df) > FOLD_ROWS if fold is None else fold):
        display(table)
        return
    summary = html.escape(f"{caption or 'Table'}: {len(df)} rows (click to open)")
    display(HTML(f'<details class="{FOLD_CLASS}"><summary>{summary}</summary>\n{table.to_html()}</details>'))
