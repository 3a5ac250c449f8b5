"""How much a reader reads: the words of an executed chapter that its rendered page shows without a click.

:func:`unfolded_words` counts them in an executed notebook (``book/NN_*.ipynb``), as Jupyter Book renders it:

* **Cells.** A cell tagged ``remove-cell`` or ``hide-cell`` counts nothing; ``remove-input`` / ``hide-input`` drop
  a code cell's source (hidden behind a toggle or not shown), ``remove-output`` / ``hide-output`` its outputs (the
  same for ``mystnb.remove_code_source`` / ``remove_code_outputs``). A visible code source counts, and so does a
  figure's caption (``mystnb.figure.caption``), which is printed under the figure.
* **Markdown** — of markdown cells and of ``text/markdown`` outputs — counts except what is folded: the body of a
  MyST ``{dropdown}`` or ``{toggle}`` directive, or of any directive with the ``dropdown`` class (backtick or colon
  fences, nested or not), and the body of an HTML ``<details>`` element. A fold's caption (a dropdown's title, a
  ``<summary>``) is on the page and counts. HTML comments, ``<script>`` and ``<style>`` count nothing, MyST
  target lines (``(label)=``) neither; a fenced code block counts (it is on the page).
* **Outputs.** Of each output, the one representation the HTML builder shows: ``text/html`` before
  ``text/markdown`` before ``text/plain`` (images and charts have no words; a chart's ``text/markdown`` fallback is a
  ``<div>`` and a ``<script>``: nothing). HTML counts its visible text with the same folds (a folded
  :func:`lmdepth.book.notebook.show_table` table counts only its caption line). Stream output counts; error
  outputs count nothing.
* **A word** is a run of non-blank characters holding at least one letter or digit (``|---|``, ``=`` and ``—`` are
  not words, ``$e_s$`` and ``0.017`` are), after tags are removed.

``tests/test_chapter_shape.py`` holds each chapter's page to :data:`MAX_UNFOLDED_WORDS`.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

#: The most words a chapter shows on its reader path (what is not folded): the claim, the method with its formula,
#: the figures, the answer and the differences from the paper; dated notes, per-model tables, variants and
#: histories fold under captions.
MAX_UNFOLDED_WORDS = 4000

#: Directives whose body starts folded.
FOLDING_DIRECTIVES = frozenset({"dropdown", "toggle"})
#: The representations of an output the HTML builder prefers, best first (of those that carry words).
PRIORITY = ("text/html", "text/markdown", "text/plain")

_WORD = re.compile(r"\S*[^\W_]\S*")
_FENCE = re.compile(r"^\s*(`{3,}|~{3,}|:{3,})\s*(.*)$")
_DIRECTIVE = re.compile(r"^\{([\w.-]+)\}\s*(.*)$")
_TARGET = re.compile(r"^\s*\([\w.:-]+\)=\s*$")
_OPTION = re.compile(r"^\s*:([\w-]+):(.*)$")


class _VisibleText(HTMLParser):
    """Collects the text of an HTML fragment a reader sees: not inside ``<script>``/``<style>``, and not inside a
    ``<details>`` except its own ``<summary>``."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.hidden = 0  # depth inside script/style
        self.details = 0  # depth inside <details>
        self.summary = 0  # inside the <summary> of the outermost open <details>

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag in ("script", "style"):
            self.hidden += 1
        elif tag == "details":
            self.details += 1
        elif tag == "summary" and self.details == 1:
            self.summary += 1
        self.parts.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style"):
            self.hidden = max(self.hidden - 1, 0)
        elif tag == "details":
            self.details = max(self.details - 1, 0)
        elif tag == "summary" and self.summary:
            self.summary -= 1
        self.parts.append(" ")

    def handle_data(self, data: str) -> None:
        if not self.hidden and (self.details == 0 or self.summary):
            self.parts.append(data)


def html_text(fragment: str) -> str:
    """The text of an HTML (or Markdown with raw HTML) fragment outside scripts, styles and ``<details>`` bodies
    (their ``<summary>`` kept), comments dropped."""
    parser = _VisibleText()
    parser.feed(re.sub(r"<!--.*?-->", " ", fragment, flags=re.S))
    parser.close()
    return "".join(parser.parts)


