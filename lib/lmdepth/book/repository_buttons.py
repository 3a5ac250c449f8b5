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


__all__ = ["LAUNCH_BUTTONS", "theme_options", "setup"]
