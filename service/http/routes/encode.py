"""``POST /v1/encode``: an image, an MP4 or frames in, latents out (diffusers' ``remote_encode`` contract)."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

import anyio
import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from ...engine.jobs import EncodeOptions, Job
from ...engine.model import ModelState
from .. import responses
from ..deps import ApiKeyDep, EncodeParamsDep, FramesMediaTypeDep, StateDep
from ..inputs import encode_header
from ..schemas import ENCODE_OPENAPI, ENCODE_RESPONSES
from .jobs import serve_job

router = APIRouter()


@router.post("/v1/encode", dependencies=[ApiKeyDep], tags=["encode"], response_class=Response,
             responses=ENCODE_RESPONSES, openapi_extra=ENCODE_OPENAPI)
async def encode(request: Request, params: EncodeParamsDep, media_type: FramesMediaTypeDep,
                 state: StateDep) -> Response:
    """Encode to float32 latents ``(B, z, T, H/s, W/s)`` (``z``, ``s``: the model's latent channels
    and spatial scale, ``/v1/models``); see the API docs for the body formats."""

    def make_job(video: np.ndarray, arrived: float) -> Job:
        options = EncodeOptions.resolve(sample=params.sample, seed=params.seed, normalize=params.normalize)
        return Job(request.state.request_id, "encode", video, "float", False, deadline=arrived + params.timeout_s,
                   loop=asyncio.get_running_loop(), arrived=arrived, encode=options)

    async def answer(job: Job, video: np.ndarray) -> Response:
        result = await responses.wait_for(request, job, job.future)
        return await responses.render_latents(result, params, state.metrics)

    async def parse(body: bytes, model: ModelState, holds: AsyncExitStack, arrived: float) -> np.ndarray:
        """Headers first (4xx before a pixel exists), then room for the frames in the host budget
        (waiting up to the deadline), then the decode into one array."""
        plan = await anyio.to_thread.run_sync(encode_header, body, media_type, params, model, state.metrics, codecs)
        deadline = arrived + params.timeout_s
        await holds.enter_async_context(state.decoded.hold(
            plan.nbytes, deadline=deadline, retry_after_s=state.settings.retry_after_s, request=request))
        return await anyio.to_thread.run_sync(plan.read, deadline)

    codecs = tuple(state.settings.video_codecs)
    return await serve_job(
        request, state, make_job=make_job, answer=answer, parse=parse,
        before_body=lambda model: model.require_encoder())  # 501 before a byte of the body is read
