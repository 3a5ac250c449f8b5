"""Old home of the plain-hook captures, now :mod:`lmdepth.model.taps` (the additivity self-check sits below the
registry that runs it). Kept only for :mod:`lmdepth.hooks.skipping` and ``tests/test_traces.py``, which a concurrent
change owns; remove once they import :mod:`lmdepth.model.taps`.
"""

from lmdepth.model.taps import forward_hooks, hooked_residuals, layer_output

__all__ = ["forward_hooks", "hooked_residuals", "layer_output"]