def _options(lines: list[str], start: int) -> dict[str, str]:
    """The ``:key: value`` option lines of a directive whose body starts at ``lines[start]``."""
    opts = {}
    for line in lines[start:]:
        opt = _OPTION.match(line)
        if not opt:
            break
        opts[opt[1]] = opt[2].strip()
    return opts


def _folds(name: str, options: dict[str, str]) -> bool:
    """Whether a directive starts folded: a folding directive, or one of class ``dropdown``, unless ``:open:``."""
    return (name in FOLDING_DIRECTIVES or "dropdown" in options.get("class", "").split()) and "open" not in options


def unfolded_markdown(text: str) -> str:
    """Markdown ``text`` without its folded blocks' bodies (MyST fences, see the module docstring; a dropdown's
    title kept), directive options and target lines; raw HTML is left for :func:`html_text`."""
    lines = text.splitlines()
    kept: list[str] = []
    stack: list[tuple[str, int, bool, bool]] = []  # (fence char, length, folded, literal code block)
    skip = 0  # option lines of the directive just opened
    for i, line in enumerate(lines):
        if skip:
            skip -= 1
            continue
        folded = any(f for _, _, f, _ in stack)
        m = _FENCE.match(line)
        if m:
            fence, info = m[1], m[2].strip()
            if stack and not info and fence[0] == stack[-1][0] and len(fence) >= stack[-1][1]:
                stack.pop()  # the innermost open block closes
                continue
            if not (stack and stack[-1][3]):  # inside a literal code block a fence-like line is text
                directive = _DIRECTIVE.match(info)
                options = _options(lines, i + 1) if directive else {}
                skip = len(options)
                stack.append((fence[0], len(fence), bool(directive) and _folds(directive[1], options),
                              not directive and fence[0] != ":"))
                if not folded:
                    kept.append(directive[2] if directive else "")  # a dropdown's title is on the page
                continue
        if not folded and not _TARGET.match(line):
            kept.append(line)
    return "\n".join(kept)


def words(text: str) -> int:
    """Words of plain text: runs of non-blank characters holding a letter or a digit."""
    return len(_WORD.findall(text))


def markdown_words(text: str) -> int:
    """Words a reader sees of a Markdown source (folded blocks, raw HTML folds, tags and comments left out)."""
    return words(html_text(unfolded_markdown(text)))


def _source(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def output_words(output: dict) -> int:
    """Words of one output of a code cell as the page shows it (see the module docstring)."""
    kind = output.get("output_type")
    if kind == "stream":
        return words(_source(output.get("text", "")))
    data = output.get("data", {})
    for mime in PRIORITY:
        if mime in data:
            body = _source(data[mime])
            if mime == "text/html":
                return words(html_text(body))
            return markdown_words(body) if mime == "text/markdown" else words(body)
    return 0


def cell_words(cell: dict) -> int:
    """Words of one notebook cell that its page shows without a click."""
    meta = cell.get("metadata", {})
    tags = set(meta.get("tags", []))
    if tags & {"remove-cell", "hide-cell"}:
        return 0
    if cell.get("cell_type") == "markdown":
        return markdown_words(_source(cell.get("source", "")))
    if cell.get("cell_type") != "code":
        return 0
    mystnb = meta.get("mystnb", {}) or {}
    n = 0
    if not tags & {"remove-input", "hide-input"} and not mystnb.get("remove_code_source"):
        n += words(_source(cell.get("source", "")))
    if not tags & {"remove-output", "hide-output"} and not mystnb.get("remove_code_outputs"):
        n += sum(output_words(o) for o in cell.get("outputs", []))
        n += markdown_words(str((mystnb.get("figure") or {}).get("caption", "")))
    return n


def unfolded_words(notebook_path: str | Path) -> int:
    """Words of an executed notebook's page a reader sees without opening anything (the module docstring says
    exactly what counts)."""
    notebook = json.loads(Path(notebook_path).read_text())
    return sum(cell_words(c) for c in notebook.get("cells", []))


__all__ = ["MAX_UNFOLDED_WORDS", "FOLDING_DIRECTIVES", "PRIORITY", "html_text", "unfolded_markdown", "words",
           "markdown_words", "output_words", "cell_words", "unfolded_words"]
