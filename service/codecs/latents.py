"""Latents in (the decode request) and latents out (the encode answer). Pure functions, no JAX.

Parsing validates everything a client can get wrong (media type, shape, dtype, byte count,
sizes, NaN/Inf) and raises :class:`service.problem.Problem` with what was expected and what was
received, so the device never sees a malformed request.

Layout: latents are ``(B, C, T, H, W)`` (NCTHW, diffusers' layout); ``C`` is the model's latent
channels (16 for Wan 2.1, 48 for Wan 2.2), ``limits.channels``.

Scaling follows diffusers' remote VAE convention, in both directions:

* decode: ``unscale_latents`` gives the model ``z / scaling_factor + shift_factor``;
* encode: ``scale_latents`` answers ``(z − shift_factor) · scaling_factor``, its inverse.
"""

from __future__ import annotations

import json
from typing import Literal

import numpy as np
from safetensors.numpy import save as save_safetensors

from ..limits import Limits
from ..problem import Problem
from .sniff import sniff
from .tensors import (
    GENERIC_CONTENT_TYPES,
    NPY_CONTENT_TYPE,
    SAFETENSORS_CONTENT_TYPE,
    TENSOR_CONTENT_TYPES,
    check_dims,
    media_type,
    npy_bytes,
    parse_npy,
    parse_raw,
    parse_safetensors,
)

LATENT_LAYOUTS = ["(C, T, H, W)", "(B, C, T, H, W)"]
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
    """Latents are ``(C, T, H, W)`` or ``(B, C, T, H, W)``, every size at least 1."""
    check_dims(shape, what="latents", layouts=LATENT_LAYOUTS, example="1,16,21,60,104")


def parse_latents(
    body: bytes, content_type: str, shape: tuple[int, ...] | None, dtype: str | None, limits: Limits
) -> tuple[np.ndarray, bool]:
    """Body -> ``(latents (B, C, T, H, W) float32, had_batch_dim)``; raises Problem on bad input.

    Values are not checked here: NaN/Inf are refused by :func:`service.codecs.tensors.check_finite` once scaling and
    denormalizing are applied (finite inputs can overflow there)."""
    body_format = latents_format(check_latents_content_type(content_type), body, shape is not None)
    if body_format == "npy":
        array = parse_npy(body, check=check_latent_dims)
    elif body_format == "safetensors":
        array = parse_safetensors(body, check=check_latent_dims)
    else:
        array = parse_raw(body, shape, dtype, check=check_latent_dims)
    return check_limits(array, limits)


def check_limits(array: np.ndarray, limits: Limits) -> tuple[np.ndarray, bool]:
    """Channels and the configured size limits; returns float32 ``(B, C, T, H, W)`` and whether
    the input had the batch dimension."""
    check_latent_dims(array.shape)
    batched = array.ndim == 5
    latents = array if batched else array[None]
    b, c, t, h, w = latents.shape
    if c != limits.channels:
        raise Problem(422, "invalid-channels", f"latents need {limits.channels} channels, got {c}: "
                      f"{layout_hint(latents.shape, limits.channels)}",
                      expected=limits.channels, received=c)
    limits.check(batch=b, frames=limits.output_frames(t), height=limits.spatial_scale * h,
                 width=limits.spatial_scale * w, what="output ")
    return np.ascontiguousarray(latents, dtype=np.float32), batched


def layout_hint(shape: tuple[int, ...], channels: int) -> str:
    """What a wrong channel count most likely means, for ``(B, C, T, H, W)`` ``shape``: latents
    laid out channels-last ``(B, T, H, W, C)`` (the last axis holds the channels), or else the
    layout the service reads."""
    if shape[-1] == channels:
        return ("the last axis has them: these latents look channels-last (B, T, H, W, C); send NCTHW "
                "(B, C, T, H, W), e.g. x.permute(0, 4, 1, 2, 3) in PyTorch or x.transpose(0, 4, 1, 2, 3) in numpy")
    return "latents are read as (B, C, T, H, W) (NCTHW, diffusers' layout) or (C, T, H, W)"


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
