"""One thread owns the devices; requests wait for it in a bounded queue.

The event loop (FastAPI handlers) only ever calls :meth:`Worker.submit`; the worker thread loads
the model, compiles the warm-up shapes, then loops: take the oldest live job plus every queued job
of the same latent shape and output kind (up to ``max_batch`` latents), decode them as one batch
through :class:`service.runner.DeviceRunner`, and hand each job its slice back on its own loop.

Jobs whose client went away or whose deadline passed while queued are dropped before they cost
device time.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal
from collections.abc import Callable

import numpy as np

from .errors import Problem
from .metrics import Metrics
from .runner import DeviceRunner

log = logging.getLogger("vaeserve")

JobKind = Literal["uint8", "float", "stream"]
STREAM_END = object()  # stream sentinel: no more chunks


@dataclass
class JobResult:
    array: np.ndarray
    queue_s: float
    decode_s: float
    batch_size: int


@dataclass
class Job:
    """One request's latents ``(B, C, T, H, W)`` float32 (already denormalized) and its reply slot."""

    request_id: str
    latents: np.ndarray
    kind: JobKind
    deadline: float  # time.monotonic()
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future = field(init=False)
    chunks: asyncio.Queue | None = field(init=False, default=None)
    arrived: float = field(default_factory=time.monotonic)
    fault: bool = False
    cancelled: bool = False  # set by the handler when its client left or it gave up
    cancel_reason: str = ""
    started: float | None = None

    def __post_init__(self) -> None:
        self.future = self.loop.create_future()
        if self.kind == "stream":
            self.chunks = asyncio.Queue()

    @property
    def key(self) -> tuple:
        return (self.latents.shape[1:], self.kind)

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


class Worker:
    """Device owner thread. States: loading -> ready -> stopping -> stopped (or failed)."""

    def __init__(self, *, load: Callable[[], tuple[DeviceRunner, dict]], warmup: Callable[[DeviceRunner], None],
                 metrics: Metrics, max_queue: int, max_batch: int, retry_after_s: int):
        self._load = load
        self._warmup = warmup
        self.metrics = metrics
        self.max_queue = max_queue
        self.max_batch = max_batch
        self.retry_after_s = retry_after_s
        self.state = "loading"
        self.error: str | None = None
        self.runner: DeviceRunner | None = None
        self.info: dict = {}
        self._queue: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._main, name="vaeserve-device", daemon=True)

    # ---- event-loop side -----------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        retry = {"Retry-After": str(self.retry_after_s)}
        with self._cond:
            if self.state != "ready":
                detail = self.error if self.state == "failed" else f"service is {self.state}"
                raise Problem(503, "unavailable", detail, headers=retry)
            if len(self._queue) >= self.max_queue:
                self._purge_abandoned()
            if len(self._queue) >= self.max_queue:
                raise Problem(429, "queue-full", f"{len(self._queue)} requests are already waiting",
                              expected=f"queue below {self.max_queue}", received=len(self._queue), headers=retry)
            self._queue.append(job)
            self.metrics.queue_depth.set(len(self._queue))
            self._cond.notify()

    def stop(self, timeout: float) -> None:
        """Stop taking work, fail what is still queued (503), wait for the current batch."""
        with self._cond:
            if self.state in ("loading", "ready"):
                self.state = "stopping"
            leftover = list(self._queue)
            self._queue.clear()
            self.metrics.queue_depth.set(0)
            self._cond.notify_all()
        for job in leftover:
            job.resolve(Problem(503, "unavailable", "service is shutting down"))
        self._thread.join(timeout)

    def _purge_abandoned(self) -> None:
        """Free the slots of jobs whose handler gave up (client gone, deadline) (lock held), so
        that abandoned requests do not turn live ones away with 429 while a long batch runs."""
        for job in self._queue:
            if job.cancelled:
                self.metrics.dropped.labels(job.cancel_reason).inc()
        self._queue = collections.deque(job for job in self._queue if not job.cancelled)

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    # ---- worker-thread side --------------------------------------------------------------

    def _main(self) -> None:
        try:
            self.runner, self.info = self._load()
            self._warmup(self.runner)
        except Exception as exc:  # report through /readyz instead of dying silently
            log.exception("model load or warm-up failed")
            with self._cond:
                self.state, self.error = "failed", f"model load failed: {type(exc).__name__}: {exc}"
            return
        with self._cond:
            if self.state == "loading":
                self.state = "ready"
                self.metrics.ready.set(1)
                log.info("ready: compiled %s", self.runner.compiled_shapes)
        while True:
            with self._cond:
                while not self._queue and self.state == "ready":
                    self._cond.wait()
                if self.state != "ready":
                    break
                batch = self._take_batch()
                self.metrics.queue_depth.set(len(self._queue))
            if batch:
                self._run(batch)
        with self._cond:
            self.state = "stopped"
            self.metrics.ready.set(0)

    def _live(self, job: Job, now: float) -> bool:
        if job.cancelled:
            self.metrics.dropped.labels(job.cancel_reason).inc()
            return False
        if now > job.deadline:
            self.metrics.dropped.labels("deadline").inc()
            job.resolve(Problem(504, "deadline-exceeded", "the request waited past its deadline in the queue"))
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
        batch, size = [head], head.latents.shape[0]
        if head.kind == "stream":  # streams are decoded alone, chunk by chunk
            return batch
        for job in list(self._queue):
            if job.key == head.key and size + job.latents.shape[0] <= self.max_batch:
                self._queue.remove(job)
                if self._live(job, now):
                    batch.append(job)
                    size += job.latents.shape[0]
        return batch

    def _run(self, batch: list[Job]) -> None:
        start = time.monotonic()
        for job in batch:
            job.started = start
            self.metrics.queue_seconds.observe(start - job.arrived)
        try:
            if batch[0].kind == "stream":
                self._run_stream(batch[0])
                return
            latents = np.concatenate([job.latents for job in batch], axis=0)
            self.metrics.batch_size.observe(latents.shape[0])
            out = self.runner.decode(latents, output=batch[0].kind, fault=any(j.fault for j in batch))
        except Exception as exc:
            self._fail(batch, exc)
            return
        decode_s = time.monotonic() - start
        self.metrics.decode_seconds.observe(decode_s)
        frame_axis = 1 if batch[0].kind == "uint8" else 2
        self.metrics.frames.inc(out.shape[0] * out.shape[frame_axis])
        offset = 0
        for job in batch:
            n = job.latents.shape[0]
            job.resolve(JobResult(out[offset : offset + n], start - job.arrived, decode_s, len(batch)))
            offset += n

    def _run_stream(self, job: Job) -> None:
        start = time.monotonic()
        self.metrics.batch_size.observe(job.latents.shape[0])
        for chunk in self.runner.decode_stream(job.latents, fault=job.fault):
            self.metrics.frames.inc(chunk.shape[0] * chunk.shape[1])
            if job.cancelled:  # the reader left: stop spending device time on it
                self.metrics.dropped.labels(job.cancel_reason).inc()
                break
            job.push(chunk)
        self.metrics.decode_seconds.observe(time.monotonic() - start)
        job.push(STREAM_END)

    def _fail(self, batch: list[Job], exc: Exception) -> None:
        log.error("device error on batch %s: %r", [j.request_id for j in batch], exc, exc_info=exc)
        for job in batch:
            problem = Problem(500, "device-error",
                              f"decode failed on the device ({type(exc).__name__}); request id {job.request_id}")
            if job.kind == "stream":
                job.push(problem)
            else:
                job.resolve(problem)

