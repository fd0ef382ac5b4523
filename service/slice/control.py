"""A multi-host slice under multi-controller JAX: start-up, the control plane, liveness and stop.

JAX runs a slice of several hosts as one process per host, every process running the same
program; their collectives wait for each other, so every process must make the same device calls
in the same order. Process 0 owns HTTP and sends each call to the others (``service.slice.broadcast``).
This module is everything else about the slice:

* ``initialize`` joins JAX's distributed runtime: explicit coordinator address, process count and
  id, or (``auto``) whatever JAX detects on TPU VMs and GKE.
* ``SliceControl`` is the control plane. It rides on the coordination service that
  ``jax.distributed`` already runs inside process 0: its key-value store carries call doorbells,
  call outcomes, faults, stop requests and the slice's failure; ``get_live_nodes`` says who is alive.
* ``SliceMonitor`` turns a dead follower, a follower's fault or a call that never finishes into
  one failure on process 0, within a bounded time, instead of a hang.
* ``SliceControl.shutdown`` stops the processes in an order in which every one exits 0.

What JAX 0.10.2 does by itself, and why this module changes it (measured on 2 CPU processes, gloo):

* Default: about ``heartbeat_timeout_s`` after a process stops heartbeating, the coordination
  service makes every other process abort (``client.h`` "Terminating process because the JAX
  distributed service detected fatal errors", SIGABRT, exit 134): no 503, no reason on ``/healthz``.
* ``jax_enable_recoverability=True`` (set here): the survivors keep running; ``get_live_nodes`` — a
  barrier over the live processes — returns without the dead one once its heartbeats have timed out.
  The death of process 0 still stops every follower within about a second (the coordination service
  lives in it), which is what we want.
* With recoverability on, ``jax.distributed.shutdown`` no longer waits for the other processes; a
  follower whose coordinator has gone aborts (exit 134). Hence the explicit stop barrier and the
  followers-first order in ``shutdown``.
* The preemption service (on by default) catches SIGTERM; with it, a SIGTERM that arrives before
  the service's own handler is ignored. It is turned off here.
* A CPU (gloo) collective whose peer process dies fails at once ("Connection closed by peer"); one
  whose peer is alive but absent waits indefinitely (observed: 200 s, then completed). Accelerator
  collectives give no such promise, hence the call deadline (``call_timeout_s``).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn

log = logging.getLogger("vaeserve")

PREFIX = "vaeserve/"
EXIT_SLICE_FAILED = 3  # a process that gives up because the slice failed exits with this code


class DistributedError(RuntimeError):
    """The distributed runtime cannot start as asked (missing or contradictory arguments)."""


class SliceFailed(RuntimeError):
    """The slice can no longer run device calls: a process died, failed or diverged."""


@dataclass(frozen=True)
class SliceHooks:
    """What the slice may ask of the server it runs in; both are called from slice threads.

    ``on_failure(reason)``: the slice failed: answer everything in flight with 503 and turn
    unhealthy (the process exits after ``failure_grace_s``). ``stop_server(reason)``: stop this
    process's server as a SIGTERM would (drain, then leave the slice in order)."""

    on_failure: Callable[[str], None]
    stop_server: Callable[[str], None]


# -- start-up ---------------------------------------------------------------------------------------
def initialize(*, coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, auto: bool = False, heartbeat_timeout_s: int = 10,
               initialization_timeout_s: int = 300, cpu_devices: int | None = None) -> SliceControl:
    """Join this process to the slice; call it before anything else touches JAX.

    Args:
      coordinator_address: ``HOST:PORT`` of process 0, where the coordination service listens.
      num_processes, process_id: the slice's size and this process's rank (0 serves HTTP).
      auto: let JAX detect all three (TPU VMs, GKE TPU pods, Slurm); explicit values still win.
      heartbeat_timeout_s: a process silent this long is dead (JAX's default is 100 s).
      initialization_timeout_s: how long to wait for every process to join.
      cpu_devices: fake this many CPU devices in this process (tests; collectives over gloo).
    """
    import jax

    given = {"coordinator_address": coordinator_address, "num_processes": num_processes, "process_id": process_id}
    if not auto and None in given.values():
        missing = sorted(name for name, value in given.items() if value is None)
        raise DistributedError(f"a multi-process slice needs coordinator_address, num_processes and process_id "
                               f"(or auto detection); missing: {', '.join(missing)}")
    if num_processes is not None and process_id is not None and not 0 <= process_id < num_processes:
        raise DistributedError(f"process_id must be in [0, {num_processes}); received {process_id}")
    if cpu_devices:
        jax.config.update("jax_num_cpu_devices", cpu_devices)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # Survive a follower's death long enough to answer 503 and say why (see the module docstring).
    jax.config.update("jax_enable_recoverability", True)
    # JAX's preemption service catches SIGTERM (to agree on a checkpoint step); until the service
    # installs its own handler, a SIGTERM would then be swallowed instead of stopping the process.
    jax.config.update("jax_enable_preemption_service", False)
    jax.distributed.initialize(coordinator_address, num_processes, process_id,
                               initialization_timeout=initialization_timeout_s,
                               heartbeat_timeout_seconds=heartbeat_timeout_s)
    from jax._src import distributed  # the runtime client: its key-value store and liveness barrier

    control = SliceControl(distributed.global_state.client, jax.process_index(), jax.process_count(),
                           heartbeat_timeout_s=heartbeat_timeout_s)
    log.info("process %d of %d joined the slice at %s (%d local, %d global devices)", control.process_id,
             control.num_processes, distributed.global_state.coordinator_address, jax.local_device_count(),
             jax.device_count())
    return control


