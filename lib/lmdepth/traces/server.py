"""A strict offline stand-in for the NDIF server: what a trace must survive to run remotely.

nnsight's own ``remote="local"`` serialises a trace and deserialises it with local modules hidden, but then runs
the *original* tracer in the caller's live frame: a list created before the ``with`` block and appended inside
looks filled locally and comes back empty from a real server, and a non-editable install of this library is not
hidden. :class:`StrictServer` closes both gaps:

* the request is serialised exactly as the remote backend does (:meth:`nnsight.schema.request.RequestModel.serialize`);
  of the library, only :data:`KERNELS` may travel with it by value (``nnsight.register``);
* it is deserialised by :class:`ServerUnpickler`, which refuses any module outside what an NDIF server has
  (:data:`SERVER_MODULES` and the standard library) — so a library function or object referenced inside the block
  fails here as it would there — while ``lmdepth`` is hidden from ``sys.modules`` and from import;
* only the deserialised copy runs, in its own frame; only the values marked ``.save()`` come back, through
  ``torch.save`` / ``torch.load`` as the server's response does; payload and result sizes are recorded and
  bounded (a saved view ships its whole storage).

:func:`payload_modules` is the static half: serialise without executing and list every module the payload's
unpickling would import.

The simulation relies on nnsight internals (``RequestModel``, the tracer's ``info`` and the thread-local saved set);
:func:`check_nnsight_internals` fails loudly when they move (the pinned version is in ``requirements.txt``).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import io
import pickletools
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

#: Top-level packages an NDIF server has besides the standard library (nnsight's own simulation keeps the same
#: set, plus cloudpickle, which nnsight's serialisation pickles through).
SERVER_MODULES = frozenset({"torch", "numpy", "transformers", "accelerate", "diffusers", "einops", "peft", "nnsight",
                            "cloudpickle"})
#: Default bound on one request's serialised payload (bytes): a block that ships client-side tensors is a bug.
MAX_PAYLOAD = 1_000_000
#: Default bound on one request's result (bytes, as ``torch.save`` writes it).
MAX_RESULT = 50_000_000
#: Bound on the client tensors one request may ship on purpose (the tuned lens' translators, L·d² floats: 40 MB for
#: SmolLM2-135M, ~21 GB for a 70B model). NDIF documents no request cap; this is the project's own.
MAX_SHIPPED = 1 << 30
#: Every request the simulation served in this process, in order (tests and the cost table read it).
REQUESTS: list["RequestRecord"] = []
_HIDDEN_ROOT = "lmdepth"  # the library under test: hidden while the request is deserialised and executed
#: The one package of the library a request may ship by value (``nnsight.register``): the torch-only maths the
#: trace blocks call.
KERNELS = "lmdepth.kernels"


class NotRemotable(RuntimeError):
    """A trace would fail on the NDIF server (a module it cannot import, a result it would not send back, a payload
    or result over its bound)."""


def _allowed(module: str) -> bool:
    root = module.split(".")[0]
    return root in SERVER_MODULES or root in sys.stdlib_module_names or root == "builtins"


def _unpickler_base() -> type:
    from nnsight.intervention.serialization import CustomCloudUnpickler

    return CustomCloudUnpickler


class ServerUnpickler(_unpickler_base()):  # type: ignore[misc]
    """nnsight's unpickler, refusing every class or function from a module the server does not have."""

    def find_class(self, module: str, name: str) -> Any:
        if not _allowed(module):
            raise NotRemotable(f"the request needs {module}.{name}, which an NDIF server cannot import: use only "
                               "torch, the model's envoys and plain data inside the trace")
        return super().find_class(module, name)


