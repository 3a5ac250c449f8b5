"""The maths that runs inside nnsight traces, written once: torch only, nothing from ``lmdepth``.

An nnsight block runs on the NDIF server, which cannot import this library; a module registered with
``nnsight.register`` travels with the request by value instead (:func:`lmdepth.traces.remote.trace_kwargs` registers
this package, and the strict server (:mod:`lmdepth.traces.server`) accepts it and nothing else of the library). So the
traces call these functions instead of inlining their formulas, and the pure functions of ``metrics/`` and
``model/`` are these same functions: what the tests hold to a reference is what runs.

Rules of the floor: import torch and the standard library only (a test holds it); create a tensor only on the
device of the tensor it meets; reduce in fp32.
"""
