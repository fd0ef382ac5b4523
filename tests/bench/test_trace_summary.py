"""``bench.trace_summary``: a trace's top kernels, read from the trace viewer JSON the profiler writes
(a GPU's layout written out by hand here; the CPU's real traces are read in test_device_check)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from bench.trace_summary import kind, markdown, summarize


def write_trace(folder: Path, events: list[dict]) -> Path:
    run = folder / "plugins" / "profile" / "2026_01_01_00_00_00"
    run.mkdir(parents=True)
    (run / "host.trace.json.gz").write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    return folder


def meta(kind_: str, pid: int, name: str, tid: int | None = None) -> dict:
    return {"ph": "M", "name": kind_, "pid": pid, **({"tid": tid} if tid is not None else {}), "args": {"name": name}}


def span(pid: int, tid: int, name: str, dur: float) -> dict:
    return {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": 0, "dur": dur}


GPU_TRACE = [
    meta("process_name", 1, "/host:CPU"), meta("thread_name", 1, "python", 5),
    meta("process_name", 2, "/device:GPU:0"), meta("thread_name", 2, "Stream #13(Kernel,Memset)", 7),
    meta("thread_name", 2, "XLA Ops", 8), meta("thread_name", 2, "XLA Modules", 10),
    meta("thread_name", 2, "Stream #14(MemcpyD2D)", 11),
    meta("process_name", 3, "/device:CUSTOM:Megascale Trace"), meta("thread_name", 3, "Stream #1", 9),
    span(1, 5, "PjitFunction(run)", 9000.0),  # the host's: not the device's time
    span(2, 7, "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nchw", 600.0),
    span(2, 7, "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nchw", 400.0),
    span(2, 7, "loop_concatenate_fusion", 250.0),
    span(2, 7, "transpose_kernel", 150.0),
    span(2, 8, "cudnn-conv-bias-activation.12", 1000.0),
    span(2, 10, "jit_run", 1400.0),  # the module's span: derived, the same time again
    span(2, 11, "MemcpyD2D", 100.0),
    span(3, 9, "not a chip", 5000.0),
]


def test_a_gpu_trace_is_summed_by_kernel_on_the_device_streams(tmp_path):
    summary = summarize(write_trace(tmp_path, GPU_TRACE), top=2)
    assert summary["source"] == "device" and summary["devices"] == ["/device:GPU:0"]
    assert summary["busy_ms"] == 1.5 and summary["kernels"] == 5  # host, CUSTOM and derived lines aside
    conv, concat = summary["top_kernels"]
    assert conv["kind"] == "convolution" and conv["count"] == 2 and conv["ms"] == 1.0
    assert abs(conv["share"] - 1000 / 1500) < 1e-3
    assert concat["name"] == "loop_concatenate_fusion" and concat["kind"] == "fusion"
    assert summary["by_kind_ms"] == {"convolution": 1.0, "fusion": 0.25, "layout": 0.15, "other": 0.1}
    assert summary["top_ops"] == [{"name": "cudnn-conv-bias-activation.12", "kind": "convolution", "ms": 1.0,
                                   "share": 1.0, "count": 1}]
    assert "| convolution | 1.00 | 66.7% | 2 |" in markdown(summary)


def test_kinds_from_names():
    assert [kind(n) for n in ("cutlass_80_tensorop_bf16_s16816gemm", "transpose_021", "input_reduce_fusion.3",
                              "wrapped_broadcast")] == ["matmul", "layout", "reduction", "other"]


def test_no_trace_says_so(tmp_path):
    assert summarize(tmp_path)["error"].startswith("no trace viewer JSON")
