"""Where a traced run spent the device's time: the top kernels of a ``jax.profiler`` trace.

    python -m bench.trace_summary TRACE_DIR [--top 25]

Reads the trace viewer JSON a ``jax.profiler.trace(dir)`` leaves (``plugins/profile/*/*.trace.json.gz``).
On a GPU the device's processes are named ``/device:GPU:N``: their streams (threads named ``Stream
...``) carry one event per kernel or copy, and the lines the profiler derives from them
(``DERIVED_LINES``) the same time again; of those, the ``XLA Ops`` line, where the trace has it, is
summed too, one event per HLO instruction. Without a device (a CPU run: the bench's ``--tiny`` mode)
the host's XLA threads (``tf_XLA...``) stand in, so that the code path runs on any host. Each
name's events are summed; the summary keeps the ``top`` names by time, each with its share of the
busy time, its count and a rough kind (``convolution``, ``matmul``, ``layout``, ...) read from the
name.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

# A kernel's or op's kind, from words its name carries: cuDNN's and CUTLASS's convolution kernels
# (implicit GEMM "fprop", "xmma...conv"), XLA's "cudnn-conv" ops; matmuls (cuBLAS "gemm", XLA's
# "dot"/"cublas"); layout changes ("transpose", "copy"); XLA's fusions; the rest.
_KINDS = (
    ("convolution", re.compile(r"conv|fprop|dgrad|wgrad|implicit_?gemm", re.I)),
    ("matmul", re.compile(r"gemm|cublas|dot|matmul|flash|fmha|attention", re.I)),
    ("layout", re.compile(r"transpose|copy|relayout", re.I)),
    ("reduction", re.compile(r"reduc", re.I)),
    ("fusion", re.compile(r"fusion|triton|loop_|input_", re.I)),
)


# Lines of a device's process the profiler derives from its streams (the same time again, by HLO op,
# module or step): every other line of the process is a stream of kernels and copies.
DERIVED_LINES = frozenset({"XLA Ops", "XLA Modules", "Steps", "TensorFlow Ops", "TensorFlow Name Scope",
                           "Framework Ops", "Framework Name Scope", "Source code", "Launch Stats", "XLA TraceMe"})
# A chip's process ("/device:GPU:0", "/device:TPU:0"), not a plugin's own line ("/device:CUSTOM:...").
_DEVICE = re.compile(r"/device:(GPU|TPU):\d")


def kind(name: str) -> str:
    return next((label for label, pattern in _KINDS if pattern.search(name)), "other")


def trace_file(trace_dir: Path) -> Path | None:
    """The trace viewer JSON under ``trace_dir`` (the newest run's), or None."""
    found = sorted(trace_dir.rglob("*.trace.json.gz"))
    return found[-1] if found else None


def _lines(events: list[dict[str, Any]]) -> tuple[dict[int, str], dict[tuple[Any, Any], str]]:
    processes: dict[int, str] = {}
    threads: dict[tuple[Any, Any], str] = {}
    for e in events:
        if e.get("ph") != "M":
            continue
        if e.get("name") == "process_name":
            processes[e["pid"]] = str(e.get("args", {}).get("name", ""))
        elif e.get("name") == "thread_name":
            threads[e["pid"], e.get("tid")] = str(e.get("args", {}).get("name", ""))
    return processes, threads


def _longest(durations: dict[str, float]) -> list[tuple[str, float]]:
    return sorted(durations.items(), key=lambda item: -item[1])


def _top(durations: dict[str, float], counts: Counter[str], top: int) -> list[dict[str, Any]]:
    busy = sum(durations.values()) or 1.0
    return [{"name": name[:200], "kind": kind(name), "ms": round(us / 1e3, 3), "share": round(us / busy, 4),
             "count": counts[name]} for name, us in _longest(durations)[:top]]


def summarize(trace_dir: Path, *, top: int = 25) -> dict[str, Any]:
    """The top kernels (and, where the trace has them, HLO ops) of a trace, by summed duration."""
    path = trace_file(trace_dir)
    if path is None:
        return {"error": f"no trace viewer JSON under {trace_dir}"}
    document = json.loads(gzip.decompress(path.read_bytes()))
    events = document["traceEvents"] if isinstance(document, dict) else document
    processes, threads = _lines(events)
    devices = {pid for pid, name in processes.items() if _DEVICE.search(name)}
    source = "device"
    if devices:
        kernel_lines = {key for key, name in threads.items() if key[0] in devices and name not in DERIVED_LINES}
        op_lines = {key for key, name in threads.items() if key[0] in devices and name == "XLA Ops"}
    else:  # no device in the trace: the host's XLA threads
        source = "host XLA threads"
        kernel_lines = {key for key, name in threads.items() if name.startswith("tf_XLA")}
        op_lines = set()
    kernel_us: defaultdict[str, float] = defaultdict(float)  # microseconds, summed
    kernel_n: Counter[str] = Counter()
    op_us: defaultdict[str, float] = defaultdict(float)
    op_n: Counter[str] = Counter()
    by_kind: defaultdict[str, float] = defaultdict(float)
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        line = (e.get("pid"), e.get("tid"))
        if source != "device" and "::" in e["name"]:
            continue  # the host runtime's own calls and waits (ThunkExecutor::Execute ...), not the program's ops
        if line in kernel_lines:
            kernel_us[e["name"]] += float(e["dur"])
            kernel_n[e["name"]] += 1
            by_kind[kind(e["name"])] += float(e["dur"])
        elif line in op_lines:
            op_us[e["name"]] += float(e["dur"])
            op_n[e["name"]] += 1
    busy_us = sum(kernel_us.values())
    return {
        "file": path.name, "source": source, "devices": sorted(processes[pid] for pid in devices),
        "busy_ms": round(busy_us / 1e3, 3), "kernels": sum(kernel_n.values()),
        "by_kind_ms": {k: round(us / 1e3, 3) for k, us in _longest(by_kind)},
        "top_kernels": _top(kernel_us, kernel_n, top), "top_ops": _top(op_us, op_n, top),
    }


def markdown(summary: dict[str, Any]) -> str:
    if "error" in summary:
        return summary["error"] + "\n"
    lines = [f"{summary['kernels']} kernels, {summary['busy_ms']:.1f} ms busy ({summary['source']}); by kind: "
             + ", ".join(f"{k} {ms:.1f} ms" for k, ms in summary["by_kind_ms"].items()), "",
             "| kernel | kind | ms | share | count |", "|---|---|---|---|---|"]
    lines += [f"| `{k['name'][:90]}` | {k['kind']} | {k['ms']:.2f} | {100 * k['share']:.1f}% | {k['count']} |"
              for k in summary["top_kernels"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace_dir", type=Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args()
    summary = summarize(args.trace_dir, top=args.top)
    print(json.dumps(summary, indent=1) if args.json else markdown(summary))


if __name__ == "__main__":
    main()
