"""Bytes in, latents out; frames in, bytes out. Pure functions, no FastAPI, no JAX.

Parsing validates everything a client can get wrong (shape, dtype, byte count, sizes, NaN/Inf)
and raises :class:`service.errors.Problem` with what was expected and what was received, so the
device never sees a malformed request.

Layouts: latents are ``(B, C, T, H, W)`` (NCTHW, diffusers' layout); frames are
``(B, F, sH, sW, 3)`` uint8, channels-last, with ``F = 1 + 4 (T - 1)`` and ``s`` the model's
spatial scale (8 for Wan 2.1, 16 for Wan 2.2).
"""

from __future__ import annotations

import io
import json
import math
import re
import struct
import tempfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import av
import ml_dtypes
import numpy as np

from .errors import Problem

RAW_CONTENT_TYPES = ("application/octet-stream", "tensor/binary")
NPY_CONTENT_TYPE = "application/x-npy"
SAFETENSORS_CONTENT_TYPE = "application/x-safetensors"
ACCEPTED_CONTENT_TYPES = (*RAW_CONTENT_TYPES, NPY_CONTENT_TYPE, SAFETENSORS_CONTENT_TYPE)

# Wire dtypes: name -> little-endian numpy dtype. bfloat16 comes from ml_dtypes (a JAX dependency).
WIRE_DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype("<f4"),
    "float16": np.dtype("<f2"),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
}
_SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
_SAFETENSORS_MAX_HEADER = 1 << 20  # the header is JSON metadata; a megabyte is already absurd
ShapeCheck = Callable[[tuple[int, ...]], None]  # raises Problem for a shape the route cannot take


@dataclass(frozen=True)
class Limits:
    """Largest request the service accepts; sizes are of the decoded output."""

    channels: int
    max_batch: int
    max_frames: int
    max_height: int
    max_width: int
    temporal_scale: int = 4  # the model's: frames per latent frame after the first (Wan 2.1: 4)
    spatial_scale: int = 8  # the model's: pixels per latent row/column (Wan 2.1: 8, Wan 2.2: 16)

    def output_frames(self, latent_frames: int) -> int:
        """The first latent frame gives one frame, every later one ``temporal_scale``."""
        return 1 + self.temporal_scale * (latent_frames - 1)

    @property
    def max_latent_frames(self) -> int:
        return 1 + (self.max_frames - 1) // self.temporal_scale

    @property
    def max_latent_height(self) -> int:
        return self.max_height // self.spatial_scale

    @property
    def max_latent_width(self) -> int:
        return self.max_width // self.spatial_scale


def media_type(content_type: str | None) -> str:
    """``"Application/X-NPY; charset=x"`` -> ``"application/x-npy"``."""
    return (content_type or "").split(";")[0].strip().lower()


def check_content_type(content_type: str | None) -> str:
    given = media_type(content_type)
    if given not in ACCEPTED_CONTENT_TYPES:
        raise Problem(
            415,
            "unsupported-media-type",
            f"Content-Type {given or '(none)'!r} is not a latent tensor format",
            expected=list(ACCEPTED_CONTENT_TYPES),
            received=given or None,
        )
    return given


def _shape_problem(slug: str, detail: str, shape: tuple[int, ...] | list) -> Problem:
    # A hostile shape can have thousands of entries: echo short ones, count long ones.
    received = list(shape) if len(shape) <= 8 else f"{len(shape)} dimensions"
    return Problem(422, slug, detail, expected=["(C, T, H, W)", "(B, C, T, H, W)"] if slug == "invalid-ndim"
                   else "positive sizes, e.g. 1,16,21,60,104", received=received)


def check_shape(shape: tuple[int, ...]) -> None:
    """The one shape check for every body format, before any reshape or allocation: latents are
    ``(C, T, H, W)`` or ``(B, C, T, H, W)`` with every size at least 1 (numpy would accept zeros,
    and negative pairs multiply to a positive byte count)."""
    if len(shape) not in (4, 5):
        raise _shape_problem("invalid-ndim", f"latents must have 4 or 5 dims, got {len(shape)}", shape)
    if min(shape) < 1:
        raise _shape_problem("invalid-shape", "every latent size must be at least 1", shape)


