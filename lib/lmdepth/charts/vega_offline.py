"""Altair charts that draw without network: offline book HTML, JupyterLab, Colab.

Altair's default renderer loads vega from a CDN, so charts in a book built
offline show "Error loading script". Here:

* :func:`write_vega_bundle` writes one classic script defining
  ``window.vegaEmbed``/``vega``/``vegaLite``, built by vl-convert from the copies
  it ships (no network). Classic, not an ES module: Chrome refuses module
  scripts from ``file://``.
* :func:`enable` turns on the ``"lmdepth"`` renderer. Its output carries the
  spec under the Vega-Lite mimetype, which JupyterLab draws offline with its
  built-in vega, plus a small HTML snippet (a div and an inline script calling
  ``window.vegaEmbed``, or importing vega-embed from jsdelivr where the page
  lacks the bundle) for the book and Colab.
* :func:`setup` makes the module a Sphinx extension that ships the bundle with
  every HTML build and loads it on every page.

The snippet goes under ``text/markdown``, not ``text/html``: JupyterLab ranks
``text/html`` (50) above its vega renderer (57) and would show the snippet
instead, which is blank in an untrusted notebook and needs the CDN otherwise;
``text/markdown`` (60) ranks below vega. myst-nb has no renderer for the
Vega-Lite mimetype and falls back to ``text/markdown``, whose raw HTML it
passes through unchanged. Colab draws only HTML, so there it is ``text/html``, and
so it is where :data:`HTML_ONLY_ENV` is "1": the explorer app (Voilà) sets it, as its
page draws the Vega-Lite mimetype with JupyterLab's renderer, which then fails to
store a PNG of the chart into Voilà's read-only output ("Javascript Error:
e.setData is not a function" under every chart); the app's page loads the bundle.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import altair as alt

BUNDLE_NAME = "vega-bundle.js"
RENDERER_NAME = "lmdepth"
# JupyterLab (vega5-extension, up to 4.6) and VS Code only know the v5 key; they
# draw the v6 spec with their vega-lite 5 (a console warning, same chart).
# Altair 6's own key "application/vnd.vegalite.v6.json" is drawn by no frontend.
VEGALITE_MIMETYPE = "application/vnd.vegalite.v5+json"
CDN_VEGA_EMBED = f"https://cdn.jsdelivr.net/npm/vega-embed@{alt.VEGAEMBED_VERSION}/+esm"
#: Set to "1" where charts are drawn by the HTML snippet alone (a page that loads :data:`BUNDLE_NAME`).
HTML_ONLY_ENV = "LMDEPTH_CHARTS_HTML"

_MODULE_SYNTAX = re.compile(r"(?:^|[;}\n])\s*(?:import|export)\s*[\w{*]")
_ids = itertools.count(1)

# One line, no blank lines: safe both as raw HTML and inside a markdown html block.
_SNIPPET = (
    '<div id="{id}" class="lmdepth-vega"></div><script>(function(){{'
    'var el=document.getElementById("{id}"),spec={spec},opt={opt};'
    "function draw(){{(window.vegaEmbed?Promise.resolve(window.vegaEmbed):"
    '(window.lmdepthVegaCdn=window.lmdepthVegaCdn||import("{cdn}")'
    ".then(function(m){{return m.default;}})))"
    ".then(function(embed){{return embed(el,spec,opt);}})"
    '.catch(function(e){{el.textContent="Chart failed to render: "+e;}});}}'
    'if(window.vegaEmbed||document.readyState==="complete")draw();'
    'else window.addEventListener("load",draw);}})();</script>'
)


@functools.cache
def bundle_js() -> str:
    """Vega + Vega-Lite (altair's schema minor version) + vega-embed as one classic script.

    vl-convert's default snippet sets ``window.vega``/``vegaLite`` to null (those
    packages have no default export), so import vega-embed's namespace, which
    re-exports both; the URL is only a key into vl-convert's embedded copies.
    The whole bundle is wrapped in a function so its minified top-level names
    do not leak into, or clash with, the page's globals.
    """
    import vl_convert as vlc

    vl_version = ".".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])
    url = f"https://cdn.jsdelivr.net/npm/vega-embed@{vlc.get_vega_embed_version()}/+esm"
    snippet = (
        f'import * as ve from "{url}";\n'
        "window.vegaEmbed=ve.default;window.vega=ve.vega;window.vegaLite=ve.vegaLite;\n"
    )
    code = vlc.javascript_bundle(snippet=snippet, vl_version=vl_version)
    if _MODULE_SYNTAX.search(code):
        raise RuntimeError("vl-convert returned an ES module; cannot use it as a classic script")
    header = (
        f"/* vega {vlc.get_vega_version()}, vega-lite {vl_version}.x, vega-embed "
        f"{vlc.get_vega_embed_version()}; built by lmdepth.charts.vega_offline with "
        f"vl-convert {vlc.__version__} */\n"
    )
    return f'{header}(function(){{"use strict";\n{code}\n}})();\n'


def write_vega_bundle(static_dir: Path) -> Path:
    """Write :data:`BUNDLE_NAME` into ``static_dir``; leave the file alone if unchanged."""
    path = Path(static_dir) / BUNDLE_NAME
    text = bundle_js()
    if not (path.is_file() and path.read_text(encoding="utf-8") == text):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return path


def _script_json(obj: Any) -> str:
    """Compact JSON with every ``<`` escaped, so it cannot end the enclosing <script>."""
    return json.dumps(obj, separators=(",", ":")).replace("<", "\\u003c")


def chart_html(spec: dict[str, Any], embed_options: dict[str, Any] | None = None) -> str:
    """A div plus an inline classic script that draws ``spec`` into it (no require.js)."""
    digest = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]
    return _SNIPPET.format(
        id=f"lmdepth-vega-{digest}-{next(_ids)}",
        spec=_script_json(spec),
        opt=_script_json(embed_options or {}),
        cdn=CDN_VEGA_EMBED,
    )


def _render(
    spec: dict[str, Any],
    embed_options: dict[str, Any] | None = None,
    html_mimetype: str = "text/markdown",
    **_: Any,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Altair renderer: the spec for Jupyter frontends plus HTML for the book and Colab."""
    embed_options = {"renderer": "svg", "actions": False, **(embed_options or {})}
    html = chart_html(spec, embed_options)
    if "google.colab" in sys.modules or os.environ.get(HTML_ONLY_ENV) == "1":  # Colab draws only HTML
        return {"text/html": html, "text/plain": "<altair chart>"}, {}
    bundle = {VEGALITE_MIMETYPE: spec, html_mimetype: html, "text/plain": "<altair chart>"}
    return bundle, {VEGALITE_MIMETYPE: {"embed_options": embed_options}}


