"""Where a trace runs: here, on NDIF, or through the strict offline simulation of NDIF — one code path for all three.

``remote`` takes three values everywhere (every model-running analysis's parameters, the chapters, the CLI):

* ``False``: run here (CPU or GPU), through the same nnsight trace;
* ``True``: send the trace to NDIF (a hub id of a hosted model; needs an API key and the network); checked first by
  :func:`lmdepth.model.ndif.preflight`, in seconds and before anything is loaded;
* ``"local"``: the strict simulation of the server (:class:`lmdepth.traces.server.StrictServer`): serialise, refuse
  what the server cannot import, execute only the deserialised copy, return only saved values.
"""

from __future__ import annotations

from typing import Any

from lmdepth.errors import ParameterError
from lmdepth.params import check_remote_mode

#: The chapters whose model-running analysis is a remote-ready trace today, and which trace; what cannot go remote
#: (tuned-lens training, integrated gradients) refuses ``remote`` other than false in one line before any work.
REMOTE_READY = {"norms": "residual metrics (lmdepth.traces.residual_metrics)",
                "cosine": "residual metrics (lmdepth.traces.residual_metrics)",
                "skipping": "skip effects, one session per problem (lmdepth.traces.skip_effects)",
                "maps": "residual collection (lmdepth.traces.boundary_residuals); the maps are fitted here",
                "lens": "logit lens and tuned lens applied (lmdepth.traces.lens_trace); the tuned lens is trained here, on "
                         "residuals collected by a remote-ready trace (lmdepth.traces.boundary_residuals.token_residuals)",
                "complexity": "depth score (lmdepth.traces.skip_effects), correctness check (lmdepth.traces.generation) "
                              "and erasure (lmdepth.traces.erasure_trace); integrated gradients run here (ig_steps=0)",
                "explorer": "the skip session of the chosen layer alone, whose clean pass also reads the contributions "
                            "and the logit-lens top tokens (lmdepth.traces.skip_effects): one request per explore"}
#: The chapters that do not run remotely, and why (the ones with a model refuse ``remote`` in one line).
NOT_REMOTE = {"moeut": "its models are trained here, not hosted on NDIF",
              "atlas": "runs no model (reads the other chapters' results)",
              "reproducibility": "runs no model"}

def trace_kwargs(nn_model: Any, remote: bool | str, extra_payload: int = 0) -> dict[str, Any]:
    """The keyword arguments that route one ``trace``/``session`` of ``nn_model`` (a remotable nnsight wrapper):
    none (here), ``remote=True`` (NDIF), or a fresh strict-simulation backend (``"local"``; its request record
    goes to :data:`lmdepth.traces.server.REQUESTS`).

    ``extra_payload``: bytes of client-side tensors the trace ships on purpose (the tuned lens' translators); the
    simulation's payload bound grows by that much and no more, so anything else shipped by mistake still fails.
    Over :data:`~lmdepth.traces.server.MAX_SHIPPED` a remote trace is refused in one line, before it is sent."""
    check_remote_mode(remote)
    if remote is False:
        return {}
    import nnsight

    from lmdepth.traces.server import KERNELS, MAX_PAYLOAD, MAX_SHIPPED, StrictServer

    if extra_payload > MAX_SHIPPED:
        raise ParameterError(f"this trace would ship {extra_payload / 2**30:.1f} GB of tensors with every request "
                             f"(bound {MAX_SHIPPED / 2**30:.0f} GB): the tuned lens' translators of a model this large "
                             "do not travel; run it with tuned_lens=false remotely (the logit lens), or here on a GPU.")
    nnsight.register(KERNELS)  # the kernels the blocks call travel with the request, by value
    if remote is True:
        return {"remote": True}
    return {"backend": StrictServer(nn_model, max_payload=MAX_PAYLOAD + extra_payload)}


__all__ = ["REMOTE_READY", "NOT_REMOTE", "trace_kwargs"]
