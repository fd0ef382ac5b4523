"""``POST /v1/decode``: latents in, video / frames / tensor out."""

from __future__ import annotations

import asyncio

import anyio
import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from ...engine.errors import EngineError
from ...engine.jobs import Job
from .. import responses
from ..deps import ApiKeyDep, DecodeParamsDep, LatentsMediaTypeDep, StateDep
from ..inputs import decode_inputs
from ..schemas import DECODE_OPENAPI, DECODE_RESPONSES
from .jobs import serve_job

router = APIRouter()


@router.post("/v1/decode", dependencies=[ApiKeyDep], tags=["decode"], response_class=Response,
             responses=DECODE_RESPONSES, openapi_extra=DECODE_OPENAPI)
async def decode(request: Request, params: DecodeParamsDep, media_type: LatentsMediaTypeDep,
                 state: StateDep) -> Response:
    """Decode latents ``(B, C, T, H, W)`` or ``(C, T, H, W)`` (``C``: the model's latent channels);
    see the API docs for the formats."""
    retry_after_s = state.settings.retry_after_s

    def make_job(parsed: tuple[np.ndarray, bool], arrived: float) -> Job:
        return Job(request.state.request_id, "decode", parsed[0], params.output, params.stream,
                   deadline=arrived + params.timeout_s, loop=asyncio.get_running_loop(), arrived=arrived)

    async def answer(job: Job, parsed: tuple[np.ndarray, bool]) -> Response:
        batched = parsed[1]
        if params.stream:
            return await responses.stream(request, job, batched,
                                          lambda error: responses.decode_problem(error, params, job, retry_after_s))
        try:
            result = await responses.wait_for(request, job, job.future)
        except EngineError as error:  # named with this request's scaling when the output is not finite
            raise responses.decode_problem(error, params, job, retry_after_s) from None
        return await responses.render_frames(result, params, batched, state.metrics)

    return await serve_job(
        request, state, make_job=make_job, answer=answer,
        parse=lambda body, model, holds, arrived: anyio.to_thread.run_sync(
            decode_inputs, body, media_type, params, model, state.metrics))
