"""``POST /v1/decode`` (and ``/v1/models/{name}/decode``): latents in, video / frames / tensor out."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import anyio
import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from vaeserve.models.sound import SoundInfo

from ...codecs.audio import Sound
from ...engine.errors import EngineError
from ...engine.jobs import Job
from .. import responses, sound, streams
from ..deps import ApiKeyDep, DecodeParamsDep, LatentsMediaTypeDep, ModelNameDep, ModelPathDep, StateDep
from ..inputs import DecodeInputs, declared_latents, decode_inputs, decode_options
from ..lifecycle import admitted
from ..query import StrictQueryDep
from ..schemas import DECODE_OPENAPI, DECODE_RESPONSES, DecodeParams
from ..state import ServiceState

router = APIRouter(tags=["decode"])


# Decorators apply from the bottom: /v1/decode is registered (and documented) first.
@router.post("/v1/models/{name:path}/decode", dependencies=[ApiKeyDep, ModelPathDep, StrictQueryDep],
             response_class=Response, responses=DECODE_RESPONSES, openapi_extra=DECODE_OPENAPI)
@router.post("/v1/decode", dependencies=[ApiKeyDep, StrictQueryDep], response_class=Response, responses=DECODE_RESPONSES,
             openapi_extra=DECODE_OPENAPI)
async def decode(request: Request, params: DecodeParamsDep, media_type: LatentsMediaTypeDep, model: ModelNameDep,
                 state: StateDep) -> Response:
    """Decode latents ``(B, C, T, H, W)`` or ``(C, T, H, W)`` (``C``: the model's latent channels)
    with the model the path or the ``model`` parameter names; see the API docs for the formats."""
    async with admitted(request, state, params.timeout_s, model) as admission:
        conditions = decode_options(params, admission.model)
        declared = declared_latents(params, media_type, admission.model)
        if declared is not None:  # a raw body: its shape is in the query, checked before the body is read
            await admission.reserve_decode(declared, params)
        async with admission.body() as body:
            inputs = await anyio.to_thread.run_sync(decode_inputs, body, media_type, params, admission.model,
                                                    state.metrics)
        if inputs.sound is not None:
            await admission.reserve_sound(inputs.sound.shape)
        if inputs.latents is None:  # the sound alone
            assert inputs.sound is not None
            job = admission.submit("sound", inputs.sound, output=params.output, stream=False)
            return await answer_sound(request, job, inputs, params, state, sound.sound_of(admission.model))
        if declared is None:
            await admission.reserve_decode(inputs.latents.shape, params)
        job = admission.submit("decode", inputs.latents, output=params.output, stream=inputs.streamed,
                               framewise=params.framewise, decode=conditions, sound=inputs.sound)
        soundtrack = None if inputs.sound is None else sound.soundtrack(sound.sound_of(admission.model),
                                                                        state.settings.audio_bitrate)
        return await answer(request, job, inputs, params, state, soundtrack)


async def answer(request: Request, job: Job, inputs: DecodeInputs, params: DecodeParams,
                 state: ServiceState, soundtrack: Callable[[np.ndarray], Sound] | None = None) -> Response:
    """The answer ``params`` asks for: a stream of frames or fragmented MP4 as the decode runs, an
    MP4 written step by step (with its ``soundtrack``), or the whole decode serialized. Engine
    errors become problems that name this request's scaling."""
    problem_for = partial(responses.decode_problem, params=params, job=job, retry_after_s=state.settings.retry_after_s)
    mp4_pool = state.mp4_pool
    assert mp4_pool is not None
    try:
        if params.mp4_stream:
            return await streams.mp4_stream(request, job, params, mp4_pool, problem_for, soundtrack)
        if params.stream:
            return await streams.frame_stream(request, job, inputs.batched, problem_for)
        if inputs.streamed:
            return await streams.pipelined_mp4(request, job, params, mp4_pool, soundtrack)
        frames = await responses.wait_for(request, job, job.future)
    except EngineError as error:
        raise problem_for(error) from None
    return await responses.render_frames(job, frames, params, inputs.batched, state.metrics)


async def answer_sound(request: Request, job: Job, inputs: DecodeInputs, params: DecodeParams, state: ServiceState,
                       info: SoundInfo) -> Response:
    """The sound decoded alone (WAV, FLAC or npy waveforms)."""
    try:
        waveforms = await responses.wait_for(request, job, job.future)
    except EngineError as error:
        raise responses.decode_problem(error, params, job, state.settings.retry_after_s) from None
    return await responses.render_sound(job, waveforms, params, inputs.batched, info.sample_rate, state.metrics)
