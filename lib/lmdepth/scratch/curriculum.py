"""A curriculum over the number of steps a problem takes: train on the shortest problems first, and admit the next
length only once the model answers the current longest ones.

Used by the pointer-chain positive control (chapter 07, :data:`lmdepth.scratch.training.CHAIN_CURRICULUM_GATE`):
trained on chains of 1 … 6 hops mixed from the start, the Transformer stayed at or below the guessing level for
9,000 steps (see the chain claim's history). A model that cannot yet follow one hop gets no signal from a six-hop
chain; one that can is a hop away from two. This is the usual remedy for compositional tasks learned from the
final answer alone.

The rule, fixed before any run used it (2026-12-02):

* stage ``m`` trains on the problems of at most ``m`` steps (``n_operations``), drawn as the whole training set
  is (seeded epochs, :func:`~lmdepth.scratch.training.batch_indices`, counted from the stage's first step), so a
  resumed run draws the same batches;
* :data:`CHECK_PER_LENGTH` problems of each length (a tenth where that is fewer) are held out of training; every
  ``curriculum_every`` steps (a field of the run's key) the model
  answers the held-out problems of the stage's longest length, and when it gets at least ``gate`` of them right
  (exact match) the next stage starts at the next step;
* once the longest length of the training set is admitted, the run trains on everything but the held-out
  problems to its last step. The stages reached and every check's score are stored in the checkpoint and the
  finished run's meta.

Stateless between checks: the stages so far, ``[(first step, longest length), …]``, determine every batch. A run
that stops between a check and its next checkpoint resumes from the checkpoint and makes the same check again on
the same weights (training is deterministic), so nothing but time is lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from lmdepth.data.dm_math import MathExample
from lmdepth.data.dm_tokens import CharTokenizer
from lmdepth.errors import DataError
from lmdepth.scratch.evaluate import exact_match
from lmdepth.scratch.models import ScratchLM

#: Held-out problems per length: the gate's check set (one check of a 90 % gate on 100 problems passes a model at
#: 80 % with probability < 0.01; the same problems are checked every interval, so over a run that bound does not
#: hold); a tenth of a length's problems where that is fewer (the smoke profile's tiny sets).
CHECK_PER_LENGTH = 100


@dataclass
class Curriculum:
    """The stages of one run and the problems each draws from.

    Attributes:
        lengths: the training set's lengths, shortest first.
        pools: longest admitted length → [n] indices of the training problems a stage draws from.
        checks: length → its held-out problems.
        gate: exact match on the held-out problems of the longest admitted length that starts the next stage.
        stages: ``[(first step, longest admitted length), …]``, the first at step 0.
        checks_made: ``[(step, length checked, exact match), …]``, every check so far.
    """

    lengths: list[int]
    pools: dict[int, torch.Tensor]
    checks: dict[int, list[MathExample]]
    gate: float
    stages: list[tuple[int, int]] = field(default_factory=list)
    checks_made: list[tuple[int, int, float]] = field(default_factory=list)

    @classmethod
    def of(cls, gate: float | None, train: Sequence[MathExample], stages: list, checks_made: list
           ) -> Curriculum | None:
        """The curriculum of a run (None when ``gate`` is None: no curriculum). ``stages`` and ``checks_made`` are
        the lists a checkpoint stored (empty: a new run); the curriculum keeps them as its own and appends to them."""
        return None if gate is None else cls.build(train, gate, stages, checks_made)

    @classmethod
    def build(cls, train: Sequence[MathExample], gate: float, stages: list | None = None,
              checks_made: list | None = None) -> Curriculum:
        """The curriculum of a training set; ``stages`` and ``checks_made`` as :meth:`of` takes them.

        Raises:
            DataError: a problem has no step count, or a length has too few problems to hold out a check set.
        """
        length = [ex.n_operations for ex in train]
        if any(n is None for n in length):
            raise DataError("a curriculum needs the number of steps of every training problem (n_operations)")
        lengths = sorted(set(length))
        held: set[int] = set()
        checks: dict[int, list[MathExample]] = {}
        for n in lengths:
            of_n = [i for i, m in enumerate(length) if m == n]
            if len(of_n) < 10:
                raise DataError(f"{len(of_n)} training problems of {n} steps; a curriculum needs at least 10 of "
                                f"each length (it holds a tenth, at most {CHECK_PER_LENGTH}, out to check)")
            first = of_n[: min(CHECK_PER_LENGTH, len(of_n) // 10)]
            held.update(first)
            checks[n] = [train[i] for i in first]
        pools = {n: torch.tensor([i for i, m in enumerate(length) if m <= n and i not in held]) for n in lengths}
        stages = [] if stages is None else stages
        stages[:] = [tuple(s) for s in stages] or [(0, lengths[0])]  # a checkpoint's are lists
        checks_made = [] if checks_made is None else checks_made
        checks_made[:] = [tuple(c) for c in checks_made]
        return cls(lengths, pools, checks, gate, stages, checks_made)

    @property
    def longest(self) -> int:
        """The longest admitted length."""
        return self.stages[-1][1]

    def stage_of(self, step: int) -> tuple[int, torch.Tensor]:
        """The stage ``step`` trains in: (its first step, [n] the indices of the training problems it draws)."""
        first, longest = next((s, m) for s, m in reversed(self.stages) if s <= step)
        return first, self.pools[longest]

    def check_due(self, step: int, every: int, last: int, model: ScratchLM, tok: CharTokenizer,
                  device: str = "cpu") -> float | None:
        """After ``step``, when it is a multiple of ``every`` before the run's ``last`` step: the exact match on the
        held-out problems of the longest admitted length, and the next stage started at ``step`` when it reaches
        the gate; None when no check is due or every length is admitted. Leaves the weights and every RNG
        untouched (the model is returned to training mode)."""
        if step % every or step >= last or self.longest == self.lengths[-1]:
            return None
        model.eval()
        with torch.no_grad():  # an evaluation: no autograd graph
            em = float(exact_match(model, tok, self.checks[self.longest], device=device).mean())
        model.train()
        self.checks_made.append((step, self.longest, em))
        if em >= self.gate:
            self.stages.append((step, self.lengths[self.lengths.index(self.longest) + 1]))
        return em


__all__ = ["CHECK_PER_LENGTH", "Curriculum"]
