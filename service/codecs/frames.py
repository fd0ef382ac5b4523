"""Frames in, for ``POST /v1/encode`` and ``vaeserve encode``: images, MP4s and frame tensors.

Every body becomes float32 frames ``(B, 3, F, H, W)`` in [-1, 1] (NCTHW, diffusers' layout),
checked against the model (``F = 1 + 4k``; ``H``, ``W`` multiples of its spatial scale: 8 for
Wan 2.1, 16 for Wan 2.2) and the configured limits before any device work; what does not fit is
a 422 problem with the nearest valid values.

Reading a body takes two steps, so that nothing large exists before it is known to fit:
:func:`frames_header` reads only headers (the PNG/JPEG header, the MP4's sample table, the tensor's
shape) and refuses what the limits, the model's shape rules or the promised formats refuse; the
:class:`FramesHeader` it returns says how many bytes the frames will take (the HTTP layer budgets
them) and :meth:`FramesHeader.read` then decodes into one array allocated for them.

Body formats (:func:`body_format`; the bytes must be what the Content-Type says, 415 otherwise):

* PNG or JPEG (``images``): one image, one frame ``(1, 3, 1, H, W)`` (for an image model
  ``(1, 3, H, W)``); pixels ``x`` become
  ``2 · (x / 255) − 1`` in float32, exactly as diffusers' ``VaeImageProcessor`` does (decoded with
  Pillow, like the PIL images a pipeline holds). Palette, grey and RGBA images are converted to
  RGB (alpha dropped); 16-bit images are refused.
* MP4 or QuickTime MOV (``mp4``): every frame of the first video stream, in one of the promised
  codecs, converted like images: ``(1, 3, F, H, W)`` (an image model takes none: 415).
* Tensors: raw little-endian bytes (``shape`` and ``dtype`` in the query), ``.npy`` or
  safetensors, ``(B, 3, F, H, W)`` or ``(B, 3, H, W)`` (one frame each; for an image model, images
  in the layouts it takes), float32/float16/bfloat16.

A body without a Content-Type (diffusers' ``remote_encode`` sends none), or with a generic one, is
a raw tensor when ``shape`` is given, else it is recognized by its first bytes (``sniff``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from vaeserve.models.config import VAEConfig
from vaeserve.models.shapes import FramesError, check_frames_shape, clip_shape

from ..limits import Limits
from ..problem import Problem
from ..settings import VideoCodec
from .images import image_header, read_image
from .mp4 import ALL_CODECS, decode_mp4, mp4_header
from .sniff import sniff
from .tensors import (
    GENERIC_CONTENT_TYPES,
    NPY_CONTENT_TYPE,
    SAFETENSORS_CONTENT_TYPE,
    SHAPE_SLUGS,
    TENSOR_CONTENT_TYPES,
    check_dims,
    check_finite,
    media_type,
    parse_npy,
    parse_raw,
    parse_safetensors,
)

BodyFormat = Literal["png", "jpeg", "mp4", "raw", "npy", "safetensors"]
IMAGE_CONTENT_TYPES = {"image/png": "png", "image/jpeg": "jpeg"}
VIDEO_CONTENT_TYPES = ("video/mp4", "video/quicktime")
FRAME_CONTENT_TYPES = (*IMAGE_CONTENT_TYPES, *VIDEO_CONTENT_TYPES, *TENSOR_CONTENT_TYPES)
FRAME_LAYOUTS = ["(B, 3, F, H, W)", "(B, 3, H, W)"]
# What a media format's bytes must sniff as, and how a detail names it.
_SNIFFED_AS = {"png": ("png", "a PNG image"), "jpeg": ("jpeg", "a JPEG image"), "mp4": ("isobmff", "an MP4/MOV video")}
_READ_FROM_BYTES = {"png": "png", "jpeg": "jpeg", "isobmff": "mp4", "npy": "npy", "safetensors": "safetensors"}


def check_frames_content_type(content_type: str | None, *, sounds: Sequence[str] = ()) -> str:
    """The media type of an encode body, or 415 (from the headers alone) when no frames body can
    have it, nor a sound's (``sounds``: the sound media types the encode also reads)."""
    given = media_type(content_type)
    if given not in FRAME_CONTENT_TYPES and given not in GENERIC_CONTENT_TYPES and given not in sounds:
        kinds = "an image, video, sound or tensor format" if sounds else "an image, video or tensor format"
        raise Problem(415, "unsupported-media-type", f"Content-Type {given!r} is not {kinds}",
                      expected=[*FRAME_CONTENT_TYPES, *sounds, "(none: recognized by content)"], received=given)
    return given


