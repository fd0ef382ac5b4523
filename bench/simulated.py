#!/usr/bin/env python
"""Does the host keep up with the chip? The real service over real HTTP, in a process of its own,
with a simulated accelerator: a benchmark-only runner whose device call takes a set time per video
(a sleep, which costs the host nothing) and returns frames of real content, the sample video
scaled to the size asked for. What is left is the host's work: reading the latents, encoding the
MP4 (whole, or fragmented while the "device" runs), serializing npy, framing raw streams, writing
the bytes. For each output and concurrency, a closed loop of requests gives throughput and p50/p99
latency; the server's CPU time over the videos it answered gives host CPU-s per video, and from it
the host cores one chip needs at this device time. Example (720p x 81 frames, 0.1 s per video):

    python -m bench.simulated --device-s 0.1 --height 720 --width 1280 --concurrency 1 2 4 --requests 8

Writes a table (stdout) and a PNG (``--plot``): throughput and latency against concurrency."""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import SAMPLE_VIDEO
from vaeserve.models.shapes import Output

# What each output asks of POST /v1/decode.
OUTPUTS = {
    "mp4": {"output_type": "mp4"},
    "mp4-streamed": {"output_type": "mp4", "stream": "true"},  # fragmented MP4 while it decodes
    "npy": {"output_type": "npy"},
    "raw-stream": {"stream": "true"},  # raw uint8 frames, one message per decode step
}
TICKS = os.sysconf("SC_CLK_TCK")


def sample_frames(path: Path, frames: int, height: int, width: int) -> np.ndarray:
    """(frames, height, width, 3) uint8: the sample video's first ``frames`` frames at this size
    (looped when it has fewer)."""
    import av

    with av.open(str(path)) as container:
        decoded = [f.reformat(width=width, height=height, format="rgb24").to_ndarray()
                   for f in container.decode(video=0)]
    return np.stack([decoded[i % len(decoded)] for i in range(frames)])


