"""FastAPI dependencies: the service state, auth, body headers, query parameters."""

from __future__ import annotations

import re
import secrets
from typing import Annotated

import numpy as np
from fastapi import Depends, Header, Path, Query, Request
from fastapi.openapi.models import HTTPBearer as HTTPBearerModel
from fastapi.security.base import SecurityBase

from vaeserve.models.conditions import SEED_RANGE, TIMESTEP_RANGE

from ..codecs.frames import check_frame_dims, check_frames_content_type
from ..codecs.latents import check_latent_dims, check_latents_content_type
from ..codecs.tensors import TENSOR_CONTENT_TYPES, media_type, parse_shape
from ..problem import Problem
from ..settings import Settings
from .schemas import DecodeParams, EncodeOutputType, EncodeParams, ImageFormat, OutputType
from .sound_encode import SOUND_CONTENT_TYPES
from .state import ServiceState


def get_state(request: Request) -> ServiceState:
    return request.app.state.service


StateDep = Annotated[ServiceState, Depends(get_state)]

# RFC 9110's optional whitespace (OWS): spaces and horizontal tabs, nothing else (not NBSP, not NEL).
_OWS = " \t"
_CREDENTIALS = re.compile(r"([^ \t]*)[ \t]*(.*)", re.S)  # scheme, OWS, token: matches every string


class BearerKey(SecurityBase):
    """``Authorization: Bearer KEY`` when an API key is configured: the scheme is case-insensitive;
    OWS around the value and between scheme and token is skipped (RFC 9110 asks for spaces there,
    a tab is taken too: it cannot change which token is compared); the token is compared exactly,
    in constant time. A security scheme (``bearer``) in the OpenAPI document, so that /docs can
    send the key."""

    def __init__(self) -> None:
        self.model = HTTPBearerModel(description="the server's API key (--api-key-file, VAESERVE_API_KEY); "
                                     "needed only when the server has one")
        self.scheme_name = "bearer"

    async def __call__(self, request: Request) -> None:
        key = get_state(request).settings.api_key
        if key is None:
            return
        authorization = request.headers.get("authorization")
        scheme, token = _CREDENTIALS.fullmatch((authorization or "").strip(_OWS)).groups()  # type: ignore[union-attr]
        given = token.encode("latin-1")  # Starlette decodes header bytes as latin-1
        if scheme.lower() != "bearer" or not secrets.compare_digest(given, key.get_secret_value().encode()):
            raise Problem(401, "unauthorized", "missing or wrong bearer token",
                          expected="Authorization: Bearer <key>",
                          received="no Authorization header" if authorization is None else "a different token",
                          headers={"WWW-Authenticate": 'Bearer realm="vaeserve"'})


def model_name(request: Request, model: Annotated[str | None, Query(
        description="the model to run, as /v1/models names it (its id): needed when the server serves several; "
        "/v1/models/{name}/decode and /v1/models/{name}/encode name it in the path")] = None) -> str | None:
    """The model a request names: the path's (``/v1/models/{name}/...``) or its ``model`` query
    parameter's (None: the only one served). Both, naming different models, are refused (422)."""
    named = request.path_params.get("name")
    if named is not None and model is not None and model != named:
        raise Problem(422, "invalid-parameter", f"the path names the model {named!r} and the model query parameter "
                      f"{model!r}", expected=named, received=model)
    return model if named is None else named


ModelNameDep = Annotated[str | None, Depends(model_name)]


def model_path(name: Annotated[str, Path(description="the model to run, as /v1/models names it (its id)")]) -> None:
    """Declares ``/v1/models/{name}/...``'s path parameter (for the API docs); ``model_name`` reads it."""


ModelPathDep = Depends(model_path)


def check_latents_body_headers(request: Request, state: StateDep) -> str:
    """``POST /v1/decode``: 415 (latent tensors) and 413 from the headers alone, before a byte of
    the body is read."""
    media_type = check_latents_content_type(request.headers.get("content-type"))
    _check_length(request, state)
    return media_type


