"""Latents in (the decode request) and latents out (the encode answer). Pure functions, no JAX.

Parsing validates everything a client can get wrong (media type, shape, dtype, byte count,
sizes, NaN/Inf) and raises :class:`service.problem.Problem` with what was expected and what was
received, so the device never sees a malformed request.

Layout: latents are ``(B, C, T, H, W)`` (NCTHW, diffusers' layout) for a video model, ``(B, C, H,
W)`` for an image model (or Flux's packed ``(B, H·W/4, 4C)``); ``C`` is the model's latent channels
(16 for Wan 2.1, 48 for Wan 2.2, 4 for SD and SDXL), ``limits.channels``.

Scaling follows diffusers' remote VAE convention, in both directions:

* decode: ``unscale_latents`` gives the model ``z / scaling_factor + shift_factor``;
* encode: ``scale_latents`` answers ``(z − shift_factor) · scaling_factor``, its inverse.
"""

from __future__ import annotations

import json
from typing import Literal

import numpy as np
from safetensors.numpy import save as save_safetensors

from vaeserve.models.shapes import LatentsError, ShapeRules, check_latents_shape, clip_shape

from ..limits import Limits
from ..problem import Problem
from .sniff import sniff
from .tensors import (
    GENERIC_CONTENT_TYPES,
    NPY_CONTENT_TYPE,
    SAFETENSORS_CONTENT_TYPE,
    SHAPE_SLUGS,
    TENSOR_CONTENT_TYPES,
    check_dims,
    media_type,
    npy_bytes,
    parse_npy,
    parse_raw,
    parse_safetensors,
)

LATENT_LAYOUTS = ["(C, T, H, W)", "(B, C, T, H, W)", "images: (C, H, W)", "(B, C, H, W)",
                  "packed images: (B, H·W/4, 4C) with height and width"]
LATENT_RANKS = (3, 4, 5)
# Latents out, by the encode's output_type.
LATENT_MEDIA_TYPES = {"pt": "application/octet-stream", "npy": NPY_CONTENT_TYPE,
                      "safetensors": SAFETENSORS_CONTENT_TYPE}


LATENT_CONTENT_TYPES = [*TENSOR_CONTENT_TYPES, "(none: a .npy or safetensors body is recognized by its bytes)"]
# What a refusal suggests: the Content-Type of each latents format, and curl's flag for one.
_FORMATS_HINT = ("send a .npy file as application/x-npy (curl: -H 'Content-Type: application/x-npy'), a safetensors "
                 "file as application/x-safetensors, or raw little-endian bytes as application/octet-stream with the "
                 "query's shape and dtype")


def check_latents_content_type(content_type: str | None) -> str:
    """The media type of a decode body, or 415 from the headers alone. A generic one (none, curl's
    form default, octet-stream) is taken: the query's shape or the body's bytes then say what it is."""
    given = media_type(content_type)
    if given not in TENSOR_CONTENT_TYPES and given not in GENERIC_CONTENT_TYPES:
        raise Problem(415, "unsupported-media-type",
                      f"Content-Type {given!r} is not a latent tensor format: {_FORMATS_HINT}",
                      expected=LATENT_CONTENT_TYPES, received=given)
    return given


LatentsFormat = Literal["raw", "npy", "safetensors"]


def latents_format(given: str, body: bytes, has_shape: bool) -> LatentsFormat:
    """Which parser reads a decode body: its Content-Type; for a generic one, raw when the query
    gives a shape, else what its first bytes are (415 for a format that holds no latents)."""
    if given == NPY_CONTENT_TYPE:
        return "npy"
    if given == SAFETENSORS_CONTENT_TYPE:
        return "safetensors"
    if given == "tensor/binary" or has_shape:
        return "raw"
    sniffed = sniff(body)
    if sniffed.kind == "npy" or sniffed.kind == "safetensors":
        return sniffed.kind
    if sniffed.known:
        raise Problem(415, "unsupported-media-type", f"the body is {sniffed.name}, not latents: {_FORMATS_HINT}",
                      expected=LATENT_CONTENT_TYPES, received=sniffed.name)
    return "raw"  # without a shape: 422 missing-shape


