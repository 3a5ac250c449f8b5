"""``lmdepth explore``: the explorer (chapter 91) as a local web app — type a prompt, pick a model and a layer, press
Run, and the contributions, the logit lens and the skip effect are computed for it in a live kernel.

The page is the explorer notebook served by Voilà (the Jupyter project's app server for notebooks with widgets):
its cells run in a kernel on this machine, the page shows their outputs without the code, and the widget's Run
button calls the same :func:`lmdepth.book.explorer.explore` as the book. Voilà is an optional dependency (the
``explore`` extra); everything the page loads comes from this machine, so it works offline:

* the notebook is written from the chapter source with the reader's parameters injected as papermill does;
* jupytext's JupyterLab extension (installed with jupytext, a dependency) is not loaded: it expects JupyterLab
  around it and throws in Voilà's page (an allowlist of the widgets' extension alone leaves Voilà's page without
  widgets);
* the page template is Voilà's ``lab`` template less its two font stylesheets from a CDN (the explorer shows no
  icon), plus the book's own vega bundle (:mod:`lmdepth.charts.vega_offline`), served from the template's static
  folder: :data:`TEMPLATE_INDEX`. The kernel draws every chart as the book's HTML snippet
  (:data:`~lmdepth.charts.vega_offline.HTML_ONLY_ENV`), never through JupyterLab's vega renderer, which puts a
  "Javascript Error" under each chart in Voilà;
* the notebook's markdown shows MyST roles, such as a link to another page of the book, as their text
  (:func:`plain_roles`): Voilà renders plain Markdown, where a role is shown raw;
* a kernel is kept ready (Voilà's preheated kernel pool, one kernel): it loads the model and runs the notebook
  before anyone asks, so a page shows its form in seconds instead of the 41–59 s the notebook takes to run on two
  cores; when a page takes it, the next one is prepared. A last cell, added here, prints :data:`READY_LINE` on the
  server's terminal when a kernel is ready.

Why Voilà and not a server of our own: it is the maintained way to serve ipywidgets from a kernel (the comm
protocol, kernel lifetime, one kernel per page), and the explorer's widget is then the same in Jupyter, Colab and
here.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lmdepth.book import explore_server
from lmdepth.book.chapters import chapter_source, check_parameters
from lmdepth.charts.vega_offline import BUNDLE_NAME, HTML_ONLY_ENV, write_vega_bundle
from lmdepth.errors import MissingPackageError, ParameterError
from lmdepth.results import temporary_dir

#: The chapter the app serves.
CHAPTER = "explorer"
#: What the page needs beyond the core dependencies: pyproject.toml's ``explore`` extra (a test holds them equal).
REQUIREMENTS = ("voila>=0.5,<0.6", "ipywidgets>=8")
#: The JupyterLab extensions the page does not load (see the module docstring).
DENIED_EXTENSIONS = ("jupyterlab-jupytext",)
#: The name of the page template written beside the notebook (:func:`prepare`).
TEMPLATE = "lmdepth"
#: Voilà's ``lab`` template, less the CDN stylesheets its ``notebook_css`` block adds (read offline, they only fail),
#: plus the vega bundle in the head, so a chart's snippet finds ``window.vegaEmbed`` when it runs.
TEMPLATE_INDEX = """\
{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js -%}
{{ super() }}
{{ resources.include_js("static/""" + BUNDLE_NAME + """") }}
{%- endblock html_head_js -%}
{%- block notebook_css -%}
{{ super() | replace('<link rel="stylesheet" href="https://cdn.jsdelivr.net/npm/@fortawesome/fontawesome-free@^5/css/all.min.css" type="text/css" />', '') | replace('<link rel="stylesheet" href="https://cdn.jsdelivr.net/npm/@fortawesome/fontawesome-free@^5/css/v4-shims.min.css" type="text/css" />', '') }}
{%- endblock notebook_css -%}
"""


def require_voila() -> None:
    """Stop in one line, before any work, where Voilà or ipywidgets is not installed.

    Raises:
        MissingPackageError: one of them is missing; the line gives the pip command.
    """
    import importlib.util

    missing = [m for m in ("voila", "ipywidgets") if importlib.util.find_spec(m) is None]
    if missing:
        wanted = " ".join(f"'{r}'" for r in REQUIREMENTS)
        raise MissingPackageError(f"`lmdepth explore` needs {' and '.join(missing)}, not installed here: pip install "
                                  f"{wanted} (or `pip install -e \".[explore]\"` in a checkout).")


#: A MyST role in Markdown: ``{doc}`text <target>``` or ``{doc}`target```.
_ROLE = re.compile(r"\{[\w:-]+\}`([^`<]*?)\s*(?:<([^`>]*)>)?`")


def plain_roles(markdown: str) -> str:
    """``markdown`` with each MyST role written as its text (its target where it has no text), as plain Markdown
    shows it: ``{doc}`chapter 01 <01_residual_norms>``` → ``chapter 01``."""
    return _ROLE.sub(lambda m: m[1] or m[2] or "", markdown)


#: What the server's terminal shows each time a kernel has run the notebook and waits for a page.
READY_LINE = "lmdepth: the explorer is ready: a page opened now shows its form at once"
#: The cell :func:`prepare` adds at the end: the kernel's stderr is the server's terminal (the page does not show it:
#: Voilà leaves stderr outputs off its pages unless ``show_tracebacks`` is set).
_READY_CELL = f"import sys as _sys\nprint({READY_LINE!r}, file=_sys.__stderr__, flush=True)"


def prepare(folder: Path, params: Mapping[str, Any]) -> Path:
    """Write the explorer notebook with ``params`` injected (checked first, as ``lmdepth run`` checks them), its
    roles in plain text (:func:`plain_roles`), and the page template with the vega bundle into ``folder``; returns
    the notebook's path.

    Raises:
        ParameterError, UnknownModelError: a parameter the explorer does not declare, or of the wrong type; a model
            that is not one.
    """
    import jupytext
    import nbformat
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    params = check_parameters(CHAPTER, dict(params))
    nb = jupytext.read(chapter_source(CHAPTER))
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = plain_roles(cell.source)
    nb.metadata.setdefault("kernelspec", {"name": "python3", "display_name": "Python 3", "language": "python"})
    nb.cells.append(nbformat.v4.new_code_cell(_READY_CELL, metadata={"tags": ["remove-cell"]}))
    path = folder / "explorer.ipynb"
    nbformat.write(nb, path)
    if params:  # papermill's loader adds the metadata its parameterizer reads (every cell's tags, its own)
        nbformat.write(parameterize_notebook(load_notebook_node(str(path)), dict(params)), path)
    template = folder / "voila" / "templates" / TEMPLATE
    template.mkdir(parents=True, exist_ok=True)
    (template / "index.html.j2").write_text(TEMPLATE_INDEX)
    (template / "conf.json").write_text(json.dumps({"base_template": "lab"}))
    write_vega_bundle(template / "static")
    return path


def check_port(port: int) -> int:
    """``port`` if the explorer can serve on it: 1–65535 and free on 127.0.0.1 (:class:`~lmdepth.errors.ParameterError`
    in one line otherwise, before anything starts; Voilà is told not to move to another port, so the address printed
    is the address served)."""
    import socket

    if not 1 <= int(port) <= 65535:
        raise ParameterError(f"--port must be between 1 and 65535, got {port}.")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: a TIME_WAIT port is free
        try:
            probe.bind(("127.0.0.1", int(port)))
        except OSError as e:
            raise ParameterError(f"port {port} on 127.0.0.1 is not free ({e.strerror}): pass another --port.") from None
    return int(port)


def voila_command(notebook: Path, port: int, open_browser: bool = False) -> list[str]:
    """The server's command line (:func:`lmdepth.book.explore_server.main`: Voilà, then its folder removed) serving
    ``notebook`` on 127.0.0.1:``port`` (never another port) without :data:`DENIED_EXTENSIONS`, with the template of
    :func:`prepare`, the code cells hidden and one kernel kept ready (preheated); Voilà's connection files go in the
    notebook's folder, which the server removes when it ends."""
    return [sys.executable, "-m", explore_server.MODULE, str(notebook), f"--port={port}", "--Voila.ip=127.0.0.1",
            "--ServerApp.port_retries=0", f"--Voila.connection_dir_root={notebook.parent}",
            f"--template={TEMPLATE}", "--strip_sources=True", "--preheat_kernel=True", "--pool_size=1",  # one kept ready
            *(f"--VoilaConfiguration.extension_denylist={name}" for name in DENIED_EXTENSIONS),
            *([] if open_browser else ["--no-browser"])]


def environment(folder: Path) -> dict[str, str]:
    """The server's environment, which its kernel inherits: Jupyter's data path led by ``folder`` (where
    :func:`prepare` put the template), charts drawn as HTML only (the page loads the bundle)."""
    import os

    path = os.pathsep.join(p for p in (str(folder), os.environ.get("JUPYTER_PATH", "")) if p)
    return {**os.environ, "JUPYTER_PATH": path, "LMDEPTH_PROGRESS": "0", HTML_ONLY_ENV: "1"}


def serve(params: Mapping[str, Any], port: int = 8866, open_browser: bool = False) -> int:
    """Serve the explorer until Ctrl-C (the server then shuts its kernel down); returns Voilà's exit status. The
    notebook's folder is a marked temporary (:func:`lmdepth.results.temporary_dir`) that the server removes when it
    ends, and the next start removes one whose server could not (:mod:`lmdepth.book.explore_server`)."""
    require_voila()
    port = check_port(port)
    parent = Path(tempfile.gettempdir())
    explore_server.sweep(parent)
    with temporary_dir(parent, explore_server.FOLDER_LABEL) as folder:
        notebook = prepare(folder, params)
        cmd = voila_command(notebook, port, open_browser)
        print(f"lmdepth: serving the explorer at http://127.0.0.1:{port}/ (Ctrl-C stops it). It loads the model and "
              f"runs the static example first (about a minute on 2 cores), then says it is ready\n  {shlex.join(cmd)}",
              file=sys.stderr, flush=True)
        return explore_server.run(cmd, folder, environment(folder))


__all__ = ["CHAPTER", "REQUIREMENTS", "DENIED_EXTENSIONS", "READY_LINE", "TEMPLATE", "TEMPLATE_INDEX", "require_voila", "plain_roles",
           "prepare", "check_port", "voila_command", "environment", "serve"]
