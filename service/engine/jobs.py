"""A request as the engine sees it: a ``Job`` (its inputs and its reply slot) and what comes back.

The event loop builds jobs and waits on them; the device thread fills them in. Everything that
touches asyncio objects from the device thread hops onto the job's loop (``call_soon_threadsafe``).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from models.shapes import Output

from .errors import EngineError

Operation = Literal["decode", "encode"]
STREAM_END = object()  # stream sentinel: no more chunks
SEED_RANGE = 2**32


@dataclass(frozen=True)
class EncodeOptions:
    """How an encode turns moments into latents: the posterior's mean (``sample=False``) or a draw
    seeded by ``seed``, then optionally ``(z − latents_mean) / latents_std`` (``normalize``).

    The seed is fixed when the request arrives (``resolve``), on the process that serves HTTP, so
    every process of a multi-host slice draws the same noise."""

    sample: bool = False
    seed: int = 0
    normalize: bool = False

    @classmethod
    def resolve(cls, *, sample: bool, seed: int | None, normalize: bool) -> EncodeOptions:
        """A fresh random seed when sampling without one; 0 (unused) for the mean."""
        if seed is None:
            seed = secrets.randbelow(SEED_RANGE) if sample else 0
        return cls(sample=sample, seed=seed, normalize=normalize)


@dataclass
class JobResult:
    array: np.ndarray
    queue_s: float  # arrival to the start of its device batch
    device_s: float  # the device batch, transfers to the host included
    batch_size: int  # inputs in the device batch this job rode in, padding excluded


@dataclass
class Job:
    """One request's inputs (decode: latents ``(B, C, T, H, W)`` float32, already scaled and
    denormalized; encode: frames ``(B, 3, F, H, W)`` float32 in [-1, 1], with its ``encode``
    options) and its reply slot: a future, or a chunk queue when ``stream`` is set."""

    request_id: str
    operation: Operation
    inputs: np.ndarray
    output: Output
    stream: bool
    deadline: float  # time.monotonic()
    loop: asyncio.AbstractEventLoop
    arrived: float = field(default_factory=time.monotonic)
    encode: EncodeOptions | None = None  # rides in the batch, not in the program key
    future: asyncio.Future = field(init=False)
    chunks: asyncio.Queue | None = field(init=False, default=None)
    cancelled: bool = False  # set by the handler when its client left or it gave up
    cancel_reason: str = ""
    started: float | None = None

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

    # Called from the device thread; everything touching asyncio objects hops onto the job's loop.
    def _call(self, fn: Callable, *args: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # loop closed: the server is gone, nobody is waiting
            pass

    def resolve(self, value: JobResult | EngineError) -> None:
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

    def fail(self, error: EngineError) -> None:
        """Answer with ``error``: in-band for a stream (its status line may be gone), else the future."""
        if self.stream:
            self.push(error)
        else:
            self.resolve(error)