class _Refuse(importlib.abc.MetaPathFinder):
    """Import hook that makes the library unimportable (as on the server)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname.split(".")[0] == _HIDDEN_ROOT:
            raise ModuleNotFoundError(f"No module named {fullname!r} (hidden: the NDIF server does not have it)")
        return None


@contextlib.contextmanager
def hidden_library() -> Iterator[None]:
    """While active, ``lmdepth`` is neither in ``sys.modules`` nor importable; restored afterwards."""
    hidden = {k: sys.modules.pop(k) for k in [k for k in sys.modules if k.split(".")[0] == _HIDDEN_ROOT]}
    finder = _Refuse()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        sys.modules.update(hidden)


@contextlib.contextmanager
def fresh_process_sources(filename: str) -> Iterator[None]:
    """While active, nnsight sees source files as a fresh server process would: its caches of parsed sources and
    compiled ``with`` blocks are empty (the server knows the shipped block only, under the client's file name, so
    an inner trace of a session must be found in that text, not in the client's file), and the file's
    ``linecache`` entry is restored afterwards."""
    import linecache

    from nnsight.tracing import globals as nn_globals

    saved = {name: dict(getattr(nn_globals, name)) for name in ("SOURCES", "BLOCKS")}
    line = linecache.cache.get(filename)
    for name in saved:
        getattr(nn_globals, name).clear()
    try:
        yield
    finally:
        for name, entries in saved.items():
            cache = getattr(nn_globals, name)
            cache.clear()
            cache.update(entries)
        if line is not None:
            linecache.cache[filename] = line
        else:
            linecache.cache.pop(filename, None)


def payload_modules(blob: bytes) -> set[str]:
    """Every module the unpickling of a serialised request would import (read from the pickle's opcodes; nothing is
    imported or executed). Protocol-4 ``STACK_GLOBAL`` takes its module from the string pushed before it (memoised
    strings included)."""
    modules: set[str] = set()
    strings: list[str] = []
    memo: dict[int, Any] = {}
    for op, arg, _ in pickletools.genops(blob):
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"):
            strings.append(arg)
        elif op.name == "MEMOIZE":
            memo[len(memo)] = strings[-1] if strings else None
        elif op.name in ("BINGET", "LONG_BINGET", "GET"):
            strings.append(memo.get(arg))  # type: ignore[arg-type]
        elif op.name in ("GLOBAL", "INST"):
            modules.add(arg.split(" ")[0])
        elif op.name == "STACK_GLOBAL" and len(strings) >= 2 and isinstance(strings[-2], str):
            modules.add(strings[-2])
        if op.name not in ("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "BINGET", "LONG_BINGET",
                           "GET", "MEMOIZE", "STACK_GLOBAL"):
            strings.append(None)  # type: ignore[arg-type]  # anything else breaks a (module, name) pair
    return modules


def foreign_modules(blob: bytes) -> list[str]:
    """The modules of a serialised request that an NDIF server could not import (sorted; empty when remotable)."""
    return sorted(m for m in payload_modules(blob) if not _allowed(m))


@dataclass
class RequestRecord:
    """What one simulated request cost: payload and result sizes (bytes), the modules it needed, what came back."""

    payload_bytes: int
    result_bytes: int
    modules: list[str]
    saved: list[str] = field(default_factory=list)


def _backend_base() -> type:
    from nnsight.tracing.backend import Backend

    return Backend


class StrictServer(_backend_base()):  # type: ignore[misc]
    """An nnsight backend (``model.trace(..., backend=StrictServer(model))``) that runs a trace as NDIF would.

    Args:
        model: the remotable nnsight wrapper (``TransformersModel``) whose envoys the request names.
        max_payload, max_result: bounds in bytes; exceeding one raises :class:`NotRemotable`.

    Each request served is recorded in :data:`REQUESTS`.
    """

    def __init__(self, model: Any, max_payload: int = MAX_PAYLOAD, max_result: int = MAX_RESULT) -> None:
        self.model = model
        self.max_payload, self.max_result = max_payload, max_result

    def __call__(self, tracer: Any) -> dict[str, Any]:
        from cloudpickle.cloudpickle import _PICKLE_BY_VALUE_MODULES
        from nnsight.schema.request import RequestModel
        from nnsight.tracing.tracer import _saves, save
        from nnsight.tracing.util import push

        by_value = sorted(m for m in _PICKLE_BY_VALUE_MODULES if m.split(".")[0] == _HIDDEN_ROOT and m != KERNELS)
        if by_value:
            raise NotRemotable(f"{', '.join(by_value)} would travel by value: only {KERNELS} (torch only) may; move "
                               "the maths a block needs there")
        blob = RequestModel.serialize(tracer)
        foreign = foreign_modules(blob)
        if foreign:
            raise NotRemotable(f"the request needs {', '.join(foreign)}, which an NDIF server cannot import: use "
                               "only torch, the model's envoys and plain data inside the trace")
        if len(blob) > self.max_payload:
            raise NotRemotable(f"the request is {len(blob):,} bytes (bound {self.max_payload:,}): it ships "
                               "client-side tensors; pass plain data and build tensors inside the trace")
        with hidden_library(), fresh_process_sources(tracer.info.frame.f_code.co_filename):
            restored = RequestModel.deserialize(blob, self.model._remoteable_persistent_objects(),
                                                unpickler=ServerUnpickler)
            restored.execute(restored.info.code)  # the copy only, in its own (deserialised) frame
        saved_ids = _saves()
        result = {k: v for k, v in restored.info.frame.f_locals.items() if id(v) in saved_ids}
        buf = io.BytesIO()
        torch.save(result, buf)
        if buf.tell() > self.max_result:
            big = max(result, key=lambda k: _nbytes(result[k]))
            raise NotRemotable(f"the result is {buf.tell():,} bytes (bound {self.max_result:,}); the largest saved "
                               f"value is {big!r}: reduce inside the trace, and .clone() a saved slice (a view "
                               "ships its whole storage)")
        # the client reads it back as NDIF's response (tensors and plain containers: the weights-only loader suffices)
        back = torch.load(io.BytesIO(buf.getvalue()), map_location="cpu", weights_only=True)
        REQUESTS.append(RequestRecord(len(blob), buf.tell(), sorted(payload_modules(blob)), sorted(back)))
        for value in back.values():  # as the remote backend does: mark, then write into the caller's frame
            save(value)
        push(tracer.info.frame, back)
        return back


def _nbytes(value: Any) -> int:
    if torch.is_tensor(value):
        return value.untyped_storage().nbytes()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    return 0


def check_nnsight_internals() -> None:
    """Fail loudly when the nnsight internals the simulation relies on have moved (after an nnsight upgrade).

    Raises:
        RuntimeError: naming what is missing.
    """
    import inspect

    from nnsight.schema.request import RequestModel
    from nnsight.tracing import globals as nn_globals
    from nnsight.tracing import tracer as tracer_module
    from nnsight.tracing import util

    missing = [name for name, ok in (
        ("RequestModel.serialize(tracer)", hasattr(RequestModel, "serialize")),
        ("RequestModel.deserialize(..., unpickler=)", "unpickler" in inspect.signature(RequestModel.deserialize).parameters),
        ("nnsight.tracing.tracer._saves", callable(getattr(tracer_module, "_saves", None))),
        ("nnsight.tracing.tracer.save", callable(getattr(tracer_module, "save", None))),
        ("nnsight.tracing.util.push", callable(getattr(util, "push", None))),
        ("CustomCloudUnpickler.persistent_load", hasattr(_unpickler_base(), "persistent_load")),
        ("nnsight.tracing.globals.SOURCES and BLOCKS", all(isinstance(getattr(nn_globals, n, None), dict)
                                                          for n in ("SOURCES", "BLOCKS"))),
    ) if not ok]
    if missing:
        raise RuntimeError(f"nnsight's internals moved ({', '.join(missing)}): the strict NDIF simulation "
                           "(lmdepth.traces.server) must be updated for this nnsight version.")


__all__ = ["KERNELS", "REQUESTS", "SERVER_MODULES", "NotRemotable", "ServerUnpickler", "StrictServer", "RequestRecord", "payload_modules",
           "foreign_modules", "hidden_library", "check_nnsight_internals"]