_DIGITS = re.compile(r"[0-9]{1,18}")  # ASCII only: int() would also take "1_6" and full-width digits


def parse_shape(values: list[str] | None, *, check: ShapeCheck = check_shape) -> tuple[int, ...] | None:
    """Shape from the query: repeated (``shape=1&shape=16``, what ``requests`` sends for a list),
    comma separated (``shape=1,16,2,4,4``) or JSON (``shape=[1,16,2,4,4]``). ``check``: latents'
    by default."""
    if not values:
        return None
    text = ",".join(values).replace("[", "").replace("]", "")
    parts = [part.strip(" ") for part in text.split(",") if part.strip(" ")]
    if not parts or not all(_DIGITS.fullmatch(part) for part in parts):
        raise Problem(422, "invalid-shape", "shape must be ASCII decimal integers", expected="e.g. 1,16,21,60,104",
                      received=values)
    shape = tuple(int(part) for part in parts)
    check(shape)
    return shape


def _raw_dtype(dtype: str | None) -> np.dtype:
    if dtype not in WIRE_DTYPES:
        raise Problem(422, "invalid-dtype", f"unsupported dtype {dtype!r}", expected=list(WIRE_DTYPES),
                      received=dtype)
    return WIRE_DTYPES[dtype]


def parse_raw(body: bytes, shape: tuple[int, ...] | None, dtype: str | None, *,
              check: ShapeCheck = check_shape) -> np.ndarray:
    """Raw little-endian bytes, laid out C-order, described by ``shape`` and ``dtype``. ``check``
    validates the shape before anything is allocated (latents by default; frames for encode)."""
    if shape is None:
        raise Problem(422, "missing-shape", "raw bodies need a 'shape' query parameter",
                      expected="shape=B,C,T,H,W", received=None)
    check(shape)
    wire = _raw_dtype(dtype)
    expected = math.prod(shape) * wire.itemsize
    if len(body) != expected:
        raise Problem(
            422,
            "body-length-mismatch",
            f"body has {len(body)} bytes; shape {list(shape)} x {dtype} needs {expected}",
            expected=expected,
            received=len(body),
        )
    return np.frombuffer(body, dtype=wire).reshape(shape)


_NPY_DTYPES = {np.dtype("<f4"): "float32", np.dtype("<f2"): "float16", np.dtype(">f4"): "float32",
               np.dtype(">f2"): "float16"}


def parse_npy(body: bytes, *, check: ShapeCheck = check_shape) -> np.ndarray:
    """``.npy`` bytes. ``allow_pickle=False``: object arrays would run code from the client."""
    try:
        array = np.load(io.BytesIO(body), allow_pickle=False)
    except Exception as exc:  # numpy raises several types for a malformed header
        raise Problem(422, "invalid-npy", f"not a readable .npy body: {exc}", expected="numpy .npy v1-3",
                      received=f"{len(body)} bytes") from None
    if not isinstance(array, np.ndarray):
        raise Problem(422, "invalid-npy", "expected one array", expected=".npy", received=type(array).__name__)
    if array.dtype not in _NPY_DTYPES:
        raise Problem(422, "invalid-dtype", f"unsupported dtype {array.dtype}", expected=["float32", "float16"],
                      received=str(array.dtype))
    check(array.shape)
    return array


