"""Answers written while the decode runs: the raw frame stream, fragmented MP4, and MP4 encoded
step by step (pipelined) for an ordinary answer.

Each consumes a stream job's chunks (uint8 frames per decode step) and tells the job when it has
taken them (``Job.consumed``): the device thread sets a job aside while it holds
``stream_buffer_bytes`` not yet taken, so a slow reader or a busy encoder holds bounded memory and
never holds up the device. A reader that takes nothing for ``write_timeout_s`` is dropped by the
server (``service.http.server``); its stream ends and is counted as 499.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing

import anyio
import numpy as np
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from ..codecs.stream import STREAM_MEDIA_TYPE, stream_message
from ..engine.errors import EngineError
from ..engine.jobs import STREAM_END, Job
from ..problem import Problem
from .encoders import EncoderPool
from .responses import wait_for
from .schemas import DecodeParams

log = logging.getLogger("vaeserve")

# The largest piece handed to the server at once: the server buffers what the socket does not
# take of a piece, so a reader that stops holds at most this much (plus the transport's own
# 64 KiB) beyond its job's pending chunks.
WRITE_PIECE_BYTES = 256 * 2**10


class StreamCut(Exception):
    """Raised by a stream's body: end the answer cut off, without its last chunk (the connection
    closes), the one signal a client of an MP4 can get once its status line is sent."""

    def __init__(self, problem: Problem):
        super().__init__(problem.detail)
        self.problem = problem


class BodyStream(StreamingResponse):
    """Starlette's streaming answer, plus: the body is handed to the server in pieces of at most
    ``WRITE_PIECE_BYTES``; it stops (its ``finally`` runs) when the client disconnects; and a
    body that raises ``StreamCut`` ends the answer cut off, its problem's status noted for the
    request metrics (``request.state.cut_status``)."""

    body_iterator: AsyncGenerator[bytes, None]

    def __init__(self, body: AsyncGenerator[bytes, None], *, media_type: str, headers: dict[str, str]):
        super().__init__(body, media_type=media_type, headers=headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async with anyio.create_task_group() as group:
            group.start_soon(_stop_when_gone, receive, group.cancel_scope)
            try:
                async with aclosing(self.body_iterator) as body:
                    async for data in body:
                        view = memoryview(data)
                        for offset in range(0, len(view), WRITE_PIECE_BYTES):
                            await send({"type": "http.response.body", "body": view[offset: offset + WRITE_PIECE_BYTES],
                                        "more_body": True})
            except StreamCut as cut:
                scope.setdefault("state", {})["cut_status"] = cut.problem.status
                group.cancel_scope.cancel()
                return  # the server closes the connection: the answer was not completed
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            group.cancel_scope.cancel()


async def _stop_when_gone(receive: Receive, scope: anyio.CancelScope) -> None:
    # The body is already read, so the next ASGI message can only be http.disconnect.
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


async def _first_item(request: Request, job: Job, problem_for: Callable[[EngineError], Problem]) -> object:
    """The stream's first chunk, waited for like an ordinary answer (deadline, client gone): an
    error before it is an ordinary problem response."""
    chunks = job.chunks
    assert chunks is not None
    first = await wait_for(request, job, asyncio.ensure_future(chunks.get()))
    if isinstance(first, EngineError):
        raise problem_for(first)
    return first


def _queue_header(job: Job) -> dict[str, str]:
    return {"X-Queue-Time-S": f"{(job.started or time.monotonic()) - job.arrived:.6f}"}


async def frame_stream(request: Request, job: Job, batched: bool,
                       problem_for: Callable[[EngineError], Problem]) -> Response:
    """Raw uint8 frames, one framed message per decode step (``service.codecs.stream``).

    Errors before the first chunk are ordinary problem responses; after it the status line is
    gone, so an error travels in-band as a ``{"type": "error"}`` message (``problem_for`` turns
    the engine's error into its problem), and the stream ends there."""
    first = await _first_item(request, job, problem_for)
    chunks = job.chunks
    assert chunks is not None

    async def messages() -> AsyncGenerator[bytes, None]:
        item, index, frames = first, 0, 0
        try:
            while item is not STREAM_END:
                if isinstance(item, EngineError):
                    problem = problem_for(item).body(request.url.path, job.request_id)
                    yield stream_message({"type": "error", "problem": problem})
                    return
                assert isinstance(item, np.ndarray)
                chunk = item if batched else item[0]
                yield stream_message(
                    {"type": "frames", "index": index, "frame_start": frames, "shape": list(chunk.shape),
                     "dtype": "uint8"}, np.ascontiguousarray(chunk).tobytes())
                job.consumed(item.nbytes)  # written: the server holds at most one piece of it
                index, frames = index + 1, frames + item.shape[1]
                item = await chunks.get()
            yield stream_message({"type": "end", "chunks": index, "frames": frames})
        finally:
            if item is not STREAM_END:
                job.cancel("client-gone")  # the reader left mid-stream: the worker stops early

    return BodyStream(messages(), media_type=STREAM_MEDIA_TYPE, headers=_queue_header(job))


async def mp4_stream(request: Request, job: Job, params: DecodeParams, encoders: EncoderPool,
                     problem_for: Callable[[EngineError], Problem]) -> Response:
    """Fragmented MP4 (``video/mp4``) written as the decode runs: the init segment, then a
    fragment per frame as the encoder lets go of it, so a browser plays while the decode runs.

    Errors before the first decode step are ordinary problem responses. After it an MP4 has no
    room for a message: the answer is cut off (no last chunk, the connection closed), the
    problem is logged with the request id, and the request is counted with the problem's status."""
    first = await _first_item(request, job, problem_for)
    chunks = job.chunks
    assert chunks is not None and isinstance(first, np.ndarray)
    _, _, height, width, _ = first.shape

    async def fragments() -> AsyncGenerator[bytes, None]:
        item: object = first
        try:
            async with encoders.encoder(height, width, fps=params.fps, crf=params.crf, fragmented=True) as encoding:
                while item is not STREAM_END:
                    if isinstance(item, EngineError):
                        problem = problem_for(item)
                        log.warning("request %s: stream cut off after it began: %s %s", job.request_id,
                                    problem.status, problem.detail)
                        raise StreamCut(problem)
                    assert isinstance(item, np.ndarray)
                    data = await encoding.write(item[0])
                    job.consumed(item.nbytes)
                    if data:
                        yield data
                    item = await chunks.get()
                yield await encoding.close()
        finally:
            if item is not STREAM_END:
                job.cancel("client-gone")

    return BodyStream(fragments(), media_type="video/mp4", headers=_queue_header(job))


async def pipelined_mp4(request: Request, job: Job, params: DecodeParams, encoders: EncoderPool) -> Response:
    """An ordinary ``video/mp4`` answer (faststart), its frames encoded as each decode step leaves
    the device, so the answer takes about max(decode, encode) instead of their sum. An error at any
    point is an ordinary problem response (``EngineError`` raised; the status line is not sent)."""
    chunks = job.chunks
    assert chunks is not None

    async def encode() -> tuple[bytes, float]:
        item = await chunks.get()
        if isinstance(item, EngineError):
            raise item
        assert isinstance(item, np.ndarray)
        _, _, height, width, _ = item.shape
        async with encoders.encoder(height, width, fps=params.fps, crf=params.crf) as encoding:
            while item is not STREAM_END:
                if isinstance(item, EngineError):
                    raise item
                assert isinstance(item, np.ndarray)
                await encoding.write(item[0])
                job.consumed(item.nbytes)
                item = await chunks.get()
            return await encoding.close(), encoding.seconds

    body, encode_s = await wait_for(request, job, asyncio.ensure_future(encode()))
    headers = {**_queue_header(job), "X-Device-Time-S": f"{job.device_s:.6f}",
               "X-Serialize-Time-S": f"{encode_s:.6f}", "X-Batch-Size": str(job.batch_size)}
    return Response(body, media_type="video/mp4", headers=headers)
