"""Encode inputs under attack and at the limits: host memory (RSS, sampled every 10 ms from /proc)
and time, side by side in one run.

    .venv/bin/python -m bench.encode_inputs                       # every part, 3 runs each
    .venv/bin/python -m bench.encode_inputs --runs 5 --concurrent 24 --png encode-inputs.png

1. The 10 KB MP4 of 128 black 1280x1280 frames (libx264 ultrafast, crf 51) sent to a real
   server (``vaeserve serve``, the tiny model, default limits): time to the 422 and the server's
   RSS growth; then ``--bursts`` rounds of ``--concurrent`` of them at once, with the server's
   RSS after each round (the first round's threads take their malloc arenas; then it is flat).
2. For contrast, what refusing it from its header saves: decoding its frames (PyAV), the way
   they were decoded before a frame count was checked, in a child process.
3. A valid MP4 at the default limits (129 frames of 1280x1280, H.264, real content: the shared
   sample video scaled up): the input stage a request goes through before the device (header
   checks, then the decode into one float32 array), in a child process: its time and peak RSS
   growth against the float32 frames it holds.

Prints min and median over ``--runs``; ``--png`` writes the RSS traces.
"""

from __future__ import annotations

import argparse
import io
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

import av
import httpx
import numpy as np

from bench.common import SAMPLE_VIDEO

MB = 2**20


def rss(pid: int) -> int:
    """Resident bytes of a process, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


class RssTrace:
    """RSS of ``pid`` every 10 ms while the ``with`` block runs: ``(seconds, bytes)`` samples."""

    def __init__(self, pid: int):
        self.pid = pid
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()

    def __enter__(self) -> RssTrace:
        self.start = time.monotonic()
        self.baseline = rss(self.pid)
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic() - self.start, rss(self.pid)))
            time.sleep(0.01)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append((time.monotonic() - self.start, rss(self.pid)))

    @property
    def growth(self) -> int:
        return max(value for _, value in self.samples) - self.baseline


def encode_video(frames, count: int, width: int, height: int, *, options: dict) -> bytes:
    """``count`` frames from the iterable ``frames`` (``av.VideoFrame``s) → H.264 MP4 bytes."""
    from tqdm import tqdm

    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=16)
        stream.width, stream.height, stream.pix_fmt, stream.options = width, height, "yuv420p", options
        for frame in tqdm(frames, total=count, desc=f"making {count}x{width}x{height}", unit="frame", leave=False):
            frame.pts = None  # numbered by the encoder, whatever clip the frame came from
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buffer.getvalue()


def bomb() -> bytes:
    black = av.VideoFrame.from_ndarray(np.zeros((1280, 1280, 3), np.uint8), format="rgb24")
    return encode_video((black for _ in range(128)), 128, 1280, 1280, options={"preset": "ultrafast", "crf": "51"})


def at_the_limits() -> bytes:
    """129 frames of 1280x1280: the sample's 81 frames, scaled up, played forward then back."""
    with av.open(str(SAMPLE_VIDEO)) as container:
        frames = [f.reformat(width=1280, height=1280, format="yuv420p") for f in container.decode(video=0)]
    order = frames + frames[-2:-50:-1]
    return encode_video(iter(order[:129]), 129, 1280, 1280, options={"preset": "veryfast", "crf": "23"})


def start_server(model_dir: Path, log: Path) -> tuple[subprocess.Popen, str]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "vaeserve", "serve", "--model", str(model_dir), "--port", str(port),
                                "--log-level", "warning"], cwd=REPO, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited:\n{log.read_text()}")
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError("server not ready")


def post_bomb(url: str, body: bytes) -> tuple[int, str, float]:
    start = time.monotonic()
    response = httpx.post(url + "/v1/encode", content=body, headers={"Content-Type": "video/mp4"}, timeout=120)
    return response.status_code, response.json().get("type", "").rsplit("/", 1)[-1], time.monotonic() - start


# A child process for the codec-level parts: it imports, says "ready", waits for a line, runs.
CHILD = """
import sys, time
body = open({path!r}, "rb").read()
{setup}
print("ready", flush=True)
sys.stdin.readline()
start = time.monotonic()
{work}
print(f"{{time.monotonic() - start:.4f}}", flush=True)
"""

FULL_DECODE = ("import av, io, numpy as np",
               "frames = [f.to_ndarray(format='rgb24') for f in av.open(io.BytesIO(body)).decode(video=0)]\n"
               "video = 2.0 * (np.stack(frames).astype(np.float32) / np.float32(255.0)) - 1.0")
INPUT_STAGE = ("import models\nfrom service.codecs.frames import frames_header\nfrom service.limits import Limits\n"
               "from service.settings import DEFAULT_VIDEO_CODECS, Settings\n"
               "s = Settings()\nlimits = Limits(channels=16, max_batch=s.max_batch, max_frames=s.max_frames, "
               "max_height=s.max_height, max_width=s.max_width)\nconfig = models.WanVAEConfig()",
               "header = frames_header(body, 'video/mp4', None, None, config, limits, codecs=DEFAULT_VIDEO_CODECS)\n"
               "frames = header.read()\nassert frames.nbytes == header.nbytes")


def in_child(body: bytes, setup: str, work: str) -> tuple[float, RssTrace]:
    """Seconds of ``work`` in a fresh process (after ``setup``) and the RSS trace around it."""
    with tempfile.NamedTemporaryFile(suffix=".mp4") as file:
        file.write(body)
        file.flush()
        code = CHILD.format(repo=str(REPO), path=file.name, setup=setup, work=work)
        child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "ready"
        with RssTrace(child.pid) as trace:
            child.stdin.write("go\n")
            child.stdin.flush()
            seconds = float(child.stdout.readline())
        child.wait()
    return seconds, trace


