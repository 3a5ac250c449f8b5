"""The lens trace of chapter 04: the logit lens and the tuned lens (its translators applied) of one problem, reduced
inside one nnsight trace so that only [lenses × metrics × layers × positions] numbers leave it (here or on NDIF).

The block reads only torch, the kernels (:mod:`lmdepth.kernels`), the model's envoys
(:meth:`~lmdepth.traces.residual_metrics.TapPaths.envoys`) and plain data: the lens dtype's name, the soft-cap as a float, and the translators as three tensors (``A`` [L, d, d], ``b``
[L, d], ``scale`` [L]). The translators are trained here (:func:`lmdepth.model.translators.train_translators`,
fitted as its own cached job by :mod:`lmdepth.analyses.tuned_lens`) and travel with the request: L·d² floats (40 MB
for SmolLM2-135M, ~21 GB for a 70B model: refused over 1 GB, :data:`lmdepth.traces.server.MAX_SHIPPED`), so on NDIF a
large model runs the logit lens alone. The metrics are the kernels that :func:`lmdepth.metrics.distributions
.lens_metrics` and :class:`lmdepth.model.unembed.Unembedding` run too (:func:`lmdepth.kernels.lens_kernels.lens_block`,
:func:`lmdepth.kernels.logits.lens_logits`), with the same block sizes and reused buffers. The lens applies the
model's head by calling it, as every trace does (a hosted model's weights are not readable), whenever it runs in the
head's own dtype — the default for the book's fp32 models, and the only way on NDIF, whose autocast makes every
matmul bf16 anyway. A lens dtype other than the head's needs the lens' own copy of the weight in that dtype: only a
run here makes one (one line refuses it remotely, before anything is sent). Calling the head allocates each block's
[rows, V] logits afresh where the copy multiplies into a reused buffer; on SmolLM2's 49,152-token head, 170 rows at a
time on one CPU thread, the two took the same time (0.16–0.17 s a block, measured 2026-11-29).
:func:`lmdepth.hooks.lens_hooks.prompt_lens` is the reference twin the tests hold it to.
"""

from __future__ import annotations

from typing import Any

import torch

from lmdepth.errors import ParameterError
from lmdepth.kernels.lens_kernels import lens_block
from lmdepth.kernels.logits import lens_logits
from lmdepth.kernels.logits import softcap as softcap_of
from lmdepth.kernels.outputs import unwrap
from lmdepth.traces.remote import trace_kwargs
from lmdepth.traces.residual_metrics import TapPaths

#: Logits per block of lens readings: memory is O(this) (≈ 5 × 32 MB) whatever the depth and vocabulary.
MAX_LOGITS = 1 << 23


