"""One thread owns the devices; requests wait for it in a bounded queue.

The event loop (route handlers) only ever calls :meth:`Worker.reserve` and :meth:`Worker.submit`;
the worker thread runs the start-up (load + warm-up, :mod:`service.engine.startup`), then loops: take the
oldest live job plus every queued job that can share its program (same model, operation, input
shape, output and stream flag, up to ``max_batch`` inputs), run them as one batch through their
model's runner, and hand each job its slice back on its own event loop. One thread serves every
model of the server: their programs take turns on the same devices.

Every decode runs as a ``StepRun``: one decode step at a time (latent frame 0, then each later
latent frame; a model that is not causal in time decodes its clip in one step), each step's frames
handed to the jobs as they leave the device — pushed to a stream (a raw frame stream, an MP4
encoded while it decodes), or kept in the answer of a job answered whole. A stream's consumer (a
socket, an encoder) may be slower than the device, so the device never waits on one: before a
step it checks that every job of the run holds fewer than ``stream_buffer_bytes`` of frames not yet
taken; a run that does not is set aside while the device serves other runs and the queue, and
taken up again when its consumers catch up (what all of them may hold together is bounded by the
host account each holds its buffer in, ``service.http``). A runner whose device calls cannot
interleave (a multi-host slice: every process runs one call to its end) runs one at a time.

Before anything runs, the runner compiles (or finds) the programs of the batch and checks them
against the memory they will run in (``Runner.prepare``): a program that cannot fit fails its
jobs with ``TooLargeForMemory`` — on a multi-host slice before process 0 sends the run to the
others. A program that ran out of memory anyway (``OutOfMemory``, counted) is checked again
before it next runs, against the memory free then.

Jobs whose client went away or whose deadline passed are dropped: in the queue before they cost
device time, in a run at its next step, so that the next request starts then.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from vaeserve.models.shapes import Output, clip_shape, is_image_shape, time_axis

from ..metrics import Metrics
from .errors import (
    DeadlineExceeded,
    DeviceFailed,
    EngineError,
    NonFiniteOutput,
    OutOfMemory,
    QueueFull,
    SlowReader,
    TooLargeForMemory,
    Unavailable,
)
from .jobs import STREAM_END, Job
from .model import ModelState, ServedModels

log = logging.getLogger("vaeserve")

class Ticket:
    """A request's place with the worker, taken before its body is read: while the body uploads it
    is an *upload* (the drain waits for it, but it holds no queue place, so stalled uploads cannot
    turn others away); :meth:`claim` makes it a queue place once the body is in (``QueueFull``
    then). :meth:`Worker.submit` spends it; :meth:`release` returns an unspent one."""

    def __init__(self, worker: Worker):
        self._worker: Worker | None = worker
        self.claimed = False

    def claim(self) -> None:
        """Turn the upload into a queue place: ``QueueFull`` when ``max_queue`` requests wait."""
        if self._worker is None:
            raise RuntimeError("queue ticket already spent")
        if not self.claimed:
            self._worker._claim()
            self.claimed = True

    def release(self) -> None:
        if self._worker is not None:
            self._worker._release(self.claimed)
            self._worker = None

    def spend(self) -> Worker:
        if self._worker is None:
            raise RuntimeError("queue ticket used twice")
        worker, self._worker = self._worker, None
        return worker


def _frames(out: np.ndarray, output: Output) -> int:
    """Output frames in a decode result: uint8 ``(B, F, H, W, 3)`` or float ``(B, 3, F, H, W)``;
    images (``(B, H, W, 3)``, ``(B, 3, H, W)``) count one each."""
    if out.ndim == 4:
        return out.shape[0]
    return out.shape[0] * out.shape[1 if output == "uint8" else 2]


def finite_values(values: np.ndarray) -> np.ndarray:
    """``values`` (waveforms, audio latents), or ``NonFiniteOutput`` counting those NaN or infinite."""
    bad = int(values.size - np.count_nonzero(np.isfinite(values)))
    if bad:
        raise NonFiniteOutput(bad)
    return values


def out_of_memory(error: BaseException) -> str | None:
    """Where a device call ran out of memory: ``"host"`` (an allocation on the host failed),
    ``"device"`` (XLA's ``RESOURCE_EXHAUSTED``); None for any other error."""
    if isinstance(error, MemoryError):
        return "host"
    if "RESOURCE_EXHAUSTED" in str(error) or "Out of memory" in str(error):
        return "device"
    return None


class _WaitForMemory(Exception):
    """A batch's programs fit the device alone, but not now beside what the runs set aside hold."""

    def __init__(self, needed: int, held: int, limit: int):
        super().__init__(f"its programs need {needed} bytes per device and runs set aside hold {held} "
                         f"of the {limit}")


@dataclass(eq=False)
class StepRun:
    """A batch of decode jobs decoding step by step: ``steps`` yields ``Decoded`` for all of them,
    each job taking its rows of every step. Nothing runs before ``prepared`` (the memory check)."""

    jobs: list[Job]
    steps: Iterator[Any]
    total_frames: int  # output frames of each job's answer
    device_s: float = 0.0  # time spent in steps (not the time set aside)
    prepared: bool = False
    steps_done: int = 0
    held: int = 0  # bytes per device its decode state (the caches) holds between steps, once prepared

    def live(self) -> list[Job]:
        """Jobs that still want frames."""
        return [job for job in self.jobs if not job.cancelled and not job.ended]

    def has_room(self, limit: int) -> bool:
        """Every live job holds fewer than ``limit`` pending bytes (a run with none left has room:
        taking it up closes it)."""
        return all(job.pending_bytes < limit for job in self.live())


class Worker:
    """Device owner thread. Runs ``startup()`` (load + warm-up of every model), then serves the
    queue until :meth:`stop`. ``on_ready`` / ``on_failed`` are called from the worker thread."""

    def __init__(self, *, startup: Callable[[], ServedModels], metrics: Metrics, max_queue: int, max_batch: int,
                 on_ready: Callable[[ServedModels], None], on_failed: Callable[[str], None],
                 stream_buffer_bytes: int = 64 * 2**20, slow_reader_s: float = 30.0):
        self._startup = startup
        self._on_ready = on_ready
        self._on_failed = on_failed
        self.metrics = metrics
        self.max_queue = max_queue
        self.max_batch = max_batch
        self.stream_buffer_bytes = stream_buffer_bytes
        self.slow_reader_s = slow_reader_s
        # The head of the queue waits for device memory that runs set aside hold (their caches):
        # no new work is taken until a run ends or a slow reader's run is ended for it.
        self._memory_wait = False
        self._suspects: set[tuple] = set()  # job keys whose programs ran out of memory: checked again first
        # job key -> the fewest rows whose batch program was refused for memory: batches stay below it
        self._refused_rows: dict[tuple, int] = {}
        self._interleave = True  # stream runs may take turns on the device (the runners say)
        self.models: ServedModels | None = None  # what start-up produced, once it has
        self._started = False  # start-up (load, warm-up) returned: from then on stop() waits for the thread
        self._batch: list[Job] = []  # the jobs on the device now
        self._runs: list[StepRun] = []  # stream runs begun and not finished, oldest first
        self._holding: set[Job] = set()  # stream jobs that may still hold pending bytes
        self._reserving = True  # False once stop() begins: no new reservations
        self._accepting = True  # False once the drain ends: reserved slots are not spent either
        self._running = True  # False once the queue is drained or the drain timed out
        self._uploading = 0  # tickets whose bodies are being read: the drain waits for them
        self._reserved = 0  # tickets claimed (bodies read) and not yet spent or released: queue places
        self._drain_ends = math.inf  # when stop() stops waiting for the work in hand
        self._busy = False  # a batch or a step is on the device (stop() waits for it)
        self._queue: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._main, name="vaeserve-device", daemon=True)

    # ---- event-loop side -----------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def reserve(self) -> Ticket:
        """An upload's ticket, before its body is read: ``Unavailable`` while draining, and
        ``QueueFull`` when ``max_queue`` requests already wait (a full queue answers 429 without
        buffering the body). It holds no queue place until :meth:`Ticket.claim`."""
        with self._cond:
            if not self._reserving:
                raise Unavailable("service is draining")
            self._check_room()
            self._uploading += 1
        return Ticket(self)

    def _check_room(self) -> None:
        """``QueueFull`` when ``max_queue`` requests wait (lock held)."""
        waiting = len(self._queue) + self._reserved
        if waiting >= self.max_queue:
            self._purge_abandoned()
            waiting = len(self._queue) + self._reserved
        if waiting >= self.max_queue:
            raise QueueFull(waiting, self.max_queue)

    def _claim(self) -> None:
        with self._cond:
            self._check_room()
            self._uploading -= 1
            self._reserved += 1

    def submit(self, job: Job, ticket: Ticket) -> None:
        ticket.claim()
        ticket.spend()
        if job.stream:
            job.on_progress = self._wake
        with self._cond:
            self._reserved -= 1
            if not self._accepting:
                raise Unavailable("service is draining")
            self._queue.append(job)
            self._cond.notify_all()

    def _release(self, claimed: bool) -> None:
        with self._cond:
            if claimed:
                self._reserved -= 1
            else:
                self._uploading -= 1
            self._cond.notify_all()  # stop() waits for the tickets still out

    def uploading(self) -> int:
        """Requests whose bodies are being read (any thread; read by a gauge at every scrape)."""
        with self._cond:
            return self._uploading

    def _wake(self) -> None:
        """A stream's consumer took bytes, or a job was cancelled: a run set aside may go on."""
        with self._cond:
            self._cond.notify_all()

    def buffered_bytes(self) -> int:
        """Decoded frame bytes that stream jobs hold for their readers or encoders (any thread)."""
        with self._cond:
            return self._buffered()

    def stop(self, timeout: float) -> None:
        """Drain: reserve no new slot; finish what is queued and running, and what the slots
        already reserved bring (uploads under way), up to ``timeout`` seconds (or until
        :meth:`end_drain`); then fail what is left (``Unavailable``), the jobs of a device call
        still running included (first answer wins: what the call delivers later is ignored), and
        stop the thread."""
        with self._cond:
            self._drain_ends = min(self._drain_ends, time.monotonic() + timeout)
            self._reserving = False
            while (self._thread.is_alive() and (self._queue or self._busy or self._runs or self._reserved
                                                  or self._uploading)
                   and time.monotonic() < self._drain_ends):
                self._cond.wait(max(0.0, self._drain_ends - time.monotonic()))
            self._accepting = self._running = False
            leftover = list(self._queue) + list(self._batch) + [job for run in self._runs for job in run.live()]
            self._queue.clear()
            self._cond.notify_all()
        for job in dict.fromkeys(leftover):  # a stream job is both on the device and in its run
            if not (job.cancelled or job.ended):
                job.fail(Unavailable("service is shutting down"))
        if not self.starting:
            self._thread.join(max(0.0, self._drain_ends - time.monotonic()))
        else:  # nothing was served, so nothing is lost: a load or warm-up compile is not waited for
            log.warning("stopped while starting: the model load or warm-up is abandoned")

    def end_drain(self) -> None:
        """End the drain now, also before it began (any thread): :meth:`stop` fails what it still
        waits for at once, as at its timeout."""
        with self._cond:
            self._drain_ends = time.monotonic()
            self._cond.notify_all()

    @property
    def starting(self) -> bool:
        """The device thread is still loading the model or compiling the warm-up."""
        with self._cond:
            return self._thread.is_alive() and not self._started

    def abort(self, error: EngineError) -> None:
        """Answer every queued job and every job on the device with ``error`` at once, and take
        no more work: the devices can no longer be trusted (a multi-host slice failed). The
        device thread may stay blocked; whatever it delivers later is ignored (first answer wins)."""
        with self._cond:
            self._reserving = self._accepting = self._running = False
            doomed = list(self._queue) + list(self._batch) + [job for run in self._runs for job in run.live()]
            self._queue.clear()
            self._cond.notify_all()
        for job in dict.fromkeys(doomed):  # a stream job is both on the device and in its run
            job.fail(error)

    @property
    def alive(self) -> bool:
        """The device thread is still running (e.g. stuck in a call after a drain timed out)."""
        return self._thread.is_alive()

    def waiting(self) -> int:
        """Requests waiting for the device: queued and not given up (a job whose client left or
        whose deadline passed stays queued until the device thread reaches it, but waits for
        nothing), and places claimed by requests whose bodies are in. Read by the queue-depth gauge at every
        scrape, so it is true on an idle server too."""
        with self._cond:
            return sum(not job.cancelled for job in self._queue) + self._reserved

    def _purge_abandoned(self) -> None:
        """Free the slots of jobs whose handler gave up (client gone, deadline) (lock held), so
        that abandoned requests do not turn live ones away with 429 while a long batch runs."""
        for job in self._queue:
            if job.cancelled:
                self.metrics.dropped.labels(job.cancel_reason).inc()
        self._queue = collections.deque(job for job in self._queue if not job.cancelled)

    def _buffered(self) -> int:
        """Pending bytes of every stream job (lock held); forgets the jobs that hold none for good."""
        self._holding = {job for job in self._holding if job.pending_bytes > 0 or not (job.ended or job.cancelled)}
        return sum(job.pending_bytes for job in self._holding)

    # ---- worker-thread side --------------------------------------------------------------

    def _main(self) -> None:
        models, failure = None, ""
        try:
            models = self._startup()
        except Exception as exc:  # report through /healthz and /readyz instead of dying silently
            log.exception("model load or warm-up failed")
            failure = f"model load failed: {type(exc).__name__}: {exc}"
        with self._cond:
            self._started = True
            if not self._running:  # stopped while starting: nobody is left to tell (the loop may be gone)
                return
        if models is None:
            self._on_failed(failure)
            return
        self.models = models
        self._interleave = all(model.runner.interleaves_streams for model in models.by_name.values())
        self.metrics.ready.set(1)
        self._on_ready(models)
        cluster = models.cluster
        if cluster is not None and not cluster.is_leader:
            cluster.follow()  # a follower of a multi-host slice: process 0's calls replace the queue
            return
        while True:
            with self._cond:
                work = self._next_work()
                if work is None:
                    break
                self._busy = True
                self._batch = work.jobs if isinstance(work, StepRun) else work
            if isinstance(work, StepRun):
                self._step(work)
            else:
                self._run(work)
            with self._cond:
                self._busy, self._batch = False, []
                self._cond.notify_all()  # stop() waits for an empty queue and an idle device
        for run in list(self._runs):  # stopped: what is left was answered by stop() or abort()
            self._close(run)
        self.metrics.ready.set(0)

    def _next_work(self) -> StepRun | list[Job] | None:
        """What the device does next (lock held; waits for it): the oldest run with room for a
        step, else a new batch (a run, for a decode) from the queue. None once stopped."""
        while self._running:
            now = time.monotonic()
            self._end_slow_readers(now)
            run = next((run for run in self._runs if run.has_room(self.stream_buffer_bytes)), None)
            if run is not None:
                return run
            if self._queue and (self._interleave or not self._runs) and not self._memory_wait:
                batch = self._take_batch()
                if batch and batch[0].operation == "decode":
                    return self._begin(batch)
                if batch:
                    return batch
            self._cond.wait(self._next_slow_reader_check(now))
        return None

    def _end_slow_readers(self, now: float) -> None:
        """End the streams whose readers have been behind for ``slow_reader_s`` while others need
        what they hold (lock held): a run's batch-mates that could go on (its device steps), or the
        head of the queue waiting for the memory a run set aside holds (every job of such a run
        is behind: the run ends, and its caches are freed)."""
        for run in self._runs:
            live = run.live()
            for job in live:
                if job.stream:
                    job.note_behind(self.stream_buffer_bytes, now)
            slow = [job for job in live if job.behind_for(now) >= self.slow_reader_s]
            if not slow:
                continue
            if len(slow) < len(live):
                why = "its batch-mates waited for it"
            elif self._memory_wait and run.steps_done:
                why = "other requests waited for the memory its decode holds"
            else:
                continue
            for job in slow:
                behind = job.pending_bytes
                self.metrics.dropped.labels("slow-reader").inc()
                log.info("request %s: its reader was behind by %d bytes for %.0f s and %s: stream ended",
                         job.request_id, behind, job.behind_for(now), why)
                job.fail(SlowReader(f"the stream was ended: its reader took too little of it for "
                                    f"{self.slow_reader_s:g} s while {why}", behind_bytes=behind,
                                    seconds=self.slow_reader_s))

    def _next_slow_reader_check(self, now: float) -> float | None:
        """Seconds until the first reader behind reaches ``slow_reader_s`` (None: none is behind)."""
        behind = [job.behind_since for run in self._runs for job in run.live() if job.behind_since is not None]
        return None if not behind else max(0.01, min(behind) + self.slow_reader_s - now)

    def _begin(self, batch: list[Job]) -> StepRun:
        """A run for a batch of decode jobs (lock held). Its steps start when it is first taken up."""
        self._note_start(batch)
        latents = batch[0].inputs if len(batch) == 1 else np.concatenate([job.inputs for job in batch], axis=0)
        limits = self._model_of(batch[0]).limits
        run = StepRun(batch, self._steps(batch, latents), limits.output_frames(clip_shape(latents.shape)[2]))
        self._runs.append(run)
        self._holding.update(job for job in batch if job.stream)
        return run

    def _model_of(self, job: Job) -> ModelState:
        """The model that runs ``job`` (set before any job is taken)."""
        assert self.models is not None
        return self.models.by_name[job.model]

    def _note_start(self, batch: list[Job]) -> None:
        start, size = time.monotonic(), sum(job.size for job in batch)
        for job in batch:
            job.started, job.batch_size = start, size
            self.metrics.queue_seconds.observe(start - job.arrived)
        self.metrics.batch_size.observe(size)

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
        """Pop the oldest live job and the queued jobs that can share its programs (lock held); []
        when the queue holds none to take."""
        now = time.monotonic()
        head = None
        for job in list(self._queue):
            self._queue.remove(job)
            if self._live(job, now):
                head = job
                break
        if head is None:
            return []
        batch, size = [head], head.size
        most = min(self.max_batch, self._refused_rows.get(head.key, self.max_batch + 1) - 1)
        for job in list(self._queue):
            if job.key == head.key and size + job.size <= most:
                self._queue.remove(job)
                if self._live(job, now):
                    batch.append(job)
                    size += job.size
        return batch

    def _prepare(self, batch: list[Job], run: StepRun | None = None) -> None:
        """Compile (or find) the programs of ``batch`` and check them against the memory they will
        run in (``TooLargeForMemory``), with the decode state the runs set aside hold
        (``_WaitForMemory``: not now); a program that ran out of memory before is also checked
        against the memory free now (``OutOfMemory``). Raises before anything runs. A decode
        ``run`` learns what its state will hold between its steps."""
        head = batch[0]
        model, rows = self._model_of(head), sum(job.size for job in batch)
        runner = model.runner
        needed = runner.prepare(head.operation, head.inputs.shape[1:], batch=rows, output=head.output,
                                framewise=head.framewise)
        limit = model.device_memory_bytes  # less the other models' resident weights
        with self._cond:
            held = sum(other.held for other in self._runs if other is not run and other.steps_done)
        if limit is not None and held and needed + held > limit:
            raise _WaitForMemory(needed, held, limit)
        if run is not None:
            run.held = runner.held_bytes(head.inputs.shape[1:], batch=rows, output=head.output,
                                         framewise=head.framewise)
        if head.key in self._suspects:
            free = runner.free_bytes()
            if free is not None and needed > free:
                raise OutOfMemory(f"this {head.operation} ran out of memory before; it needs {needed} bytes per device "
                                  f"and {free} are free now", where="device")

    def _split_refused(self, batch: list[Job], exc: Exception) -> bool:
        """A batch of several requests whose programs were refused for memory goes back to the front
        of the queue, to run in smaller batches (each request alone, at the least): a 422 says what a
        request cannot do alone, never what its batch-mates made of it. True when it was split."""
        if not isinstance(exc, TooLargeForMemory) or len(batch) < 2:
            return False
        rows = sum(job.size for job in batch)
        key = batch[0].key
        self._refused_rows[key] = min(rows, self._refused_rows.get(key, rows))
        self.metrics.batches_split.inc()
        log.info("the batch of %d rows of requests %s is too large for memory: run again in smaller batches",
                 rows, [job.request_id for job in batch])
        with self._cond:
            self._queue.extendleft(reversed(batch))
        return True

    def _wait_for_memory(self, batch: list[Job], wait: _WaitForMemory) -> None:
        """A batch that does not fit beside the decode state of the runs set aside goes back to the
        front of the queue, and no new work is taken until a run ends (or is ended for it)."""
        log.info("requests %s wait for device memory: %s", [job.request_id for job in batch], wait)
        with self._cond:
            self._memory_wait = True
            self._queue.extendleft(reversed(batch))

    def _run(self, batch: list[Job]) -> None:
        self._note_start(batch)
        start = batch[0].started or time.monotonic()
        try:
            self._prepare(batch)
            latents = self._execute(batch)
        except _WaitForMemory as wait:
            self._wait_for_memory(batch, wait)
            return
        except Exception as exc:
            if not self._split_refused(batch, exc):
                self._fail(batch, exc)
            return
        self._suspects.discard(batch[0].key)
        device_s = time.monotonic() - start
        self.metrics.device_seconds.labels(batch[0].operation).observe(device_s)
        if batch[0].operation == "encode":
            self.metrics.frames_encoded.inc(sum(job.size * clip_shape(job.inputs.shape)[2] for job in batch))
        offset = 0
        for job in batch:
            job.device_s = device_s
            job.resolve(latents[offset: offset + job.size])
            offset += job.size

    def _execute(self, batch: list[Job]) -> np.ndarray:
        """The one device call of an encode batch (frames in, latents out), a sound batch (audio
        latents in, waveforms out) or a sound encode batch (waveforms in, audio latents out; both
        ``NonFiniteOutput`` for any value not finite), host arrays."""
        # A batch of one runs on its own inputs: a copy would double the host memory of a large encode.
        inputs = batch[0].inputs if len(batch) == 1 else np.concatenate([job.inputs for job in batch], axis=0)
        runner = self._model_of(batch[0]).runner
        if batch[0].operation == "sound":
            return finite_values(runner.decode_sound(inputs))
        if batch[0].operation == "sound_encode":
            return finite_values(runner.encode_sound(inputs))
        requests = [(job.encode, job.size) for job in batch if job.encode is not None]
        return runner.encode(inputs, requests)

    def _decode_sounds(self, run: StepRun) -> None:
        """The sound of each job of a decode run that has one, before its first step (it is small
        beside the video): its program checked like every program, its waveforms handed to the job;
        a job whose sound fails fails alone."""
        model = self._model_of(run.jobs[0])
        for job in run.live():
            if job.sound is None:
                continue
            start = time.monotonic()
            try:
                model.runner.prepare("sound", job.sound.shape[1:], batch=job.size)
                job.hear(finite_values(model.runner.decode_sound(job.sound)))
            except Exception as exc:
                self._fail([job], exc)
            finally:
                job.device_s += time.monotonic() - start
                self.metrics.device_seconds.labels("sound").observe(time.monotonic() - start)

    def _steps(self, batch: list[Job], latents: np.ndarray) -> Iterator[Any]:
        """The steps of a decode batch; each job's rows decode with its own conditions (an LTX timestep, seed)."""
        head = batch[0]
        return self._model_of(head).runner.decode_stream(latents, output=head.output, framewise=head.framewise,
                                                         conditions=[(job.decode, job.size) for job in batch])

    def _expire(self, run: StepRun) -> None:
        """Answer the jobs of ``run`` whose deadline has passed (504) and stop decoding for them:
        the device goes on to the next request at this step, not at the end of their decode."""
        now = time.monotonic()
        for job in run.live():
            if now > job.deadline:
                self.metrics.dropped.labels("deadline").inc()
                job.fail(DeadlineExceeded(f"the deadline passed while decoding; stopped after {run.steps_done} "
                                          f"decode steps (request id {job.request_id})"))

    def _step(self, run: StepRun) -> None:
        """One decode step of ``run``, its rows handed to each live job; the run ends when its
        steps do, when it fails, or when no job wants more (cancelled, past its deadline)."""
        self._expire(run)
        if not run.live():
            self._close(run)
            return
        start = time.monotonic()
        try:
            if not run.prepared:  # the run's programs are those of all its jobs' latents, padded
                self._prepare(run.jobs, run)
                run.prepared = True
                self._decode_sounds(run)
            step = next(run.steps, None)
        except _WaitForMemory as wait:
            self._close(run, requeued=True)
            self._wait_for_memory(run.live(), wait)
            return
        except Exception as exc:
            split = not run.prepared and self._split_refused(run.live(), exc)
            if not split:
                self._fail(run.live(), exc)
            self._close(run, requeued=split)
            return
        seconds = time.monotonic() - start
        run.device_s += seconds
        run.steps_done += step is not None
        for job in run.jobs:
            job.device_s += seconds
        if step is None:  # the last step was the last: every job still waiting gets its end
            self._suspects.discard(run.jobs[0].key)
            for job in run.live():
                self._finish(job)
            self._close(run)
            return
        frames, nonfinite = step
        self.metrics.frames_decoded.inc(_frames(frames, run.jobs[0].output))
        offset = 0
        for job in run.jobs:
            rows = slice(offset, offset + job.size)
            offset += job.size
            if job.cancelled or job.ended:
                continue
            bad = int(nonfinite[rows].sum())
            if bad:  # a stream's status line may be gone: the error goes in-band, and it ends
                job.fail(NonFiniteOutput(bad))
            elif job.stream:
                job.push(frames[rows])
            else:
                job.keep(frames[rows], run.total_frames)
        if not run.live():
            self._close(run)

    @staticmethod
    def _finish(job: Job) -> None:
        """A job whose decode is done: the end of its stream, or its whole answer."""
        if job.stream:
            job.push(STREAM_END)
            return
        assert job.kept is not None
        answer, job.kept = job.kept, None
        if is_image_shape(job.inputs.shape):  # decoded as a one-frame clip, answered as images
            answer = answer.squeeze(time_axis(job.output))
        job.resolve(answer)

    def _close(self, run: StepRun, *, requeued: bool = False) -> None:
        """Finish a run on the device thread: stop its steps (on a multi-host slice the remaining
        steps still run on every process), count its device time and the jobs dropped (none when its
        jobs went back to the queue, ``requeued``: nothing ran)."""
        try:
            close = getattr(run.steps, "close", None)
            if close is not None:
                close()
        except Exception:  # the run is over either way; the jobs already have their answer
            log.exception("closing the steps of requests %s", [job.request_id for job in run.jobs])
        if not requeued:
            self.metrics.device_seconds.labels(run.jobs[0].operation).observe(run.device_s)
        for job in run.jobs:
            if job.cancelled:  # the reader left: the device stopped early for it
                self.metrics.dropped.labels(job.cancel_reason).inc()
        with self._cond:
            if run in self._runs:
                self._runs.remove(run)
                self._memory_wait = False  # its state is freed: the head of the queue may fit now
            self._cond.notify_all()

    def _fail(self, batch: list[Job], exc: Exception) -> None:
        ids = [j.request_id for j in batch]
        where = out_of_memory(exc)
        if where is not None:  # the server goes on; this program is checked again before it next runs
            log.error("out of memory (%s) on batch %s: %s", where, ids, str(exc).splitlines()[0] if str(exc) else exc)
            self.metrics.out_of_memory.labels(where).inc()
            self._suspects.add(batch[0].key)
            error: EngineError = OutOfMemory(f"the {batch[0].operation} ran out of {where} memory while it ran",
                                             where=where)
        elif isinstance(exc, EngineError):  # the runner chose the answer (a refusal, a failed slice)
            log.warning("batch %s: %s", ids, exc)
            if isinstance(exc, TooLargeForMemory):
                self.metrics.refused_for_memory.labels("compiled").inc(len(batch))
            error = exc
        else:
            log.error("device error on batch %s: %r", ids, exc, exc_info=exc)
            error = DeviceFailed(batch[0].operation, exc)
        for job in batch:
            job.fail(error)
