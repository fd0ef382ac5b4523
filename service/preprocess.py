"""Request bodies to device inputs, on the host (run in a thread: it touches every value)."""

from __future__ import annotations

import numpy as np

from . import codec, frames
from .errors import Problem
from .metrics import Metrics
from .protocol import DecodeParams, EncodeParams
from .state import ModelState


def _check_output(latents: np.ndarray, params: DecodeParams, limits: codec.Limits) -> None:
    if params.output_type in ("mp4", "png") and not params.stream and latents.shape[0] != 1:
        raise Problem(422, "batch-not-supported", f"{params.output_type} holds one video",
                      expected="batch size 1", received=latents.shape[0])
    frames = limits.output_frames(latents.shape[2])
    if params.output_type == "png" and params.frame >= frames:
        raise Problem(422, "invalid-frame", f"frame {params.frame} does not exist",
                      expected=f"frame < {frames}", received=params.frame)


def _check_served(latents: np.ndarray, params: DecodeParams, model: ModelState, metrics: Metrics) -> None:
    try:
        model.check_served(latents.shape[1:], "stream" if params.stream else params.output)
    except Problem:
        metrics.refused_shapes.inc()
        raise


def decode_inputs(body: bytes, media_type: str, params: DecodeParams, model: ModelState,
                  metrics: Metrics) -> tuple[np.ndarray, bool]:
    """Body → ``(latents (B, C, T, H, W) float32, had a batch dim)``: parsed, checked against the
    limits, scaled (``/ scaling_factor + shift_factor``), denormalized if asked, then checked for
    NaN/Inf — after the arithmetic, because finite inputs and factors can overflow float32."""
    latents, batched = codec.parse_latents(body, media_type, params.shape, params.dtype, model.limits)
    _check_served(latents, params, model, metrics)
    _check_output(latents, params, model.limits)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # check_finite reports it
        values = codec.apply_scaling(latents, params.scaling_factor, params.shift_factor)
        if params.denormalize:
            values = model.denormalize(values)
    codec.check_finite(values, transformed=values is not latents)
    return np.ascontiguousarray(values, np.float32), batched


def encode_inputs(body: bytes, media_type: str, params: EncodeParams, model: ModelState,
                  metrics: Metrics) -> np.ndarray:
    """Body → frames ``(B, 3, F, H, W)`` float32 in [-1, 1]: parsed (image, MP4 or tensor), checked
    against the model's shape rules and the limits, finite, and served (``--shapes``)."""
    video = frames.parse_frames(body, media_type, params.shape, params.dtype, model.vae.config, model.limits)
    try:
        model.check_encode_served(video.shape[1:])
    except Problem:
        metrics.refused_shapes.inc()
        raise
    return video
