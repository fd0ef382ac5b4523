"""``POST /v1/decode``: latents in, video / frames / tensor out."""

from __future__ import annotations

import asyncio

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import Response

from ...engine.errors import EngineError
from ...engine.jobs import Job
from ...problem import Problem
from .. import responses, streams
from ..deps import ApiKeyDep, DecodeParamsDep, LatentsMediaTypeDep, StateDep
from ..inputs import DecodeInputs, decode_inputs
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

    def make_job(parsed: DecodeInputs, arrived: float) -> Job:
        return Job(request.state.request_id, "decode", parsed.latents, params.output, parsed.stepped,
                   deadline=arrived + params.timeout_s, loop=asyncio.get_running_loop(), arrived=arrived,
                   framewise=params.framewise)

    async def answer(job: Job, parsed: DecodeInputs) -> Response:
        def problem_for(error: EngineError) -> Problem:  # named with this request's scaling when not finite
            return responses.decode_problem(error, params, job, retry_after_s)

        encoders = state.encoders
        assert encoders is not None
        if params.mp4_stream:
            return await streams.mp4_stream(request, job, params, encoders, problem_for)
        if params.stream:
            return await streams.frame_stream(request, job, parsed.batched, problem_for)
        try:
            if parsed.stepped:
                return await streams.pipelined_mp4(request, job, params, encoders)
            result = await responses.wait_for(request, job, job.future)
        except EngineError as error:
            raise problem_for(error) from None
        return await responses.render_frames(result, params, parsed.batched, state.metrics, encoders)

    return await serve_job(
        request, state, make_job=make_job, answer=answer,
        parse=lambda body, model, holds, arrived: anyio.to_thread.run_sync(
            decode_inputs, body, media_type, params, model, state.metrics))