def check_frames_body_headers(request: Request, state: StateDep) -> str:
    """``POST /v1/encode``: 415 (images, MP4, frame tensors, WAV, FLAC, or none) and 413 from the headers alone."""
    frames_or_sound = check_frames_content_type(request.headers.get("content-type"), sounds=tuple(SOUND_CONTENT_TYPES))
    _check_length(request, state)
    return frames_or_sound


def _check_length(request: Request, state: ServiceState) -> None:
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isascii() or not length.isdigit():
            raise Problem(400, "bad-content-length", "Content-Length is not an integer", expected="digits",
                          received=length)
        size, limit = int(length), state.settings.max_body_bytes
        if size > limit:
            raise Problem(413, "payload-too-large", f"body of {size} bytes is over the limit",
                          expected=f"<= {limit} bytes", received=size)


def _float32(name: str, value: float | None, *, positive: bool = False) -> float | None:
    """The latents are float32: a factor must stay finite (and non-zero to divide by) there too."""
    if value is None:
        return None
    with np.errstate(over="ignore"):  # 1e39 becomes inf, 1e-50 becomes 0: both refused below
        narrowed = np.float32(value)
    if not np.isfinite(narrowed) or (positive and narrowed <= 0):
        raise Problem(422, "invalid-parameter", f"{name} is not usable in float32",
                      expected=f"finite{' non-zero' if positive else ''} float32", received=value)
    return value


# Query parameters both routes take, declared once.
DtypeQuery = Annotated[str | None, Query(description="raw bodies: float32 | float16 | bfloat16")]
ScalingQuery = Annotated[float | None, Query(gt=0, allow_inf_nan=False)]
ShiftQuery = Annotated[float | None, Query(allow_inf_nan=False)]
TimeoutQuery = Annotated[float | None, Query(gt=0, allow_inf_nan=False, description="this request's deadline in "
                                             "seconds, shorter or longer than the server's default, up to "
                                             "max_request_timeout_s")]


# A decoder's conditions (``models.conditions``), each checked here for range;
# whether the model takes them is checked once it is known (``service.http.inputs.decode_options``).
TimestepQuery = Annotated[float | None, Query(ge=TIMESTEP_RANGE[0], le=TIMESTEP_RANGE[1], allow_inf_nan=False,
                                               description="timestep-conditioned decoders (LTX-Video 0.9.1+, "
                                               "LTX-2): the decode timestep (default: the checkpoint's "
                                               "decode_timestep, else 0.05)")]
NoiseScaleQuery = Annotated[float | None, Query(ge=0, le=1, allow_inf_nan=False,
                                                 description="timestep-conditioned decoders: noise mixed into "
                                                 "the latents, (1 - s) z + s noise (default: the checkpoint's "
                                                 "decode_noise_scale, else 0)")]
SeedQuery = Annotated[int | None, Query(ge=0, lt=SEED_RANGE, description="decoders that take a timestep or "
                                         "inject noise: the noise's seed (default: a fresh one, answered in X-Seed)")]


def request_timeout(settings: Settings, timeout_s: float | None) -> float:
    """The request's deadline: its ``timeout_s`` (up to ``max_request_timeout_s``), else the server's default."""
    return settings.request_timeout_s if timeout_s is None else min(timeout_s, settings.timeout_cap_s)