def summary(values: list[float], scale: float = 1.0, unit: str = "") -> str:
    return f"{min(values) / scale:9.2f} {statistics.median(values) / scale:9.2f} {max(values) / scale:9.2f} {unit:2s}"


def repeat(runs: int, fn: Callable[[], tuple[float, RssTrace]]) -> tuple[list[float], list[float], RssTrace]:
    times: list[float] = []
    growths: list[float] = []
    trace = None
    for _ in range(runs):
        seconds, trace = fn()
        times.append(seconds)
        growths.append(trace.growth)
    assert trace is not None
    return times, growths, trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--concurrent", type=int, default=24)
    parser.add_argument("--bursts", type=int, default=8, help="rounds of --concurrent bombs")
    parser.add_argument("--png", type=Path, help="write the RSS traces here")
    args = parser.parse_args()

    import os

    from vaeserve import models

    the_bomb, valid = bomb(), at_the_limits()
    print(f"bomb: {len(the_bomb):,} bytes (128 x 1280x1280); at the limits: {len(valid):,} bytes (129 x 1280x1280); "
          f"machine: {os.cpu_count()} cores")
    traces: dict[str, RssTrace] = {}
    rows: list[str] = []
    with tempfile.TemporaryDirectory() as folder:
        models.save_vae(models.init_vae(models.WanVAEConfig(base_dim=8, num_res_blocks=1), seed=0), folder)
        server, url = start_server(Path(folder), Path(folder) / "server.log")
        try:
            def one() -> tuple[float, RssTrace]:
                with RssTrace(server.pid) as trace:
                    status, slug, seconds = post_bomb(url, the_bomb)
                assert (status, slug) == (422, "invalid-frame-count"), (status, slug)
                return seconds, trace

            times, growths, traces["one bomb (server)"] = repeat(args.runs, one)
            rows.append(f"{'one bomb -> 422 (server)':38s} {summary(times, unit='s')} {summary(growths, MB, 'MB')}")

            before = rss(server.pid)
            after_each: list[int] = []

            def many() -> tuple[float, RssTrace]:
                with RssTrace(server.pid) as trace, ThreadPoolExecutor(args.concurrent) as pool:
                    start = time.monotonic()
                    answers = list(pool.map(lambda _: post_bomb(url, the_bomb), range(args.concurrent)))
                    seconds = time.monotonic() - start
                assert all(answer[:2] == (422, "invalid-frame-count") for answer in answers), answers
                after_each.append(rss(server.pid) - before)
                return seconds, trace

            times, growths, traces[f"{args.concurrent} bombs at once (server)"] = repeat(args.bursts, many)
            rows.append(f"{f'{args.concurrent} bombs at once (server)':38s} {summary(times, unit='s')} "
                        f"{summary(growths, MB, 'MB')}  server RSS after each burst: "
                        f"{', '.join(f'{g / MB:+.0f}' for g in after_each)} MB")
        finally:
            server.terminate()
            server.wait(60)

    times, growths, traces["full decode of the bomb"] = repeat(args.runs, lambda: in_child(the_bomb, *FULL_DECODE))
    rows.append(f"{'decoding the bomb (what 422 saves)':38s} {summary(times, unit='s')} {summary(growths, MB, 'MB')}")
    float32 = 129 * 1280 * 1280 * 3 * 4
    times, growths, traces["input stage at the limits"] = repeat(args.runs, lambda: in_child(valid, *INPUT_STAGE))
    rows.append(f"{'at the limits: headers + decode':38s} {summary(times, unit='s')} {summary(growths, MB, 'MB')}  "
                f"float32 frames {float32 / MB:.0f} MB; peak / frames {min(growths) / float32:.3f}")

    print(f"{'case':38s} {'time (s)':>29s}    {'peak RSS growth (MB)':>29s}")
    print(f"{'':38s} {'min':>9s} {'median':>9s} {'max':>9s}    {'min':>9s} {'median':>9s} {'max':>9s}")
    for row in rows:
        print(row)
    if args.png:
        plot(traces, float32, args.png)
        print(f"wrote {args.png}")


def plot(traces: dict[str, RssTrace], float32: int, path: Path) -> None:
    """Peak RSS growth per case (log scale) beside the RSS traces of each case's last run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (bars, lines) = plt.subplots(1, 2, figsize=(12, 4))
    names = list(traces)
    peaks = [max(traces[name].growth / MB, 0.01) for name in names]
    bars.barh(names, peaks, color=["tab:green", "tab:green", "tab:red", "tab:blue"][: len(names)])
    bars.axvline(float32 / MB, color="grey", linestyle="--", label="float32 frames at the limits")
    bars.set_xscale("log")
    bars.set_xlabel("peak RSS growth (MB, log scale)")
    bars.invert_yaxis()
    bars.legend(fontsize=8, loc="lower right")
    for y, peak in enumerate(peaks):
        bars.text(peak, y, f" {peak:,.1f} MB", va="center", fontsize=8)
    for name in names:
        trace = traces[name]
        lines.plot([t for t, _ in trace.samples], [(v - trace.baseline) / MB for _, v in trace.samples], label=name)
    lines.set_xlabel("seconds")
    lines.set_ylabel("RSS growth (MB)")
    lines.legend(fontsize=8)
    figure.suptitle("python -m bench.encode_inputs (2-core CPU host): the 10 KB 1280x1280x128 MP4 refused from its "
                    "header, and a valid MP4 at the limits", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
