"""scripts/bench_traces.py: each chapter's trace timed against its plain-hook reference on the same inputs, which must
give the same numbers."""

import importlib.util
import sys

import pytest
import torch

from lmdepth.model.registry import load_model
from lmdepth.runtime import REPO_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]


def bench():
    spec = importlib.util.spec_from_file_location("bench_traces", REPO_ROOT / "scripts" / "bench_traces.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up while the class is made
    spec.loader.exec_module(module)
    return module


def test_the_bench_runs_on_a_model_directory_and_compares_equal_numbers(tiny_dirs, capsys):
    rows = bench().main(["--model", str(tiny_dirs["llama"]), "--chapters", "01-02,04,06", "--repeats", "2"])
    assert [(r["chapter"], r["runs"]) for r in rows] == [("01-02", 2), ("04", 2), ("04", 2), ("06", 2)]
    assert all(r["diff"] <= 1e-5 and r["ref_cpu"] > 0 and r["trace_cpu"] > 0 for r in rows)
    assert all(r["ref_fw"] == r["trace_fw"] == 1 for r in rows)  # one forward pass per problem, either path
    assert torch.is_grad_enabled()  # called in-process, it leaves autograd as it found it
    table = capsys.readouterr().out
    assert "residual metrics" in table and "load average at end" in table


def test_the_bench_stops_in_one_line_when_a_trace_differs_from_its_reference(tiny_dirs, monkeypatch):
    module = bench()
    real = module.residual_metrics
    monkeypatch.setattr(module, "residual_metrics", lambda *a, **k: real(*a, **k) + 1e-3)
    with pytest.raises(SystemExit, match=r"^01-02 residual metrics: the trace and its reference differ by 0\.001 \(> 1e-05\)$") as e:
        module.main(["--model", str(tiny_dirs["llama"]), "--chapters", "01-02", "--repeats", "1"])
    assert "\n" not in str(e.value)


def test_the_bench_times_chapter_07s_traces_on_its_own_scratch_run(tiny_dirs):
    rows = bench().main(["--model", str(tiny_dirs["llama"]), "--chapters", "07", "--repeats", "1"])
    assert [(r["chapter"], r["measurement"]) for r in rows] == [("07", "depth: skip session (scratch MoEUT)"),
                                                               ("07", "depth: erasure map (scratch MoEUT)")]
    assert all(r["diff"] <= 1e-5 and r["ref_cpu"] > 0 and r["trace_cpu"] > 0 for r in rows)
    skip, erase = rows
    assert skip["ref_fw"] == skip["trace_fw"] == 1 + 8  # the clean pass, then one per skipped depth step
    # the clean pass, then per group of erased positions one pass per boundary; the hooks' short cut needs none for
    # the last boundary (the trace skips every layer there, but its embedding runs)
    groups = (erase["trace_fw"] - 1) // 9
    assert groups >= 1 and erase["trace_fw"] == 1 + 9 * groups and erase["ref_fw"] == 1 + 8 * groups


def test_the_ceiling_counts_a_traces_work_in_plain_forwards(tiny_dirs, capsys):
    """``--ceiling``: the residual-metrics trace of one problem is exactly one plain forward's work (every layer once
    over its tokens) and the metrics' arithmetic; the lens trace is one forward too, and its head's rows are counted beside, each with the lens' reduction of
    its logits; the tuned lens' training step is a line of its own; each line carries its efficiency."""
    import json

    rows = bench().main(["--model", str(tiny_dirs["llama"]), "--chapters", "01-02,04", "--repeats", "1", "--ceiling"])
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    *traced, step = lines
    assert [x["path"] for x in traced] == [f"{r['chapter']} {r['measurement']}" for r in rows]
    assert all(x["forwards"] == 1.0 and x["plain_forward_s"] > 0 and x["efficiency"] > 0 for x in traced)
    assert traced[0]["efficiency"] == pytest.approx(rows[0]["efficiency"], abs=1e-3)
    # the residual metrics' own arithmetic is counted beside the forward (timed plainly); the lens has none
    assert traced[0]["plain_extra_s"] > 0 and traced[1]["plain_extra_s"] == traced[2]["plain_extra_s"] == 0
    assert rows[0]["efficiency"] == pytest.approx((traced[0]["plain_forward_s"] + traced[0]["plain_extra_s"])
                                                  / rows[0]["trace_cpu"], rel=1e-2)
    # the head's rows beyond a forward's one: none for the residual metrics; the lens unembeds its P positions at
    # every layer and the last residual (P (L + 1) + 1: its self-check's row too), the tuned lens L more times P
    n_layers = len(load_model(str(tiny_dirs["llama"])).adapter.layers)
    logit, tuned = traced[1]["head_rows"], traced[2]["head_rows"]
    assert traced[0]["head_rows"] == 0 and traced[0]["plain_head_row_s"] > 0
    assert traced[0]["plain_reduction_row_s"] == 0 and traced[1]["plain_reduction_row_s"] > 0
    p = (logit - 1) / (n_layers + 1)
    assert p == int(p) > 0 and tuned == p * (2 * n_layers + 1) + 1, (logit, tuned, n_layers)
    row_s = traced[1]["plain_head_row_s"] + traced[1]["plain_reduction_row_s"]
    assert traced[1]["efficiency"] == pytest.approx((traced[1]["plain_forward_s"] + row_s * logit)
                                                    / rows[1]["trace_cpu"], rel=1e-2)
    assert step["path"] == "04 tuned lens: a training step" and step["candidates"] > 0
    assert step["efficiency"] == pytest.approx(step["plain_work_s"] / step["trace_cpu_s"], rel=1e-2)


def test_the_ceilings_plain_lens_reduction_computes_what_the_lens_does():
    """The work the lens' ceiling counts per row is the lens' own: both KLs and the top-k overlap equal
    :func:`lmdepth.kernels.lens_kernels.lens_block` against the same output distribution."""
    from lmdepth.kernels.lens_kernels import lens_block

    z = torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 3
    plain = bench().plain_lens_reduction(z, k=5)()
    final_logp = torch.log_softmax(z[:1], -1).expand_as(z).contiguous()
    bufs = [torch.empty(6, 50) for _ in range(3)]
    kernel = lens_block(z, final_logp, final_logp.exp(), z[:1].topk(5, -1).indices.expand(6, 5), *bufs)
    assert torch.allclose(plain, kernel, atol=1e-5)
    assert plain[0, 0].abs() < 1e-5 and plain[2, 0] == 1 and (plain[0, 1:] > 1e-3).all()  # row 0 is the final
