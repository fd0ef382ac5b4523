"""Answers written while the decode runs: the raw frame stream, fragmented MP4, and an MP4 written
step by step (pipelined) for an ordinary answer.

Each consumes a stream job's chunks (uint8 frames per decode step) through one loop,
:func:`job_frames`, which tells the job when the consumer has taken a chunk (``Job.consumed``):
the device thread sets a job aside while it holds ``stream_buffer_bytes`` not yet taken, so a slow
reader or a busy MP4 writer holds bounded memory and never holds up the device. A reader that
takes nothing for ``write_timeout_s`` is dropped by the server (``service.http.server``); its
stream ends and is counted as 499.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing

import numpy as np
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from ..codecs.audio import Sound
from ..codecs.stream import STREAM_MEDIA_TYPE, stream_message
from ..engine.errors import EngineError
from ..engine.jobs import STREAM_END, Job
from ..problem import Problem
from .admission import unless_client_leaves
from .mp4_pool import Mp4Pool
from .problems import ClientGone
from .responses import job_headers, wait_for
from .schemas import DecodeParams

log = logging.getLogger("vaeserve")

# The largest piece handed to the server at once: the server buffers what the socket does not
# take of a piece, so a reader that stops holds at most this much (plus the transport's own
# 64 KiB) beyond its job's pending chunks.
WRITE_PIECE_BYTES = 256 * 2**10


async def job_frames(job: Job) -> AsyncGenerator[np.ndarray, None]:
    """A stream job's frames ``(B, f, H, W, 3)``, step by step, until its end. Each chunk counts as
    taken (``Job.consumed``) when the consumer asks for the next one; an ``EngineError`` the
    device thread pushed is raised here. A consumer that stops early cancels the job, so the device
    stops working for it."""
    chunks = job.chunks
    assert chunks is not None
    item: object = None
    try:
        while (item := await chunks.get()) is not STREAM_END:
            if isinstance(item, EngineError):
                raise item
            assert isinstance(item, np.ndarray)
            yield item
            job.consumed(item.nbytes)
    finally:
        if item is not STREAM_END:
            job.cancel("client-gone")


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
        try:
            await unless_client_leaves(receive, self._send_body(send))
        except ClientGone:
            return  # the body's generator was closed: its job is cancelled
        except StreamCut as cut:
            scope.setdefault("state", {})["cut_status"] = cut.problem.status
            return  # the server closes the connection: the answer was not completed
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _send_body(self, send: Send) -> None:
        async with aclosing(self.body_iterator) as body:
            async for data in body:
                view = memoryview(data)
                for offset in range(0, len(view), WRITE_PIECE_BYTES):
                    await send({"type": "http.response.body", "body": view[offset: offset + WRITE_PIECE_BYTES],
                                "more_body": True})


async def _first(request: Request, job: Job, frames: AsyncIterator[np.ndarray]) -> np.ndarray:
    """The stream's first chunk, waited for like an ordinary answer (deadline, client gone): an
    error before it is an ordinary problem response (the ``EngineError`` is raised)."""
    return await wait_for(request, job, anext(frames))


async def frame_stream(request: Request, job: Job, batched: bool,
                       problem_for: Callable[[EngineError], Problem]) -> Response:
    """Raw uint8 frames, one framed message per decode step (``service.codecs.stream``).

    Errors before the first chunk are ordinary problem responses; after it the status line is
    gone, so an error travels in-band as a ``{"type": "error"}`` message (``problem_for`` turns
    the engine's error into its problem), and the stream ends there."""
    frames = job_frames(job)
    first = await _first(request, job, frames)

    async def messages() -> AsyncGenerator[bytes, None]:
        index, count = 0, 0
        async with aclosing(frames):
            try:
                chunk = first
                while True:
                    piece = chunk if batched else chunk[0]
                    yield stream_message(
                        {"type": "frames", "index": index, "frame_start": count, "shape": list(piece.shape),
                         "dtype": "uint8"}, np.ascontiguousarray(piece).tobytes())
                    index, count = index + 1, count + chunk.shape[1]
                    chunk = await anext(frames)
            except StopAsyncIteration:
                yield stream_message({"type": "end", "chunks": index, "frames": count})
            except EngineError as error:
                problem = problem_for(error).body(request.url.path, job.request_id)
                yield stream_message({"type": "error", "problem": problem})

    return BodyStream(messages(), media_type=STREAM_MEDIA_TYPE, headers=job_headers(job))


async def mp4_stream(request: Request, job: Job, params: DecodeParams, mp4_pool: Mp4Pool,
                     problem_for: Callable[[EngineError], Problem],
                     soundtrack: Callable[[np.ndarray], Sound] | None = None) -> Response:
    """Fragmented MP4 (``video/mp4``) written as the decode runs: the init segment, then a
    fragment per frame as the H.264 encoder lets go of it, so a browser plays while the decode runs;
    with the job's sound (decoded before its frames) as the ``soundtrack`` of its waveforms, its
    packets after the frames they accompany.

    Errors before the first decode step are ordinary problem responses. After it an MP4 has no
    room for a message: the answer is cut off (no last chunk, the connection closed), the
    problem is logged with the request id, and the request is counted with the problem's status."""
    frames = job_frames(job)
    sound = None if soundtrack is None else soundtrack(await wait_for(request, job, job.heard))
    first = await _first(request, job, frames)
    _, _, height, width, _ = first.shape

    async def fragments() -> AsyncGenerator[bytes, None]:
        async with aclosing(frames), mp4_pool.writer(height, width, fps=params.fps, crf=params.crf,
                                                     fragmented=True, sound=sound) as writer:
            try:
                chunk = first
                while True:
                    if data := await writer.write(chunk[0]):
                        yield data
                    chunk = await anext(frames)
            except StopAsyncIteration:
                yield await writer.close()
            except EngineError as error:
                problem = problem_for(error)
                log.warning("request %s: stream cut off after it began: %s %s", job.request_id, problem.status,
                            problem.detail)
                raise StreamCut(problem) from None

    return BodyStream(fragments(), media_type="video/mp4", headers=job_headers(job))


async def pipelined_mp4(request: Request, job: Job, params: DecodeParams, mp4_pool: Mp4Pool,
                        soundtrack: Callable[[np.ndarray], Sound] | None = None) -> Response:
    """An ordinary ``video/mp4`` answer (faststart), its frames written as each decode step leaves
    the device, so the answer takes about max(decode, MP4) instead of their sum; with the job's
    sound (decoded before its frames) as the ``soundtrack`` of its waveforms. An error at any
    point is an ordinary problem response (``EngineError`` raised; the status line is not sent)."""

    async def write() -> tuple[bytes, float]:
        async with aclosing(job_frames(job)) as frames:
            sound = None if soundtrack is None else soundtrack(await job.heard)
            first = await anext(frames)
            _, _, height, width, _ = first.shape
            async with mp4_pool.writer(height, width, fps=params.fps, crf=params.crf, sound=sound) as writer:
                await writer.write(first[0])
                async for chunk in frames:
                    await writer.write(chunk[0])
                return await writer.close(), writer.seconds

    body, mp4_s = await wait_for(request, job, write())
    return Response(body, media_type="video/mp4", headers=job_headers(job, serialize_s=mp4_s))
