"""``POST /v1/decode``: latents in, video / frames / tensor out."""

from __future__ import annotations

import asyncio

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from .. import responses
from ..deps import ApiKeyDep, DecodeParamsDep, MediaTypeDep, StateDep
from ..preprocess import decode_inputs
from ..protocol import DECODE_OPENAPI, DECODE_RESPONSES
from ..worker import Job
from .jobs import serve_job

router = APIRouter()


@router.post("/v1/decode", dependencies=[ApiKeyDep], tags=["decode"], response_class=Response,
             responses=DECODE_RESPONSES, openapi_extra=DECODE_OPENAPI)
async def decode(request: Request, params: DecodeParamsDep, media_type: MediaTypeDep, state: StateDep) -> Response:
    """Decode latents ``(B, 16, T, H, W)`` or ``(16, T, H, W)``; see the README for formats."""

    def make_job(parsed: tuple[np.ndarray, bool], arrived: float) -> Job:
        return Job(request.state.request_id, "decode", parsed[0], params.output, params.stream,
                   deadline=arrived + params.timeout_s, loop=asyncio.get_running_loop(), arrived=arrived)

    async def answer(job: Job, parsed: tuple[np.ndarray, bool]) -> Response:
        batched = parsed[1]
        if params.stream:
            return await responses.stream(request, job, batched)
        result = await responses.wait_for(request, job, job.future)
        return await responses.render(result, params, batched, state.metrics)

    return await serve_job(
        request, state, make_job=make_job, answer=answer,
        parse=lambda body, model: decode_inputs(body, media_type, params, model, state.metrics))
