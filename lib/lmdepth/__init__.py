"""lmdepth: reproduce and extend "Do Language Models Use Their Depth Efficiently?" (Csordás et al. 2025).

The library behind the book: architecture adapters, nnsight residual capture, fp32 metrics, data sets shipped in
PyPI packages, cached results with provenance, and altair chart builders. Chapters import it; nothing here
plots and computes at once.
"""

__version__ = "0.1.0"
# Bump when a change alters any computed number: it is part of every cache key.
COMPUTE_VERSION = 1


def _defer_rfc3987_syntax() -> None:
    """Let ``rfc3987_syntax`` load only when an IRI is validated, not whenever jsonschema is imported.

    jsonschema imports it at start-up for its ``iri`` formats, and its import compiles ~35 Earley parsers: 3 s of
    every kernel's and command's start here (altair and nbformat import jsonschema; no schema they check uses those
    formats). Upstream: python-jsonschema/jsonschema#1428. Until jsonschema defers it, a stand-in whose
    ``is_valid_syntax`` imports the real module on its first call takes its place, unless it is loaded already.
    """
    import importlib
    import importlib.util
    import sys
    import types

    name = "rfc3987_syntax"
    spec = None if name in sys.modules else importlib.util.find_spec(name)
    if spec is None:
        return

    def real() -> types.ModuleType:
        if sys.modules.get(name) is stand_in:
            del sys.modules[name]
        return importlib.import_module(name)

    def is_valid_syntax(term: str, value: str) -> bool:
        return real().is_valid_syntax(term, value)

    stand_in = types.ModuleType(name, "Stand-in of lmdepth: the real module is imported on first use.")
    def attribute(attr: str) -> object:  # any other public name (PEP 562): the real module's
        if attr.startswith("__"):  # what tools probe on every module (__file__, __spec__ …) loads nothing
            raise AttributeError(attr)
        return getattr(real(), attr)

    stand_in.is_valid_syntax, stand_in.__getattr__ = is_valid_syntax, attribute
    stand_in.__path__ = list(spec.submodule_search_locations or [])  # its submodules import as before
    sys.modules[name] = stand_in


_defer_rfc3987_syntax()
