"""Request bodies to device inputs, on the host (run in a thread: it touches every value)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from models.shapes import clip_shape

from ..codecs.frames import FramesHeader, frames_header
from ..codecs.latents import parse_latents, unscale_latents
from ..codecs.tensors import check_finite
from ..engine.errors import ShapeNotServed
from ..engine.model import ModelState
from ..metrics import Metrics
from ..problem import Problem
from ..settings import VideoCodec
from .schemas import DecodeParams, EncodeParams


@dataclass(frozen=True)
class DecodeInputs:
    """A decode request's latents ``(B, C, T, H, W)`` float32 (an image model's ``(B, C, H, W)``),
    whether the body had the batch dim, and whether it decodes step by step (a stream, or an MP4
    encoded while it decodes)."""

    latents: np.ndarray
    batched: bool
    stepped: bool


def _stepped(shape: tuple[int, ...], params: DecodeParams, model: ModelState) -> bool:
    """Whether the decode runs step by step (the stream programs) or whole; ``ShapeNotServed``
    when ``--shapes`` serves neither. An MP4 is encoded while it decodes wherever the stream
    programs are served, else made from the whole decode. A framewise decode is a whole decode
    (HunyuanVideo 1.0's only), streamed in pieces when asked to. An image decodes whole: no stream,
    no MP4."""
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
    if params.stream:
        model.check_served(shape, "stream")
        return True
    if params.output_type == "mp4" and model.serves(shape, "stream"):  # (not a stream here)
        return True
    model.check_served(shape, params.output)
    return False


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


def decode_inputs(body: bytes, media_type: str, params: DecodeParams, model: ModelState,
                  metrics: Metrics) -> DecodeInputs:
    """Body → latents ``(B, C, T, H, W)`` (images ``(B, C, H, W)``) float32: parsed (Flux's packed
    latents unpacked), checked against the model and the limits, scaled
    (``/ scaling_factor + shift_factor``), denormalized if asked, then checked for NaN/Inf — after
    the arithmetic, because finite inputs and factors can overflow float32."""
    latents, batched = parse_latents(body, media_type, params.shape, params.dtype, model.limits, model.vae.config,
                                     packed_size=params.packed_size)
    try:
        stepped = _stepped(latents.shape[1:], params, model)
    except ShapeNotServed:
        metrics.refused_shapes.inc()
        raise
    _check_output(latents, params, model)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # check_finite reports it
        values = unscale_latents(latents, params.scaling_factor, params.shift_factor)
        if params.denormalize:
            values = model.denormalize(values)
    check_finite(values, "latents", where=f" after scaling ({params.scaling})" if values is not latents else "")
    return DecodeInputs(np.ascontiguousarray(values, np.float32), batched, stepped)


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
