"""``POST /v1/decode``: latents in, video / frames / tensor out."""

from __future__ import annotations

import asyncio
import logging
import time

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import Response

from .. import responses
from ..admission import read_body
from ..deps import ApiKeyDep, DecodeParamsDep, MediaTypeDep, StateDep
from ..errors import CLIENT_GONE, ClientGone
from ..preprocess import decode_inputs
from ..protocol import DECODE_OPENAPI, DECODE_RESPONSES
from ..worker import Job

log = logging.getLogger("vaeserve")

router = APIRouter()


@router.post("/v1/decode", dependencies=[ApiKeyDep], tags=["decode"], response_class=Response,
             responses=DECODE_RESPONSES, openapi_extra=DECODE_OPENAPI)
async def decode(request: Request, params: DecodeParamsDep, media_type: MediaTypeDep, state: StateDep) -> Response:
    """Decode latents ``(B, 16, T, H, W)`` or ``(16, T, H, W)``; see the README for formats."""
    arrived = time.monotonic()
    model, worker = state.serving()
    ticket = worker.reserve()  # 429 here, before a byte of the body is read
    settings, request_id = state.settings, request.state.request_id
    try:
        async with read_body(request, max_bytes=settings.max_body_bytes, budget=state.reading,
                             timeout_s=settings.read_timeout_s, retry_after_s=settings.retry_after_s) as body:
            latents, batched = await anyio.to_thread.run_sync(decode_inputs, body, media_type, params, model,
                                                              state.metrics)
        job = Job(request_id, "decode", latents, params.output, params.stream, deadline=arrived + params.timeout_s,
                  loop=asyncio.get_running_loop(), arrived=arrived)
        worker.submit(job, ticket)
        if params.stream:
            return await responses.stream(request, job, batched)
        result = await responses.wait_for(request, job, job.future)
    except ClientGone as gone:
        log.info("request %s: %s", request_id, gone)
        return Response(status_code=CLIENT_GONE)
    finally:
        ticket.release()  # a no-op once the job was submitted
    response = await responses.render(result, params, batched, state.metrics)
    state.metrics.total_seconds.observe(time.monotonic() - arrived)
    return response