def enable(
    *,
    renderer: str = "svg",
    actions: bool | dict[str, bool] = False,
    max_rows: int | None = 5000,
    html_mimetype: str = "text/markdown",
) -> None:
    """Register and enable the ``"lmdepth"`` altair renderer.

    ``renderer`` is vega's ("svg" or "canvas"); ``actions`` is vega-embed's
    export/source menu. Data stay inline in the spec (altair's default data
    transformer); past ``max_rows`` rows altair prints ``MaxRowsError`` instead of
    drawing (it does not raise, so a notebook run still "passes").
    ``html_mimetype="text/html"`` favours Colab showing saved outputs over
    JupyterLab drawing the Vega-Lite mimetype (see the module docstring).
    """
    alt.renderers.register(RENDERER_NAME, _render)
    alt.renderers.enable(
        RENDERER_NAME,
        embed_options={"renderer": renderer, "actions": actions},
        html_mimetype=html_mimetype,
    )
    alt.data_transformers.enable("default", max_rows=max_rows)


def setup(app: Any) -> dict[str, Any]:
    """Sphinx extension: write the bundle into the HTML output and load it on every page.

    Also silences myst-nb's "skipping unknown output mime type" warning, raised
    once per chart for the Vega-Lite mimetype, so ``-W`` builds pass.
    """

    def _silence(app: Any, config: Any) -> None:
        config.suppress_warnings = [*config.suppress_warnings, "mystnb.unknown_mime_type"]

    def _write(app: Any) -> None:
        if app.builder.format == "html":
            write_vega_bundle(Path(app.outdir) / "_static")

    def _dedupe_scripts(app: Any, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
        # jupyter-book 1.x registers sphinx-thebe and sphinx-togglebutton twice, so their inline scripts appear
        # twice on every page and the second `const THEBE_JS_URL` throws a SyntaxError in the console.
        seen, kept = set(), []
        for js in context.get("script_files", []):
            # the second copy is registered with filename '' instead of None: compare by content
            key = (getattr(js, "filename", str(js)) or "", repr(sorted(getattr(js, "attributes", {}).items())))
            if key not in seen:
                seen.add(key)
                kept.append(js)
        context["script_files"] = kept

    app.connect("config-inited", _silence)
    app.connect("builder-inited", _write)
    app.connect("html-page-context", _dedupe_scripts, priority=900)
    app.add_js_file(BUNDLE_NAME)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
