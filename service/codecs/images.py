"""PNG and JPEG in, for ``POST /v1/encode``: the header read and checked before a pixel is decoded,
then the image decoded by Pillow's decoder for that one format.

The size and bit depth come from the bytes themselves — a PNG's IHDR chunk (always first), a
JPEG's start-of-frame segment — before Pillow sees the body, so a decompression bomb is refused
for its size with the limit it breaks. 16-bit PNGs of every colour type (and 12-bit JPEGs) are
refused alike: Pillow would cut RGB ones to 8 bits without a word and refuse grey ones, and a
pipeline's ``PIL.Image.convert("RGB")`` holds 8-bit pixels.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from PIL import Image

from ..problem import Problem

ImageFormat = Literal["png", "jpeg"]
_PILLOW_FORMATS = {"png": ["PNG"], "jpeg": ["JPEG"]}
# Pillow modes that convert to 8-bit RGB exactly (float and 16-bit integer modes would clip).
IMAGE_MODES = ("1", "L", "LA", "P", "PA", "RGB", "RGBA", "RGBX", "CMYK", "YCbCr")
_PNG_COLOUR_TYPES = {0: "grey", 2: "RGB", 3: "palette", 4: "grey + alpha", 6: "RGBA"}
# JPEG start-of-frame markers (baseline, extended, progressive, lossless; Huffman or arithmetic).
_JPEG_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_JPEG_NO_LENGTH = {0x01, *range(0xD0, 0xD8)}  # TEM and RSTn stand alone


@dataclass(frozen=True)
class ImageHeader:
    width: int
    height: int
    depth: int  # bits per channel (sample)
    layout: str  # "RGB", "palette", "3 components", ... for details


def _invalid(body: bytes, kind: ImageFormat, detail: str) -> Problem:
    return Problem(422, "invalid-image", detail, expected=f"a readable {kind.upper()} image",
                   received=f"{len(body)} bytes")


def png_header(body: bytes) -> ImageHeader:
    """The IHDR chunk: the first after the signature, at a fixed offset in every PNG."""
    if len(body) < 33 or body[12:16] != b"IHDR":
        raise _invalid(body, "png", "the PNG does not start with its IHDR chunk")
    width, height, depth, colour = struct.unpack(">IIBB", body[16:26])
    return ImageHeader(width, height, depth, _PNG_COLOUR_TYPES.get(colour, f"colour type {colour}"))


def jpeg_header(body: bytes) -> ImageHeader:
    """The start-of-frame segment, found by walking the marker segments that precede it."""
    offset = 2  # after SOI
    while offset + 4 <= len(body):
        if body[offset] != 0xFF:
            break
        marker = body[offset + 1]
        if marker == 0xFF:  # fill byte
            offset += 1
            continue
        if marker in _JPEG_NO_LENGTH:
            offset += 2
            continue
        (length,) = struct.unpack(">H", body[offset + 2 : offset + 4])
        if marker in _JPEG_SOF and length >= 8 and offset + 10 <= len(body):
            depth, height, width, components = struct.unpack(">BHHB", body[offset + 4 : offset + 10])
            return ImageHeader(width, height, depth, f"{components} components")
        if marker == 0xDA or length < 2:  # scan data before any frame header, or a broken length
            break
        offset += 2 + length
    raise _invalid(body, "jpeg", "the JPEG has no readable frame header (SOF) before its data")


def _open(body: bytes, kind: ImageFormat) -> Image.Image:
    try:
        return Image.open(io.BytesIO(body), formats=_PILLOW_FORMATS[kind])
    except Exception as exc:  # Pillow raises several types for a header it cannot read
        raise _invalid(body, kind, f"not a readable {kind.upper()}: {exc}") from None


def image_header(body: bytes, kind: ImageFormat, check_size: Callable[[int, int], None]) -> ImageHeader:
    """The image's header, checked before any pixel is decoded: 8 bits per channel at most, then
    ``check_size(height, width)`` (the limits and the model's shape rules), then what Pillow's
    header parse says — one frame (an animated PNG is another format: 415) in a mode that converts
    to 8-bit RGB exactly."""
    header = png_header(body) if kind == "png" else jpeg_header(body)
    if header.depth > 8:
        raise Problem(422, "unsupported-bit-depth", f"{header.depth}-bit {kind.upper()}s are not read: convert to 8 "
                      "bits per channel first", expected="8 bits per channel or fewer",
                      received=f"{header.depth}-bit {header.layout}")
    check_size(header.height, header.width)
    with _open(body, kind) as image:
        if getattr(image, "is_animated", False):
            raise Problem(415, "unsupported-media-type", "animated PNGs (APNG) are not read: send one frame as a "
                          "PNG, or the clip as an MP4", expected=["image/png", "image/jpeg", "video/mp4"],
                          received=f"an animated PNG of {getattr(image, 'n_frames', '?')} frames")
        if image.mode not in IMAGE_MODES:
            raise Problem(422, "invalid-image-mode", f"image mode {image.mode} does not convert to 8-bit RGB",
                          expected=list(IMAGE_MODES), received=image.mode)
        if image.size != (header.width, header.height):
            raise _invalid(body, kind, f"Pillow reads a {image.size[0]}x{image.size[1]} image where the header "
                           f"says {header.width}x{header.height}")
    return header


def read_image(body: bytes, kind: ImageFormat) -> np.ndarray:
    """The pixels ``(H, W, 3)`` uint8 of an image whose header was checked (:func:`image_header`)."""
    with _open(body, kind) as image:
        try:
            return np.asarray(image.convert("RGB"))
        except Exception as exc:  # truncated or corrupt data: Pillow raises OSError, SyntaxError, ...
            raise _invalid(body, kind, f"the {kind.upper()} does not decode: {exc}") from None