def decode_params(
    state: StateDep,
    model: ModelNameDep,
    output_type: Annotated[OutputType | None, Query(description="default mp4 (an image model: png); with "
                                                    "stream=true, mp4 asks for fragmented MP4 instead of raw frames; "
                                                    "pil: an image file in image_format")] = None,
    image_format: Annotated[ImageFormat, Query(description="output_type=pil: png or jpg")] = "png",
    denormalize: Annotated[bool | None, Query(description="z * latents_std + latents_mean first")] = None,
    do_scaling: Annotated[bool | None, Query(description="diffusers' name for denormalize")] = None,
    partial_postprocess: Annotated[bool, Query(description="pt: uint8 frames instead of float16")] = False,
    stream: Annotated[bool, Query(description="answer as the decode runs: raw uint8 frames chunk by chunk, or "
                                   "fragmented MP4 with output_type=mp4")] = False,
    fps: Annotated[int | None, Query(ge=1, le=240)] = None,
    crf: Annotated[int | None, Query(ge=0, le=51)] = None,
    frame: Annotated[int, Query(ge=0, description="png: which output frame")] = 0,
    shape: Annotated[list[str] | None, Query(description="raw bodies: B,C,T,H,W or C,T,H,W (images: B,C,H,W)")] = None,
    dtype: DtypeQuery = None,
    scaling_factor: ScalingQuery = None,
    shift_factor: ShiftQuery = None,
    timeout_s: TimeoutQuery = None,
    height: Annotated[int | None, Query(ge=1, description="packed latents (B, H·W/4, 4C): the image's height")] = None,
    width: Annotated[int | None, Query(ge=1, description="packed latents: the image's width")] = None,
    framewise: Annotated[bool, Query(description="HunyuanVideo 1.0 only: decode as diffusers does by default "
                                     "(tiles of 16 frames, blended), not the whole clip")] = False,
    timestep: TimestepQuery = None,
    noise_scale: NoiseScaleQuery = None,
    seed: SeedQuery = None,
    accept: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> DecodeParams:
    settings = state.settings
    if denormalize is None:
        denormalize = bool(do_scaling)
    served = state.models.find(model) if state.models is not None else None  # None: a 503, 404 or 422 follows
    images = served is not None and served.vae.config.is_image
    return DecodeParams(
        output_type=output_type or ("png" if images else "mp4"), denormalize=denormalize, partial_postprocess=partial_postprocess,
        stream=stream, mp4_stream=stream and output_type == "mp4", fps=fps or settings.default_fps, crf=settings.default_crf if crf is None else crf,
        frame=frame, shape=parse_shape(shape, check=check_latent_dims), dtype=dtype,
        scaling_factor=_float32("scaling_factor", scaling_factor, positive=True),
        shift_factor=_float32("shift_factor", shift_factor), timeout_s=request_timeout(settings, timeout_s),
        framewise=framewise, image_format=image_format, packed_size=(height, width),
        pil_tensor=output_type == "pil" and media_type(accept) in TENSOR_CONTENT_TYPES,
        timestep=timestep, noise_scale=noise_scale, seed=seed,
    )


def encode_params(
    state: StateDep,
    output_type: EncodeOutputType = "pt",
    normalize: Annotated[bool, Query(description="(z - latents_mean) / latents_std after")] = False,
    sample: Annotated[bool, Query(description="draw from the posterior instead of taking its mean")] = False,
    seed: Annotated[int | None, Query(ge=0, lt=SEED_RANGE, description="noise seed for sample (default: fresh)")] = None,
    shape: Annotated[list[str] | None, Query(description="raw bodies: B,3,F,H,W or B,3,H,W")] = None,
    dtype: DtypeQuery = None,
    scaling_factor: ScalingQuery = None,
    shift_factor: ShiftQuery = None,
    timeout_s: TimeoutQuery = None,
    audio: Annotated[bool, Query(description="encode the body's sound (an MP4's track; a WAV or FLAC body always) "
                                 "to the model's audio latents")] = False,
) -> EncodeParams:
    return EncodeParams(
        output_type=output_type, normalize=normalize, sample=sample, seed=seed, shape=parse_shape(shape, check=check_frame_dims),
        dtype=dtype, scaling_factor=_float32("scaling_factor", scaling_factor, positive=True),
        shift_factor=_float32("shift_factor", shift_factor), timeout_s=request_timeout(state.settings, timeout_s),
        audio=audio,
    )


DecodeParamsDep = Annotated[DecodeParams, Depends(decode_params)]
EncodeParamsDep = Annotated[EncodeParams, Depends(encode_params)]
LatentsMediaTypeDep = Annotated[str, Depends(check_latents_body_headers)]
FramesMediaTypeDep = Annotated[str, Depends(check_frames_body_headers)]
ApiKeyDep = Depends(BearerKey())
