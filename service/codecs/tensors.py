"""Tensor bodies: raw little-endian bytes, ``.npy`` and safetensors, parsed without trusting them.

Shared by the latents a decode takes and the frames an encode takes: every parser checks the
shape it is about to read with the caller's ``check`` (latents' or frames' dimensions) before
anything is allocated, and refuses what it cannot read safely (no pickles, bounded headers).
"""

from __future__ import annotations

import io
import json
import math
import re
import struct
from collections.abc import Callable

import ml_dtypes
import numpy as np

from ..problem import Problem
from .sniff import NPY_MAGIC, sniff

RAW_CONTENT_TYPES = ("application/octet-stream", "tensor/binary")
NPY_CONTENT_TYPE = "application/x-npy"
SAFETENSORS_CONTENT_TYPE = "application/x-safetensors"
TENSOR_CONTENT_TYPES = (*RAW_CONTENT_TYPES, NPY_CONTENT_TYPE, SAFETENSORS_CONTENT_TYPE)
# Content types that say nothing about the body (none at all; curl's default for --data-binary):
# the body is raw when the query gives its shape, else its first bytes say what it is (``sniff``).
GENERIC_CONTENT_TYPES = ("", "application/octet-stream", "binary/octet-stream", "application/x-www-form-urlencoded")

# Wire dtypes: name -> little-endian numpy dtype. bfloat16 comes from ml_dtypes (a JAX dependency).
WIRE_DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype("<f4"),
    "float16": np.dtype("<f2"),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
}
_SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
_SAFETENSORS_MAX_HEADER = 1 << 20  # the header is JSON metadata; a megabyte is already absurd
ShapeCheck = Callable[[tuple[int, ...]], None]  # raises Problem for a shape the route cannot take


def media_type(content_type: str | None) -> str:
    """``"Application/X-NPY; charset=x"`` -> ``"application/x-npy"``."""
    return (content_type or "").split(";")[0].strip().lower()


def check_dims(shape: tuple[int, ...], *, what: str, layouts: list[str], example: str,
               ranks: tuple[int, ...] = (4, 5)) -> None:
    """The one dimension check of every tensor body, before any reshape or allocation: one of
    ``ranks`` dims (``layouts``), every size at least 1 (numpy would accept zeros, and negative pairs
    multiply to a positive byte count). ``what`` names the tensor in the detail."""
    # A hostile shape can have thousands of entries: echo short ones, count long ones.
    received = list(shape) if len(shape) <= 8 else f"{len(shape)} dimensions"
    if len(shape) not in ranks:
        allowed = " or ".join(map(str, ranks))
        raise Problem(422, "invalid-ndim", f"{what} must have {allowed} dims, got {len(shape)}", expected=layouts,
                      received=received)
    if min(shape) < 1:
        raise Problem(422, "invalid-shape", f"every {what} size must be at least 1",
                      expected=f"positive sizes, e.g. {example}", received=received)


_DIGITS = re.compile(r"[0-9]{1,18}")  # ASCII only: int() would also take "1_6" and full-width digits


def parse_shape(values: list[str] | None, *, check: ShapeCheck) -> tuple[int, ...] | None:
    """Shape from the query: repeated (``shape=1&shape=16``, what ``requests`` sends for a list),
    comma separated (``shape=1,16,2,4,4``) or JSON (``shape=[1,16,2,4,4]``), checked by ``check``."""
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


# The slug of a 422 for each way a shape misfits the model (``models.shapes.ShapeError.what``).
SHAPE_SLUGS = {"ndim": "invalid-ndim", "channels": "invalid-channels", "sizes": "invalid-shape",
               "frames": "invalid-frame-count", "height": "invalid-height", "width": "invalid-width"}


def _raw_dtype(dtype: str | None) -> np.dtype:
    if dtype is None:
        raise Problem(422, "missing-dtype", "dtype missing: raw bodies need a 'dtype' query parameter",
                      expected=[f"dtype={name}" for name in WIRE_DTYPES], received=None)
    if dtype not in WIRE_DTYPES:
        raise Problem(422, "invalid-dtype", f"unsupported dtype {dtype!r}", expected=list(WIRE_DTYPES),
                      received=dtype)
    return WIRE_DTYPES[dtype]


def parse_raw(body: bytes, shape: tuple[int, ...] | None, dtype: str | None, *,
              check: ShapeCheck) -> np.ndarray:
    """Raw little-endian bytes, laid out C-order, described by ``shape`` and ``dtype``. ``check``
    validates the shape before anything is allocated (latents' or frames' dims)."""
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


def _npy_problem(body: bytes, detail: str) -> Problem:
    return Problem(422, "invalid-npy", detail, expected="a .npy file (version 1-3, starting with \\x93NUMPY)",
                   received=f"{len(body)} bytes")


def parse_npy(body: bytes, *, check: ShapeCheck) -> np.ndarray:
    """``.npy`` bytes, read from their header before anything is allocated: ``check`` sees the
    shape first, the data is then a view of ``body``. No pickles: object arrays are refused."""
    if not body.startswith(NPY_MAGIC):
        raise _npy_problem(body, f"the body is not a .npy file: it is {sniff(body).name}")
    stream = io.BytesIO(body)
    try:
        major, _ = np.lib.format.read_magic(stream)
        read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        shape, fortran_order, dtype = read_header(stream)
    except Exception as exc:  # numpy raises ValueError and others for a malformed header
        raise _npy_problem(body, f"the .npy header does not parse: {exc}") from None
    if dtype.hasobject:
        raise _npy_problem(body, "the .npy holds Python objects (pickled data), which are never loaded")
    if dtype not in _NPY_DTYPES:
        raise Problem(422, "invalid-dtype", f"unsupported dtype {dtype}", expected=["float32", "float16"],
                      received=str(dtype))
    check(shape)
    data = memoryview(body)[stream.tell():]
    expected = math.prod(shape) * dtype.itemsize
    if len(data) != expected:
        raise Problem(422, "body-length-mismatch", f"the .npy data has {len(data)} bytes; its header's shape "
                      f"{list(shape)} x {dtype} needs {expected}", expected=expected, received=len(data))
    array = np.frombuffer(data, dtype=dtype)
    return array.reshape(shape[::-1]).transpose() if fortran_order else array.reshape(shape)


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


def safetensors_names(body: bytes) -> list[str]:
    """The tensor names a safetensors body's header lists (422 for a malformed header)."""
    header, _ = _safetensors_header(body)
    return [name for name in header if name != "__metadata__"]


def parse_safetensors(body: bytes, *, check: ShapeCheck, name: str | None = None) -> np.ndarray:
    """A safetensors file's tensor ``name`` (None: its one tensor, by any name). Parsed by hand so
    that bfloat16 works without torch and so every malformed header gets a precise 422."""
    header, header_len = _safetensors_header(body)
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    if name is not None:
        if name not in tensors:
            raise Problem(422, "missing-tensor", f"the safetensors body has no tensor named {name!r}",
                          expected=name, received=sorted(tensors)[:8])
        tensors = {name: tensors[name]}
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


def check_finite(array: np.ndarray, what: str, *, where: str = "") -> None:
    """422 unless every value of ``array`` (``what``: "latents", "frames") is finite; ``where``
    says where the values came from when arithmetic made them (finite inputs can overflow)."""
    finite = np.isfinite(array)
    if not finite.all():
        bad = int(array.size - np.count_nonzero(finite))
        raise Problem(422, "non-finite", f"{what} contain {bad} NaN/Inf values{where}", expected="finite values",
                      received=f"{bad} non-finite of {array.size}")


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()
