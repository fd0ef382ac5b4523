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

import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..engine.errors import Unavailable
from ..engine.model import DEVICE_CALLS, ModelState
from ..engine.runner import DeviceRunner
from ..settings import Settings
from .broadcast import Channel, Handler, Leader, follow
from .control import SliceControl, SliceFailed, SliceHooks, SliceMonitor, exit_on_failure, exit_process, initialize

log = logging.getLogger("vaeserve")

# After leaving the slice, a process still running this long is ended (exit 0).
EXIT_GUARD_S = 15.0


def _array_parameter(method: Callable[..., Any]) -> str | None:
    """The parameter of a runner method that carries its host array (``latents``, ``frames``), if any."""
    for name, parameter in inspect.signature(method).parameters.items():
        if parameter.annotation in (np.ndarray, "np.ndarray"):
            return name
    return None


def runner_handlers(runner: DeviceRunner) -> dict[str, Handler]:
    """The runner's device calls (``DEVICE_CALLS``) as call handlers, ``handler(array, **options)``:
    the same table on every process."""

    def handler(method: Callable[..., Any]) -> Handler:
        carrier = _array_parameter(method)
        return lambda array, **options: method(**options, **({carrier: array} if carrier else {}))

    return {name: handler(getattr(runner, name)) for name in DEVICE_CALLS}


@contextmanager
def _unavailable_when_failed() -> Iterator[None]:
    """A failed slice answers ``Unavailable`` (503), not a device error (500): the request was
    fine, the service is not."""
    try:
        yield
    except SliceFailed as failure:
        raise Unavailable(f"the multi-host slice failed: {failure}") from failure


class SliceRunner:
    """Process 0's runner: ``DeviceRunner``'s interface; each of its device calls
    (``DEVICE_CALLS``) is made on every process, the reads of the program cache here only.
    Seeds were resolved on process 0 (when the requests arrived), so every process draws the same
    noise; the programs a compile returns are process 0's (for the memory check)."""

    # A stream is one call on the followers, run to its end before the next call: process 0 may
    # not slip another call between its steps.
    interleaves_streams = False

    def __init__(self, runner: DeviceRunner, leader: Leader):
        self._runner = runner
        self._leader = leader
        self.vae, self.mesh, self.buckets = runner.vae, runner.mesh, runner.buckets

    def __getattr__(self, name: str) -> Any:
        if name not in DEVICE_CALLS:
            return getattr(self._runner, name)
        method = getattr(self._runner, name)
        signature, carrier = inspect.signature(method), _array_parameter(method)

        def send(*args: Any, **kwargs: Any) -> Any:
            options = dict(signature.bind(*args, **kwargs).arguments)
            array = options.pop(carrier) if carrier else None
            if inspect.isgeneratorfunction(method):
                return self._stream(name, array, options)
            with _unavailable_when_failed():
                return self._leader.call(name, array, **options)
        return send

    def _stream(self, name: str, array: np.ndarray | None, options: dict[str, Any]) -> Iterator[Any]:
        steps = self._leader.stream(name, array, **options)
        try:
            with _unavailable_when_failed():
                yield from steps
        finally:
            steps.close()  # a reader that left: the remaining steps still run on every process


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