# -- the control plane ------------------------------------------------------------------------------
def _timed_out(error: Exception) -> bool:
    return "DEADLINE_EXCEEDED" in str(error)


def _not_found(error: Exception) -> bool:
    return "NOT_FOUND" in str(error)


class SliceControl:
    """The slice's control plane: keys under ``vaeserve/`` in JAX's coordination service.

    Keys: ``call/{seq}`` (doorbell), ``outcome/{seq}/{pid}``, ``fault/{pid}``, ``stop/{pid}``
    (stop requests) and ``failed`` (the slice's failure, set by process 0 before it exits). Every
    wait is bounded. The failure is also kept locally; ``on_failure`` listeners hear it once.
    """

    def __init__(self, client: Any, process_id: int, num_processes: int, *, heartbeat_timeout_s: float = 10.0):
        self.client = client
        self.process_id = process_id
        self.num_processes = num_processes
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.failure: str | None = None
        self._failure_lock = threading.Lock()
        self._failed = threading.Event()
        self._listeners: list[Callable[[str], None]] = []

    @property
    def is_leader(self) -> bool:
        return self.process_id == 0

    @property
    def processes(self) -> list[int]:
        return list(range(self.num_processes))

    # -- keys --------------------------------------------------------------------------------
    def _set(self, key: str, value: str) -> None:
        self.client.key_value_set(PREFIX + key, value, allow_overwrite=True)

    def _wait(self, key: str, timeout_s: float) -> str | None:
        """The value of ``key``, waiting up to ``timeout_s``; None if it did not appear."""
        try:
            return self.client.blocking_key_value_get(PREFIX + key, max(1, int(timeout_s * 1000)))
        except Exception as error:  # the runtime raises JaxRuntimeError with a status in the text
            if _timed_out(error):
                return None
            raise

    def _get(self, key: str) -> str | None:
        try:
            return self.client.key_value_try_get(PREFIX + key)
        except Exception as error:
            if _not_found(error):
                return None
            raise

    def _entries(self, directory: str) -> dict[int, str]:
        return {int(key.rsplit("/", 1)[1]): value for key, value in self.client.key_value_dir_get(PREFIX + directory)}

    def _delete(self, key: str) -> None:
        self.client.key_value_delete(PREFIX + key)

    # -- doorbells and outcomes ----------------------------------------------------------------
    def ring(self, seq: int) -> None:
        """Process 0: call ``seq`` is about to be broadcast."""
        self._set(f"call/{seq}", "")

    def wait_ring(self, seq: int, timeout_s: float) -> bool:
        """A follower: wait up to ``timeout_s`` for call ``seq``'s doorbell."""
        return self._wait(f"call/{seq}", timeout_s) is not None

    def report_outcome(self, seq: int, outcome: str) -> None:
        self._set(f"outcome/{seq}/{self.process_id}", outcome)

    def collect_outcomes(self, seq: int, timeout_s: float, poll_s: float = 0.25) -> dict[int, str]:
        """Process 0: every follower's outcome of call ``seq``.

        Raises ``SliceFailed`` as soon as the slice has failed (a follower that died will never
        report) or when ``timeout_s`` passes first. The call's keys are deleted afterwards.
        """
        deadline = time.monotonic() + timeout_s
        outcomes: dict[int, str] = {}
        for pid in self.processes[1:]:
            while pid not in outcomes:
                self.raise_if_failed()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self.fail(f"process {pid} did not finish call {seq} within {timeout_s:.0f} s")
                value = self._wait(f"outcome/{seq}/{pid}", min(poll_s, left))
                if value is not None:
                    outcomes[pid] = value
        self._delete(f"call/{seq}")
        self._delete(f"outcome/{seq}")
        return outcomes

    # -- faults, stop requests, failure ------------------------------------------------------
    def report_fault(self, reason: str) -> None:
        """This process can no longer follow the slice (it exits next)."""
        self._set(f"fault/{self.process_id}", reason)

    def faults(self) -> dict[int, str]:
        return self._entries("fault/")

    def request_stop(self, reason: str) -> None:
        """Ask process 0 to drain and stop the whole slice (a follower's SIGTERM)."""
        self._set(f"stop/{self.process_id}", reason)

    def stop_requests(self) -> dict[int, str]:
        return self._entries("stop/")

    def published_failure(self) -> str | None:
        """The failure process 0 published for the followers, if any."""
        return self._get("failed")

    def on_failure(self, listener: Callable[[str], None]) -> None:
        self._listeners.append(listener)

    def fail(self, reason: str) -> SliceFailed:
        """Record the slice's failure (the first reason wins), tell the listeners, and return the
        exception to raise. On process 0 the failure is also published to the followers."""
        with self._failure_lock:
            first = self.failure is None
            if first:
                self.failure = reason
                self._failed.set()
        if first:
            log.critical("slice failed: %s", reason)
            if self.is_leader:
                try:
                    self._set("failed", reason)
                except Exception:  # the coordination service is part of what may have failed
                    log.exception("could not publish the failure to the followers")
            for listener in self._listeners:
                try:
                    listener(reason)
                except Exception:  # one broken listener must not keep the others (the exit) from running
                    log.exception("slice failure listener %r failed", listener)
        return SliceFailed(self.failure or reason)

    def failed_within(self, timeout_s: float) -> bool:
        """Whether the slice has failed, or fails within ``timeout_s``."""
        return self._failed.wait(timeout_s)

    def raise_if_failed(self) -> None:
        if self.failure is not None:
            raise SliceFailed(self.failure)

    # -- liveness ---------------------------------------------------------------------------
    def live_processes(self) -> set[int]:
        """The processes alive now; a barrier: it returns once every live process has asked."""
        return set(self.client.get_live_nodes(self.processes))

    # -- stop ------------------------------------------------------------------------------
    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Leave the slice so that every process exits 0: all meet at a barrier, the followers
        disconnect, and process 0 (which hosts the coordination service) goes last. Bounded by
        ``timeout_s`` at each step; a process that does not come is logged and left behind."""
        import jax

        try:
            self.client.wait_at_barrier(PREFIX + "shutdown", int(timeout_s * 1000))
        except Exception as error:
            log.warning("not every process reached the stop barrier within %.0f s: %s", timeout_s, error)
        if self.is_leader:
            self._wait_for_followers_to_leave(timeout_s)
        jax.distributed.shutdown()

    def _wait_for_followers_to_leave(self, timeout_s: float) -> None:
        # get_live_nodes has no timeout of its own: ask from a helper thread, and stop waiting.
        gone = threading.Event()

        def poll() -> None:
            while self.live_processes() != {0}:
                time.sleep(0.05)
            gone.set()

        threading.Thread(target=poll, name="vaeserve-followers-gone", daemon=True).start()
        if not gone.wait(timeout_s):
            log.warning("followers still connected after %.0f s; stopping the coordinator anyway", timeout_s)


def exit_on_failure(control: SliceControl, *, grace_s: float = 2.0, code: int = EXIT_SLICE_FAILED) -> None:
    """After a failure, exit this process with ``code``: process 0 once ``grace_s`` has passed
    (time to answer requests in flight with 503, and for the followers to read the failure), a
    follower at once (it answers no requests, and must leave before process 0 takes the
    coordination service down). ``os._exit``: a device thread may be stuck in a collective that
    will never return, and a normal exit would wait for it."""
    delay_s = grace_s if control.is_leader else 0.0

    def schedule(reason: str) -> None:
        def leave() -> None:
            time.sleep(delay_s)
            log.critical("exiting with code %d: %s", code, reason)
            exit_process(code)

        threading.Thread(target=leave, name="vaeserve-exit", daemon=True).start()

    control.on_failure(schedule)


def wait_for_exit(timeout_s: float = 60.0) -> NoReturn:
    """Park a thread that has nothing left to do after a failure until ``exit_on_failure`` ends
    the process. Returning instead would run the normal exit, which stops the coordination
    service at once (on process 0), before the followers have read why."""
    time.sleep(timeout_s)
    exit_process(EXIT_SLICE_FAILED)


def exit_process(code: int) -> NoReturn:
    """End a slice process without the interpreter's teardown. After leaving the slice, the
    finalisers that teardown's garbage collection runs for JAX's distributed runtime can block for
    good (seen in CI: process 0 still running 90 s after uvicorn's "Finished server process", its
    main thread in "Garbage-collecting"), and the exit guard's daemon thread is frozen by then.
    Call it once this process has left the slice (``SliceControl.shutdown``): nothing is lost then."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# -- the monitor ------------------------------------------------------------------------------------