def check_latent_dims(shape: tuple[int, ...]) -> None:
    """Latents of any model: 3, 4 or 5 dims (``LATENT_LAYOUTS``), every size at least 1; which
    layouts a model takes is checked once the body is read (:func:`check_limits`)."""
    check_dims(shape, what="latents", layouts=LATENT_LAYOUTS, example="1,16,21,60,104", ranks=LATENT_RANKS)


def parse_latents(body: bytes, content_type: str, shape: tuple[int, ...] | None, dtype: str | None, limits: Limits,
                  rules: ShapeRules, *, packed_size: tuple[int | None, int | None] = (None, None),
                  tensor: str | None = None) -> tuple[np.ndarray, bool]:
    """Body -> ``(latents float32 in the model's batched layout, had_batch_dim)``; raises Problem
    on bad input. ``packed_size``: the image's ``(height, width)`` in pixels when the body may be
    packed latents (see :func:`model_layout`).

    Values are not checked here: NaN/Inf are refused by :func:`service.codecs.tensors.check_finite` once scaling and
    denormalizing are applied (finite inputs can overflow there). ``tensor``: the name of the
    latents in a safetensors body that holds several (None: its one tensor)."""
    body_format = latents_format(check_latents_content_type(content_type), body, shape is not None)
    if body_format == "npy":
        array = parse_npy(body, check=check_latent_dims)
    elif body_format == "safetensors":
        array = parse_safetensors(body, check=check_latent_dims, name=tensor)
    else:
        array = parse_raw(body, shape, dtype, check=check_latent_dims)
    latents, batched = model_layout(array, rules, packed_size)
    return check_limits(latents, limits, rules), batched


def model_layout(array: np.ndarray, rules: ShapeRules,
                 packed_size: tuple[int | None, int | None] = (None, None)) -> tuple[np.ndarray, bool]:
    """A body's latents in the layout the model takes, with the batch dim, and whether the body had it.

    A video model takes ``(B, C, T, H, W)``; ``(C, T, H, W)`` is one video. An image model takes
    ``(B, C, H, W)`` (Qwen-Image also ``(B, C, 1, H, W)``); ``(C, H, W)`` is one image, and with
    ``packed_size`` (the image's height and width in pixels, as diffusers' ``remote_decode`` sends
    them) a 3-dim body is Flux's packed latents ``(B, H·W/4, 4C)``, unpacked here."""
    height, width = packed_size
    if rules.is_image and array.ndim == 3 and (height is not None or width is not None):
        if height is None or width is None:
            raise Problem(422, "missing-size", "packed latents need both height and width (the image's, in pixels)",
                          expected="height=H&width=W", received={"height": height, "width": width})
        return unpack_latents(array, height, width, rules.spatial_scale), True
    unbatched = 3 if rules.is_image else 4
    return (array[None], False) if array.ndim == unbatched else (array, True)


