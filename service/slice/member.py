"""The service on a multi-host slice: join it, send process 0's device calls to every process.

Every process runs ``vaeserve serve`` with the same model and settings plus its place in the slice
(``--coordinator-address --num-processes --process-id``, or ``--distributed auto``). The start-up
(:mod:`service.engine.startup`, with the ``join`` of :mod:`service.slice.boot`) joins the slice
before JAX starts, loads the model and builds the mesh over every process's devices, then:

* process 0 wraps its ``DeviceRunner`` in a :class:`SliceRunner`: the worker, the warm-up and the
  routes see the usual runner, and each call (decode, stream, encode, compile) is sent to every process
  first (:class:`service.slice.broadcast.Leader`);
* every other process *follows*: its worker thread makes each call it receives with the same
  runner, and its HTTP server answers only the probes (``/healthz``, ``/readyz``) so an
  orchestrator can watch every host.

Stop: SIGTERM on process 0 drains its queue, then sends STOP; a follower receiving STOP stops its
own server (``SliceHooks.stop_server``), and all leave the slice together (exit 0). SIGTERM on a
follower asks process 0 to do exactly that (process 0 then stops its own server the same way). Failure: a dead, failed or diverged process, or a call past ``call_timeout_s``,
turns process 0's ``/healthz`` to 503 with the reason, answers requests in flight with 503, and
exits 3 after ``failure_grace_s``; followers exit 3 (or, when process 0 is gone, are stopped by JAX).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from models.shapes import Output
from sharding import Decoded

from ..engine.errors import Unavailable
from ..engine.jobs import EncodeOptions
from ..engine.model import CompiledPrograms, ModelState
from ..engine.runner import DeviceRunner
from ..settings import Settings
from .broadcast import Channel, Handler, Leader, follow
from .control import SliceControl, SliceFailed, SliceHooks, SliceMonitor, exit_on_failure, exit_process, initialize

log = logging.getLogger("vaeserve")

# After leaving the slice, a process still running this long is ended (exit 0).
EXIT_GUARD_S = 15.0


def requests_to_json(requests: Sequence[tuple[EncodeOptions, int]]) -> list[list]:
    """An encode batch's ``(options, rows)`` as JSON values, to send them to every process."""
    return [[options.sample, options.seed, options.normalize, rows] for options, rows in requests]


def requests_from_json(rows: list[list]) -> list[tuple[EncodeOptions, int]]:
    return [(EncodeOptions(sample=bool(sample), seed=int(seed), normalize=bool(normalize)), int(n))
            for sample, seed, normalize, n in rows]


def runner_handlers(runner: DeviceRunner) -> dict[str, Handler]:
    """The runner's operations as call handlers, the same table on every process."""
    return {
        "decode": lambda latents, output, framewise: runner.decode(latents, output=output, framewise=framewise),
        "decode_stream": lambda latents, framewise: runner.decode_stream(latents, framewise=framewise),
        "compile": lambda _, shape, output, stream, framewise: runner.compile(tuple(shape), output=output, stream=stream,
                                                                             framewise=framewise),
        "encode": lambda frames, requests: runner.encode(frames, requests_from_json(requests)),
        "compile_encode": lambda _, shape: runner.compile_encode(tuple(shape)),
    }


@contextmanager
def _unavailable_when_failed() -> Iterator[None]:
    """A failed slice answers ``Unavailable`` (503), not a device error (500): the request was
    fine, the service is not."""
    try:
        yield
    except SliceFailed as failure:
        raise Unavailable(f"the multi-host slice failed: {failure}") from failure


class SliceRunner:
    """Process 0's runner: ``DeviceRunner``'s interface, every call made on every process."""

    # A stream is one call on the followers, run to its end before the next call: process 0 may
    # not slip another call between its steps.
    interleaves_streams = False

    def __init__(self, runner: DeviceRunner, leader: Leader):
        self._runner = runner
        self._leader = leader
        self.vae, self.mesh, self.buckets = runner.vae, runner.mesh, runner.buckets

    def decode(self, latents: np.ndarray, *, output: Output = "uint8", framewise: bool = False) -> Decoded:
        with _unavailable_when_failed():
            return self._leader.call("decode", latents, output=output, framewise=framewise)

    def decode_stream(self, latents: np.ndarray, *, framewise: bool = False) -> Iterator[Decoded]:
        steps = self._leader.stream("decode_stream", latents, framewise=framewise)
        try:
            with _unavailable_when_failed():
                yield from steps
        finally:
            steps.close()  # a reader that left: the remaining steps still run on every process

    def compile(self, shape: tuple[int, ...], *, output: Output, stream: bool, framewise: bool = False) -> CompiledPrograms:
        """Every process compiles; process 0's programs are returned (for the memory check)."""
        with _unavailable_when_failed():
            return self._leader.call("compile", None, shape=list(shape), output=output, stream=stream,
                                     framewise=framewise)

    def encode(self, frames: np.ndarray, requests: Sequence[tuple[EncodeOptions, int]]) -> np.ndarray:
        """Seeds were resolved on process 0 (when the requests arrived), so every process draws the same noise."""
        with _unavailable_when_failed():
            return self._leader.call("encode", frames, requests=requests_to_json(requests))

    def compile_encode(self, shape: tuple[int, ...]) -> CompiledPrograms:
        with _unavailable_when_failed():
            return self._leader.call("compile_encode", None, shape=list(shape))

    def programs(self) -> list[list]:
        return self._runner.programs()

    def program_memory(self) -> list[dict[str, Any]]:
        return self._runner.program_memory()


