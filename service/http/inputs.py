"""Request bodies to device inputs, on the host (run in a thread: it touches every value)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vaeserve.models.conditions import refused_conditions
from vaeserve.models.shapes import clip_shape

from ..codecs.frames import FramesHeader, frames_header
from ..codecs.latents import parse_latents, unscale_latents
from ..codecs.tensors import RAW_CONTENT_TYPES, check_finite
from ..engine.errors import ShapeNotServed
from ..engine.jobs import DecodeOptions
from ..engine.model import ModelState
from ..metrics import Metrics
from ..problem import Problem
from ..settings import VideoCodec
from .schemas import DecodeParams, EncodeParams
from .sound import (
    AUDIO_LATENTS,
    VIDEO_LATENTS,
    body_tensors,
    check_sound_answer,
    check_sync,
    parse_audio_latents,
    sound_alone,
)


@dataclass(frozen=True)
class DecodeInputs:
    """A decode request's latents ``(B, C, T, H, W)`` float32 (an image model's ``(B, C, H, W)``),
    whether the body had the batch dim, and whether its answer takes the decode's steps as they come
    (a stream, or an MP4 encoded while it decodes) rather than the whole decode at its end. With
    sound (``service.http.sound``): its audio latents ``(B, *layout)`` float32; a request for the
    sound alone has no video latents to decode (None)."""

    latents: np.ndarray | None
    batched: bool
    streamed: bool
    sound: np.ndarray | None = None


def check_decode_served(shape: tuple[int, ...], params: DecodeParams, model: ModelState) -> bool:
    """Whether the answer takes the decode's steps as they come (a stream, an MP4); ``ShapeNotServed``
    when ``--shapes`` does not serve latents ``shape`` ``(C, T, H, W)`` with this output. Every
    decode runs step by step: uint8 frames (mp4, npy, png, ``pt`` + ``partial_postprocess``) and
    streams run the same programs. A framewise decode (HunyuanVideo 1.0's only) is one step, and so
    is an image's, which is answered whole: no stream, no MP4."""
    if model.vae.config.is_image and (params.stream or params.output_type == "mp4"):
        received = "stream=true" if params.stream else "output_type=mp4"
        raise Problem(422, "invalid-parameter", f"the {model.vae.config.class_name} VAE decodes images, which are "
                      "answered whole", expected="output_type png, jpeg, pil, pt or npy", received=received)
    if params.framewise:
        if not model.framewise:
            raise Problem(422, "invalid-parameter", "framewise=true is diffusers' default decode of HunyuanVideo "
                          f"1.0 clips; the {model.vae.config.family} VAE decodes a clip exactly as it is",
                          expected="framewise=false", received="framewise=true")
        model.check_served(shape, "framewise")
        return params.stream
    if params.output == "uint8" and (model.serves(shape, "uint8") or model.serves(shape, "stream")):
        return params.stream or params.output_type == "mp4"
    model.check_served(shape, "stream" if params.stream else params.output)
    return params.stream or params.output_type == "mp4"


def decode_options(params: DecodeParams, model: ModelState) -> DecodeOptions | None:
    """The decode's conditions (``DecodeOptions``: its timestep, noise scale and seed, a fresh seed
    when none is given) for a decoder that takes them, None for one that does not. The values'
    ranges are the query's (``service.http.deps``); here, 422 for a condition the model does not
    take: any of them for a decoder that takes none, a timestep or noise scale for one that is not
    timestep-conditioned (it only injects noise)."""
    config = model.vae.config
    refused = refused_conditions(config, timestep=params.timestep, noise_scale=params.noise_scale, seed=params.seed)
    if refused is not None:
        raise Problem(422, "invalid-parameter", refused.detail, expected=refused.expected, received=refused.received)
    if not config.decode_conditions:
        return None
    return DecodeOptions.resolve(timestep=params.timestep, noise_scale=params.noise_scale, seed=params.seed)


def _check_output(latents: np.ndarray, params: DecodeParams, model: ModelState) -> None:
    images = model.vae.config.is_image
    if params.one_video and latents.shape[0] != 1:
        one = "image" if images or params.image_file else "video"
        raise Problem(422, "batch-not-supported", f"{params.image_file or params.output_type} holds one {one}: "
                      "decode a batch as pt or npy", expected="batch size 1", received=latents.shape[0])
    frames = model.limits.output_frames(clip_shape(latents.shape)[2])
    if params.image_file and params.frame >= frames:
        raise Problem(422, "invalid-frame", f"frame {params.frame} does not exist",
                      expected=f"frame < {frames}", received=params.frame)


def declared_latents(params: DecodeParams, media_type: str, model: ModelState) -> tuple[int, ...] | None:
    """The latents a raw body's query declares (``shape=``) in the model's batched layout (a video's
    ``(B, C, T, H, W)``, an image's ``(B, C, H, W)``), for the memory check before the body is read;
    None for the formats that carry their shape inside the body, and for a shape the parse will
    refuse anyway (it says why, once the body is read)."""
    if params.shape is None or media_type not in RAW_CONTENT_TYPES:
        return None
    rank = 4 if model.vae.config.is_image else 5
    shape = params.shape if len(params.shape) == rank else (1, *params.shape)
    if len(shape) != rank:
        return None
    b, c, t, h, w = clip_shape(shape)
    limits = model.limits
    try:
        limits.check(batch=b, frames=limits.output_frames(t), height=limits.spatial_scale * h,
                     width=limits.spatial_scale * w)
    except Problem:
        return None
    return shape if c == limits.channels else None


def decode_inputs(body: bytes, media_type: str, params: DecodeParams, model: ModelState,
                  metrics: Metrics) -> DecodeInputs:
    """Body → latents ``(B, C, T, H, W)`` (images ``(B, C, H, W)``) float32: parsed (Flux's packed
    latents unpacked), checked against the model and the limits, scaled
    (``/ scaling_factor + shift_factor``), denormalized if asked, then checked for NaN/Inf — after
    the arithmetic, because finite inputs and factors can overflow float32. A safetensors body may
    hold the sound's ``audio_latents`` beside the ``latents`` (``service.http.sound``): they are
    checked, and the sound is answered alone or with the video."""
    names = body_tensors(body, media_type, params)
    sound, sound_batched = parse_audio_latents(body, model) if AUDIO_LATENTS in names else (None, False)
    alone = sound_alone(params, sound is not None)
    if alone and sound is None:
        raise Problem(422, "missing-tensor", f"output_type={params.output_type} answers a sound: send its "
                      f"audio latents as the safetensors tensor {AUDIO_LATENTS!r}", expected=AUDIO_LATENTS,
                      received=names or "a body of one tensor")
    if alone and VIDEO_LATENTS not in names:
        assert sound is not None
        check_sound_answer(params, sound.shape[0])
        return DecodeInputs(None, sound_batched, streamed=False, sound=sound)
    latents, batched = parse_latents(body, media_type, params.shape, params.dtype, model.limits, model.vae.config,
                                     packed_size=params.packed_size, tensor=VIDEO_LATENTS if sound is not None else None)
    if sound is not None:
        check_sound_answer(params, sound.shape[0])
        check_sync(sound, latents, params, model)
        if alone:  # the video latents only set the sound's length
            return DecodeInputs(None, sound_batched, streamed=False, sound=sound)
    try:
        streamed = check_decode_served(latents.shape[1:], params, model)
    except ShapeNotServed:
        metrics.refused_shapes.inc()
        raise
    _check_output(latents, params, model)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # check_finite reports it
        values = unscale_latents(latents, params.scaling_factor, params.shift_factor)
        if params.denormalize:
            values = model.denormalize(values)
    check_finite(values, "latents", where=f" after scaling ({params.scaling})" if values is not latents else "")
    return DecodeInputs(np.ascontiguousarray(values, np.float32), batched, streamed, sound)


def encode_header(body: bytes, media_type: str, params: EncodeParams, model: ModelState, metrics: Metrics,
                codecs: tuple[VideoCodec, ...]) -> FramesHeader:
    """Body → the header of its frames ``(B, 3, F, H, W)``, from its headers alone: its format (the
    bytes must be what the Content-Type says; videos in one of ``codecs``), the model's shape
    rules, the limits, and the shapes served (``--shapes``). Nothing is decoded yet."""
    header = frames_header(body, media_type, params.shape, params.dtype, model.vae.config, model.limits, codecs=codecs)
    try:
        model.check_encode_served(header.shape[1:])
    except ShapeNotServed:
        metrics.refused_shapes.inc()
        raise
    return header
