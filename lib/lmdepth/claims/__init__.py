"""The claims registry: every claim of the paper the book checks, with its statistic, rule, precondition and
control (book/method.md#method-verdicts). Chapters and the findings page render from it; nothing else sets a threshold.

Claims not yet in the registry are still checked by their chapters as point estimates; the findings page lists
them apart and does not count them.
"""

from __future__ import annotations

from lmdepth.claims import (
    complexity_claims,
    lens_claims,
    maps_claims,
    residual_claims,
    scratch_claims,
    skipping_claims,
)
from lmdepth.claims.spec import EARLY_LAYERS, ClaimSpec

REGISTRY: dict[str, ClaimSpec] = {c.id: c for c in (*residual_claims.CLAIMS, *skipping_claims.CLAIMS, *lens_claims.CLAIMS,
                                                      *complexity_claims.CLAIMS, *maps_claims.CLAIMS,
                                                      *scratch_claims.CLAIMS)}


def for_chapter(chapter: str) -> list[ClaimSpec]:
    """The registered claims of one chapter, in the order the chapter shows them."""
    return [c for c in REGISTRY.values() if c.chapter == chapter]


__all__ = ["REGISTRY", "EARLY_LAYERS", "ClaimSpec", "for_chapter"]
