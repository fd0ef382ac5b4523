"""One thread owns the devices; requests wait for it in a bounded queue.

The event loop (route handlers) only ever calls :meth:`Worker.reserve` and :meth:`Worker.submit`;
the worker thread runs the start-up (load + warm-up, :mod:`service.loading`), then loops: take the
oldest live job plus every queued job that can share its program (same operation, input shape,
output and stream flag, up to ``max_batch`` inputs), run them as one batch through the runner,
and hand each job its slice back on its own event loop.

Jobs whose client went away or whose deadline passed while queued are dropped before they cost
device time.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from models.shapes import Output

from .errors import Problem
from .metrics import Metrics

if TYPE_CHECKING:
    from .runner import DeviceRunner
    from .state import ModelState

log = logging.getLogger("vaeserve")

Operation = Literal["decode", "encode"]
STREAM_END = object()  # stream sentinel: no more chunks


@dataclass
class JobResult:
    array: np.ndarray
    queue_s: float
    decode_s: float
    batch_size: int  # inputs (latents) in the device batch this job rode in, padding excluded


@dataclass
class Job:
    """One request's inputs (decode: latents ``(B, C, T, H, W)`` float32, already scaled and
    denormalized; encode: frames ``(B, 3, F, H, W)`` float32 in [-1, 1], with ``options`` its rows'
    ``models.encode.PosteriorOptions``) and its reply slot: a future, or a chunk queue when
    ``stream`` is set."""

    request_id: str
    operation: Operation
    inputs: np.ndarray
    output: Output
    stream: bool
    deadline: float  # time.monotonic()
    loop: asyncio.AbstractEventLoop
    arrived: float = field(default_factory=time.monotonic)
    future: asyncio.Future = field(init=False)
    chunks: asyncio.Queue | None = field(init=False, default=None)
    cancelled: bool = False  # set by the handler when its client left or it gave up
    cancel_reason: str = ""
    started: float | None = None
    options: Any = None  # encode: per-row posterior options (they ride in the batch, not in the key)

    def __post_init__(self) -> None:
        self.future = self.loop.create_future()
        if self.stream:
            self.chunks = asyncio.Queue()

    @property
    def size(self) -> int:
        return int(self.inputs.shape[0])

    @property
    def key(self) -> tuple:
        """Jobs with equal keys run the same device program and may share a batch."""
        return (self.operation, self.inputs.shape[1:], self.output, self.stream)

    def cancel(self, reason: str = "client-gone") -> None:
        if not self.cancelled:
            self.cancelled, self.cancel_reason = True, reason

    # Called from the worker thread; everything touching asyncio objects hops onto the job's loop.
    def _call(self, fn: Callable, *args: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # loop closed: the server is gone, nobody is waiting
            pass

    def resolve(self, value: Any) -> None:
        def settle() -> None:
            # A cancelled job's handler has already answered; an unread exception would be logged.
            if not self.future.done() and not self.cancelled:
                if isinstance(value, BaseException):
                    self.future.set_exception(value)
                else:
                    self.future.set_result(value)
        self._call(settle)

    def push(self, item: Any) -> None:
        assert self.chunks is not None
        self._call(self.chunks.put_nowait, item)

    def fail(self, problem: Problem) -> None:
        """Answer with ``problem``: in-band for a stream (its status line may be gone), else the future."""
        if self.stream:
            self.push(problem)
        else:
            self.resolve(problem)


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
                 retry_after_s: int, on_ready: Callable[[ModelState], None], on_failed: Callable[[str], None]):
        self._startup = startup
        self._on_ready = on_ready
        self._on_failed = on_failed
        self.metrics = metrics
        self.max_queue = max_queue
        self.max_batch = max_batch
        self.retry_after_s = retry_after_s
        self._runner: DeviceRunner | None = None
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
        """A queue slot, or 429 when ``max_queue`` requests already wait (or are being read)."""
        with self._cond:
            if not self._accepting:
                raise Problem(503, "unavailable", "service is draining", headers=self._retry())
            waiting = len(self._queue) + self._reserved
            if waiting >= self.max_queue:
                self._purge_abandoned()
                waiting = len(self._queue) + self._reserved
            if waiting >= self.max_queue:
                raise Problem(429, "queue-full", f"{waiting} requests are already waiting",
                              expected=f"fewer than {self.max_queue} waiting", received=waiting,
                              headers=self._retry())
            self._reserved += 1
            self._publish_depth()
        return Ticket(self)

    def submit(self, job: Job, ticket: Ticket) -> None:
        ticket.spend()
        with self._cond:
            self._reserved -= 1
            if not self._accepting:
                self._publish_depth()
                raise Problem(503, "unavailable", "service is draining", headers=self._retry())
            self._queue.append(job)
            self._publish_depth()
            self._cond.notify()

    def _release(self) -> None:
        with self._cond:
            self._reserved -= 1
            self._publish_depth()

    def stop(self, timeout: float) -> None:
        """Drain: take no new work, finish what is queued and running (up to ``timeout`` seconds),
        then fail what is left with 503 and stop the thread."""
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
            job.fail(Problem(503, "unavailable", "service is shutting down", headers=self._retry()))
        self._thread.join(max(0.0, deadline - time.monotonic()))

    def abort(self, problem: Problem) -> None:
        """Answer every queued job and the batch on the device with ``problem`` at once, and take
        no more work: the devices can no longer be trusted (a multi-host slice failed). The
        device thread may stay blocked; whatever it delivers later is ignored (first answer wins)."""
        with self._cond:
            self._accepting = self._running = False
            doomed = list(self._queue) + list(self._batch)
            self._queue.clear()
            self._publish_depth()
            self._cond.notify_all()
        for job in doomed:
            job.fail(problem)

    @property
    def alive(self) -> bool:
        """The device thread is still running (e.g. stuck in a call after a drain timed out)."""
        return self._thread.is_alive()

    def _retry(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)}

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
        if model.follower:  # a multi-host follower: process 0's calls replace the queue
            assert model.slice is not None
            model.slice.follow()
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
            job.fail(Problem(504, "deadline-exceeded", "the request waited past its deadline in the queue"))
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
            out = self._execute(batch)
        except Exception as exc:
            self._fail(batch, exc)
            return
        decode_s = time.monotonic() - start
        self._account(batch, out, decode_s)
        offset = 0
        for job in batch:
            job.resolve(JobResult(out[offset : offset + job.size], start - job.arrived, decode_s, size))
            offset += job.size

    def _execute(self, batch: list[Job]) -> np.ndarray:
        """The one device call of a batch, by operation (host arrays in, host array out)."""
        assert self._runner is not None
        inputs = np.concatenate([job.inputs for job in batch], axis=0)
        head = batch[0]
        if head.operation == "decode":
            return self._runner.decode(inputs, output=head.output)
        if head.operation == "encode":
            from models.encode import PosteriorOptions

            return self._runner.encode(inputs, PosteriorOptions.concatenate([job.options for job in batch]))
        raise ValueError(f"unknown operation {head.operation!r}")

    def _account(self, batch: list[Job], out: np.ndarray, seconds: float) -> None:
        if batch[0].operation == "encode":
            self.metrics.encode_device_seconds.observe(seconds)
            self.metrics.frames_encoded.inc(sum(job.size * job.inputs.shape[2] for job in batch))
        else:
            self.metrics.decode_seconds.observe(seconds)
            self.metrics.frames.inc(_frames(out, batch[0].output))

    def _steps(self, job: Job) -> Iterator[np.ndarray]:
        assert self._runner is not None
        if job.operation == "decode":
            return self._runner.decode_stream(job.inputs)
        raise ValueError(f"operation {job.operation!r} does not stream")

    def _run_stream(self, job: Job) -> None:
        start = time.monotonic()
        for chunk in self._steps(job):
            self.metrics.frames.inc(_frames(chunk, job.output))
            if job.cancelled:  # the reader left: stop spending device time on it
                self.metrics.dropped.labels(job.cancel_reason).inc()
                break
            job.push(chunk)
        self.metrics.decode_seconds.observe(time.monotonic() - start)
        job.push(STREAM_END)

    def _fail(self, batch: list[Job], exc: Exception) -> None:
        log.error("device error on batch %s: %r", [j.request_id for j in batch], exc, exc_info=exc)
        for job in batch:
            # A runner may choose the answer itself (a failed multi-host slice: 503).
            job.fail(exc if isinstance(exc, Problem) else Problem(
                500, "device-error", f"{job.operation} failed on the device ({type(exc).__name__}); "
                f"request id {job.request_id}"))