def _unsupported(name: str, declared: str | None) -> Problem:
    """415 for a body that is ``name`` (what its bytes are), where ``declared`` was expected."""
    instead = f", not {declared}" if declared else ""
    return Problem(415, "unsupported-media-type", f"the body is {name}{instead}: encode reads PNG, JPEG, MP4/MOV "
                   "and frame tensors", expected=[*FRAME_CONTENT_TYPES, "(none: recognized by content)"], received=name)


def body_format(media_type: str, body: bytes, has_shape: bool) -> BodyFormat:
    """Which parser reads this body: its Content-Type, or for generic ones ``shape`` or its bytes
    (415 for bytes of a format the service does not read)."""
    if media_type in IMAGE_CONTENT_TYPES:
        return IMAGE_CONTENT_TYPES[media_type]  # type: ignore[return-value]
    if media_type in VIDEO_CONTENT_TYPES:
        return "mp4"
    if media_type == NPY_CONTENT_TYPE:
        return "npy"
    if media_type == SAFETENSORS_CONTENT_TYPE:
        return "safetensors"
    if media_type == "tensor/binary" or has_shape:  # octet-stream or generic, described by the query
        return "raw"
    sniffed = sniff(body)
    if sniffed.kind is not None:
        return _READ_FROM_BYTES[sniffed.kind]  # type: ignore[return-value]
    if sniffed.known:
        raise _unsupported(sniffed.name, None)
    return "raw"  # raw without a shape: 422 missing-shape names the formats


def _check_bytes_are(body: bytes, body_type: BodyFormat) -> None:
    """415 unless a PNG, JPEG or MP4 body's first bytes are that format, naming what they are."""
    kind, name = _SNIFFED_AS[body_type]
    sniffed = sniff(body)
    if sniffed.kind != kind:
        raise _unsupported(sniffed.name, name)


def to_unit_range(pixels: np.ndarray, out: np.ndarray) -> None:
    """uint8 ``(H, W, 3)`` pixels → float32 ``(3, H, W)`` ``out``, ``2 · (x / 255) − 1``: diffusers'
    ``VaeImageProcessor`` arithmetic, step by step in float32 (the same roundings), in place."""
    np.divide(pixels.transpose(2, 0, 1), np.float32(255.0), out=out, dtype=np.float32)
    out *= np.float32(2.0)
    out -= np.float32(1.0)


def check_shape(shape: tuple[int, ...], config: VAEConfig, limits: Limits) -> None:
    """The model's shape rules and the configured limits, for frames ``(B, 3, F, H, W)`` (an image
    model's ``(B, 3, H, W)``) — from a header, before anything is decoded. A frame count or size
    that breaks a rule gets 422 with the nearest valid values within the limits; one over its limit
    gets the limit's 422 (no valid value near it is served)."""
    try:
        check_frames_shape(shape, config)
    except FramesError as error:
        expected, detail = error.expected, str(error)
        if error.what in _LIMITED:
            b, _, f, h, w = clip_shape(shape)
            limits.check(batch=b, frames=f, height=h, width=w)
            expected = within_limit(expected, _LIMITED[error.what](limits))
            detail = detail.replace(f"expected {error.expected}", f"expected {expected}")
        raise Problem(422, SHAPE_SLUGS.get(error.what, "invalid-shape"), detail, expected=expected,
                      received=error.received) from None
    b, _, f, h, w = clip_shape(shape)
    limits.check(batch=b, frames=f, height=h, width=w)


# The sizes whose rule names the nearest valid values, and the limit on each.
_LIMITED: dict[str, Callable[[Limits], int]] = {"frames": lambda limits: limits.max_frames,
                                                "height": lambda limits: limits.max_height,
                                                "width": lambda limits: limits.max_width}


def within_limit(nearest: list[int], limit: int) -> list[int] | str:
    """The nearest valid values that ``limit`` lets through (a value within it always has one
    below it, unless it is below the smallest valid one)."""
    return [value for value in nearest if value <= limit] or f"none: {nearest} is over the limit {limit}"


def model_frames(shape: tuple[int, ...], config: VAEConfig) -> tuple[int, ...]:
    """Frames of ``shape`` in the layout the model takes: a video model's ``(B, 3, F, H, W)`` (an
    image ``(B, 3, H, W)`` is one frame), an image model's as they are (its shape rules decide)."""
    return shape if config.is_image or len(shape) == 5 else (*shape[:2], 1, *shape[2:])


def check_frame_dims(shape: tuple[int, ...]) -> None:
    """Frames tensors are ``(B, 3, F, H, W)`` or ``(B, 3, H, W)``, every size at least 1."""
    check_dims(shape, what="frames", layouts=FRAME_LAYOUTS, example="1,3,81,480,832")


