"""``POST /v1/encode``: an image, an MP4 or frames in, latents out (diffusers' ``remote_encode`` contract)."""

from __future__ import annotations

import asyncio
import logging
import time

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import Response

from models.encode import posterior_options

from .. import responses
from ..admission import read_body
from ..deps import ApiKeyDep, EncodeMediaTypeDep, EncodeParamsDep, StateDep
from ..errors import CLIENT_GONE, ClientGone
from ..preprocess import encode_inputs
from ..protocol import ENCODE_OPENAPI, ENCODE_RESPONSES
from ..worker import Job

log = logging.getLogger("vaeserve")

router = APIRouter()


@router.post("/v1/encode", dependencies=[ApiKeyDep], tags=["encode"], response_class=Response,
             responses=ENCODE_RESPONSES, openapi_extra=ENCODE_OPENAPI)
async def encode(request: Request, params: EncodeParamsDep, media_type: EncodeMediaTypeDep,
                 state: StateDep) -> Response:
    """Encode to float32 latents ``(B, z, T, H/s, W/s)`` (``s`` 8 for Wan 2.1, 16 for Wan 2.2); see the
    README for body formats."""
    arrived = time.monotonic()
    model, worker = state.serving()
    model.require_encoder()  # 501 before a byte of the body is read
    ticket = worker.reserve()  # 429 here, likewise
    settings, request_id = state.settings, request.state.request_id
    try:
        async with read_body(request, max_bytes=settings.max_body_bytes, budget=state.reading,
                             timeout_s=settings.read_timeout_s, retry_after_s=settings.retry_after_s) as body:
            video = await anyio.to_thread.run_sync(encode_inputs, body, media_type, params, model, state.metrics)
        options = posterior_options(video.shape[0], sample=params.sample, seed=params.seed, normalize=params.normalize)
        job = Job(request_id, "encode", video, "float", False, deadline=arrived + params.timeout_s,
                  loop=asyncio.get_running_loop(), arrived=arrived, options=options)
        worker.submit(job, ticket)
        result = await responses.wait_for(request, job, job.future)
    except ClientGone as gone:
        log.info("request %s: %s", request_id, gone)
        return Response(status_code=CLIENT_GONE)
    finally:
        ticket.release()  # a no-op once the job was submitted
    response = await responses.render_latents(result, params, state.metrics)
    state.metrics.total_seconds.observe(time.monotonic() - arrived)
    return response