def unpack_latents(packed: np.ndarray, height: int, width: int, spatial_scale: int) -> np.ndarray:
    """Flux's packed latents ``(B, h/2 · w/2, 4C)`` (2x2 patches of ``C`` channels, row by row) →
    ``(B, C, h, w)``, ``h = 2 · ⌊height / 2s⌋`` as Flux's pipelines compute it from the image's
    ``height`` (``s``: the spatial scale). A view where the layout allows it; 422 when the token or
    channel count does not fit the size."""
    b, tokens, packed_channels = packed.shape
    h, w = 2 * (height // (2 * spatial_scale)), 2 * (width // (2 * spatial_scale))
    if h == 0 or w == 0 or tokens != (h // 2) * (w // 2) or packed_channels % 4:
        raise Problem(422, "invalid-shape", f"packed latents of a {height}x{width} image are (B, {h // 2 * (w // 2)}, 4C)",
                      expected=[b, (h // 2) * (w // 2), "4C"], received=list(packed.shape))
    channels = packed_channels // 4
    return packed.reshape(b, h // 2, w // 2, channels, 2, 2).transpose(0, 3, 1, 4, 2, 5).reshape(b, channels, h, w)


def check_limits(latents: np.ndarray, limits: Limits, rules: ShapeRules) -> np.ndarray:
    """The model's shape rules and the configured size limits (on the output, in pixels) for
    batched ``latents``; returns them float32 and contiguous."""
    try:
        check_latents_shape(latents.shape, rules)
    except LatentsError as error:
        detail = (f"latents need {error.expected} channels, got {error.received}: "
                  f"{layout_hint(latents.shape, error.expected)}" if error.what == "channels" else str(error))
        received = list(latents.shape) if error.what == "ndim" else error.received  # the shape, as check_dims says it
        raise Problem(422, SHAPE_SLUGS.get(error.what, "invalid-shape"), detail, expected=error.expected,
                      received=received) from None
    b, _, t, h, w = clip_shape(latents.shape)
    limits.check(batch=b, frames=limits.output_frames(t), height=limits.spatial_scale * h,
                 width=limits.spatial_scale * w, what="output ")
    return np.ascontiguousarray(latents, dtype=np.float32)


def layout_hint(shape: tuple[int, ...], channels: int) -> str:
    """What a wrong channel count most likely means, for batched latents ``shape`` (a video's
    ``(B, C, T, H, W)``, an image's ``(B, C, H, W)``): latents laid out channels-last (the last axis
    holds the channels), or else the layout the service reads."""
    video = len(shape) == 5
    first, last = ("(B, C, T, H, W)", "(B, T, H, W, C)") if video else ("(B, C, H, W)", "(B, H, W, C)")
    if shape[-1] == channels:
        order = "0, 4, 1, 2, 3" if video else "0, 3, 1, 2"
        return (f"the last axis has them: these latents look channels-last {last}; send {first} "
                f"(diffusers' layout), e.g. x.permute({order}) in PyTorch or x.transpose({order}) in numpy")
    return f"latents are read as {first} ({'NCTHW' if video else 'NCHW'}, diffusers' layout), or without the batch dim"


def unscale_latents(latents: np.ndarray, scaling_factor: float | None, shift_factor: float | None) -> np.ndarray:
    """Decode input: ``latents / scaling_factor + shift_factor`` in float32 (either factor optional)."""
    if scaling_factor is not None:
        latents = latents / np.float32(scaling_factor)
    if shift_factor is not None:
        latents = latents + np.float32(shift_factor)
    return latents


def scale_latents(latents: np.ndarray, scaling_factor: float | None, shift_factor: float | None) -> np.ndarray:
    """Encode output: ``(latents − shift_factor) · scaling_factor`` in float32, the inverse of
    :func:`unscale_latents`."""
    if shift_factor is not None:
        latents = latents - np.float32(shift_factor)
    if scaling_factor is not None:
        latents = latents * np.float32(scaling_factor)
    return latents


def serialize_latents(latents: np.ndarray, output_type: str) -> tuple[bytes, dict[str, str]]:
    """float32 latents ``(B, z, T, h, w)`` → (body, extra headers) for ``output_type``: ``pt`` (raw
    little-endian bytes, described by ``shape``/``dtype`` headers as diffusers' client reads them),
    ``npy`` or ``safetensors`` (one tensor named ``latents``)."""
    latents = np.ascontiguousarray(latents, "<f4")
    if output_type == "npy":
        return npy_bytes(latents), {}
    if output_type == "safetensors":
        return save_safetensors({"latents": latents}), {}
    return latents.tobytes(), {"shape": json.dumps(list(latents.shape)), "dtype": "float32"}