@dataclass(frozen=True)
class FramesHeader:
    """A body whose headers passed every check: the frames ``shape`` ``(B, 3, F, H, W)`` it becomes
    (an image model's ``(B, 3, H, W)``), and how to decode them (``fill(out, deadline)`` writes
    every value of ``out``)."""

    shape: tuple[int, ...]
    fill: Callable[[np.ndarray, float | None], None]
    checks_finite: bool  # tensors can hold NaN/Inf; decoded pixels cannot

    @property
    def nbytes(self) -> int:
        """Host bytes of the float32 frames: what :meth:`read` allocates and the request holds."""
        return math.prod(self.shape) * 4

    def read(self, deadline: float | None = None) -> np.ndarray:
        """The frames, float32 ``(B, 3, F, H, W)`` in one array allocated here; 422 for a body whose
        data does not match its header, 504 past ``deadline`` (``time.monotonic()``)."""
        out = np.empty(self.shape, np.float32)
        self.fill(out, deadline)
        if self.checks_finite:
            check_finite(out, "frames")
        return out


def _image_header(body: bytes, kind: Literal["png", "jpeg"], config: VAEConfig, limits: Limits) -> FramesHeader:
    header = image_header(body, kind, lambda height, width: check_shape(model_frames((1, 3, height, width), config),
                                                                         config, limits))

    def fill(out: np.ndarray, deadline: float | None) -> None:
        to_unit_range(read_image(body, kind), out.reshape(3, header.height, header.width))

    return FramesHeader(model_frames((1, 3, header.height, header.width), config), fill, checks_finite=False)


def _mp4_header(body: bytes, config: VAEConfig, limits: Limits, codecs: tuple[VideoCodec, ...]) -> FramesHeader:
    if config.is_image:
        raise Problem(415, "unsupported-media-type", f"the {config.class_name} VAE encodes images: send a PNG, a "
                      "JPEG or a tensor", expected=["image/png", "image/jpeg", *TENSOR_CONTENT_TYPES],
                      received="video/mp4")
    header = mp4_header(body, codecs, limits.max_frames)
    shape = (1, 3, header.frames, header.height, header.width)
    check_shape(shape, config, limits)

    def fill(out: np.ndarray, deadline: float | None) -> None:
        decode_mp4(body, header, lambda index, rgb: to_unit_range(rgb, out[0, :, index]), deadline)

    return FramesHeader(shape, fill, checks_finite=False)


def _tensor_header(body: bytes, body_type: BodyFormat, shape: tuple[int, ...] | None, dtype: str | None,
                 config: VAEConfig, limits: Limits) -> FramesHeader:
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
    view = array.reshape(model_frames(array.shape, config))  # a view of the body: nothing copied yet
    check_shape(view.shape, config, limits)

    def fill(out: np.ndarray, deadline: float | None) -> None:
        out[...] = view  # float16/bfloat16/big-endian → float32, exactly

    return FramesHeader(view.shape, fill, checks_finite=True)


def read_frames_header(body: bytes, body_type: BodyFormat, shape: tuple[int, ...] | None, dtype: str | None,
              config: VAEConfig, limits: Limits, *, codecs: tuple[VideoCodec, ...]) -> FramesHeader:
    """The checks of a body whose format is known (a Content-Type, or a file's suffix offline),
    from its headers alone; nothing of the size of the frames is allocated."""
    if body_type in _SNIFFED_AS:
        _check_bytes_are(body, body_type)
    if body_type in ("png", "jpeg"):
        return _image_header(body, body_type, config, limits)
    if body_type == "mp4":
        return _mp4_header(body, config, limits, codecs)
    return _tensor_header(body, body_type, shape, dtype, config, limits)


def frames_header(body: bytes, media_type: str, shape: tuple[int, ...] | None, dtype: str | None,
                config: VAEConfig, limits: Limits, *, codecs: tuple[VideoCodec, ...]) -> FramesHeader:
    """An encode body's :class:`FramesHeader`, from its Content-Type (or bytes) and headers."""
    return read_frames_header(body, body_format(media_type, body, shape is not None), shape, dtype, config, limits,
                     codecs=codecs)


def parse_frames(body: bytes, media_type: str, shape: tuple[int, ...] | None, dtype: str | None,
                 config: VAEConfig, limits: Limits, *, codecs: tuple[VideoCodec, ...] = ALL_CODECS) -> np.ndarray:
    """Body → checked float32 frames ``(B, 3, F, H, W)`` in [-1, 1] in one go (no budget in between:
    tests and tools); every codec is read unless ``codecs`` says otherwise."""
    return frames_header(body, media_type, shape, dtype, config, limits, codecs=codecs).read()
