"""Check every rendered page of a built book for what a reader would see as broken (lmdepth.book.defects):
figures or many-column tables wider than the text column, raw LaTeX, nan/None cells, missing show_table tables, and
a page wider than its window, in a 1,400 px desktop window and on a 390 px phone.

    .venv/bin/python scripts/check_pages.py            # the book built by scripts/build_book.sh (_build/html)
    .venv/bin/python scripts/check_pages.py /tmp/b/_build/html

Exit status 1 when any page has a defect (each is listed); 2, with one line saying what is missing, without headless
Chromium (`apt install chromium`) or without a built book.
"""

from __future__ import annotations

import sys
from pathlib import Path

from lmdepth.book.chapters import CHAPTERS
from lmdepth.book.defects import PHONE, chromium_exe, expected_tables, page_defects, rendered
from lmdepth.runtime import REPO_ROOT

#: The book's pages that are Markdown, not chapters (book/*.md).
TEXT_PAGES = ("intro", "method", "references")


def main(html_root: Path) -> int:
    if chromium_exe() is None:
        print("check_pages: headless Chromium is needed and none is on PATH: install it (Debian: `apt install "
              "chromium`; scripts/test.sh does it where it may) and run again.", file=sys.stderr)
        return 2
    if not (html_root / "index.html").is_file():
        print(f"check_pages: no built book at {html_root}: build it first (`bash scripts/build_book.sh`).",
              file=sys.stderr)
        return 2
    bad = 0
    for stem in [*CHAPTERS.values(), *TEXT_PAGES]:
        page = html_root / "book" / f"{stem}.html"
        if not page.exists():
            print(f"{stem}: not built ({page})")
            bad += 1
            continue
        source = REPO_ROOT / "notebooks" / f"{stem}.py"
        defects = page_defects(rendered(page), expected_tables(source.read_text()) if source.is_file() else 0)
        defects += [f"on a {PHONE[0]} px phone: {d}" for d in page_defects(rendered(page, phone=True), phone=True)]
        print(f"{stem}: {'ok' if not defects else f'{len(defects)} defect(s)'}")
        for d in defects:
            print(f"    {d}")
        bad += bool(defects)
    return 1 if bad else 0


if __name__ == "__main__":
    # resolved: Chromium gets file:// URIs, which need absolute paths
    sys.exit(main(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else REPO_ROOT / "_build" / "html"))