def _safetensors_problem(body: bytes, detail: str) -> Problem:
    return Problem(422, "invalid-safetensors", detail, expected="safetensors with one F32/F16/BF16 tensor",
                   received=f"{len(body)} bytes")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _safetensors_header(body: bytes) -> tuple[dict, int]:
    """The JSON header (a dict) and its length; 422 for anything malformed."""
    if len(body) < 8:
        raise _safetensors_problem(body, "body shorter than the 8-byte header length")
    (header_len,) = struct.unpack("<Q", body[:8])
    if header_len > min(_SAFETENSORS_MAX_HEADER, len(body) - 8):
        raise _safetensors_problem(body, f"header length {header_len} is out of range")
    try:
        header = json.loads(body[8 : 8 + header_len])
    except (ValueError, RecursionError):  # RecursionError: deeply nested arrays or objects
        raise _safetensors_problem(body, "header is not JSON (or is nested too deeply)") from None
    if not isinstance(header, dict):
        raise _safetensors_problem(body, "header is not a JSON object")
    return header, header_len


def parse_safetensors(body: bytes, *, check: ShapeCheck = check_shape) -> np.ndarray:
    """A safetensors file with exactly one tensor (any name). Parsed by hand so that bfloat16
    works without torch and so every malformed header gets a precise 422."""
    header, header_len = _safetensors_header(body)
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    if len(tensors) != 1:
        raise _safetensors_problem(body, f"expected exactly one tensor, found {len(tensors)}")
    (info,) = tensors.values()
    fields = info if isinstance(info, dict) else {}
    dtype_name = _SAFETENSORS_DTYPES.get(fields.get("dtype"))  # type: ignore[arg-type]
    if dtype_name is None:
        raise Problem(422, "invalid-dtype", "unsupported safetensors tensor", expected=list(_SAFETENSORS_DTYPES),
                      received=_jsonable_info(info))
    shape, offsets = fields.get("shape"), fields.get("data_offsets")
    if not isinstance(shape, list) or not all(_is_int(s) for s in shape):
        raise _safetensors_problem(body, "tensor shape must be a list of integers")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(o) for o in offsets):
        raise _safetensors_problem(body, "data_offsets must be two integers")
    check(tuple(shape))
    start, end = offsets
    data = body[8 + header_len :]
    if not 0 <= start <= end <= len(data):
        raise _safetensors_problem(body, f"data offsets {[start, end]} outside the {len(data)}-byte buffer")
    return parse_raw(data[start:end], tuple(shape), dtype_name, check=check)


def _jsonable_info(info) -> str:
    return json.dumps(info)[:200] if isinstance(info, (dict, list)) else repr(info)[:200]


def parse_latents(
    body: bytes, content_type: str, shape: tuple[int, ...] | None, dtype: str | None, limits: Limits
) -> tuple[np.ndarray, bool]:
    """Body -> ``(latents (B, C, T, H, W) float32, had_batch_dim)``; raises Problem on bad input.

    Values are not checked here: NaN/Inf are refused by :func:`check_finite` once scaling and
    denormalizing are applied (finite inputs can overflow there)."""
    given = check_content_type(content_type)
    if given == NPY_CONTENT_TYPE:
        array = parse_npy(body)
    elif given == SAFETENSORS_CONTENT_TYPE:
        array = parse_safetensors(body)
    else:
        array = parse_raw(body, shape, dtype)
    return check_limits(array, limits)


def check_limits(array: np.ndarray, limits: Limits) -> tuple[np.ndarray, bool]:
    """Channels and the configured size limits; returns float32 ``(B, C, T, H, W)`` and whether
    the input had the batch dimension."""
    check_shape(array.shape)
    batched = array.ndim == 5
    latents = array if batched else array[None]
    b, c, t, h, w = latents.shape
    if c != limits.channels:
        raise Problem(422, "invalid-channels", f"latents need {limits.channels} channels, got {c}",
                      expected=limits.channels, received=c)
    checks = (
        ("batch", b, limits.max_batch, "too-large-batch"),
        ("frames", limits.output_frames(t), limits.max_frames, "too-many-frames"),
        ("height", limits.spatial_scale * h, limits.max_height, "too-large-height"),
        ("width", limits.spatial_scale * w, limits.max_width, "too-large-width"),
    )
    for name, value, limit, slug in checks:
        if value > limit:
            raise Problem(422, slug, f"output {name} {value} is over the limit {limit}",
                          expected=f"{name} <= {limit}", received=value)
    return np.ascontiguousarray(latents, dtype=np.float32), batched