def lens_readings(nn_model: Any, paths: TapPaths, input_ids: torch.Tensor, positions: torch.Tensor,
                  lens_dtype: str = "float32", softcap: float | None = None,
                  translators: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None, k: int = 5,
                  remote: bool | str = False, max_logits: int = MAX_LOGITS) -> tuple[torch.Tensor, float]:
    """One traced forward pass → both lenses' per-token metrics at the chosen positions.

    Args:
        nn_model: the remotable nnsight wrapper of the model (``LoadedModel.nn``).
        paths: the family's taps (:meth:`TapPaths.of`).
        input_ids: [1, tokens] token ids.
        positions: [P] int64 positions to read.
        lens_dtype: dtype name of the unembedding matmul (``"float32"``, ``"bfloat16"``, ``"float16"``);
            log-softmax is always fp32. The head's own dtype calls the head; another reads a copy of its weight,
            which a remote run refuses (:class:`~lmdepth.errors.ParameterError`, before any request).
        softcap: the model's ``final_logit_softcapping`` (Gemma) or None.
        translators: the tuned lens' ``(A [L, d, d], b [L, d], scale [L])``, or None for the logit lens alone.
        k: top-k of the overlap.
        remote: ``False`` (here), ``True`` (NDIF) or ``"local"`` (strict simulation).
        max_logits: logits per block.

    Returns:
        ([lenses, 3, layers, P] fp32 on CPU — lenses: logit, then tuned if given; metrics: KL(P_lens‖P_final),
        KL(P_final‖P_lens), top-k overlap —, KL(lens on h_L ‖ the model's own output) at the last position: a
        self-check that the lens at the last layer reproduces the model's logits).
    """
    # envoys and plain data for the block (it must not read `paths` or `envoys`, library objects)
    envoys = paths.envoys(nn_model)
    layers, norm, head, n_layers = envoys.layers, envoys.final_norm, envoys.lm_head, paths.n_layers
    A, b, scale = translators if translators is not None else (None, None, None)
    n_lens = 1 if translators is None else 2
    n_pos = int(positions.shape[0])
    extra = 0 if translators is None else sum(t.numel() * t.element_size() for t in translators)
    mm_dtype = getattr(torch, lens_dtype)
    head_dtype = str(next(head.parameters()).dtype).removeprefix("torch.")  # read here, outside the block
    own_head = lens_dtype == head_dtype
    if remote is not False and not own_head:
        raise ParameterError(f"lens_dtype {lens_dtype} differs from the hosted model's head ({head_dtype}): a remote "
                             f"lens calls the head in its own dtype (its weights are not readable); pass lens_dtype "
                             f"{head_dtype}")
    with torch.no_grad(), nn_model.trace(input_ids, logits_to_keep=1,
                                         **trace_kwargs(nn_model, remote, extra_payload=extra)):
        hs = [layers[l].input[0, positions] for l in range(n_layers)]  # a gather copies: [P, d] each
        last = layers[n_layers - 1].output
        h_last = unwrap(last)[0]  # [T, d]
        hs.append(h_last[positions])
        model_logits = head.output[0, -1:].float()  # [1, V]: logits_to_keep=1
        vocab, device = int(model_logits.shape[-1]), model_logits.device  # the head's
        weight, bias = None, None  # the head is called
        if not own_head:  # the lens' copy in its dtype: once per trace, not per block (only here, never remote)
            weight = head.weight.detach().to(mm_dtype)
            bias = getattr(head, "bias", None)
            bias = None if bias is None else bias.detach().float()
        if A is not None:  # shipped on the CPU: where the model runs (no copy when it is the CPU)
            A, b, scale = A.to(device), b.to(device), scale.to(device)
        # reusable [rows, V] buffers: a fresh tensor of tens of MB per block costs more in page faults than the maths
        pos_chunk = max(1, min(n_pos, max_logits // vocab))
        per_block = max(1, max_logits // (pos_chunk * vocab))
        rows_max = per_block * pos_chunk
        logp_buf, p_buf, diff_buf = (torch.empty(rows_max, vocab, device=device) for _ in range(3))
        z_buf = zmm_buf = None
        if weight is not None:
            z_buf = torch.empty(rows_max, vocab, device=device)
            zmm_buf = z_buf if mm_dtype == torch.float32 else torch.empty(rows_max, vocab, dtype=mm_dtype,
                                                                            device=device)

        # the self-check: the lens at h_L against the model's own (soft-capped) output at the last position
        # final norm in the residual's dtype, matmul in the lens dtype
        lens_last = torch.log_softmax(
            lens_logits(head, norm(h_last[-1:]), mm_dtype, weight, bias, softcap, z_buf, zmm_buf).clone(), -1)
        model_last = torch.log_softmax(softcap_of(model_logits, softcap), -1)
        check = (lens_last.exp() * (lens_last - model_last)).nansum(-1).max().cpu().save()

        readings = [(l, i) for l in range(n_layers) for i in range(n_lens)]  # (layer, lens)
        values = torch.zeros(n_lens, 3, n_layers, n_pos)
        for s in range(0, n_pos, pos_chunk):
            rows = slice(s, s + pos_chunk)
            final_z = lens_logits(head, norm(hs[-1][rows]), mm_dtype, weight, bias, softcap, z_buf,
                                  zmm_buf).clone()  # [P', V]: the buffers are reused below
            final_logp = torch.log_softmax(final_z, dim=-1)
            final_p = final_logp.exp()
            final_top = final_z.topk(k, dim=-1).indices
            for r in range(0, len(readings), per_block):
                block = readings[r: r + per_block]
                # [G, P', d]: the residuals themselves (logit lens) or translated (tuned lens)
                xs = []
                for l, i in block:
                    h = hs[l][rows].to(device).float()  # from its layer's device to the head's
                    xs.append(h if i == 0 else h + h @ A[l].T + scale[l] * b[l])
                x = torch.stack(xs)
                G, P = x.shape[0], x.shape[1]
                z = lens_logits(head, norm(x.flatten(0, 1)), mm_dtype, weight, bias, softcap, z_buf, zmm_buf)
                m = lens_block(z.view(G, P, vocab), final_logp, final_p, final_top, logp_buf, p_buf,
                               diff_buf).cpu()  # [3, G, P']
                for j, (l, i) in enumerate(block):
                    values[i, :, l, rows] = m[:, j]
        values.save()
    return values, float(check)


__all__ = ["MAX_LOGITS", "lens_readings"]
