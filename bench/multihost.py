#!/usr/bin/env python
"""What a multi-host slice adds to a decode call: the broadcast of the call and the gather of frames.

The same tp mesh and the same latents, once in 1 process (every device local) and once in 2
processes (half the devices each, gloo collectives over loopback). Process 0 times each
``service.broadcast.Leader.call`` in four parts:

  * send   — doorbell (a coordination-service key) + header + padded payload (``broadcast_one_to_all``)
  * decode — the sharded decode on the devices (until ``block_until_ready``)
  * gather — ``sharding.to_host``: a device-to-host copy, an all-gather when the mesh spans processes
  * agree  — the rest of the call: collecting every follower's outcome

A second table times the protocol alone at production sizes: the latents of a 480p / 720p x 81
frame video broadcast, and its uint8 frames (split over tp, as a decode leaves them) gathered.

On CPU the devices are forced host devices sharing this machine's cores: 2 processes cannot be
faster here; the point is the overhead. Min and median over ``--runs`` after one warm-up call.

    python -m bench.multihost                       # real Wan 2.1 config, latents 1x16x2x16x16, tp=4
    python -m bench.multihost --config tiny --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NoReturn

REPO = Path(__file__).resolve().parents[1]

import numpy as np

from bench.common import CONFIGS, bench_config, latent_shape

# (name, latents (B, C, T, H, W), uint8 frames (B, F, H, W, 3)): production sizes for the protocol table
PRODUCTION = [
    ("480p x 81", (1, 16, 21, 60, 104), (1, 81, 480, 832, 3)),
    ("720p x 81", (1, 16, 21, 90, 160), (1, 81, 720, 1280, 3)),
]
PARTS = ("send", "decode", "gather", "agree", "total")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=CONFIGS, default="real")
    parser.add_argument("--shape", type=latent_shape, default=(1, 16, 2, 16, 16), help="latents BxCxTxHxW (default: 5 frames of 128x128)")
    parser.add_argument("--tp", type=int, default=4, help="devices per frame, split over the processes")
    parser.add_argument("--runs", type=int, default=3, help="timed calls per output, after one warm-up call")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds allowed to each slice")
    # one process of a slice (the script starts these itself)
    parser.add_argument("--process-id", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--num-processes", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# -- one process of the slice -------------------------------------------------------------------
def _handlers(vae, mesh, record: dict) -> dict:
    """The calls every process makes; process 0's decode/gather times go into ``record``."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    from vaeserve import sharding

    def decode(latents, output):
        start = time.perf_counter()
        frames = sharding.sharded_decode(vae, latents, mesh, output=output).block_until_ready()
        record["decode"] = time.perf_counter() - start
        start = time.perf_counter()
        host = sharding.to_host(frames)
        record["gather"] = time.perf_counter() - start
        return host

    def gather(array, shape):
        frames_sharding = NamedSharding(mesh, P(sharding.DP_AXIS, None, sharding.TP_AXIS))
        zeros = jax.jit(lambda: jax.numpy.zeros(shape, jax.numpy.uint8), out_shardings=frames_sharding)()
        start = time.perf_counter()
        sharding.to_host(zeros.block_until_ready())
        record["gather"] = time.perf_counter() - start

    return {"decode": decode, "gather": gather, "receive": lambda array: None}


def _timed(leader, record: dict, op: str, array=None, **options) -> dict:
    record.clear()
    start = time.perf_counter()
    leader.call(op, array, **options)
    record["total"] = time.perf_counter() - start
    record["send"] = leader.channel.last_send_s
    record["agree"] = record["total"] - record["send"] - record.get("decode", 0.0) - record.get("gather", 0.0)
    return dict(record)


def lead(leader, args, record: dict) -> dict:
    from tqdm import tqdm

    latents = np.random.default_rng(0).standard_normal(args.shape).astype(np.float32)
    results: dict[str, list[dict]] = {}
    steps = [("decode", output) for output in ("uint8", "float")] + [("protocol", name) for name, *_ in PRODUCTION]
    with tqdm(total=len(steps) * (args.runs + 1), desc=f"process 0 of {args.num_processes}", file=sys.stderr) as bar:
        for kind, name in steps:
            rows = []
            for run in range(args.runs + 1):
                if kind == "decode":
                    row = _timed(leader, record, "decode", latents, output=name)
                else:
                    latents_shape, frames_shape = next((lat, fr) for n, lat, fr in PRODUCTION if n == name)
                    row = _timed(leader, record, "receive", np.zeros(latents_shape, np.float32))
                    row["gather"] = _timed(leader, record, "gather", shape=list(frames_shape))["gather"]
                if run:  # run 0 compiles
                    rows.append(row)
                bar.update()
            results[f"{kind}:{name}"] = rows
    return results