class SliceMonitor:
    """Watches the slice from every process.

    Every process runs a liveness thread: rounds of ``get_live_nodes`` (a barrier, so all
    processes keep calling it). On process 0 a missing process fails the slice; on a follower
    the failure process 0 published is read and adopted. Process 0 also runs a watchdog: a
    follower's fault fails the slice, a stop request is handed to ``on_stop_request`` (once per
    process), and a call running longer than ``call_timeout_s`` fails the slice.

    A dead follower is therefore noticed within ``heartbeat_timeout_s + interval_s``.
    """

    def __init__(self, control: SliceControl, *, interval_s: float = 1.0, call_timeout_s: float = 600.0,
                 on_stop_request: Callable[[int, str], None] | None = None):
        self.control = control
        self.interval_s = interval_s
        self.call_timeout_s = call_timeout_s
        self.on_stop_request = on_stop_request
        self._stopping = threading.Event()
        self._busy: tuple[int, str, float] | None = None  # (seq, op, started) of the call in flight
        self._stops_seen: set[int] = set()
        self._threads: list[threading.Thread] = []

    def start(self) -> SliceMonitor:
        targets = [self._liveness] + ([self._watchdog] if self.control.is_leader else [])
        for target in targets:
            thread = threading.Thread(target=target, name=f"vaeserve-{target.__name__.strip('_')}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop watching (before a clean shutdown). A liveness round in progress ends when the
        other processes also stop or leave; the threads are daemons, so a late one never blocks exit."""
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout_s)

    @property
    def detection_s(self) -> float:
        """How long the liveness thread may take to notice a dead process."""
        return self.control.heartbeat_timeout_s + 2 * self.interval_s

    @contextmanager
    def call(self, seq: int, op: str) -> Iterator[None]:
        """Mark call ``seq`` in flight on process 0, for the deadline."""
        self._busy = (seq, op, time.monotonic())
        try:
            yield
        finally:
            self._busy = None

    def _liveness(self) -> None:
        control = self.control
        while not self._stopping.is_set():
            try:
                live = control.live_processes()
                failure = None if control.is_leader else control.published_failure()
            except Exception as error:
                if not self._stopping.is_set():
                    log.error("liveness check failed: %s", error)
                return
            missing = sorted(set(control.processes) - live)
            if self._stopping.is_set():
                return
            if missing and control.is_leader:
                control.fail(f"process {', '.join(map(str, missing))} stopped sending heartbeats "
                             "(dead, killed or unreachable)")
            elif failure is not None:
                control.fail(f"process 0 reported: {failure}")
            self._stopping.wait(self.interval_s)

    def _watchdog(self) -> None:
        control = self.control
        while not self._stopping.wait(self.interval_s):
            try:
                faults = control.faults()
                stops = control.stop_requests()
            except Exception as error:
                log.error("slice watchdog could not read the control plane: %s", error)
                continue
            for pid, reason in sorted(faults.items()):
                control.fail(f"process {pid} failed: {reason}")
            for pid, reason in sorted(stops.items()):
                if pid not in self._stops_seen:
                    self._stops_seen.add(pid)
                    log.warning("process %d asks the slice to stop (%s)", pid, reason)
                    if self.on_stop_request is not None:
                        self.on_stop_request(pid, reason)
            busy = self._busy
            if busy is not None and time.monotonic() - busy[2] > self.call_timeout_s:
                control.fail(f"call {busy[0]} ({busy[1]}) did not finish on the slice within "
                             f"{self.call_timeout_s:.0f} s")
