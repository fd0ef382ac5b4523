"""``POST /v1/encode``: an image, an MP4 or frames in, latents out (diffusers' ``remote_encode`` contract)."""

from __future__ import annotations

import asyncio

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from models.encode import posterior_options

from .. import responses
from ..deps import ApiKeyDep, EncodeMediaTypeDep, EncodeParamsDep, StateDep
from ..preprocess import encode_inputs
from ..protocol import ENCODE_OPENAPI, ENCODE_RESPONSES
from ..worker import Job
from .jobs import serve_job

router = APIRouter()


@router.post("/v1/encode", dependencies=[ApiKeyDep], tags=["encode"], response_class=Response,
             responses=ENCODE_RESPONSES, openapi_extra=ENCODE_OPENAPI)
async def encode(request: Request, params: EncodeParamsDep, media_type: EncodeMediaTypeDep,
                 state: StateDep) -> Response:
    """Encode to float32 latents ``(B, z, T, H/s, W/s)`` (``s`` 8 for Wan 2.1, 16 for Wan 2.2); see the
    README for body formats."""

    def make_job(video: np.ndarray, arrived: float) -> Job:
        options = posterior_options(video.shape[0], sample=params.sample, seed=params.seed, normalize=params.normalize)
        return Job(request.state.request_id, "encode", video, "float", False, deadline=arrived + params.timeout_s,
                   loop=asyncio.get_running_loop(), arrived=arrived, options=options)

    async def answer(job: Job, video: np.ndarray) -> Response:
        result = await responses.wait_for(request, job, job.future)
        return await responses.render_latents(result, params, state.metrics)

    return await serve_job(
        request, state, make_job=make_job, answer=answer,
        before_body=lambda model: model.require_encoder(),  # 501 before a byte of the body is read
        parse=lambda body, model: encode_inputs(body, media_type, params, model, state.metrics))
