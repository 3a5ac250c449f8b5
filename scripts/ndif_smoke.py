"""The one real NDIF check: a hosted model through chapter 01's trace (residual norms) and chapter 03's skip session.

Everything else about NDIF is verified offline (the tests run every trace through the strict simulation of the
server, ``remote="local"``); what only a real server shows — that it accepts our requests, runs them, and returns the
same kind of numbers — needs this command, with an NDIF API key (https://login.ndif.us) and the network:

    NDIF_API_KEY=... .venv/bin/python scripts/ndif_smoke.py                       # meta-llama/Llama-3.1-8B on NDIF
    .venv/bin/python scripts/ndif_smoke.py --model smollm2-135m --remote local     # the same pipeline, offline

It runs one GSM8K problem: the residual norms (one request) and the all-token skip of every whole layer (one
request: a session of 1 + L forwards), prints the per-layer numbers, and writes ``ndif_smoke.json`` beside the runs
with the server's nnsight / transformers / torch versions as NDIF reported them (the runs' own sidecars keep them too,
under ``model.ndif``). Without a key, the network, a hosted model or matching versions it says so in one line and
exits with status 2 before any model or data is loaded (:func:`lmdepth.model.ndif.preflight`). The default model is
the smallest Llama that NDIF listed as running when this was written (Llama 3.1 8B; gated: `huggingface-cli login`
for its config); ``python -c "import nnsight; print(nnsight.status())"`` lists what runs now. NDIF computes in bf16:
compare with a local bf16 run (``--remote false --dtype bfloat16`` on a GPU), not with fp32 numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_MODEL = "meta-llama/Llama-3.1-8B"


def parse_remote(text: str) -> bool | str:
    """``true`` (NDIF), ``local`` (the strict offline simulation) or ``false`` (here)."""
    value = {"true": True, "false": False, "local": "local"}.get(text.lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"--remote must be true, local or false, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL, help=f"a model NDIF hosts (default {DEFAULT_MODEL}); with "
                                                           "--remote local/false any model lmdepth loads")
    ap.add_argument("--remote", type=parse_remote, default=True, help="true (NDIF, default), local, false")
    ap.add_argument("--dataset", default="gsm8k", help="gsm8k, math or a .jsonl file (one problem is run)")
    ap.add_argument("--dtype", default="float32", help="the local model's dtype (--remote local/false)")
    ap.add_argument("--results-dir", default="lmdepth-results/ndif-smoke", help="where the runs and the sidecar go")
    args = ap.parse_args(argv)

    from lmdepth.errors import LmDepthError

    t0 = time.time()
    try:
        versions: dict[str, Any] | None = None
        if args.remote is True:  # seconds, before anything is loaded: key, network, hosting, versions
            from lmdepth.model.ndif import preflight

            versions = preflight(args.model)
        from lmdepth.traces import server as strict

        before = len(strict.REQUESTS)
        norms, skip = smoke(args)
    except LmDepthError as e:
        print("\n".join(f"ndif_smoke: {line}" for line in str(e).splitlines()), file=sys.stderr)  # one per problem
        return 2
    from lmdepth.traces.skip_effects import session_forwards

    n_layers = int(norms.meta["model"]["n_layers"])
    server = (norms.meta["model"].get("ndif") or versions) if args.remote is True else None
    report(norms, skip)
    from lmdepth.runtime import environment

    env = environment()
    sidecar = {
        "model": args.model, "remote": args.remote, "dataset": args.dataset,
        "server_versions": None if server is None else server.get("server"),
        "local_versions": {k: env.get(k) for k in ("nnsight", "transformers", "torch")},
        "runs": {"norms": str(norms.path), "skipping": str(skip.path)},
        # what the code sends per problem: one trace (norms), one session of 1 + L forwards (skipping); the strict
        # simulation counts its requests, NDIF's are not visible here
        "forwards_per_problem": {"norms": 1, "skipping": session_forwards(n_layers, 0, True)},
        "requests_simulated": len(strict.REQUESTS) - before if args.remote == "local" else None,
        "wall_time_s": round(time.time() - t0, 1),
    }
    out = Path(args.results_dir) / "ndif_smoke.json"
    out.write_text(json.dumps(sidecar, indent=2, default=str) + "\n")
    where = ("NDIF" if args.remote is True else "the strict offline simulation of NDIF" if args.remote == "local"
             else "here")
    print(f"ndif_smoke: ran on {where} in {sidecar['wall_time_s']} s; server versions: "
          f"{sidecar['server_versions'] or 'n/a (not NDIF)'}; sidecar {out}")
    return 0


def smoke(args: argparse.Namespace):
    """One problem through the norms trace and the all-token whole-layer skip session (fresh runs, never the
    cache: the point is to exercise the server)."""
    from lmdepth.analyses import residual, skipping

    common = dict(dataset=args.dataset, n_examples=1, selection="first", dtype=args.dtype, remote=args.remote,
                  results_dir=args.results_dir, use_cache=False, n_boot=10)
    norms = residual.run(args.model, **common)
    skip = skipping.run(model_name=args.model, analysis="current", parts=["layer"], local=False, **common)
    return norms, skip


def report(norms, skip) -> None:
    """Per layer: the residual norm and the layer's own contribution norm (chapter 01), and what skipping the layer
    changes (chapter 03: the largest relative change of a later layer's contribution, and of the output)."""
    t = norms.table
    mean = t[(t.stat == "mean") & (t.metric == "norm")]
    resid = mean[mean.component == "residual"].set_index("layer").value
    layer = mean[mean.component == "layer"].set_index("layer").value
    u = skip.units
    later = u[u.metric == "later_effect"].set_index("layer").value
    out = u[u.metric == "output_change"].set_index("layer").value
    print(f"{'layer':>5} {'‖h‖':>10} {'‖Δ‖':>10} {'skip: later':>12} {'skip: output':>13}")
    for l in layer.index:
        print(f"{l:>5} {resid.get(l, float('nan')):>10.3f} {layer[l]:>10.3f} {later.get(l, float('nan')):>12.4f} "
              f"{out.get(l, float('nan')):>13.4f}")


if __name__ == "__main__":
    sys.exit(main())
