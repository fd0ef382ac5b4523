"""From a submitted job to an HTTP response: wait for it (deadline, client gone), serialize it.
Answers written while the decode runs (streams, MP4 written step by step) are in
``service.http.streams``."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
import numpy as np
from fastapi import Request
from fastapi.responses import Response

from ..codecs.latents import LATENT_MEDIA_TYPES, scale_latents, serialize_latents
from ..codecs.tensors import NPY_CONTENT_TYPE, check_finite, npy_bytes
from ..codecs.video import jpeg_bytes, png_bytes
from ..engine.errors import DeadlineExceeded, EngineError, NonFiniteOutput
from ..engine.jobs import Job
from ..metrics import Metrics
from ..problem import Problem
from .admission import unless_client_leaves
from .problems import ClientGone, engine_problem
from .schemas import DecodeParams, EncodeParams
from .sound import sound_body

T = TypeVar("T")


async def wait_for(request: Request, job: Job, work: Awaitable[T]) -> T:
    """The result of ``work`` (the job's future, its first chunk, an MP4 written from its steps);
    ``DeadlineExceeded`` at the job's deadline, ``ClientGone`` if the client leaves first. Either
    way out the job is cancelled first, so the worker spends no more device time on it."""
    try:
        return await unless_client_leaves(request.receive, work, deadline=job.deadline, on_give_up=job.cancel)
    except ClientGone:
        raise ClientGone("client left while its request was queued or decoding") from None
    except TimeoutError:
        raise DeadlineExceeded(f"no result within the deadline (request id {job.request_id})") from None


def decode_problem(error: EngineError, params: DecodeParams, job: Job, retry_after_s: int) -> Problem:
    """The problem a decode's engine error is answered with (a non-finite decode names the request's scaling)."""
    return engine_problem(error, retry_after_s=retry_after_s, request_id=job.request_id,
                          scaling=params.scaling if isinstance(error, NonFiniteOutput) else None)


def job_headers(job: Job, *, serialize_s: float | None = None) -> dict[str, str]:
    """Where a request's time went: the queue (arrival to the start of its device batch) and, once
    the device is done with it, the device, the serialization and the batch it rode in; and the
    seed of a decode's noise (an LTX decoder's) or of an encode's sampled latents, so that the
    answer can be reproduced."""
    headers = {"X-Queue-Time-S": f"{(job.started or time.monotonic()) - job.arrived:.6f}"}
    if job.decode is not None:
        headers["X-Seed"] = str(job.decode.seed)
    if job.encode is not None and job.encode.sample:
        headers["X-Seed"] = str(job.encode.seed)
    if serialize_s is not None:
        headers |= {"X-Device-Time-S": f"{job.device_s:.6f}", "X-Serialize-Time-S": f"{serialize_s:.6f}",
                    "X-Batch-Size": str(job.batch_size)}
    return headers


IMAGE_FILES = {"png": (png_bytes, "image/png"), "jpeg": (jpeg_bytes, "image/jpeg")}


def _frames_body(array: np.ndarray, params: DecodeParams, batched: bool) -> tuple[bytes, str, dict[str, str]]:
    """Decoded frames from the worker -> (body, media type, extra headers), all but MP4. Runs in a
    thread. ``array``: uint8 ``(B, F, H, W, 3)`` or float ``(B, 3, F, H, W)``; an image model's
    ``(B, H, W, 3)`` or ``(B, 3, H, W)``."""
    if params.image_file is not None:
        write, media_type = IMAGE_FILES[params.image_file]
        return write(array[0] if array.ndim == 4 else array[0, params.frame]), media_type, {}
    out = array if batched else array[0]
    if params.output_type == "npy":
        return npy_bytes(out), NPY_CONTENT_TYPE, {}
    if params.pil_tensor:  # what diffusers' client turns into PIL images itself: (N, 3, H, W) in [0, 1]
        images = array.reshape(-1, *array.shape[-3:]).transpose(0, 3, 1, 2)
        out = (images.astype(np.float32) / np.float32(255)).astype("<f2")
    elif out.dtype != np.uint8:  # pt: float16, as diffusers' client takes it
        out = out.astype("<f2")
    # Raw little-endian bytes, described by headers the way diffusers' client reads them.
    dtype = "uint8" if out.dtype == np.uint8 else "float16"
    headers = {"shape": json.dumps(list(out.shape)), "dtype": dtype}
    return np.ascontiguousarray(out).tobytes(), "application/octet-stream", headers


def _latents_body(latents: np.ndarray, params: EncodeParams) -> tuple[bytes, str, dict[str, str]]:
    """Encoded latents from the worker → ``pt`` / ``npy`` / ``safetensors``, scaled as asked on the
    way out; 422 ``non-finite`` when the factors make them overflow, as a decode's scaled latents."""
    with np.errstate(over="ignore", invalid="ignore"):  # check_finite reports it
        scaled = scale_latents(latents, params.scaling_factor, params.shift_factor)
    # Checked scaled or not: latents of NaN/Inf are never answered 200.
    check_finite(scaled, "latents", where=f" after scaling ({params.scaling})" if scaled is not latents else "")
    body, headers = serialize_latents(scaled, params.output_type)
    return body, LATENT_MEDIA_TYPES[params.output_type], headers


async def _serialized(job: Job, array: np.ndarray, output_type: str, metrics: Metrics,
                      serialize: Callable[[np.ndarray], tuple[bytes, str, dict[str, str]]]) -> Response:
    start = time.monotonic()
    body, media_type, headers = await anyio.to_thread.run_sync(serialize, array)
    serialize_s = time.monotonic() - start
    metrics.serialize_seconds.labels(output_type).observe(serialize_s)
    return Response(body, media_type=media_type, headers={**headers, **job_headers(job, serialize_s=serialize_s)})


async def render_frames(job: Job, frames: np.ndarray, params: DecodeParams, batched: bool, metrics: Metrics) -> Response:
    """A whole decode's frames as the answer ``params`` asks for: npy, png or ``pt`` (an MP4 is
    written as the decode runs: ``service.http.streams.pipelined_mp4``)."""
    return await _serialized(job, frames, params.output_type, metrics, lambda a: _frames_body(a, params, batched))


async def render_sound(job: Job, waveforms: np.ndarray, params: DecodeParams, batched: bool, sample_rate: int,
                       metrics: Metrics) -> Response:
    """A sound decoded alone as the answer ``params`` asks for: WAV, FLAC or npy (``service.http.sound``)."""
    return await _serialized(job, waveforms, params.output_type, metrics,
                             lambda a: sound_body(a, params, batched, sample_rate))


async def render_latents(job: Job, latents: np.ndarray, params: EncodeParams, metrics: Metrics) -> Response:
    return await _serialized(job, latents, params.output_type, metrics, lambda a: _latents_body(a, params))
