"""One process of a 2-process test slice (2 CPU devices each, gloo collectives).

``python -m tests.helpers.slice_process SCENARIO --process-id I --port P --out DIR``, run from the
repository root. Every process builds the same tiny model and the same handler table (two ``DeviceRunner``s: tp = 4
across both processes, and tp = 2 x dp = 2 with one replica per process), then process 0 drives
SCENARIO while the follower runs ``broadcast.follow``:

* ``parity``: decodes (uint8, float, stream) on both meshes, a stream abandoned after its first
  step, a call that raises on every process, a negative control without halos, and an encode at
  tp = 4 through the service's own handler (rows with different posterior options); saves
  ``DIR/slice.npz`` and ``DIR/report.json``; stops the slice; every process exits 0.
* ``idle``: waits, ready at once, for the follower to be killed; exits 3 (slice failed).
* ``busy``: all-gathers across the processes in a loop until the follower is killed mid-call; exits 3.
* ``sigterm``: serves until a follower's stop request arrives (SIGTERM), then stops the slice.
* ``diverge``: one call that fails on the follower only; both processes exit 3.

Each process writes ``DIR/ready{I}`` when the test may act (its signal handler installed; process 0
after the first call for ``busy``).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from vaeserve.service.engine.jobs import EncodeOptions
from vaeserve.service.slice.control import (
    SliceFailed,
    SliceMonitor,
    exit_on_failure,
    exit_process,
    initialize,
    wait_for_exit,
)

# The smallest Wan-shaped decoder (one up stage, 2x in space and time): compiles dominate these tests.
MICRO = dict(base_dim=8, num_res_blocks=0, dim_mult=(1, 2), temperal_downsample=(True,), scale_factor_spatial=2,
             scale_factor_temporal=2)
SHAPE = (2, 16, 3, 8, 4)  # B=2 (one per dp replica), T=3 (frame 0, then the scan), H=8: 2 rows per band at tp=4
# Failure detection in the fault scenarios: heartbeat timeout + monitor interval, then process 0's
# grace before it exits. The parity slice is not timed, and is given a longer heartbeat.
FAULT_HEARTBEAT_S, PARITY_HEARTBEAT_S = 3, 10
INTERVAL_S, GRACE_S = 0.5, 1.5


def micro_vae():
    """The MICRO decoder with seeded NumPy weights (perturbed gammas and biases): built in well
    under a second, where ``init_vae``'s one small compile per initializer took ~20 s here."""
    from tests.helpers.wan_reference import seeded_decoder_weights
    from vaeserve import models
    from vaeserve.models.loading import build_vae

    config = models.WanVAEConfig(**MICRO)
    return build_vae(config, seeded_decoder_weights(config, seed=7), dtype="float32", metadata={"source": "seed 7"})


def micro_encoder_vae():
    """MICRO with one residual block per stage (the encoder needs them to widen its stages), decoder
    and encoder seeded: for the encode call."""
    from tests.helpers.wan_reference import seeded_vae_weights
    from vaeserve import models
    from vaeserve.models.loading import build_vae

    config = models.WanVAEConfig(**{**MICRO, "num_res_blocks": 1})
    return build_vae(config, seeded_vae_weights(config, seed=7), dtype="float32", metadata={"source": "seed 7"})


def slice_latents(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)


def slice_frames() -> tuple[np.ndarray, list[tuple[EncodeOptions, int]]]:
    """Frames for the MICRO encoder, (2, 3, 5, 16, 8) -> latents (2, 16, 3, 8, 4) (2 rows per band at
    tp = 4), as two one-row requests: row 0 sampled with seed 3, row 1 normalized."""
    frames = np.random.default_rng(1).uniform(-1, 1, (2, 3, 5, 16, 8)).astype(np.float32)
    return frames, [(EncodeOptions(sample=True, seed=3), 1), (EncodeOptions(normalize=True), 1)]


def build_handlers(vae, runners, encode_runner) -> dict[str, Callable[..., Any]]:
    from vaeserve import sharding
    from vaeserve.service.slice.member import runner_handlers
    from vaeserve.sharding._controls import decode_with

    handlers: dict[str, Callable[..., Any]] = {}
    for name, runner in runners.items():
        handlers[f"{name}.decode"] = lambda z, runner=runner, **options: runner.decode(z, **options).frames
        handlers[f"{name}.stream"] = lambda z, runner=runner: (step.frames for step in runner.decode_stream(z))
    # Negative control: the same tp=4 decode without halo exchange (bands decoded independently).
    no_halo = functools.partial(decode_with, "none", vae, mesh=runners["tp4"].mesh)
    handlers["tp4.decode_no_halo"] = lambda z: sharding.to_host(no_halo(z))
    handlers["tp4.encode"] = runner_handlers(encode_runner)["encode"]  # the service's own table
    handlers["diverge"] = _fail_on_followers
    handlers["collectives"] = _collectives
    return handlers


