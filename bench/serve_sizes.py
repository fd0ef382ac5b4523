#!/usr/bin/env python
"""What a decode costs on this host: ``vaeserve serve`` with its default settings (the embedded
Wan 2.1 model, random weights) in a process of its own, asked for an MP4 of each latent size twice
— the first request compiles that size's programs, the second is served by them — with the wall
time of each answer, the server's CPU time for it (all its threads; on a busy host the wall time
grows, the CPU time much less), and its resident memory after each size (``VmRSS``) and at its
peak (``VmHWM``), from /proc.

    python -m bench.serve_sizes                                  # the README's sizes
    python -m bench.serve_sizes --sizes 16x2x16x16 16x5x30x52 --timeout 900

Prints a Markdown table. Sizes are run in the order given, smallest first: the peak memory is the
process's, so it only grows.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np

from bench.common import latent_shape
from vaeserve.service.codecs.tensors import npy_bytes

SIZES = ("1x16x2x16x16", "1x16x5x16x16", "1x16x2x30x52", "1x16x5x30x52", "1x16x5x60x104")


def cpu_s(pid: int) -> float:
    """CPU seconds a process has used (user + system, all its threads), from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_gb(pid: int) -> tuple[float, float]:
    """(resident, peak resident) GB of a process, from /proc/PID/status."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    kb = lambda name: int(fields[name].split()[0])  # noqa: E731
    return kb("VmRSS") / 1e6, kb("VmHWM") / 1e6


@contextlib.contextmanager
def server(port: int, log: Path) -> Iterator[subprocess.Popen]:
    """``vaeserve serve`` on ``port`` with its defaults, until /readyz is 200."""
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "vaeserve", "serve", "--port", str(port)],
                                   stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            if process.poll() is not None:
                raise SystemExit(f"the server exited: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        yield process
    finally:
        process.terminate()
        process.wait(60)


def decode(port: int, pid: int, latents: np.ndarray, timeout: float) -> tuple[float, float, int, int]:
    """One MP4 decode: wall seconds to the whole answer, the server's CPU seconds for it, the
    status and the MP4's bytes."""
    start, cpu = time.perf_counter(), cpu_s(pid)
    response = httpx.post(f"http://127.0.0.1:{port}/v1/decode", params={"output_type": "mp4"}, timeout=timeout,
                          content=npy_bytes(latents), headers={"Content-Type": "application/x-npy"})
    return time.perf_counter() - start, cpu_s(pid) - cpu, response.status_code, len(response.content)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", type=latent_shape, default=[latent_shape(s) for s in SIZES],
                        metavar="BxCxTxHxW")
    parser.add_argument("--port", type=int, default=8741)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per request (the server's deadline)")
    args = parser.parse_args(argv)
    log = Path(tempfile.mkdtemp(prefix="serve-sizes-")) / "server.log"
    print(f"vaeserve serve (defaults) on {os.cpu_count()} CPUs; MP4 answers; server log: {log}\n")
    print("| latents | video | first request (compiles): wall s, CPU-s | next request: wall s, CPU-s | MP4 KB "
          "| server memory GB (peak) |")
    print("|---|---|---|---|---|---|")
    with server(args.port, log) as process:
        rss, peak = memory_gb(process.pid)
        print(f"| (loaded, idle) | — | — | — | — | {rss:.2f} ({peak:.2f}) |", flush=True)
        for shape in args.sizes:
            latents = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
            _, _, t, h, w = shape
            video = f"{8 * w}x{8 * h} x {1 + 4 * (t - 1)}"
            first, first_cpu, status, _ = decode(args.port, process.pid, latents, args.timeout)
            if status != 200:
                print(f"| {'x'.join(map(str, shape))} | {video} | {status} after {first:.0f} s | — | — | — |", flush=True)
                break
            second, second_cpu, status, size = decode(args.port, process.pid, latents, args.timeout)
            rss, peak = memory_gb(process.pid)
            print(f"| {'x'.join(map(str, shape))} | {video} | {first:.1f}, {first_cpu:.1f} | {second:.1f}, "
                  f"{second_cpu:.1f} | {size / 1e3:,.0f} | {rss:.2f} ({peak:.2f}) |", flush=True)


if __name__ == "__main__":
    main()
