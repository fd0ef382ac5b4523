"""What a body is, from its first bytes: the formats the service reads, and a name for the common
ones it does not, so that a refusal can say what it received ("a BMP image", "an MPEG-TS video").

Nothing here parses past a few header bytes: identifying a body costs nothing and runs no decoder.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Literal

# What the service reads. "isobmff" is an MP4 or QuickTime MOV file (one FFmpeg demuxer reads both).
Readable = Literal["png", "jpeg", "isobmff", "npy", "safetensors"]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
NPY_MAGIC = b"\x93NUMPY"
# ISO base media files that are still images, not video: HEIF/HEIC and AVIF photos.
_IMAGE_BRANDS = {b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"mif1", b"msf1", b"avif", b"avis"}
# Top-level QuickTime atoms an old MOV file may start with instead of 'ftyp'.
_QUICKTIME_ATOMS = {b"moov", b"mdat", b"wide", b"free", b"skip", b"pnot"}
_BMP_HEADER_SIZES = {12, 40, 52, 56, 64, 108, 124}


@dataclass(frozen=True)
class Sniffed:
    """``kind``: the parser that reads the body, or ``None`` for a format the service does not
    read; ``name``: what it is, for details ("a PNG image", "unrecognized bytes 00 01 ...");
    ``known``: whether any format claims the bytes."""

    kind: Readable | None
    name: str
    known: bool = True


def _isobmff(body: bytes) -> Sniffed | None:
    box = body[4:8]
    if box == b"ftyp":
        brand = body[8:12]
        if brand in _IMAGE_BRANDS:
            return Sniffed(None, f"a HEIF/AVIF image (brand {brand.decode('latin-1')!r})")
        if brand == b"qt  ":
            return Sniffed("isobmff", "a QuickTime MOV video")
        return Sniffed("isobmff", f"an MP4 video (brand {brand.decode('latin-1')!r})")
    if box in _QUICKTIME_ATOMS:
        size = struct.unpack(">I", body[:4])[0]  # 0: to the end of the file; 1: a 64-bit size follows
        if size in (0, 1) or 8 <= size <= len(body):
            return Sniffed("isobmff", "a QuickTime MOV video")
    return None


def _bmp(body: bytes) -> bool:
    return (body[:2] == b"BM" and len(body) >= 18 and body[6:10] == b"\0\0\0\0"
            and struct.unpack("<I", body[14:18])[0] in _BMP_HEADER_SIZES)


def _mpeg_ts(body: bytes) -> bool:
    return len(body) > 188 and body[0] == 0x47 and body[188] == 0x47


def _safetensors(body: bytes) -> bool:
    return len(body) > 9 and struct.unpack("<Q", body[:8])[0] <= len(body) - 8 and body[8:9] == b"{"


# Formats the service does not read, recognized by their first bytes.
_PREFIXES: tuple[tuple[bytes, str], ...] = (
    (b"GIF87a", "a GIF image"), (b"GIF89a", "a GIF image"), (b"II*\0", "a TIFF image"), (b"MM\0*", "a TIFF image"),
    (b"\x1a\x45\xdf\xa3", "a Matroska/WebM video"), (b"OggS", "an Ogg file"), (b"FLV\x01", "an FLV video"),
    (b"\0\0\x01\xba", "an MPEG program stream"), (b"\0\0\x01\0", "an ICO icon"),
    (b"\0\0\0\x01", "an H.264/H.265 elementary stream (no container)"),
    (b"\0\0\x01", "an H.264/H.265 elementary stream (no container)"),
    (b"8BPS", "a Photoshop image"), (b"qoif", "a QOI image"), (b"DDS ", "a DDS image"), (b"\x01\xda", "an SGI image"),
    (b"\xff\x0a", "a JPEG XL image"), (b"\0\0\0\x0cJXL ", "a JPEG XL image"), (b"\0\0\0\x0cjP  ", "a JPEG 2000 image"),
    (b"\xff\x4f\xff\x51", "a JPEG 2000 codestream"), (b"ffconcat version", "an FFmpeg concat playlist"),
    (b"#EXTM3U", "an HLS playlist"), (b"PK\x03\x04", "a zip archive (an .npz?)"), (b"\x1f\x8b", "a gzip file"),
    (b"%PDF", "a PDF document"),
)
_RIFF_FORMS = {b"WEBP": "a WebP image", b"AVI ": "an AVI video", b"WAVE": "a WAV audio file"}


def sniff(body: bytes) -> Sniffed:
    """The format the first bytes of ``body`` give away; ``kind`` is ``None`` for anything the
    service does not read (named when it is a common format)."""
    if body.startswith(PNG_SIGNATURE):
        return Sniffed("png", "a PNG image")
    if body.startswith(b"\xff\xd8\xff"):
        return Sniffed("jpeg", "a JPEG image")
    if body.startswith(NPY_MAGIC):
        return Sniffed("npy", "a .npy array")
    found = _isobmff(body)
    if found is not None:
        return found
    if _bmp(body):
        return Sniffed(None, "a BMP image")
    if _mpeg_ts(body):
        return Sniffed(None, "an MPEG-TS video")
    if body[:4] == b"RIFF" and body[8:12] in _RIFF_FORMS:
        return Sniffed(None, _RIFF_FORMS[body[8:12]])
    for prefix, name in _PREFIXES:
        if body.startswith(prefix):
            return Sniffed(None, name)
    if len(body) > 2 and body[0:1] == b"P" and body[1:2] in b"1234567" and body[2:3] in b" \t\r\n":
        return Sniffed(None, "a PNM image (PBM/PGM/PPM/PAM)")
    if _safetensors(body):
        return Sniffed("safetensors", "a safetensors file")
    return Sniffed(None, f"unrecognized bytes ({len(body)} bytes: {body[:8].hex(' ') or 'empty'})", known=False)
