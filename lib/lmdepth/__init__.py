"""lmdepth: reproduce and extend "Do Language Models Use Their Depth Efficiently?" (Csordás et al. 2025).

The library behind the book: architecture adapters, nnsight residual capture, fp32 metrics, data sets shipped in
PyPI packages, cached results with provenance, and altair chart builders. Chapters import it; nothing here
plots and computes at once.
"""

__version__ = "0.1.0"
# Bump when a change alters any computed number: it is part of every cache key.
COMPUTE_VERSION = 1
