"""NDIF access for ``remote=True``: everything a remote run needs, checked in seconds before anything is loaded."""

from __future__ import annotations

import os
import socket
from typing import Any
from urllib.parse import urlparse

from lmdepth.errors import RemoteUnavailable


def _reachable(url: str, timeout: float) -> bool:
    u = urlparse(url)
    try:
        socket.create_connection((u.hostname, u.port or (443 if u.scheme == "https" else 80)), timeout=timeout).close()
        return True
    except OSError:
        return False


def preflight(model_name: str, timeout: float = 3.0) -> dict[str, Any]:
    """Everything ``remote=True`` needs, checked in seconds and before any model is loaded or downloaded.

    Checks, in order: an NDIF API key is set (``NDIF_API_KEY``, or nnsight's config), the Hugging Face hub and NDIF
    answer, NDIF hosts ``model_name`` and it is running, and the server's nnsight, transformers and torch versions
    equal the local ones.

    Returns:
        The server's versions (for the run's sidecar).

    Raises:
        RemoteUnavailable: one line per failed check, saying what to do (key, hub and NDIF are checked together;
            hosting and versions once those pass).
    """
    from nnsight.schema.config import CONFIG

    # key, hub and NDIF reachability all checked, so a fresh setup learns every missing piece at once (one line
    # each); the hosting and version checks need all three
    missing = []
    if not (os.environ.get("NDIF_API_KEY") or CONFIG.API.APIKEY):
        missing.append("remote=true needs an NDIF API key: get one at https://login.ndif.us and set NDIF_API_KEY "
                       "(in Colab: a secret named NDIF_API_KEY), or run with remote=false.")
    if not _reachable("https://huggingface.co", timeout):
        missing.append("remote=true: the Hugging Face hub (huggingface.co) cannot be reached from this machine; "
                       "NDIF needs the model's config and tokenizer from it. Check the network.")
    if not _reachable(CONFIG.API.HOST, timeout):
        missing.append(f"remote=true: NDIF ({CONFIG.API.HOST}) cannot be reached from this machine. Check the "
                       "network, or NDIF's status page.")
    if missing:
        raise RemoteUnavailable("\n".join(missing))
    import nnsight
    from nnsight import ndif

    try:
        running = ndif.is_model_running(model_name)
    except Exception as e:  # gated configs and unknown ids raise from the hub
        raise RemoteUnavailable(f"remote=true: could not look up {model_name!r} on the hub ({type(e).__name__}); "
                                "for a gated model (e.g. Llama) run `huggingface-cli login` first.") from None
    if not running:
        raise RemoteUnavailable(f"remote=true: NDIF does not run {model_name!r} now: `python -c \"import nnsight; "
                                "print(nnsight.status())\"` lists the hosted models.")
    env = ndif.compare()
    critical = {p: v for p, v in env.packages.items() if p.lower() in ("nnsight", "transformers", "torch")
                and not v["match"]}
    if critical:
        detail = ", ".join(f"{p} {v['local']} here, {v['remote']} on NDIF" for p, v in critical.items())
        pins = " ".join(f"{p}=={v['remote']}" for p, v in critical.items())
        raise RemoteUnavailable(f"remote=true: versions differ ({detail}); install the server's versions "
                                f"(pip install {pins}).")
    return {"nnsight": nnsight.__version__, "server": {p: v["remote"] for p, v in env.packages.items()
                                                       if p.lower() in ("nnsight", "transformers", "torch")}}


__all__ = ["preflight"]
