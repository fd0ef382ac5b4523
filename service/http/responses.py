"""From a queued job to an HTTP response: wait (deadline, client gone), serialize. Answers written
while the decode runs (streams, MP4 encoded step by step) are in ``service.http.streams``."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import anyio
import numpy as np
from fastapi import Request
from fastapi.responses import Response

from ..codecs.latents import LATENT_MEDIA_TYPES, scale_latents, serialize_latents
from ..codecs.tensors import NPY_CONTENT_TYPE, npy_bytes
from ..codecs.video import png_bytes
from ..engine.errors import EngineError, NonFiniteOutput
from ..engine.jobs import Job, JobResult
from ..metrics import Metrics
from ..problem import Problem
from .admission import client_left
from .encoders import EncoderPool
from .problems import ClientGone, engine_problem
from .schemas import DecodeParams, EncodeParams


async def wait_for(request: Request, job: Job, awaitable: asyncio.Future):
    """Result of ``awaitable``, or 504 at the job's deadline, or ClientGone if the client left.
    Either way out, ``awaitable`` is cancelled and the job is marked cancelled so the worker does
    not spend device time on it."""
    watcher = asyncio.ensure_future(client_left(request))
    try:
        done, _ = await asyncio.wait(
            {awaitable, watcher}, timeout=max(0.0, job.deadline - time.monotonic()),
            return_when=asyncio.FIRST_COMPLETED,
        )
    finally:
        watcher.cancel()
    if awaitable in done:
        return awaitable.result()
    awaitable.cancel()
    if watcher in done:
        job.cancel("client-gone")
        raise ClientGone("client left while its request was queued or decoding")
    job.cancel("deadline")
    raise Problem(504, "deadline-exceeded", f"no result within the deadline (request id {job.request_id})",
                  expected="decode finished before the deadline", received="deadline passed")


def scaling_text(params: DecodeParams) -> str:
    """How a decode request scaled its latents, for the problem of a non-finite decode."""
    return (f"scaling_factor={params.scaling_factor}, shift_factor={params.shift_factor}, "
            f"denormalize={str(params.denormalize).lower()}")


def decode_problem(error: EngineError, params: DecodeParams, job: Job, retry_after_s: int) -> Problem:
    return engine_problem(error, retry_after_s=retry_after_s, request_id=job.request_id,
                          scaling=scaling_text(params) if isinstance(error, NonFiniteOutput) else None)


def timing_headers(result: JobResult, serialize_s: float) -> dict[str, str]:
    return {"X-Queue-Time-S": f"{result.queue_s:.6f}", "X-Device-Time-S": f"{result.device_s:.6f}",
            "X-Serialize-Time-S": f"{serialize_s:.6f}", "X-Batch-Size": str(result.batch_size)}


def _frames_body(array: np.ndarray, params: DecodeParams, batched: bool) -> tuple[bytes, str, dict[str, str]]:
    """Decoded frames from the worker -> (body, media type, extra headers), all but MP4. Runs in a thread."""
    if params.output_type == "png":
        return png_bytes(array[0, params.frame]), "image/png", {}
    out = array if batched else array[0]
    if params.output_type == "npy":
        return npy_bytes(out), NPY_CONTENT_TYPE, {}
    # pt: raw little-endian bytes, described by headers the way diffusers' client reads them.
    if out.dtype != np.uint8:
        out = out.astype("<f2")
    dtype = "uint8" if out.dtype == np.uint8 else "float16"
    headers = {"shape": json.dumps(list(out.shape)), "dtype": dtype}
    return np.ascontiguousarray(out).tobytes(), "application/octet-stream", headers


def _latents_body(latents: np.ndarray, params: EncodeParams) -> tuple[bytes, str, dict[str, str]]:
    """Encoded latents from the worker → ``pt`` / ``npy`` / ``safetensors``, scaled as asked on the way out."""
    body, headers = serialize_latents(scale_latents(latents, params.scaling_factor, params.shift_factor),
                                      params.output_type)
    return body, LATENT_MEDIA_TYPES[params.output_type], headers


async def _serialized(result: JobResult, output_type: str, metrics: Metrics,
                      serialize: Callable[[np.ndarray], tuple[bytes, str, dict[str, str]]]) -> Response:
    start = time.monotonic()
    body, media_type, headers = await anyio.to_thread.run_sync(serialize, result.array)
    serialize_s = time.monotonic() - start
    metrics.serialize_seconds.labels(output_type).observe(serialize_s)
    return Response(body, media_type=media_type, headers={**headers, **timing_headers(result, serialize_s)})


async def render_frames(result: JobResult, params: DecodeParams, batched: bool, metrics: Metrics,
                        encoders: EncoderPool) -> Response:
    if params.output_type == "mp4":  # whole (the step programs are not served): on an MP4 encoder
        start = time.monotonic()
        body = await encoders.encode(result.array[0], fps=params.fps, crf=params.crf)
        return Response(body, media_type="video/mp4", headers=timing_headers(result, time.monotonic() - start))
    return await _serialized(result, params.output_type, metrics, lambda a: _frames_body(a, params, batched))


async def render_latents(result: JobResult, params: EncodeParams, metrics: Metrics) -> Response:
    return await _serialized(result, params.output_type, metrics, lambda a: _latents_body(a, params))