def _collectives(array) -> None:
    """100 cross-process all-gathers back to back: a call that is inside device collectives most of
    the time and compiles in well under a second (unlike a decode). A fixed count, not a time: every
    process must make the same collectives (a timed loop diverges and hangs)."""
    from jax.experimental import multihost_utils

    for _ in range(100):
        multihost_utils.process_allgather(np.ones(1 << 16, np.float32))


def _fail_on_followers(array) -> None:
    import jax

    if jax.process_index() != 0:
        raise RuntimeError("a fault on this process only")


def drive_parity(leader, out: Path) -> None:
    z = slice_latents()
    arrays, report = {}, {}
    for mesh in ("tp4", "tp2dp2"):
        arrays[f"{mesh}_uint8"] = leader.call(f"{mesh}.decode", z, output="uint8")
        arrays[f"{mesh}_float"] = leader.call(f"{mesh}.decode", z, output="float")
    arrays["tp4_stream"] = np.concatenate(list(leader.stream("tp4.stream", z)), axis=1)
    # A consumer that stops after the first step: the slice must stay in step for the next call.
    steps = leader.stream("tp4.stream", z)
    next(steps)
    steps.close()
    arrays["after_abandoned_stream"] = leader.call("tp4.decode", z, output="uint8")
    # The same error on every process (16 latent channels expected) leaves the slice usable.
    try:
        leader.call("tp4.decode", z[:, :15], output="uint8")
    except Exception as error:
        report["bad_call_error"] = type(error).__name__
    arrays["after_error"] = leader.call("tp4.decode", z, output="float")
    arrays["no_halo"] = leader.call("tp4.decode_no_halo", z)
    frames, requests = slice_frames()
    arrays["tp4_encode"] = leader.call("tp4.encode", frames, requests=requests)  # travels as JSON lists
    np.savez(out / "slice.npz", **arrays)
    (out / "report.json").write_text(json.dumps(report))


def drive_faults(leader, scenario: str, out: Path, stop_requested: threading.Event) -> None:
    if scenario == "busy":
        leader.call("collectives")
    (out / "ready0").touch()
    if scenario == "diverge":
        leader.call("diverge")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not stop_requested.is_set():
        if scenario == "busy":
            leader.call("collectives")
        else:
            time.sleep(0.05)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=["parity", "idle", "busy", "sigterm", "diverge"])
    parser.add_argument("--process-id", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s p{args.process_id} %(levelname)s %(message)s")

    control = initialize(coordinator_address=f"127.0.0.1:{args.port}", num_processes=2, process_id=args.process_id,
                         heartbeat_timeout_s=PARITY_HEARTBEAT_S if args.scenario == "parity" else FAULT_HEARTBEAT_S,
                         initialization_timeout_s=60, cpu_devices=2)
    exit_on_failure(control, grace_s=GRACE_S)
    stop_requested = threading.Event()
    monitor = SliceMonitor(control, interval_s=INTERVAL_S, call_timeout_s=120,
                           on_stop_request=lambda pid, reason: stop_requested.set()).start()

    from vaeserve import sharding
    from vaeserve.service.engine.runner import DeviceRunner
    from vaeserve.service.slice.broadcast import Channel, Leader, follow

    vae = micro_vae()
    runners = {"tp4": DeviceRunner(vae, sharding.make_mesh(4), max_batch=2, dp=1),
               "tp2dp2": DeviceRunner(vae, sharding.make_mesh(2, dp=2), max_batch=2, dp=2)}
    encode_runner = DeviceRunner(micro_encoder_vae(), sharding.make_mesh(4), max_batch=2, dp=1)
    handlers = build_handlers(vae, runners, encode_runner)
    channel = Channel(control, poll_s=0.25)
    try:
        if control.is_leader:
            leader = Leader(channel, monitor, handlers)
            if args.scenario == "parity":
                drive_parity(leader, args.out)
            else:
                drive_faults(leader, args.scenario, args.out, stop_requested)
            leader.stop()
        else:
            signal.signal(signal.SIGTERM, lambda signum, frame: control.request_stop("SIGTERM"))
            (args.out / f"ready{control.process_id}").touch()
            follow(channel, handlers)
    except SliceFailed as failure:
        logging.critical("the slice failed: %s", failure)
        wait_for_exit()
    monitor.stop()
    control.shutdown(timeout_s=20)
    return 0


if __name__ == "__main__":
    exit_process(main())