class SimulatedRunner:
    """The ``Runner`` the worker calls, with no device: each call sleeps ``device_s`` per video
    (a stream's steps their share of it) and returns the sample frames. Benchmarks only."""

    interleaves_streams = True
    device_s = 0.1
    frames: np.ndarray  # (F, H, W, 3) uint8, set before the app starts

    def __init__(self, vae: Any, mesh: Any, *, max_batch: int, dp: int):
        self.vae, self.mesh, self.buckets = vae, mesh, [max_batch]

    def _video(self, latents: np.ndarray, first: int, count: int) -> np.ndarray:
        batch = latents.shape[0]
        time.sleep(self.device_s * batch * count / len(self.frames))
        return np.broadcast_to(self.frames[first:first + count], (batch, count, *self.frames.shape[1:])).copy()

    def decode(self, latents: np.ndarray, *, output: Output = "uint8", framewise: bool = False,
               conditions: Sequence[Any] = ()) -> Any:
        from vaeserve.sharding import Decoded

        assert output == "uint8", "the simulated device makes uint8 frames only"
        return Decoded(self._video(latents, 0, len(self.frames)), np.zeros(latents.shape[0], np.int64))

    def decode_stream(self, latents: np.ndarray, *, output: Output = "uint8", framewise: bool = False,
                      conditions: Sequence[Any] = ()) -> Iterator[Any]:
        from vaeserve.sharding import Decoded

        assert output == "uint8", "the simulated device makes uint8 frames only"
        first = 0
        for count in [1] + [4] * ((len(self.frames) - 1) // 4):  # Wan's steps: 1 frame, then 4 per latent
            yield Decoded(self._video(latents, first, count), np.zeros(latents.shape[0], np.int64))
            first += count

    def encode(self, frames: np.ndarray, requests: Any) -> np.ndarray:
        raise NotImplementedError("the simulated device decodes only")

    def decode_sound(self, latents: np.ndarray) -> np.ndarray:
        raise NotImplementedError("the simulated device decodes video only")

    def encode_sound(self, waveforms: np.ndarray) -> np.ndarray:
        raise NotImplementedError("the simulated device decodes video only")

    def compile(self, shape: tuple[int, ...], *, output: Output, stream: bool, framewise: bool = False,
                sizes: Any = None) -> list:
        return []

    def compile_encode(self, shape: tuple[int, ...], *, sizes: Any = None) -> list:
        return []

    def prepare(self, operation: Any, shape: tuple[int, ...], *, batch: int, output: Output = "uint8",
                framewise: bool = False) -> int:
        return 0  # nothing compiled, nothing to check

    def held_bytes(self, shape: tuple[int, ...], *, batch: int, output: Output = "uint8",
                   framewise: bool = False) -> int:
        return 0  # no decode state

    def free_bytes(self) -> int | None:
        return None

    def programs(self) -> list[list]:
        return []

    def program_memory(self) -> list[dict[str, Any]]:
        return []


def serve(args: argparse.Namespace) -> None:
    """The server process: the real app and uvicorn, the simulated runner in place of the device's."""
    from vaeserve import models
    from vaeserve.service.http.app import create_app
    from vaeserve.service.http.server import serve as run_server
    from vaeserve.service.settings import Settings

    SimulatedRunner.device_s = args.device_s
    SimulatedRunner.frames = sample_frames(args.sample, args.frames, args.height, args.width)
    settings = Settings(port=args.port, max_batch=1, max_frames=args.frames, max_height=args.height,
                        max_width=args.width, log_level="warning", mp4_writers=args.mp4_writers)
    vae = models.init_vae(models.WanVAEConfig(base_dim=8, num_res_blocks=1), seed=0)  # config only: never run
    sys.exit(run_server(create_app(settings, vae=vae, runner_factory=SimulatedRunner), settings))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def host_cpu() -> tuple[int, int]:
    """(idle, total) jiffies of every core since boot, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return values[3] + values[4], sum(values)  # idle + iowait


@contextlib.contextmanager
def server(args: argparse.Namespace) -> Iterator[tuple[str, int]]:
    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "bench.simulated", "--serve", "--port", str(port), "--device-s", str(args.device_s),
               "--frames", str(args.frames), "--height", str(args.height), "--width", str(args.width),
               "--sample", str(args.sample)]
    if args.mp4_writers:
        command += ["--mp4-writers", str(args.mp4_writers)]
    process = subprocess.Popen(command)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/readyz", timeout=5).status_code == 200:
                    break
            assert process.poll() is None and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)
        yield url, process.pid
    finally:
        process.terminate()
        process.wait(60)


def one_request(client: Any, url: str, body: bytes, params: dict) -> tuple[float, float, int]:
    """(latency, time to the first byte, bytes received) of one decode, read to its end."""
    start = time.perf_counter()
    first, size = 0.0, 0
    with client.stream("POST", url + "/v1/decode", content=body, params=params,
                       headers={"Content-Type": "application/octet-stream"}) as response:
        assert response.status_code == 200, response.read()[:500]
        for chunk in response.iter_raw():  # as it arrives
            first = first or time.perf_counter() - start
            size += len(chunk)
    return time.perf_counter() - start, first, size


def run_point(url: str, pid: int, body: bytes, params: dict, concurrency: int, requests: int) -> dict[str, Any]:
    """A closed loop: ``concurrency`` clients, ``requests`` decodes in all."""
    import httpx

    counter = iter(range(requests))
    lock = threading.Lock()
    results: list[tuple[float, float, int]] = []

    def client_loop() -> None:
        with httpx.Client(timeout=600) as client:
            while True:
                with lock:
                    if next(counter, None) is None:
                        return
                results.append(one_request(client, url, body, params))

    one_request(httpx.Client(timeout=600), url, body, params)  # warm: first-use costs out of the numbers
    server_cpu, own_cpu, host, start = cpu_seconds(pid), time.process_time(), host_cpu(), time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        for future in [pool.submit(client_loop) for _ in range(concurrency)]:
            future.result()
    wall = time.perf_counter() - start
    idle, total = (now - then for now, then in zip(host_cpu(), host, strict=True))
    latencies = sorted(r[0] for r in results)
    return {"videos_per_s": requests / wall, "p50_s": statistics.median(latencies),
            "p99_s": latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))],
            "first_byte_s": statistics.median(r[1] for r in results),
            "mb_per_video": statistics.mean(r[2] for r in results) / 1e6,
            "server_cpu_s_per_video": (cpu_seconds(pid) - server_cpu) / requests,
            "loadgen_cpu_share": (time.process_time() - own_cpu) / wall / (os.cpu_count() or 1),
            "server_cpu_share": (cpu_seconds(pid) - server_cpu) / wall / (os.cpu_count() or 1),
            "host_idle": idle / max(total, 1)}


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for output in dict.fromkeys(row["output"] for row in rows):
        mine = [row for row in rows if row["output"] == output]
        x = [row["concurrency"] for row in mine]
        left.plot(x, [row["videos_per_s"] for row in mine], "o-", label=output)
        line, = right.plot(x, [row["p50_s"] for row in mine], "o-", label=f"{output} p50")
        right.plot(x, [row["p99_s"] for row in mine], "x--", color=line.get_color(), label=f"{output} p99")
    left.set(xlabel="concurrent requests", ylabel="videos / s", title="throughput")
    right.set(xlabel="concurrent requests", ylabel="seconds", title="latency")
    for ax in (left, right):
        ax.set_xticks(sorted({row["concurrency"] for row in rows}))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device-s", type=float, default=0.1, help="simulated device time per video")
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--sample", type=Path, default=SAMPLE_VIDEO, help="the video whose frames the device returns")
    parser.add_argument("--outputs", nargs="+", choices=list(OUTPUTS), default=list(OUTPUTS))
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--requests", type=int, default=16, help="decodes per point (after one to warm up)")
    parser.add_argument("--mp4-writers", type=int, default=None, help="the server's --mp4-writers")
    parser.add_argument("--plot", type=Path, default=Path("simulated.png"))
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args)
        return
    from tqdm import tqdm

    from vaeserve.service.codecs.video import mp4_bytes

    # The encode alone, in this process, before the server starts: what a pipelined MP4 answer
    # (device and encoder overlapping) is held to, max(device time, encode time).
    frames = sample_frames(args.sample, args.frames, args.height, args.width)
    encode_s = []
    for _ in tqdm(range(2), desc="encode alone", unit="run", leave=False):
        start = time.perf_counter()
        mp4_bytes(frames, fps=16, crf=18)
        encode_s.append(time.perf_counter() - start)
    del frames
    latents = (1, 16, (args.frames - 1) // 4 + 1, args.height // 8, args.width // 8)
    body = np.zeros(latents, "<f4").tobytes()  # the simulated device ignores the values
    rows = []
    with server(args) as (url, pid):
        points = [(o, c) for o in args.outputs for c in args.concurrency]
        for output, concurrency in tqdm(points, desc="points", unit="point"):
            params = {"shape": ",".join(map(str, latents)), "dtype": "float32", **OUTPUTS[output]}
            rows.append({"output": output, "concurrency": concurrency,
                         **run_point(url, pid, body, params, concurrency, args.requests)})
    cores = os.cpu_count() or 1
    print(f"device {args.device_s} s per video (device rate {1 / args.device_s:.1f} videos/s), "
          f"{args.frames} x {args.height}x{args.width}, {args.requests} requests per point, {cores} host cores")
    print(f"{'output':13} {'conc':>4} {'videos/s':>8} {'p50 s':>7} {'p99 s':>7} {'1st byte':>8} {'MB/video':>8} "
          f"{'CPU-s/video':>11} {'cores/chip':>10} {'bound':>6} {'server':>6} {'loadgen':>7} {'idle':>5}")
    for row in rows:
        # What the host allows: its cores over the CPU-s a video costs, or the device's rate.
        bound = min(1 / args.device_s, cores / row["server_cpu_s_per_video"])
        print(f"{row['output']:13} {row['concurrency']:4d} {row['videos_per_s']:8.2f} {row['p50_s']:7.2f} "
              f"{row['p99_s']:7.2f} {row['first_byte_s']:8.2f} {row['mb_per_video']:8.1f} "
              f"{row['server_cpu_s_per_video']:11.2f} {row['server_cpu_s_per_video'] / args.device_s:10.1f} "
              f"{row['videos_per_s'] / bound:6.2f} {row['server_cpu_share']:6.0%} {row['loadgen_cpu_share']:7.0%} "
              f"{row['host_idle']:5.0%}")
    alone = max(args.device_s, min(encode_s))
    print(f"the encode alone: {min(encode_s):.2f} s (min of {len(encode_s)}); a pipelined mp4 answer at "
          f"concurrency 1 over max(device, encode): " + ", ".join(
              f"{row['output']} {row['p50_s'] / alone:.2f}" for row in rows
              if row["concurrency"] == 1 and row["output"].startswith("mp4")))
    print("cores/chip: host cores one chip needs at this device time (CPU-s per video / device s); "
          "bound: throughput over min(device rate, host cores / CPU-s per video); "
          "server, loadgen: the server's and the load generator's share of the host's CPU; "
          "idle: the host's idle share (other processes took the rest)")
    plot(rows, args.plot, f"simulated device {args.device_s} s/video, {args.frames} x {args.height}x{args.width}, "
         f"{cores} host cores: python -m bench.simulated --device-s {args.device_s} --height {args.height} "
         f"--width {args.width}")
    print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
