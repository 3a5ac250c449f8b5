"""Each chapter's "How it is measured": the library's own code that computes the chapter's quantity — the nnsight
trace that runs the model and the kernel that reduces its activations — shown on the page from the functions
themselves (:func:`inspect.getsource`), never from a copy that could drift from what ran.

:data:`MEASUREMENTS` names the functions per chapter; :func:`show_measurement` displays their source folded (an
HTML ``<details>``, so also in Jupyter and Colab) under one caption. ``tests/test_measurement.py`` holds every
chapter to one such cell and the executed pages to the functions' current source.
"""

from __future__ import annotations

import html
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lmdepth.kernels.lens_kernels import lens_block
from lmdepth.kernels.residual_kernels import cosine, relative_norm, token_metrics
from lmdepth.kernels.skip_kernels import edited_output, row_changes, skipped_pass_layer
from lmdepth.metrics.depth import depth_score, layer_effect
from lmdepth.metrics.ridge import fit_direction
from lmdepth.traces.boundary_residuals import boundary_residuals_at
from lmdepth.traces.erasure_trace import erasure_effects
from lmdepth.traces.lens_trace import lens_readings
from lmdepth.traces.residual_metrics import residual_metrics
from lmdepth.traces.skip_effects import skip_effects

#: The functions that compute each chapter's quantity, the trace first.
MEASUREMENTS: dict[str, tuple[Callable[..., Any], ...]] = {
    "norms": (residual_metrics, token_metrics, relative_norm),
    "cosine": (residual_metrics, token_metrics, cosine),
    "skipping": (skip_effects, skipped_pass_layer, edited_output, row_changes),
    "lens": (lens_readings, lens_block),
    "complexity": (skip_effects, layer_effect, depth_score),
    "maps": (boundary_residuals_at, fit_direction),
    "moeut": (skip_effects, erasure_effects, layer_effect, depth_score),
}
#: The caption of the folded cell.
TITLE = "How it is measured"
#: The class of the cell's ``<details>`` element (a test finds the cell by it).
CSS_CLASS = "lmdepth-measurement"

_PACKAGE = Path(__file__).resolve().parents[1]


def qualified_name(fn: Callable[..., Any]) -> str:
    """``module.function``, as the page names it."""
    return f"{fn.__module__}.{fn.__qualname__}"


def where(fn: Callable[..., Any]) -> str:
    """The function's file inside the package and its lines, e.g. ``lmdepth/traces/residual_metrics.py, lines
    86–115``."""
    lines, first = inspect.getsourcelines(fn)
    path = Path(inspect.getsourcefile(fn)).resolve().relative_to(_PACKAGE.parent)
    return f"{path.as_posix()}, lines {first}–{first + len(lines) - 1}"


def source_block(fn: Callable[..., Any]) -> str:
    """One function's source as an HTML ``<pre>`` (highlighted where Pygments is installed), headed by its name and
    place; its text, unescaped and stripped of tags, is :func:`inspect.getsource` of the function."""
    code = inspect.getsource(fn)
    try:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import PythonLexer

        body = highlight(code, PythonLexer(stripnl=False, ensurenl=False),
                         HtmlFormatter(noclasses=True, nowrap=True, style="default"))
    except ImportError:  # a plain block: the same text, unhighlighted
        body = html.escape(code)
    head = f"<p><code>{html.escape(qualified_name(fn))}</code> ({html.escape(where(fn))})</p>"
    return f'{head}\n<pre style="overflow-x: auto; font-size: 85%; line-height: 1.35">{body}</pre>'


def measurement_html(chapter: str) -> str:
    """The folded block of ``chapter``'s measurement code.

    Raises:
        KeyError: the chapter names no measurement in :data:`MEASUREMENTS`.
    """
    functions = MEASUREMENTS[chapter]
    names = ", ".join(f.__name__ for f in functions)
    summary = html.escape(f"{TITLE}: the library's own code ({names}), click to open")
    blocks = "\n".join(source_block(f) for f in functions)
    return f'<details class="lmdepth-folded {CSS_CLASS}"><summary>{summary}</summary>\n{blocks}\n</details>'


def show_measurement(chapter: str) -> None:
    """Display :func:`measurement_html` of ``chapter`` now (a chapter's folded "How it is measured" cell)."""
    from IPython.display import HTML, display

    display(HTML(measurement_html(chapter)))


__all__ = ["MEASUREMENTS", "TITLE", "CSS_CLASS", "qualified_name", "where", "source_block", "measurement_html",
           "show_measurement"]
