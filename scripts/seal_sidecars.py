"""Give every finished run's sidecar under a results folder the digest of its own content (``meta_sha256``,
:func:`lmdepth.results.meta_digest`), for sidecars written before the library recorded it, so that an edit of a
stored run's parameters (a sample size, a model name) is seen as damage instead of passing as the stored run.

Run once on the committed results (2026-12-01: 106 of 125 sidecars had none); the digest is computed from each
sidecar as it is, after checking that the run's files still match the digests the sidecar already records (a run
whose files do not match is reported and left unsealed).

    .venv/bin/python scripts/seal_sidecars.py results            # seal, and print what was sealed
    .venv/bin/python scripts/seal_sidecars.py results --check    # exit 1 if any sidecar lacks its digest
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lmdepth.results import META_DIGEST, atomic_write_text, damage, meta_digest


def unsealed(root: Path) -> list[Path]:
    """The sidecars of finished runs (a ``table.csv`` beside them) under ``root`` that have no digest."""
    out = []
    for meta in sorted(root.rglob("meta.json")):
        if (meta.parent / "table.csv").exists():
            body = json.loads(meta.read_text(encoding="utf-8"))
            if isinstance(body, dict) and META_DIGEST not in body:
                out.append(meta)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", type=Path)
    ap.add_argument("--check", action="store_true", help="only check; exit 1 if a sidecar lacks its digest")
    args = ap.parse_args()
    todo = unsealed(args.root)
    if args.check:
        for meta in todo:
            print(f"no digest: {meta}")
        return 1 if todo else 0
    bad = 0
    for meta in todo:
        problem = damage(meta.parent)
        if problem:
            print(f"left unsealed (its files do not match): {meta.parent}: {problem}", file=sys.stderr)
            bad += 1
            continue
        body = json.loads(meta.read_text(encoding="utf-8"))
        body[META_DIGEST] = meta_digest(body)
        atomic_write_text(meta, json.dumps(body, indent=2, default=str))
        print(f"sealed {meta}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