def run_process(args) -> NoReturn:
    from vaeserve.service.slice.broadcast import Channel, Leader, follow
    from vaeserve.service.slice.control import SliceMonitor, exit_process, initialize

    control = initialize(coordinator_address=f"127.0.0.1:{args.port}", num_processes=args.num_processes,
                         process_id=args.process_id, heartbeat_timeout_s=60, cpu_devices=args.tp // args.num_processes)
    monitor = SliceMonitor(control, call_timeout_s=args.timeout).start()

    from vaeserve import models, sharding

    vae = models.init_vae(bench_config(args.config), seed=0)
    record: dict = {}
    handlers = _handlers(vae, sharding.make_mesh(args.tp), record)
    channel = Channel(control)
    if control.is_leader:
        leader = Leader(channel, monitor, handlers)
        results = lead(leader, args, record)
        leader.stop()
        args.result.write_text(json.dumps({"results": results, "parameters": vae.metadata["parameters"]}))
    else:
        follow(channel, handlers)
    monitor.stop()
    control.shutdown()
    exit_process(0)


# -- the orchestrator ---------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_slice(args, processes: int, out: Path) -> dict:
    """Start ``processes`` processes of this script, wait (bounded), return process 0's results."""
    port, result = _free_port(), out / f"result-{processes}.json"
    env = {key: value for key, value in os.environ.items() if key != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    common = [sys.executable, "-m", "bench.multihost", "--config", args.config, "--shape", "x".join(map(str, args.shape)),
              "--tp", str(args.tp), "--runs", str(args.runs), "--timeout", str(args.timeout),
              "--num-processes", str(processes), "--port", str(port), "--result", str(result)]
    started = [subprocess.Popen([*common, "--process-id", str(pid)], env=env, cwd=REPO,
                                stderr=None if pid == 0 else subprocess.DEVNULL) for pid in range(processes)]
    try:
        codes = [process.wait(args.timeout) for process in started]
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
    if codes != [0] * processes:
        raise SystemExit(f"the {processes}-process slice exited with {codes}")
    return json.loads(result.read_text())


def _stat(rows: list[dict], part: str, scale: float = 1.0) -> tuple[float, float]:
    values = [row[part] * scale for row in rows]
    return min(values), float(np.median(values))


def report(args, slices: dict[int, dict]) -> None:
    b, _, t, h, w = args.shape
    print(f"\nconfig {args.config} ({slices[1]['parameters'] / 1e6:.1f} M decoder parameters), latents {args.shape} → "
          f"{b} x {1 + 4 * (t - 1)} frames of {8 * h}x{8 * w}, tp={args.tp}; {args.runs} runs, min / median\n")
    print("| output | processes | send ms | decode s | gather ms | agree ms | call s | (send+gather+agree) / decode |")
    print("|---|---|---|---|---|---|---|---|")
    for output in ("uint8", "float"):
        for processes, data in slices.items():
            rows = data["results"][f"decode:{output}"]
            send, decode, gather, agree, total = (_stat(rows, part) for part in PARTS)
            overhead = [(r["send"] + r["gather"] + r["agree"]) / r["decode"] for r in rows]
            print(f"| {output} | {processes} | {send[0] * 1e3:.1f} / {send[1] * 1e3:.1f} | {decode[0]:.2f} / {decode[1]:.2f} "
                  f"| {gather[0] * 1e3:.1f} / {gather[1] * 1e3:.1f} | {agree[0] * 1e3:.1f} / {agree[1] * 1e3:.1f} "
                  f"| {total[0]:.2f} / {total[1]:.2f} | {min(overhead):.3f} / {float(np.median(overhead)):.3f} |")
    print("\nProtocol alone at production sizes (no model): broadcast of the latents, gather of the uint8 frames\n")
    print("| video | latents MB | send ms, 1 process | send ms, 2 processes | frames MB | gather ms, 1 process "
          "| gather ms, 2 processes | gather MB/s, 2 processes |")
    print("|---|---|---|---|---|---|---|---|")
    for name, latents_shape, frames_shape in PRODUCTION:
        rows = {processes: data["results"][f"protocol:{name}"] for processes, data in slices.items()}
        send_ms = {p: _stat(r, "send", 1e3) for p, r in rows.items()}
        gather_ms = {p: _stat(r, "gather", 1e3) for p, r in rows.items()}
        frames_mb = np.prod(frames_shape) / 1e6
        print(f"| {name} | {np.prod(latents_shape) * 4 / 1e6:.1f} | {send_ms[1][0]:.1f} / {send_ms[1][1]:.1f} "
              f"| {send_ms[2][0]:.1f} / {send_ms[2][1]:.1f} | {frames_mb:.0f} "
              f"| {gather_ms[1][0]:.0f} / {gather_ms[1][1]:.0f} | {gather_ms[2][0]:.0f} / {gather_ms[2][1]:.0f} "
              f"| {frames_mb / (gather_ms[2][1] / 1e3):,.0f} |")
    print(f"\nCPU devices are forced host devices sharing {os.cpu_count()} cores; 2 processes talk over loopback (gloo).")


def main() -> None:
    args = parse_args()
    if args.process_id is not None:
        run_process(args)
        return
    if args.tp % 2:
        raise SystemExit("--tp must be even: it is split over 2 processes")
    with tempfile.TemporaryDirectory() as out:
        slices = {processes: run_slice(args, processes, Path(out)) for processes in (1, 2)}
    report(args, slices)


if __name__ == "__main__":
    main()
