"""From a queued job to an HTTP response: wait (deadline, client gone), encode, stream."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import anyio
import numpy as np
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from . import codec, frames
from .errors import ClientGone, Problem
from .metrics import Metrics
from .protocol import DecodeParams, EncodeParams
from .worker import STREAM_END, Job, JobResult

STREAM_MEDIA_TYPE = "application/x-vaeserve-stream"

async def _wait_disconnect(request: Request) -> None:
    # The body is already read, so the next ASGI message can only be http.disconnect.
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def wait_for(request: Request, job: Job, awaitable: asyncio.Future):
    """Result of ``awaitable``, or 504 at the job's deadline, or ClientGone if the client left.
    Either way out, the job is marked cancelled so the worker does not spend device time on it."""
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait(
            {awaitable, watcher}, timeout=max(0.0, job.deadline - time.monotonic()),
            return_when=asyncio.FIRST_COMPLETED,
        )
    finally:
        watcher.cancel()
    if awaitable in done:
        return awaitable.result()
    if watcher in done:
        job.cancel("client-gone")
        raise ClientGone("client left while its request was queued or decoding")
    job.cancel("deadline")
    raise Problem(504, "deadline-exceeded", f"no result within the deadline (request id {job.request_id})",
                  expected="decode finished before the deadline", received="deadline passed")


def timing_headers(result: JobResult, encode_s: float | None = None) -> dict[str, str]:
    headers = {"X-Queue-Time-S": f"{result.queue_s:.6f}", "X-Decode-Time-S": f"{result.decode_s:.6f}",
               "X-Batch-Size": str(result.batch_size)}
    if encode_s is not None:
        headers["X-Encode-Time-S"] = f"{encode_s:.6f}"
    return headers


def _encode(array: np.ndarray, params: DecodeParams, batched: bool) -> tuple[bytes, str, dict[str, str]]:
    """Host array from the worker -> (body, media type, extra headers). Runs in a thread."""
    if params.output_type == "mp4":
        return codec.encode_mp4(array[0], fps=params.fps, crf=params.crf), "video/mp4", {}
    if params.output_type == "png":
        return codec.encode_png(array[0, params.frame]), "image/png", {}
    out = array if batched else array[0]
    if params.output_type == "npy":
        return codec.encode_npy(out), codec.NPY_CONTENT_TYPE, {}
    # pt: raw little-endian bytes, described by headers the way diffusers' client reads them.
    if out.dtype != np.uint8:
        out = out.astype("<f2")
    dtype = "uint8" if out.dtype == np.uint8 else "float16"
    headers = {"shape": json.dumps(list(out.shape)), "dtype": dtype}
    return np.ascontiguousarray(out).tobytes(), "application/octet-stream", headers


async def render(result: JobResult, params: DecodeParams, batched: bool, metrics: Metrics) -> Response:
    start = time.monotonic()
    body, media_type, headers = await anyio.to_thread.run_sync(_encode, result.array, params, batched)
    encode_s = time.monotonic() - start
    metrics.encode_seconds.observe(encode_s)
    return Response(body, media_type=media_type, headers={**headers, **timing_headers(result, encode_s)})


def _serialize_latents(latents: np.ndarray, params: EncodeParams) -> tuple[bytes, dict[str, str]]:
    return frames.encode_latents(frames.apply_scaling(latents, params.scaling_factor, params.shift_factor),
                                 params.output_type)


async def render_latents(result: JobResult, params: EncodeParams, metrics: Metrics) -> Response:
    """Latents from the worker → ``pt`` / ``npy`` / ``safetensors`` (scaled as asked on the way out)."""
    start = time.monotonic()
    body, headers = await anyio.to_thread.run_sync(_serialize_latents, result.array, params)
    metrics.encode_seconds.observe(time.monotonic() - start)
    timing = {"X-Queue-Time-S": f"{result.queue_s:.6f}", "X-Device-Time-S": f"{result.decode_s:.6f}",
              "X-Batch-Size": str(result.batch_size)}
    return Response(body, media_type=frames.LATENT_MEDIA_TYPES[params.output_type], headers={**headers, **timing})


async def stream(request: Request, job: Job, batched: bool) -> Response:
    """Raw uint8 frames, one framed message per decode chunk (see codec.stream_message).

    Errors before the first chunk are ordinary problem responses; after it the status line is
    gone, so an error travels in-band as a ``{"type": "error"}`` message."""
    chunks = job.chunks
    assert chunks is not None
    getter = asyncio.ensure_future(chunks.get())
    try:
        first = await wait_for(request, job, getter)
    finally:
        getter.cancel()  # no-op once it has its item; otherwise it would wait forever
    if isinstance(first, Problem):
        raise first
    queue_s = (job.started or time.monotonic()) - job.arrived

    async def messages() -> AsyncIterator[bytes]:
        item, index, frames = first, 0, 0
        try:
            while item is not STREAM_END:
                if isinstance(item, Problem):
                    problem = item.body(request.url.path, job.request_id)
                    yield codec.stream_message({"type": "error", "problem": problem})
                    return
                chunk = item if batched else item[0]
                yield codec.stream_message(
                    {"type": "frames", "index": index, "frame_start": frames, "shape": list(chunk.shape),
                     "dtype": "uint8"}, np.ascontiguousarray(chunk).tobytes())
                index, frames = index + 1, frames + item.shape[1]
                item = await chunks.get()
            yield codec.stream_message({"type": "end", "chunks": index, "frames": frames})
        finally:
            if item is not STREAM_END:
                job.cancel("client-gone")  # the reader left mid-stream: the worker stops early

    return StreamingResponse(messages(), media_type=STREAM_MEDIA_TYPE,
                             headers={"X-Queue-Time-S": f"{queue_s:.6f}"})
