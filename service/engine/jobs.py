"""A request as the engine sees it: a ``Job`` (its inputs and its reply slot) and what comes back.

The event loop builds jobs and waits on them; the device thread fills them in. Everything that
touches asyncio objects from the device thread hops onto the job's loop (``call_soon_threadsafe``).

Every decode runs a step at a time. A *stream* job gets its frames step by step, as chunks (a raw
frame stream, or an MP4 encoded while the decode runs). Its chunks wait on the event loop until
their consumer (the socket, an encoder) has taken them: the job counts those *pending* bytes, the
device thread reads the count to set a job aside that holds too many, and the consumer wakes it
when it takes some. Any other decode job *keeps* each step's frames in its answer (``keep``), one
array allocated at the first step, and gets it when the last step is done.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import numpy as np

from vaeserve.models.conditions import SEED_RANGE
from vaeserve.models.shapes import Output, time_axis

from .errors import EngineError

Operation = Literal["decode", "encode", "sound", "sound_encode"]  # sound: audio latents to waveforms; sound_encode: back
STREAM_END = object()  # stream sentinel: no more chunks


class EncodeOptions(NamedTuple):
    """How an encode turns moments into latents: the posterior's mean (``sample=False``) or a draw
    seeded by ``seed``, then optionally ``(z − latents_mean) / latents_std`` (``normalize``).

    The seed is fixed when the request arrives (``resolve``), on the process that serves HTTP, so
    every process of a multi-host slice draws the same noise. A tuple, so that it travels to the
    other processes as JSON (a list) and comes back as ``EncodeOptions(*options)``."""

    sample: bool = False
    seed: int = 0
    normalize: bool = False

    @classmethod
    def resolve(cls, *, sample: bool, seed: int | None, normalize: bool) -> EncodeOptions:
        """A fresh random seed when sampling without one; 0 (unused) for the mean."""
        if seed is None:
            seed = secrets.randbelow(SEED_RANGE) if sample else 0
        return cls(sample=sample, seed=seed, normalize=normalize)


class DecodeOptions(NamedTuple):
    """The conditions of a decode by a decoder that takes them (LTX from 0.9.1: a timestep, seeded
    noise; ``models.decode.decode_conditions``): its timestep (None for a decoder that takes none),
    noise scale and seed, per request, so that requests with different ones share a batch.

    Fixed when the request arrives (``resolve``), on the process that serves HTTP, so every
    process of a multi-host slice draws the same noise; a tuple, so that it travels to the other
    processes as JSON (a list) and comes back as ``DecodeOptions(*options)``."""

    timestep: float | None
    noise_scale: float | None
    seed: int

    @classmethod
    def resolve(cls, *, timestep: float | None, noise_scale: float | None, seed: int | None) -> DecodeOptions:
        """A fresh random seed when none is given: the answer names it (``X-Seed``), so that it can
        be reproduced."""
        return cls(timestep=timestep, noise_scale=noise_scale,
                   seed=secrets.randbelow(SEED_RANGE) if seed is None else seed)


@dataclass(eq=False)  # a job is itself (held in sets by the worker), whatever its fields say
class Job:
    """One request's inputs (decode: latents ``(B, C, T, H, W)`` float32, already scaled and
    denormalized; encode: frames ``(B, 3, F, H, W)`` float32 in [-1, 1], with its ``encode``
    options) and its reply slot: a future (the output array, or an ``EngineError``), or a chunk
    queue when ``stream`` is set (uint8 frames ``(B, f, H, W, 3)`` per decode step, then
    ``STREAM_END`` or an ``EngineError``). The device thread notes when its batch started, the
    inputs in that batch, and the device time it has had (``started``, ``batch_size``, ``device_s``)."""

    request_id: str
    operation: Operation
    inputs: np.ndarray
    output: Output
    stream: bool
    deadline: float  # time.monotonic()
    loop: asyncio.AbstractEventLoop
    model: str  # the name of the model that runs it (a server may serve several: ``ServedModels``)
    arrived: float = field(default_factory=time.monotonic)
    encode: EncodeOptions | None = None  # rides in the batch, not in the program key
    decode: DecodeOptions | None = None  # a decode's conditions: they too ride in the batch, per row
    framewise: bool = False  # decode: HunyuanVideo 1.0's framewise decode (a program of its own)
    # A decode's audio latents (B, *layout) float32: their waveforms are decoded before its first
    # step and answered in ``heard`` (a job whose operation is "sound" has them as its inputs).
    sound: np.ndarray | None = None
    heard: asyncio.Future = field(init=False)
    future: asyncio.Future = field(init=False)
    chunks: asyncio.Queue | None = field(init=False, default=None)
    cancelled: bool = False  # set by the handler when its client left or it gave up
    cancel_reason: str = ""
    started: float | None = None
    batch_size: int = 0  # inputs in the device batch (or stream run) the job rode in
    device_s: float = 0.0  # time its batch (or stream run) spent on the device so far
    ended: bool = False  # (device thread) answered: a stream's last item pushed (STREAM_END or an error), or resolved
    kept: np.ndarray | None = None  # (device thread) a decode's frames so far, in the array of its whole answer
    kept_frames: int = 0
    produced_bytes: int = 0  # (device thread) frame bytes pushed so far
    consumed_bytes: int = 0  # (event loop) frame bytes the consumer has taken, or that were dropped
    on_progress: Callable[[], None] | None = None  # (the worker's) wake-up: bytes taken, or cancelled
    behind_since: float | None = None  # (device thread) when a stream's buffer filled and its reader fell behind

    def __post_init__(self) -> None:
        self.future = self.loop.create_future()
        self.heard = self.loop.create_future()
        if self.stream:
            self.chunks = asyncio.Queue()

    @property
    def size(self) -> int:
        return int(self.inputs.shape[0])

    @property
    def key(self) -> tuple:
        """Jobs with equal keys run the same device programs of the same model and may share a
        batch (a stream and a whole answer of the same frames run the same steps)."""
        return (self.model, self.operation, self.inputs.shape[1:], self.output, self.framewise)

    @property
    def pending_bytes(self) -> int:
        """Frame bytes pushed and not yet taken by the consumer (0 once cancelled: they are dropped)."""
        return 0 if self.cancelled else self.produced_bytes - self.consumed_bytes

    def note_behind(self, limit: int, now: float) -> None:
        """(device thread) Whether the reader is behind: from the moment its buffer holds ``limit``
        bytes until it has taken it down to half (a reader that takes a few bytes now and then
        stays behind)."""
        pending = self.pending_bytes
        if pending >= limit and self.behind_since is None:
            self.behind_since = now
        elif pending <= limit // 2:
            self.behind_since = None

    def behind_for(self, now: float) -> float:
        """Seconds its reader has been behind (0 when it is not)."""
        return 0.0 if self.behind_since is None else now - self.behind_since

    def cancel(self, reason: str = "client-gone") -> None:
        """The handler gives up (event loop): the worker stops spending device time on the job,
        and the chunks waiting for it are dropped now rather than when the job is forgotten."""
        if self.cancelled:
            return
        self.cancelled, self.cancel_reason = True, reason
        if self.chunks is not None:
            while not self.chunks.empty():
                self.chunks.get_nowait()
        self._progress()

    def consumed(self, nbytes: int) -> None:
        """The consumer took ``nbytes`` of frames (event loop): room for the device to go on."""
        self.consumed_bytes += nbytes
        self._progress()

    def _progress(self) -> None:
        if self.on_progress is not None:
            self.on_progress()

    # Called from the device thread; everything touching asyncio objects hops onto the job's loop.
    def _call(self, fn: Callable, *args: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # loop closed: the server is gone, nobody is waiting
            pass

    def keep(self, frames: np.ndarray, total_frames: int) -> None:
        """(device thread) One step's frames of a decode that is answered whole: written into the
        answer (allocated at the first step for ``total_frames`` frames; a step that is the whole
        decode is kept as it is)."""
        axis = time_axis(self.output)
        if self.kept is None:
            if frames.shape[axis] == total_frames:
                self.kept, self.kept_frames = frames, total_frames
                return
            shape = list(frames.shape)
            shape[axis] = total_frames
            self.kept = np.empty(shape, frames.dtype)
        index: list[slice] = [slice(None)] * frames.ndim
        index[axis] = slice(self.kept_frames, self.kept_frames + frames.shape[axis])
        self.kept[tuple(index)] = frames
        self.kept_frames += frames.shape[axis]

    def hear(self, waveforms: np.ndarray) -> None:
        """(device thread) The waveforms of the decode's sound, before its first frames."""
        def settle() -> None:
            if not self.heard.done() and not self.cancelled:
                self.heard.set_result(waveforms)
        self._call(settle)

    def resolve(self, value: np.ndarray | EngineError) -> None:
        self.ended = True

        def settle() -> None:
            # A cancelled job's handler has already answered; an unread exception would be logged.
            if not self.future.done() and not self.cancelled:
                if isinstance(value, BaseException):
                    self.future.set_exception(value)
                else:
                    self.future.set_result(value)
        self._call(settle)

    def push(self, item: Any) -> None:
        """A stream's next chunk (frames), or its last item (``STREAM_END``, an ``EngineError``)."""
        chunks = self.chunks
        assert chunks is not None
        if isinstance(item, np.ndarray):
            self.produced_bytes += item.nbytes
        else:
            self.ended = True

        def put() -> None:
            if not self.cancelled:
                chunks.put_nowait(item)
        self._call(put)

    def fail(self, error: EngineError) -> None:
        """Answer with ``error``: in-band for a stream (its status line may be gone), else the future
        (and the sound's, where it is still awaited)."""
        if self.sound is not None:
            def settle() -> None:
                if not self.heard.done() and not self.cancelled:
                    self.heard.set_exception(error)
            self._call(settle)
        if self.stream:
            self.push(error)
        else:
            self.resolve(error)
