"""httpx load test for ``POST /v1/decode`` (``vaeserve loadtest``).

Two modes:

* closed loop (``--concurrency N``): N clients, each sends its next request when the previous
  one answered. Measures capacity; latency is per request.
* open loop (``--rate R``): Poisson arrivals at R requests/s, independent of answers. Latency is
  timed from each request's *scheduled* send time, so a server that falls behind shows its queueing
  (no coordinated omission).

Before anything is measured, every batch size the run can make is compiled: the server pads a
device batch up to a *bucket* (``batch_buckets`` in ``GET /v1/models``), one program each, and a
program compiled inside the measured window would be timed as serving. One request per bucket,
holding that many latents, runs the program the run's requests will share (an MP4 request's
program is the raw stream's, a PNG's the npy one's: they batch the same way); then ``--warmup``
requests of the run's own kind. The server's compile counter (``vaeserve_compiles_total``) is read
around the window: a window with a compile in it is not reported as a measurement (exit status 3;
``--allow-compiles`` reports it, saying so).

Beside each latency it reports where the time went, from the answers' headers: the queue
(``X-Queue-Time-S``, arrival to the start of the device batch), the device (``X-Device-Time-S``,
the batch's device time, transfers included; a streamed answer sends its headers before the
device is done, so it has none) and the batch sizes (``X-Batch-Size``).

The run stops at ``--requests`` or ``--duration``, whichever comes first. It only talks to the URL
it is given (loopback by default).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np


@dataclass
class Sample:
    status: str  # HTTP status, or the exception name when there was no response
    latency_s: float
    bytes_in: int
    queue_s: float | None = None  # X-Queue-Time-S: arrival to the start of its device batch
    device_s: float | None = None  # X-Device-Time-S: its device batch (not sent by streamed answers)
    batch_size: int | None = None  # X-Batch-Size: requests' latents in that batch, padding excluded


def _header(response: httpx.Response, name: str, kind: type = float) -> Any:
    value = response.headers.get(name)
    return None if value is None else kind(value)


# What a bucket's warm-up request asks instead of the run's own output, where that holds one video
# (B = 1): a request that runs the same device program (the same uint8 frames; stepped for MP4)
# and may hold any number of latents.
_WARM_INSTEAD = {"mp4": {"stream": "true"}, "png": {"output_type": "npy"}}
COMPILES = re.compile(r"^vaeserve_compiles_total (\S+)$", re.M)


@dataclass
class LoadPlan:
    url: str
    shape: tuple[int, ...]
    output_type: str
    params: dict = field(default_factory=dict)
    api_key: str | None = None
    timeout_s: float = 600.0
    frames_per_video: int = 0  # from the served model's config (see model_frames)

    @property
    def frames_per_request(self) -> int:
        batch = self.shape[0] if len(self.shape) == 5 else 1
        return batch * self.frames_per_video


async def served_model(client: httpx.AsyncClient, base: str, headers: dict) -> dict:
    """The served model as ``GET /v1/models`` describes it."""
    response = await client.get(base + "/v1/models", headers=headers)
    response.raise_for_status()
    return response.json()["data"][0]


def model_frames(model: dict, latent_frames: int) -> int:
    """Output frames per video, from the config the server reports: the frame formula lives in
    the model config only (a Wan 2.2 or test model need not make 4 frames per latent frame)."""
    from vaeserve.models.registry import config_from_dict

    return config_from_dict(model["config"]).num_output_frames(latent_frames)


def _parse_shape(text: str) -> tuple[int, ...]:
    shape = tuple(int(v) for v in text.replace(",", "x").split("x"))
    if len(shape) not in (4, 5):
        raise argparse.ArgumentTypeError("shape is CxTxHxW or BxCxTxHxW")
    return shape


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vaeserve loadtest", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL (or .../v1/decode)")
    p.add_argument("--shape", type=_parse_shape, default=(1, 16, 2, 4, 4), help="latents, e.g. 1x16x21x60x104")
    p.add_argument("--output-type", default="pt", choices=["mp4", "pt", "npy", "png"])
    p.add_argument("--float16", dest="partial_postprocess", action="store_false",
                   help="pt: ask for float16 (B, 3, F, H, W) instead of uint8 frames")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--concurrency", type=int, help="closed loop with N clients (default 4)")
    mode.add_argument("--rate", type=float, help="open loop: Poisson arrivals per second")
    p.add_argument("--requests", type=int, default=100, help="measured requests at most")
    p.add_argument("--duration", type=float, default=60.0, help="seconds at most")
    p.add_argument("--warmup", type=int, default=2,
                   help="requests sent first and not measured (after one per batch bucket the run can use)")
    p.add_argument("--allow-compiles", action="store_true",
                   help="report a window in which the server compiled (the latencies include the compiles)")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--api-key")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", dest="json_path", help="write the result here (default bench/results/...)")
    return p


class LoadRunner:
    def __init__(self, plan: LoadPlan, client: httpx.AsyncClient, latents: np.ndarray):
        self.plan, self.client, self.latents, self.body = plan, client, latents, latents.tobytes()
        self.base = plan.url.rstrip("/").removesuffix("/v1/decode")
        self.endpoint = self.base + "/v1/decode"
        self.headers = {"Content-Type": "application/octet-stream"}
        if plan.api_key:
            self.headers["Authorization"] = f"Bearer {plan.api_key}"
        self.query = {"shape": ",".join(map(str, plan.shape)), "dtype": "float32",
                      "output_type": plan.output_type, **plan.params}

    async def one(self, started: float | None = None) -> Sample:
        """One request; latency from ``started`` (the scheduled time in open loop) or from now."""
        start = time.perf_counter() if started is None else started
        try:
            response = await self.client.post(self.endpoint, content=self.body, params=self.query,
                                              headers=self.headers)
        except httpx.HTTPError as exc:
            return Sample(type(exc).__name__, time.perf_counter() - start, 0)
        return Sample(str(response.status_code), time.perf_counter() - start, len(response.content),
                      queue_s=_header(response, "X-Queue-Time-S"), device_s=_header(response, "X-Device-Time-S"),
                      batch_size=_header(response, "X-Batch-Size", int))

    async def warm_bucket(self, size: int) -> httpx.Response:
        """One request of ``size`` latents (the first of the run's, repeated) that runs the program
        the run's requests share at batch bucket ``size``."""
        rows = np.repeat(self.latents.reshape(-1, *self.latents.shape[-4:])[:1], size, axis=0)
        query = {**self.query, "shape": ",".join(map(str, rows.shape)), **_WARM_INSTEAD.get(self.plan.output_type, {})}
        if query.get("stream") == "true":
            query.pop("output_type")  # raw frames: the stream's program, any batch
        return await self.client.post(self.endpoint, content=rows.tobytes(), params=query, headers=self.headers)

    async def compiles(self) -> float:
        """The server's compile counter (``GET /metrics``)."""
        response = await self.client.get(self.base + "/metrics")
        response.raise_for_status()
        match = COMPILES.search(response.text)
        return float(match.group(1)) if match else 0.0

    async def closed_loop(self, concurrency: int, requests: int, duration: float) -> list[Sample]:
        samples: list[Sample] = []
        issued = 0
        stop_at = time.perf_counter() + duration

        async def client_loop() -> None:
            nonlocal issued
            while issued < requests and time.perf_counter() < stop_at:
                issued += 1  # single-threaded event loop: no race between check and increment
                samples.append(await self.one())

        await asyncio.gather(*(client_loop() for _ in range(concurrency)))
        return samples

    async def open_loop(self, rate: float, requests: int, duration: float, seed: int) -> list[Sample]:
        rng = random.Random(seed)
        begin = time.perf_counter()
        tasks, at = [], begin
        for _ in range(requests):
            at += rng.expovariate(rate)
            if at - begin > duration:
                break
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            tasks.append(asyncio.create_task(self.one(started=at)))
        return list(await asyncio.gather(*tasks))


def buckets_used(buckets: list[int], max_batch: int, rows: int, concurrency: int | None) -> list[int]:
    """The batch buckets a run can fill: a closed loop of ``concurrency`` clients, each request
    holding ``rows`` latents, makes batches of at most ``concurrency · rows`` (and ``max_batch``);
    an open loop (``concurrency`` None) any up to ``max_batch``."""
    largest = max_batch if concurrency is None else min(concurrency * rows, max_batch)
    return [size for size in buckets if size < largest] + [min(size for size in buckets if size >= largest)]


async def warm_up(runner: LoadRunner, buckets: list[int], requests: int) -> dict:
    """Compile what the run will use before it is measured: one request per batch bucket, then
    ``requests`` of the run's own. Raises ``SystemExit`` when the server refuses one."""
    warmed, skipped = [], {}
    for size in buckets:
        response = await runner.warm_bucket(size)
        if response.status_code == 200:
            warmed.append(size)
        elif response.status_code in (413, 422) and size > 1:  # body over the limit, shape not served
            skipped[size] = f"{response.status_code} {response.json().get('detail', '')}"
        else:
            raise SystemExit(f"warm-up of batch bucket {size} failed: {response.status_code} {response.text[:500]}")
    warm = [await runner.one() for _ in range(requests)]
    if any(s.status != "200" for s in warm):
        raise SystemExit(f"warm-up failed: {[s.status for s in warm]}")
    return {"buckets": warmed, "skipped": skipped, "requests": requests}


def _percentiles(values: list[float]) -> dict[str, float | None]:
    array = np.array(values, dtype=np.float64)

    def pct(q: float) -> float | None:
        return float(np.percentile(array, q)) if array.size else None

    return {"p50": pct(50), "p95": pct(95), "p99": pct(99), "mean": float(array.mean()) if array.size else None,
            "max": float(array.max()) if array.size else None}


def summarize(samples: list[Sample], wall_s: float, plan: LoadPlan) -> dict:
    ok = [s for s in samples if s.status == "200"]
    bytes_in = sum(s.bytes_in for s in ok)
    return {
        "requests": len(samples),
        "ok": len(ok),
        "by_status": dict(sorted(Counter(s.status for s in samples).items())),
        "wall_s": wall_s,
        "latency_s": _percentiles([s.latency_s for s in ok]),
        "queue_s": _percentiles([s.queue_s for s in ok if s.queue_s is not None]),
        "device_s": _percentiles([s.device_s for s in ok if s.device_s is not None]),
        "batch_sizes": dict(sorted(Counter(s.batch_size for s in ok if s.batch_size is not None).items())),
        "requests_per_s": len(ok) / wall_s if wall_s else 0.0,
        "frames_per_s": len(ok) * plan.frames_per_request / wall_s if wall_s else 0.0,
        "mb_per_s": bytes_in / 1e6 / wall_s if wall_s else 0.0,
        "bytes_per_response": bytes_in / len(ok) if ok else 0,
    }


async def run(args: argparse.Namespace) -> dict:
    params = {"partial_postprocess": "true"} if args.output_type == "pt" and args.partial_postprocess else {}
    plan = LoadPlan(args.url, args.shape, args.output_type, params, args.api_key, args.timeout)
    latents = np.random.default_rng(args.seed).standard_normal(args.shape).astype("<f4")
    concurrency = None if args.rate else (args.concurrency or 4)
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
    async with httpx.AsyncClient(timeout=args.timeout, limits=limits) as client:
        runner = LoadRunner(plan, client, latents)
        auth = {"Authorization": runner.headers["Authorization"]} if plan.api_key else {}
        model = await served_model(client, runner.base, auth)
        plan.frames_per_video = model_frames(model, args.shape[-3])
        rows = args.shape[0] if len(args.shape) == 5 else 1
        buckets = buckets_used(model["batch_buckets"], model["latents"]["max_batch"], rows, concurrency)
        warmed = await warm_up(runner, buckets, args.warmup)
        compiles_before = await runner.compiles()
        begin = time.perf_counter()
        if concurrency is None:
            mode, samples = "open", await runner.open_loop(args.rate, args.requests, args.duration, args.seed)
        else:
            mode, samples = "closed", await runner.closed_loop(concurrency, args.requests, args.duration)
        wall = time.perf_counter() - begin
        compiled = int(await runner.compiles() - compiles_before)
    config = {**vars(args), "mode": mode, "shape": list(args.shape), "concurrency": concurrency}
    config.pop("api_key", None)
    return {"config": config, "warmup": warmed, "compiles_in_window": compiled,
            "summary": summarize(samples, wall, plan), "samples": [asdict(s) for s in samples]}


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{1000 * value:.1f} ms"


def _spread(values: dict) -> str:
    if values["p50"] is None:
        return "n/a"
    return "  ".join(f"{q} {_ms(values[q])}" for q in ("p50", "p95", "p99", "max"))


def format_summary(result: dict) -> str:
    c, s, warm = result["config"], result["summary"], result["warmup"]
    load = f"concurrency {c['concurrency']}" if c["mode"] == "closed" else f"rate {c['rate']}/s"
    batches = ", ".join(f"{size} x {count}" for size, count in s["batch_sizes"].items()) or "n/a"
    skipped = "".join(f"; bucket {size} not warmed ({why})" for size, why in warm["skipped"].items())
    compiles = result["compiles_in_window"]
    return "\n".join([
        f"vaeserve loadtest: {c['mode']} loop, {load}, shape {c['shape']}, output {c['output_type']}",
        f"  warm-up   batch buckets {warm['buckets']} compiled first, then {warm['requests']} requests{skipped}",
        f"  requests  {s['requests']} ({s['ok']} ok) in {s['wall_s']:.2f} s; by status {s['by_status']}",
        f"  latency   {_spread(s['latency_s'])}",
        f"  queue     {_spread(s['queue_s'])}   (X-Queue-Time-S: arrival to the device batch)",
        f"  device    {_spread(s['device_s'])}   (X-Device-Time-S: the device batch)",
        f"  batches   {batches}   (size x answers, X-Batch-Size)",
        f"  throughput {s['requests_per_s']:.2f} req/s  {s['frames_per_s']:.1f} frames/s  {s['mb_per_s']:.3f} MB/s",
        f"  compiles  {compiles or 'none'} during the window"
        + (": these latencies include compiles, not only serving" if compiles else ""),
    ])


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = asyncio.run(run(args))
    path = Path(args.json_path or f"bench/results/loadtest-{time.strftime('%Y%m%d-%H%M%S')}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    compiles = result["compiles_in_window"]
    if compiles and not args.allow_compiles:
        print(f"vaeserve loadtest: the server compiled {compiles} program(s) during the measured window, so its "
              "latencies are not serving's; not reported (the raw samples are in "
              f"{path}). Run again: what was compiled stays compiled (or --allow-compiles).", file=sys.stderr)
        return 3
    print(format_summary(result))
    print(f"  wrote {path}")
    return 0 if result["summary"]["ok"] else 1
