"""``POST /v1/encode`` (and ``/v1/models/{name}/encode``): an image, an MP4 or frames in, latents out
(diffusers' ``remote_encode`` contract); or a sound in (a WAV, FLAC or an MP4's track: docs/audio.md),
audio latents out."""

from __future__ import annotations

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import Response

from ...engine.jobs import EncodeOptions
from .. import responses
from ..deps import ApiKeyDep, EncodeParamsDep, FramesMediaTypeDep, ModelNameDep, ModelPathDep, StateDep
from ..inputs import encode_header
from ..lifecycle import admitted
from ..query import StrictQueryDep
from ..schemas import ENCODE_OPENAPI, ENCODE_RESPONSES, EncodeParams
from ..sound_encode import encodes_sound, read_waveform, sound_encode_host_bytes, sound_encoder_of
from ..state import ServiceState

router = APIRouter(tags=["encode"])


# Decorators apply from the bottom: /v1/encode is registered (and documented) first.
@router.post("/v1/models/{name:path}/encode", dependencies=[ApiKeyDep, ModelPathDep, StrictQueryDep],
             response_class=Response, responses=ENCODE_RESPONSES, openapi_extra=ENCODE_OPENAPI)
@router.post("/v1/encode", dependencies=[ApiKeyDep, StrictQueryDep], response_class=Response, responses=ENCODE_RESPONSES,
             openapi_extra=ENCODE_OPENAPI)
async def encode(request: Request, params: EncodeParamsDep, media_type: FramesMediaTypeDep, model: ModelNameDep,
                 state: StateDep) -> Response:
    """Encode to float32 latents ``(B, z, T, H/s, W/s)`` (``z``, ``s``: the model's latent channels
    and spatial scale, ``/v1/models``) with the model the path or the ``model`` parameter names;
    see the API docs for the body formats. A sound's body: ``encode_sound``."""
    if encodes_sound(media_type, params):
        return await encode_sound(request, params, media_type, model, state)
    state.serving(model)[0].require_encoder()  # 501 before a queue slot is taken or a byte of the body read
    async with admitted(request, state, params.timeout_s, model) as admission:
        async with admission.body() as body:
            # Headers first (4xx before a pixel exists), then the memory: the encode's program
            # against the devices' (the estimate) and its frames in the host account (waiting up
            # to the deadline), then the decode into one array.
            header = await anyio.to_thread.run_sync(encode_header, body, media_type, params, admission.model,
                                                    state.metrics, tuple(state.settings.video_codecs))
            await admission.reserve_encode(header)
            frames = await anyio.to_thread.run_sync(header.read, admission.deadline)
        options = EncodeOptions.resolve(sample=params.sample, seed=params.seed, normalize=params.normalize)
        job = admission.submit("encode", frames, output="float", stream=False, encode=options)
        latents = await responses.wait_for(request, job, job.future)
        return await responses.render_latents(job, latents, params, state.metrics)


async def encode_sound(request: Request, params: EncodeParams, media_type: str, model: str | None,
                       state: ServiceState) -> Response:
    """A sound (``service.http.sound_encode``) to float32 audio latents ``(1, *layout)`` (the
    model's ``sound.latent_layout``), answered in the formats video latents are."""
    info = sound_encoder_of(state.serving(model)[0], params)  # 422 before a queue slot or a byte of the body
    async with admitted(request, state, params.timeout_s, model) as admission:
        async with admission.body() as body:
            waveform = await anyio.to_thread.run_sync(read_waveform, body, media_type, info,
                                                      admission.model.limits.max_audio_seconds)
        await admission.hold_host(sound_encode_host_bytes(waveform.shape, info))
        job = admission.submit("sound_encode", waveform, output="float", stream=False)
        latents = await responses.wait_for(request, job, job.future)
        return await responses.render_latents(job, latents, params, state.metrics)
