"""The life of a decode or encode request, as its route reads it: **admit** (refused at once when
the queue is full, before a byte of the body is read; the queue place is taken once the body is
in, so uploads hold none), **parse** (the body, held against the reading budget, into the job's
inputs), **submit** (the job to the device worker), **answer** (wait or stream, then serialize).

.. code-block:: python

    async with admitted(request, state, params.timeout_s, model) as admission:  # 503 / 404 / 429 here
        async with admission.body() as body:                               # 413 / 408 / 429 here
            inputs = await anyio.to_thread.run_sync(parse, body, ...)       # 4xx here
        await admission.reserve_decode(inputs.latents.shape, params)       # 422 / 503 here
        job = admission.submit("decode", inputs, ...)
        return await answer(job)                                            # 504, 499 here

``reserve_*`` is the memory check before anything runs: the estimate of the request's programs
against the devices' memory (422 ``too-large-for-memory`` for what clearly cannot fit; the rest is
compiled and checked by the worker), then its host bytes held in the host account (waiting in
turn up to the deadline, then 503). A raw body's shape is in its query: its decode is checked
before a byte of the body is read.

A client that leaves on the way raises ``ClientGone``, answered 499 (``service.http.problems``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from fastapi import Request

from ..codecs.frames import FramesHeader
from ..engine.errors import TooLargeForMemory
from ..engine.jobs import Job, Operation
from ..engine.model import ModelState
from ..engine.worker import Ticket, Worker
from .admission import MemoryBudget, read_body
from .host_memory import decode_host_bytes, encode_host_bytes
from .schemas import DecodeParams
from .sound import sound_host_bytes, sound_of
from .state import ServiceState


@dataclass
class Admission:
    """An admitted request: the model and worker that serve it, its ticket (a queue place once the body is in), its arrival and
    deadline, and what it holds until it ends (``hold``)."""

    request: Request
    state: ServiceState
    model: ModelState
    worker: Worker
    ticket: Ticket
    arrived: float
    deadline: float
    holds: AsyncExitStack

    @asynccontextmanager
    async def body(self) -> AsyncIterator[bytes]:
        """The request body, held against the reading budget while the block runs. Once it is in,
        the request takes its queue place (429 if the queue filled while it uploaded)."""
        settings = self.state.settings
        async with read_body(self.request, max_bytes=settings.max_body_bytes, budget=self.state.reading,
                             timeout_s=settings.read_timeout_s, stall_s=settings.upload_stall_s,
                             retry_after_s=settings.retry_after_s) as body:
            self.ticket.claim()
            yield body

    async def hold(self, budget: MemoryBudget, nbytes: int) -> None:
        """Hold ``nbytes`` of ``budget`` until the request ends, waiting for them in turn up to the deadline."""
        await self.holds.enter_async_context(budget.hold(nbytes, deadline=self.deadline, receive=self.request.receive,
                                                         retry_after_s=self.state.settings.retry_after_s))

    def check(self, check: Callable[[], None]) -> None:
        """``check()`` (a ``ModelState.check_*_fits``), its refusal counted."""
        try:
            check()
        except TooLargeForMemory:
            self.state.metrics.refused_for_memory.labels("estimate").inc()
            raise

    async def hold_host(self, nbytes: int) -> None:
        """Hold ``nbytes`` of the host account until the request ends (waiting in turn up to the
        deadline: 503); more than the whole account is refused at once (422)."""
        try:
            await self.hold(self.state.host, nbytes)
        except TooLargeForMemory:
            self.state.metrics.refused_for_memory.labels("host").inc()
            raise

    async def reserve_decode(self, shape: tuple[int, ...], params: DecodeParams) -> None:
        """A decode of latents ``shape`` ``(B, C, T, H, W)``, answered as ``params`` asks: refused
        when its programs clearly cannot fit the devices, then its host bytes held."""
        model = self.model
        self.check(partial(model.check_decode_fits, shape, params.output))
        await self.hold_host(decode_host_bytes(shape, params, model.limits, causal=model.vae.config.causal,
                                               stream_buffer_bytes=self.state.settings.stream_buffer_bytes))

    async def reserve_encode(self, header: FramesHeader) -> None:
        """An encode of the frames ``header`` describes: refused when its program clearly cannot
        fit the devices, then its host bytes held (before the frames are decoded)."""
        self.check(partial(self.model.check_encode_fits, header.shape))
        await self.hold_host(encode_host_bytes(header, self.model.limits))

    async def reserve_sound(self, shape: tuple[int, ...]) -> None:
        """The sound of audio latents ``shape`` ``(B, *layout)``: its host bytes held (its program is
        small; it is compiled and checked against the device's memory before it runs)."""
        await self.hold_host(sound_host_bytes(shape, sound_of(self.model)))

    def submit(self, operation: Operation, inputs: np.ndarray, **fields: Any) -> Job:
        """The request's job (its other ``Job`` fields given by name), queued in the place its ticket holds."""
        job = Job(self.request.state.request_id, operation, inputs, deadline=self.deadline,
                  loop=asyncio.get_running_loop(), model=self.model.name, arrived=self.arrived, **fields)
        self.worker.submit(job, self.ticket)
        return job


@asynccontextmanager
async def admitted(request: Request, state: ServiceState, timeout_s: float,
                   model: str | None) -> AsyncIterator[Admission]:
    """Admit a request before a byte of its body is read: the service must be serving (503 while
    loading, draining or failed) the ``model`` it names (404; 422 when it names none of several),
    and the queue not full (429); its deadline is ``timeout_s`` from
    now. The ticket is given back unless a job was submitted with it; what the request held is let go
    when the block ends. The request's arrival is noted for its latency metric (taken when the last
    byte of its answer is sent: ``service.http.middleware``)."""
    arrived = time.monotonic()
    served, worker = state.serving(model)
    ticket = worker.reserve()
    request.state.arrived = arrived
    async with AsyncExitStack() as holds:
        try:
            yield Admission(request, state, served, worker, ticket, arrived, arrived + timeout_s, holds)
        finally:
            ticket.release()  # a no-op once the job was submitted