@dataclass
class SliceMember:
    """This process's part in the slice, kept in ``ModelState.cluster`` (the engine's ``Cluster``)."""

    control: SliceControl
    monitor: SliceMonitor
    channel: Channel
    handlers: dict[str, Handler]
    leader: Leader | None  # process 0 only
    hooks: SliceHooks

    stop_requested: bool = False  # a follower asked process 0 to stop the slice (its own SIGTERM)
    stopped: bool = False  # a follower received STOP

    @property
    def is_leader(self) -> bool:
        return self.control.is_leader

    @property
    def process_id(self) -> int:
        return self.control.process_id

    @property
    def num_processes(self) -> int:
        return self.control.num_processes

    def follow(self) -> None:
        """A follower's device loop (in the worker thread) until process 0 sends STOP; then this
        process's server stops as on SIGTERM (unless a SIGTERM already is stopping it), and its
        lifespan leaves the slice."""
        try:
            follow(self.channel, self.handlers)
        except SliceFailed as failure:
            log.critical("process %d stops following: %s", self.control.process_id, failure)
            return
        self.stopped = True
        if not self.stop_requested:
            self.hooks.stop_server("process 0 stopped the slice")

    def request_stop(self, reason: str) -> None:
        """A follower's SIGTERM: ask process 0 to stop the slice; keep following until it does."""
        if not self.is_leader and not self.stopped and not self.stop_requested:
            self.stop_requested = True
            self.control.request_stop(reason)

    def leave(self, device_idle: bool) -> None:
        """After the drain: process 0 sends STOP (only if the slice is healthy and its device
        thread is idle: a STOP interleaved with a call would hang both); then every process
        leaves the slice in order (``SliceControl.shutdown``)."""
        if self.control.failure is not None:
            return  # exit_on_failure ends the process
        if self.leader is not None:
            if not device_idle:
                raise self.control.fail("the device thread did not finish within the drain time")
            self.leader.stop()
        self.monitor.stop()
        self.control.shutdown()
        _exit_if_still_running(EXIT_GUARD_S)


def _exit_if_still_running(after_s: float) -> None:
    """Once the slice is left, the process must end: exit 0 anyway if it is still running after
    ``after_s`` (uvicorn's own shutdown stuck). Only while Python still runs: once the interpreter
    tears down, daemon threads are frozen; ``distributed.exit_process`` keeps a slice process out of
    teardown."""

    def guard() -> None:
        time.sleep(after_s)
        log.error("still running %.0f s after leaving the slice: exiting now", after_s)
        exit_process(0)

    threading.Thread(target=guard, name="vaeserve-exit-guard", daemon=True).start()


def _stop_once(hooks: SliceHooks) -> Callable[[int, str], None]:
    """Process 0's answer to the first follower that asks the slice to stop: stop its own server,
    the same path as an orchestrator's SIGTERM (drain, STOP, leave). Later asks are already served."""
    asked = threading.Event()

    def stop(process_id: int, reason: str) -> None:
        if not asked.is_set():
            asked.set()
            log.warning("stopping the slice for process %d: draining first", process_id)
            hooks.stop_server(f"process {process_id} asked the slice to stop ({reason})")
    return stop


def join_slice(settings: Settings) -> SliceControl:
    """Join the slice the settings describe (before anything starts JAX's backend)."""
    return initialize(coordinator_address=settings.coordinator_address, num_processes=settings.num_processes,
                      process_id=settings.process_id, auto=settings.distributed == "auto",
                      heartbeat_timeout_s=settings.heartbeat_timeout_s)


def attach_slice(model: ModelState, control: SliceControl, settings: Settings, hooks: SliceHooks) -> ModelState:
    """Give the loaded model its place in the slice: monitor, exit on failure, and on process 0 a
    ``SliceRunner`` in place of the runner. ``hooks.on_failure(reason)`` is called once, from a
    monitor or device thread, when the slice fails."""
    control.on_failure(hooks.on_failure)
    exit_on_failure(control, grace_s=settings.failure_grace_s)
    monitor = SliceMonitor(control, call_timeout_s=settings.call_timeout_s, on_stop_request=_stop_once(hooks)).start()
    channel = Channel(control)
    assert isinstance(model.runner, DeviceRunner), "a slice wraps the device runner of this process"
    handlers = runner_handlers(model.runner)
    leader = Leader(channel, monitor, handlers) if control.is_leader else None
    member = SliceMember(control, monitor, channel, handlers, leader, hooks)
    if leader is None:
        return replace(model, cluster=member)
    return replace(model, runner=SliceRunner(model.runner, leader), cluster=member)