def check_finite(latents: np.ndarray, *, transformed: bool = False) -> None:
    """422 unless every value is finite. ``transformed``: scaling or denormalizing was applied,
    which can overflow float32 from finite inputs, so the detail says where the values came from."""
    finite = np.isfinite(latents)
    if not finite.all():
        bad = int(latents.size - np.count_nonzero(finite))
        where = " after scaling/denormalizing" if transformed else ""
        raise Problem(422, "non-finite", f"latents contain {bad} NaN/Inf values{where}",
                      expected="finite values", received=f"{bad} non-finite of {latents.size}")


def apply_scaling(latents: np.ndarray, scaling_factor: float | None, shift_factor: float | None) -> np.ndarray:
    """diffusers' remote client convention: ``latents / scaling_factor + shift_factor`` (float32)."""
    if scaling_factor is not None:
        latents = latents / np.float32(scaling_factor)
    if shift_factor is not None:
        latents = latents + np.float32(shift_factor)
    return latents


# ------------------------------------------------------------------------------------------
# Encoders. Frames are (F, H, W, 3) uint8 for one video.


def encode_mp4(frames: np.ndarray, *, fps: int, crf: int) -> bytes:
    """H.264 (libx264, yuv420p) in MP4 with the ``moov`` index before the media (faststart), so a
    player or browser starts before the whole file has arrived. H and W are multiples of 8 here,
    so even (yuv420p needs it).

    FFmpeg's faststart moves the index in a second pass that reopens the output by name, which a
    BytesIO does not have: the video goes through a private temporary file."""
    with tempfile.TemporaryDirectory(prefix="vaeserve-mp4-") as folder:
        path = Path(folder) / "video.mp4"
        with av.open(str(path), mode="w", format="mp4", options={"movflags": "+faststart"}) as container:
            stream = container.add_stream("libx264", rate=fps)
            stream.width, stream.height = int(frames.shape[2]), int(frames.shape[1])
            stream.pix_fmt = "yuv420p"
            stream.options = {"crf": str(crf), "preset": "veryfast"}
            for frame in frames:
                for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
        return path.read_bytes()


def mp4_boxes(data: bytes) -> list[str]:
    """The top-level box types of an MP4, in file order (``["ftyp", "moov", "free", "mdat"]``)."""
    boxes, offset = [], 0
    while offset + 8 <= len(data):
        size, box = struct.unpack(">I4s", data[offset : offset + 8])
        if size == 1:  # a 64-bit size follows the type
            (size,) = struct.unpack(">Q", data[offset + 8 : offset + 16])
        boxes.append(box.decode("latin-1"))
        if size < 8:  # 0: the box runs to the end of the file
            break
        offset += size
    return boxes


def decode_mp4(data: bytes) -> np.ndarray:
    """MP4 bytes -> (F, H, W, 3) uint8; used by the CLI round trip and by tests."""
    with av.open(io.BytesIO(data), mode="r") as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def encode_npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def encode_png(frame: np.ndarray) -> bytes:
    """One (H, W, 3) uint8 frame as PNG (8-bit RGB, no filtering); stdlib only."""
    height, width, _ = frame.shape
    rows = np.concatenate([np.zeros((height, 1), np.uint8), frame.reshape(height, width * 3)], axis=1)

    def chunk(tag: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + tag + payload + struct.pack(">I", zlib.crc32(tag + payload))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows.tobytes(), 6))
            + chunk(b"IEND", b""))


# ------------------------------------------------------------------------------------------
# Stream framing: a sequence of messages, each ``u32 little-endian N | N bytes JSON header |
# payload``. The header says how long the payload is (``nbytes``), so a reader never guesses.


def stream_message(header: dict, payload: bytes = b"") -> bytes:
    header = {**header, "nbytes": len(payload)}
    encoded = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<I", len(encoded)) + encoded + payload
