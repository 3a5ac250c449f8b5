"""Draw the README's picture, docs/atlas.png: the across-models atlas of the stored default-profile results (the same
chart as the book's "Across models" page, without the random-init controls), offline (vl-convert).

    .venv/bin/python scripts/readme_figure.py            # from results/, after the default book was built
"""

from __future__ import annotations

import sys
from pathlib import Path

from lmdepth.analyses import atlas
from lmdepth.charts.atlas_charts import atlas_chart
from lmdepth.model.random_init import is_random_init
from lmdepth.runtime import REPO_ROOT


def main(results_dir: Path = REPO_ROOT / "results", out: Path = REPO_ROOT / "docs" / "atlas.png") -> int:
    source = atlas.summary_source(results_dir, "default")
    table = atlas.atlas_table(results_dir, only=source.only)
    if not len(table):
        print(f"readme_figure: no results under {results_dir}: build the book first (`bash scripts/build_book.sh`).",
              file=sys.stderr)
        return 2
    table = table[~table.model.map(is_random_init)]  # the models, not their random-init controls
    out.parent.mkdir(parents=True, exist_ok=True)
    atlas_chart(table).save(str(out))
    print(f"readme_figure: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
