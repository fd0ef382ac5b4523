"""httpx load test for ``POST /v1/decode`` (``vaeserve loadtest``).

Two modes:

* closed loop (``--concurrency N``): N clients, each sends its next request when the previous
  one answered. Measures capacity; latency is per request.
* open loop (``--rate R``): Poisson arrivals at R requests/s, independent of answers. Latency is
  timed from each request's *scheduled* send time, so a server that falls behind shows its queueing
  (no coordinated omission).

Warm-up requests run first and are excluded. The run stops at ``--requests`` or ``--duration``,
whichever comes first. It only talks to the URL it is given (loopback by default).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np


@dataclass
class Sample:
    status: str  # HTTP status, or the exception name when there was no response
    latency_s: float
    bytes_in: int


@dataclass
class Plan:
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


async def model_frames(client: httpx.AsyncClient, url: str, headers: dict, latent_frames: int) -> int:
    """Output frames per video, from the config the server reports: the frame formula lives in
    the model config only (a Wan 2.2 or test model need not make 4 frames per latent frame)."""
    from models.config import config_from_dict

    response = await client.get(url.split("/v1/decode")[0].rstrip("/") + "/v1/models", headers=headers)
    response.raise_for_status()
    config = config_from_dict(response.json()["data"][0]["config"])
    return config.num_output_frames(latent_frames)


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
    p.add_argument("--warmup", type=int, default=2, help="requests sent first and not measured")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--api-key")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", dest="json_path", help="write the result here (default bench/results/...)")
    return p


class Runner:
    def __init__(self, plan: Plan, client: httpx.AsyncClient, body: bytes):
        self.plan, self.client, self.body = plan, client, body
        self.endpoint = plan.url if plan.url.rstrip("/").endswith("/v1/decode") else plan.url.rstrip("/") + "/v1/decode"
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
            status, size = str(response.status_code), len(response.content)
        except httpx.HTTPError as exc:
            status, size = type(exc).__name__, 0
        return Sample(status, time.perf_counter() - start, size)

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


def summarize(samples: list[Sample], wall_s: float, plan: Plan) -> dict:
    ok = [s for s in samples if s.status == "200"]
    latencies = np.array([s.latency_s for s in ok]) if ok else np.zeros(0)

    def pct(q: float) -> float | None:
        return float(np.percentile(latencies, q)) if latencies.size else None

    bytes_in = sum(s.bytes_in for s in ok)
    return {
        "requests": len(samples),
        "ok": len(ok),
        "by_status": dict(sorted(Counter(s.status for s in samples).items())),
        "wall_s": wall_s,
        "latency_s": {"p50": pct(50), "p95": pct(95), "p99": pct(99), "mean": float(latencies.mean()) if ok else None,
                      "max": float(latencies.max()) if ok else None},
        "requests_per_s": len(ok) / wall_s if wall_s else 0.0,
        "frames_per_s": len(ok) * plan.frames_per_request / wall_s if wall_s else 0.0,
        "mb_per_s": bytes_in / 1e6 / wall_s if wall_s else 0.0,
        "bytes_per_response": bytes_in / len(ok) if ok else 0,
    }


async def run(args: argparse.Namespace) -> dict:
    params = {"partial_postprocess": "true"} if args.output_type == "pt" and args.partial_postprocess else {}
    plan = Plan(args.url, args.shape, args.output_type, params, args.api_key, args.timeout)
    latents = np.random.default_rng(args.seed).standard_normal(args.shape).astype("<f4")
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
    async with httpx.AsyncClient(timeout=args.timeout, limits=limits) as client:
        runner = Runner(plan, client, latents.tobytes())
        auth = {"Authorization": runner.headers["Authorization"]} if plan.api_key else {}
        plan.frames_per_video = await model_frames(client, plan.url, auth, args.shape[-3])
        warm = [await runner.one() for _ in range(args.warmup)]
        if any(s.status != "200" for s in warm):
            raise SystemExit(f"warm-up failed: {[s.status for s in warm]}")
        begin = time.perf_counter()
        if args.rate:
            mode, samples = "open", await runner.open_loop(args.rate, args.requests, args.duration, args.seed)
        else:
            concurrency = args.concurrency or 4
            mode, samples = "closed", await runner.closed_loop(concurrency, args.requests, args.duration)
        wall = time.perf_counter() - begin
    config = {**vars(args), "mode": mode, "shape": list(args.shape), "concurrency": args.concurrency or (
        None if args.rate else 4)}
    config.pop("api_key", None)
    return {"config": config, "summary": summarize(samples, wall, plan),
            "samples": [asdict(s) for s in samples]}


def format_summary(result: dict) -> str:
    c, s = result["config"], result["summary"]
    lat = s["latency_s"]
    ms = lambda v: "n/a" if v is None else f"{1000 * v:.1f} ms"  # noqa: E731
    load = f"concurrency {c['concurrency']}" if c["mode"] == "closed" else f"rate {c['rate']}/s"
    return "\n".join([
        f"vaeserve loadtest: {c['mode']} loop, {load}, shape {c['shape']}, output {c['output_type']}",
        f"  requests  {s['requests']} ({s['ok']} ok) in {s['wall_s']:.2f} s; by status {s['by_status']}",
        f"  latency   p50 {ms(lat['p50'])}  p95 {ms(lat['p95'])}  p99 {ms(lat['p99'])}  max {ms(lat['max'])}",
        f"  throughput {s['requests_per_s']:.2f} req/s  {s['frames_per_s']:.1f} frames/s  {s['mb_per_s']:.3f} MB/s",
    ])


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = asyncio.run(run(args))
    print(format_summary(result))
    path = Path(args.json_path or f"bench/results/loadtest-{time.strftime('%Y%m%d-%H%M%S')}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    print(f"  wrote {path}")
    return 0 if result["summary"]["ok"] else 1
