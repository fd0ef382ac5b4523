"""Frames in, for ``POST /v1/encode`` and ``vaeserve encode``: images, MP4s and frame tensors.

Every body becomes float32 frames ``(B, 3, F, H, W)`` in [-1, 1] (NCTHW, diffusers' layout),
checked against the model (``F = 1 + 4k``; ``H``, ``W`` multiples of its spatial scale: 8 for
Wan 2.1, 16 for Wan 2.2) and the configured limits before any device work; what does not fit is
a 422 problem with the nearest valid values.

Body formats (:func:`body_format`):

* PNG or JPEG: one image, one frame ``(1, 3, 1, H, W)``; pixels ``x`` become ``2 · (x / 255) − 1``
  in float32, exactly as diffusers' ``VaeImageProcessor`` does (decoded with Pillow, like the PIL
  images a pipeline holds). Palette, grey and RGBA images are converted to RGB (alpha dropped).
* MP4: every frame of the first video stream (PyAV), converted like images: ``(1, 3, F, H, W)``.
* Tensors: raw little-endian bytes (``shape`` and ``dtype`` in the query), ``.npy`` or
  safetensors, ``(B, 3, F, H, W)`` or ``(B, 3, H, W)`` (one frame each), float32/float16/bfloat16.

A body without a Content-Type (diffusers' ``remote_encode`` sends none), or with a generic one, is
a raw tensor when ``shape`` is given, else it is recognized by its first bytes.
"""

from __future__ import annotations

import io
from typing import Literal

import av
import numpy as np

from models.config import WanVAEConfig
from models.shapes import FramesError, check_frames_shape

from ..engine.limits import Limits
from ..problem import Problem
from .tensors import (
    NPY_CONTENT_TYPE,
    SAFETENSORS_CONTENT_TYPE,
    TENSOR_CONTENT_TYPES,
    check_dims,
    media_type,
    parse_npy,
    parse_raw,
    parse_safetensors,
)

BodyFormat = Literal["png", "jpeg", "mp4", "raw", "npy", "safetensors"]
IMAGE_CONTENT_TYPES = {"image/png": "png", "image/jpeg": "jpeg"}
MP4_CONTENT_TYPE = "video/mp4"
# Content types that say nothing about the body: it is sniffed (or raw, when shape is given).
GENERIC_CONTENT_TYPES = ("", "application/octet-stream", "binary/octet-stream", "application/x-www-form-urlencoded")
FRAME_CONTENT_TYPES = (*IMAGE_CONTENT_TYPES, MP4_CONTENT_TYPE, *TENSOR_CONTENT_TYPES)
# Pillow modes that convert to RGB without losing meaning (16-bit and float images would clip).
IMAGE_MODES = ("1", "L", "LA", "P", "PA", "RGB", "RGBA", "RGBX", "CMYK", "YCbCr")
FRAME_LAYOUTS = ["(B, 3, F, H, W)", "(B, 3, H, W)"]

_SLUGS = {"ndim": "invalid-ndim", "channels": "invalid-channels", "sizes": "invalid-shape",
          "frames": "invalid-frame-count", "height": "invalid-height", "width": "invalid-width"}


def check_frames_content_type(content_type: str | None) -> str:
    """The media type of an encode body, or 415 (from the headers alone) when no frames body can have it."""
    given = media_type(content_type)
    if given not in FRAME_CONTENT_TYPES and given not in GENERIC_CONTENT_TYPES:
        raise Problem(415, "unsupported-media-type", f"Content-Type {given!r} is not an image, video or tensor format",
                      expected=[*FRAME_CONTENT_TYPES, "(none: recognized by content)"], received=given)
    return given


def sniff(body: bytes) -> BodyFormat | None:
    """The format its first bytes give away, if any."""
    if body.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if body.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if body[4:8] == b"ftyp":
        return "mp4"
    if body.startswith(b"\x93NUMPY"):
        return "npy"
    return None


def body_format(media_type: str, body: bytes, has_shape: bool) -> BodyFormat:
    """Which parser reads this body: its Content-Type, or for generic ones ``shape`` or its bytes."""
    if media_type in IMAGE_CONTENT_TYPES:
        return IMAGE_CONTENT_TYPES[media_type]  # type: ignore[return-value]
    if media_type == MP4_CONTENT_TYPE:
        return "mp4"
    if media_type == NPY_CONTENT_TYPE:
        return "npy"
    if media_type == SAFETENSORS_CONTENT_TYPE:
        return "safetensors"
    if media_type == "tensor/binary" or has_shape:  # octet-stream or generic, described by the query
        return "raw"
    return sniff(body) or "raw"  # raw without a shape: 422 missing-shape names the formats


def to_unit_range(pixels: np.ndarray) -> np.ndarray:
    """uint8 pixels → float32 ``2 · (x / 255) − 1`` (diffusers' ``VaeImageProcessor`` arithmetic)."""
    return 2.0 * (pixels.astype(np.float32) / np.float32(255.0)) - 1.0


def _check_pixels(height: int, width: int, frames: int, limits: Limits) -> None:
    """The configured limits, from a header, before pixels are decoded (no decompression bombs)."""
    for name, value, limit, slug in (("frames", frames, limits.max_frames, "too-many-frames"),
                                     ("height", height, limits.max_height, "too-large-height"),
                                     ("width", width, limits.max_width, "too-large-width")):
        if value > limit:
            raise Problem(422, slug, f"{name} {value} is over the limit {limit}", expected=f"{name} <= {limit}",
                          received=value)


