"""One thread owns the devices; requests wait for it in a bounded queue.

The event loop (route handlers) only ever calls :meth:`Worker.reserve` and :meth:`Worker.submit`;
the worker thread runs the start-up (load + warm-up, :mod:`service.engine.startup`), then loops: take the
oldest live job plus every queued job that can share its program (same operation, input shape,
output and stream flag, up to ``max_batch`` inputs), run them as one batch through the runner,
and hand each job its slice back on its own event loop.

Jobs whose client went away or whose deadline passed while queued are dropped before they cost
device time.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from models.shapes import Output

from ..metrics import Metrics
from .errors import DeadlineExceeded, DeviceFailed, EngineError, NonFiniteOutput, QueueFull, Unavailable
from .jobs import STREAM_END, Job, JobResult
from .model import ModelState, Runner

log = logging.getLogger("vaeserve")

class Ticket:
    """A queue slot reserved before the request body is read (so a full queue answers 429 without
    buffering the body). :meth:`Worker.submit` spends it; :meth:`release` returns an unspent one."""

    def __init__(self, worker: Worker):
        self._worker: Worker | None = worker

    def release(self) -> None:
        if self._worker is not None:
            self._worker._release()
            self._worker = None

    def spend(self) -> Worker:
        if self._worker is None:
            raise RuntimeError("queue ticket used twice")
        worker, self._worker = self._worker, None
        return worker


def _frames(out: np.ndarray, output: Output) -> int:
    """Output frames in a decode result: uint8 ``(B, F, H, W, 3)`` or float ``(B, 3, F, H, W)``."""
    return out.shape[0] * out.shape[1 if output == "uint8" else 2]


class Worker:
    """Device owner thread. Runs ``startup()`` (load + warm-up), then serves the queue until
    :meth:`stop`. ``on_ready`` / ``on_failed`` are called from the worker thread."""

    def __init__(self, *, startup: Callable[[], ModelState], metrics: Metrics, max_queue: int, max_batch: int,
                 on_ready: Callable[[ModelState], None], on_failed: Callable[[str], None]):
        self._startup = startup
        self._on_ready = on_ready
        self._on_failed = on_failed
        self.metrics = metrics
        self.max_queue = max_queue
        self.max_batch = max_batch
        self._runner: Runner | None = None
        self.model: ModelState | None = None  # what start-up produced, once it has
        self._batch: list[Job] = []  # the jobs on the device now
        self._accepting = True  # False once stop() begins: no new reservations
        self._running = True  # False once the queue is drained or the drain timed out
        self._reserved = 0  # tickets handed out and not yet spent or released
        self._busy = False  # a batch is on the device (stop() waits for it)
        self._queue: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._main, name="vaeserve-device", daemon=True)

    # ---- event-loop side -----------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def reserve(self) -> Ticket:
        """A queue slot; ``QueueFull`` when ``max_queue`` requests already wait (or are being read)."""
        with self._cond:
            if not self._accepting:
                raise Unavailable("service is draining")
            waiting = len(self._queue) + self._reserved
            if waiting >= self.max_queue:
                self._purge_abandoned()
                waiting = len(self._queue) + self._reserved
            if waiting >= self.max_queue:
                raise QueueFull(waiting, self.max_queue)
            self._reserved += 1
            self._publish_depth()
        return Ticket(self)

    def submit(self, job: Job, ticket: Ticket) -> None:
        ticket.spend()
        with self._cond:
            self._reserved -= 1
            if not self._accepting:
                self._publish_depth()
                raise Unavailable("service is draining")
            self._queue.append(job)
            self._publish_depth()
            self._cond.notify()

    def _release(self) -> None:
        with self._cond:
            self._reserved -= 1
            self._publish_depth()

    def stop(self, timeout: float) -> None:
        """Drain: take no new work, finish what is queued and running (up to ``timeout`` seconds),
        then fail what is left (``Unavailable``) and stop the thread."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._accepting = False
            while self._thread.is_alive() and (self._queue or self._busy) and time.monotonic() < deadline:
                self._cond.wait(max(0.0, deadline - time.monotonic()))
            self._running = False
            leftover = list(self._queue)
            self._queue.clear()
            self._publish_depth()
            self._cond.notify_all()
        for job in leftover:
            job.fail(Unavailable("service is shutting down"))
        self._thread.join(max(0.0, deadline - time.monotonic()))

    def abort(self, error: EngineError) -> None:
        """Answer every queued job and the batch on the device with ``error`` at once, and take
        no more work: the devices can no longer be trusted (a multi-host slice failed). The
        device thread may stay blocked; whatever it delivers later is ignored (first answer wins)."""
        with self._cond:
            self._accepting = self._running = False
            doomed = list(self._queue) + list(self._batch)
            self._queue.clear()
            self._publish_depth()
            self._cond.notify_all()
        for job in doomed:
            job.fail(error)

    @property
    def alive(self) -> bool:
        """The device thread is still running (e.g. stuck in a call after a drain timed out)."""
        return self._thread.is_alive()

    def _publish_depth(self) -> None:
        self.metrics.queue_depth.set(len(self._queue) + self._reserved)

    def _purge_abandoned(self) -> None:
        """Free the slots of jobs whose handler gave up (client gone, deadline) (lock held), so
        that abandoned requests do not turn live ones away with 429 while a long batch runs."""
        for job in self._queue:
            if job.cancelled:
                self.metrics.dropped.labels(job.cancel_reason).inc()
        self._queue = collections.deque(job for job in self._queue if not job.cancelled)

    # ---- worker-thread side --------------------------------------------------------------

    def _main(self) -> None:
        try:
            model = self._startup()
        except Exception as exc:  # report through /healthz and /readyz instead of dying silently
            log.exception("model load or warm-up failed")
            self._on_failed(f"model load failed: {type(exc).__name__}: {exc}")
            return
        with self._cond:
            if not self._running:  # stopped while loading
                return
        self._runner, self.model = model.runner, model
        self.metrics.ready.set(1)
        self._on_ready(model)
        if model.cluster is not None and not model.cluster.is_leader:
            model.cluster.follow()  # a follower of a multi-host slice: process 0's calls replace the queue
            return
        while True:
            with self._cond:
                while not self._queue and self._running:
                    self._cond.wait()
                if not self._running:
                    break
                batch = self._batch = self._take_batch()
                self._busy = bool(batch)
                self._publish_depth()
            if batch:
                self._run(batch)
            with self._cond:
                self._busy, self._batch = False, []
                self._cond.notify_all()  # stop() waits for an empty queue and an idle device
        self.metrics.ready.set(0)

    def _live(self, job: Job, now: float) -> bool:
        if job.cancelled:
            self.metrics.dropped.labels(job.cancel_reason).inc()
            return False
        if now > job.deadline:
            self.metrics.dropped.labels("deadline").inc()
            job.fail(DeadlineExceeded("the request waited past its deadline in the queue"))
            return False
        return True

    def _take_batch(self) -> list[Job]:
        """Pop the oldest live job and the queued jobs that can share its program (lock held)."""
        now = time.monotonic()
        while self._queue:
            head = self._queue.popleft()
            if self._live(head, now):
                break
        else:
            return []
        batch, size = [head], head.size
        if head.stream:  # streams run alone, step by step
            return batch
        for job in list(self._queue):
            if job.key == head.key and size + job.size <= self.max_batch:
                self._queue.remove(job)
                if self._live(job, now):
                    batch.append(job)
                    size += job.size
        return batch

    def _run(self, batch: list[Job]) -> None:
        start = time.monotonic()
        for job in batch:
            job.started = start
            self.metrics.queue_seconds.observe(start - job.arrived)
        size = sum(job.size for job in batch)
        self.metrics.batch_size.observe(size)
        try:
            if batch[0].stream:
                self._run_stream(batch[0])
                return
            out, nonfinite = self._execute(batch)
        except Exception as exc:
            self._fail(batch, exc)
            return
        device_s = time.monotonic() - start
        self._account(batch, out, device_s)
        offset = 0
        for job in batch:
            rows = slice(offset, offset + job.size)
            bad = int(nonfinite[rows].sum())
            job.resolve(NonFiniteOutput(bad) if bad else JobResult(out[rows], start - job.arrived, device_s, size))
            offset += job.size

    def _execute(self, batch: list[Job]) -> tuple[np.ndarray, np.ndarray]:
        """The one device call of a batch, by operation: host arrays in, the host array out and its
        per-row non-finite count (encodes: none counted)."""
        assert self._runner is not None
        # A batch of one runs on its own inputs: a copy would double the host memory of a large encode.
        inputs = batch[0].inputs if len(batch) == 1 else np.concatenate([job.inputs for job in batch], axis=0)
        head = batch[0]
        if head.operation == "decode":
            return self._runner.decode(inputs, output=head.output)
        requests = [(job.encode, job.size) for job in batch if job.encode is not None]
        return self._runner.encode(inputs, requests), np.zeros(len(inputs), np.int32)

    def _account(self, batch: list[Job], out: np.ndarray, seconds: float) -> None:
        operation = batch[0].operation
        self.metrics.device_seconds.labels(operation).observe(seconds)
        if operation == "encode":
            self.metrics.frames_encoded.inc(sum(job.size * job.inputs.shape[2] for job in batch))
        else:
            self.metrics.frames_decoded.inc(_frames(out, batch[0].output))

    def _steps(self, job: Job) -> Iterator[Any]:
        assert self._runner is not None
        if job.operation == "decode":
            return self._runner.decode_stream(job.inputs)
        raise ValueError(f"operation {job.operation!r} does not stream")

    def _run_stream(self, job: Job) -> None:
        start = time.monotonic()
        for chunk, nonfinite in self._steps(job):
            self.metrics.frames_decoded.inc(_frames(chunk, job.output))
            if job.cancelled:  # the reader left: stop spending device time on it
                self.metrics.dropped.labels(job.cancel_reason).inc()
                break
            bad = int(nonfinite.sum())
            if bad:  # the status line is gone: the error goes in-band, and the stream ends
                job.push(NonFiniteOutput(bad))
                break
            job.push(chunk)
        self.metrics.device_seconds.labels(job.operation).observe(time.monotonic() - start)
        job.push(STREAM_END)

    def _fail(self, batch: list[Job], exc: Exception) -> None:
        log.error("device error on batch %s: %r", [j.request_id for j in batch], exc, exc_info=exc)
        # A runner may choose the answer itself (a failed multi-host slice: Unavailable).
        error = exc if isinstance(exc, EngineError) else DeviceFailed(batch[0].operation, exc)
        for job in batch:
            job.fail(error)