def parse_image(body: bytes, limits: Limits) -> np.ndarray:
    """PNG/JPEG bytes → ``(1, 3, 1, H, W)`` float32 in [-1, 1] (the first frame of an animation)."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(body)) as image:
            width, height = image.size
            _check_pixels(height, width, 1, limits)
            if image.mode not in IMAGE_MODES:
                raise Problem(422, "invalid-image-mode", f"image mode {image.mode} does not convert to 8-bit RGB",
                              expected=list(IMAGE_MODES), received=image.mode)
            pixels = np.asarray(image.convert("RGB"))
    except Problem:
        raise
    except Exception as exc:  # Pillow raises many types for truncated or corrupt files
        raise Problem(422, "invalid-image", f"not a readable PNG/JPEG: {exc}", expected="PNG or JPEG",
                      received=f"{len(body)} bytes") from None
    return to_unit_range(pixels).transpose(2, 0, 1)[None, :, None]


def parse_mp4(body: bytes, limits: Limits) -> np.ndarray:
    """MP4 bytes → ``(1, 3, F, H, W)`` float32 in [-1, 1]: every frame of the first video stream."""
    frames: list[np.ndarray] = []
    try:
        with av.open(io.BytesIO(body), mode="r") as container:
            if not container.streams.video:
                raise Problem(422, "invalid-video", "the file has no video stream", expected="an MP4 with video",
                              received="no video stream")
            stream = container.streams.video[0]
            _check_pixels(stream.codec_context.height, stream.codec_context.width, 1, limits)
            for frame in container.decode(stream):
                _check_pixels(frame.height, frame.width, len(frames) + 1, limits)
                frames.append(frame.to_ndarray(format="rgb24"))
    except Problem:
        raise
    except Exception as exc:  # PyAV's FFmpegError family, and anything a corrupt container triggers
        raise Problem(422, "invalid-video", f"not a readable MP4: {exc}", expected="MP4 (H.264 or any FFmpeg codec)",
                      received=f"{len(body)} bytes") from None
    if not frames:
        raise Problem(422, "invalid-video", "the video has no frames", expected="at least 1 frame", received=0)
    return to_unit_range(np.stack(frames)).transpose(3, 0, 1, 2)[None]


def check_frame_dims(shape: tuple[int, ...]) -> None:
    """Frames tensors are ``(B, 3, F, H, W)`` or ``(B, 3, H, W)``, every size at least 1."""
    check_dims(shape, what="frames", layouts=FRAME_LAYOUTS, example="1,3,81,480,832")


def parse_tensor(body: bytes, body_type: BodyFormat, shape: tuple[int, ...] | None, dtype: str | None) -> np.ndarray:
    """A raw, ``.npy`` or safetensors frames tensor → float32 ``(B, 3, F, H, W)``."""
    if body_type == "npy":
        array = parse_npy(body, check=check_frame_dims)
    elif body_type == "safetensors":
        array = parse_safetensors(body, check=check_frame_dims)
    else:
        if shape is None:
            raise Problem(422, "missing-shape", "a tensor body needs 'shape' (and 'dtype') query parameters, or "
                          "send an image, an MP4, .npy or safetensors", expected="shape=B,3,F,H,W&dtype=float32",
                          received=None)
        array = parse_raw(body, shape, dtype, check=check_frame_dims)
    array = np.asarray(array, np.float32)
    return array[:, :, None] if array.ndim == 4 else array


def check_frames(frames: np.ndarray, config: WanVAEConfig, limits: Limits) -> None:
    """The model's shape rules (422 with the nearest valid frame count or size), the configured
    limits, and finite values."""
    try:
        check_frames_shape(frames.shape, config)
    except FramesError as error:
        raise Problem(422, _SLUGS.get(error.what, "invalid-shape"), str(error), expected=error.expected,
                      received=error.received) from None
    if frames.shape[0] > limits.max_batch:
        raise Problem(422, "too-large-batch", f"batch {frames.shape[0]} is over the limit {limits.max_batch}",
                      expected=f"batch <= {limits.max_batch}", received=frames.shape[0])
    _check_pixels(frames.shape[3], frames.shape[4], frames.shape[2], limits)
    finite = np.isfinite(frames)
    if not finite.all():
        bad = int(frames.size - np.count_nonzero(finite))
        raise Problem(422, "non-finite", f"frames contain {bad} NaN/Inf values", expected="finite values",
                      received=f"{bad} non-finite of {frames.size}")


def parse_frames(body: bytes, media_type: str, shape: tuple[int, ...] | None, dtype: str | None,
                 config: WanVAEConfig, limits: Limits) -> np.ndarray:
    """Body → checked float32 frames ``(B, 3, F, H, W)`` in [-1, 1]; raises Problem on bad input."""
    return read_frames(body, body_format(media_type, body, shape is not None), shape, dtype, config, limits)


def read_frames(body: bytes, body_type: BodyFormat, shape: tuple[int, ...] | None, dtype: str | None,
                config: WanVAEConfig, limits: Limits) -> np.ndarray:
    """``parse_frames`` for a body whose format is known (a file's suffix says it offline)."""
    if body_type in ("png", "jpeg"):
        frames = parse_image(body, limits)
    elif body_type == "mp4":
        frames = parse_mp4(body, limits)
    else:
        frames = parse_tensor(body, body_type, shape, dtype)
    check_frames(frames, config, limits)
    return np.ascontiguousarray(frames, np.float32)
