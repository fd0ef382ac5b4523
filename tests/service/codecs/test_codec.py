"""Body parsing and encoders (``service.codec``), without a server: every body format goes
through one shape check, malformed bodies are 422 problems (never an exception numpy or json
raises), and MP4s start with their index."""

from __future__ import annotations

import io
import json
import struct

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy

from tests.helpers.service_helpers import latents, problem_of
from vaeserve.models.families.wan.config import WanVAEConfig
from vaeserve.service.codecs.latents import (
    check_latent_dims,
    check_limits,
    parse_latents,
    scale_latents,
    unscale_latents,
)
from vaeserve.service.codecs.tensors import (
    WIRE_DTYPES,
    check_finite,
    npy_bytes,
    parse_npy,
    parse_safetensors,
    parse_shape,
)
from vaeserve.service.codecs.video import mp4_boxes, mp4_bytes, png_bytes, read_mp4
from vaeserve.service.limits import Limits

LIMITS = Limits(channels=16, max_batch=2, max_frames=9, max_height=64, max_width=64)
RULES = WanVAEConfig(base_dim=8, num_res_blocks=1)  # the shape rules of a video model with 16 latent channels
RAW, NPY, SAFETENSORS = "tensor/binary", "application/x-npy", "application/x-safetensors"


def safetensors_body(shape, nbytes: int, *, dtype: str = "F32", header: bytes | None = None) -> bytes:
    if header is None:
        header = json.dumps({"z": {"dtype": dtype, "shape": shape, "data_offsets": [0, nbytes]}}).encode()
    return struct.pack("<Q", len(header)) + header + b"\0" * nbytes


def parse(body: bytes, media_type: str, shape=None, dtype=None):
    return parse_latents(body, media_type, shape, dtype, LIMITS, RULES)


def latents_shape(values):
    return parse_shape(values, check=check_latent_dims)


def latents_npy(body):
    return parse_npy(body, check=check_latent_dims)


def latents_safetensors(body):
    return parse_safetensors(body, check=check_latent_dims)


# ---- forms that work ----------------------------------------------------------------------------


def test_parse_shape_forms():
    assert parse_shape(["1", "16", "2", "4", "4"], check=check_latent_dims) == (1, 16, 2, 4, 4)  # requests' repeated keys
    assert parse_shape(["1,16,2,4,4"], check=check_latent_dims) == (1, 16, 2, 4, 4)
    assert parse_shape(["[1, 16, 2, 4, 4]"], check=check_latent_dims) == (1, 16, 2, 4, 4)
    assert parse_shape(["16,2,4,4"], check=check_latent_dims) == (16, 2, 4, 4)
    assert parse_shape(None, check=check_latent_dims) is None


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_raw_dtypes_round_trip(dtype):
    x = latents()
    wire = x.astype(WIRE_DTYPES[dtype])
    out, batched = parse(wire.tobytes(), RAW, x.shape, dtype)
    assert batched and out.dtype == np.float32
    assert np.array_equal(out, wire.astype(np.float32))


def test_safetensors_bf16_and_errors():
    x = latents().astype(ml_dtypes.bfloat16)
    header = json.dumps({"z": {"dtype": "BF16", "shape": list(x.shape), "data_offsets": [0, x.nbytes]}}).encode()
    body = struct.pack("<Q", len(header)) + header + x.tobytes()
    assert np.array_equal(parse_safetensors(body, check=check_latent_dims), x)
    two = safetensors.numpy.save({"a": np.zeros(2, np.float32), "b": np.zeros(2, np.float32)})
    assert "exactly one" in problem_of(latents_safetensors, two).detail
    assert problem_of(latents_safetensors, b"\xff" * 16).status == 422
    ints = safetensors.numpy.save({"a": np.zeros(2, np.int32)})
    assert problem_of(latents_safetensors, ints).slug == "invalid-dtype"


def test_npy_refuses_pickles_and_ints():
    buffer = io.BytesIO()
    np.save(buffer, np.array([object()], dtype=object), allow_pickle=True)
    assert problem_of(latents_npy, buffer.getvalue()).slug == "invalid-npy"
    assert problem_of(latents_npy, npy_bytes(np.zeros(3, np.int64))).received == "int64"
    big_endian = latents().astype(">f4")
    out, _ = parse(npy_bytes(big_endian), NPY)
    assert np.array_equal(out, latents())


def test_limits_are_on_output_sizes():
    ok = check_limits(np.zeros((2, 16, 3, 8, 8), np.float32), LIMITS, RULES)  # 9 frames, 64x64
    assert ok.shape == (2, 16, 3, 8, 8)
    assert problem_of(check_limits, np.zeros((1, 16, 4, 8, 8), np.float32), LIMITS, RULES).received == 13


@pytest.mark.parametrize("media_type", ["", "application/x-www-form-urlencoded", "application/octet-stream"])
def test_a_generic_content_type_is_read_by_the_body_bytes(media_type):
    # curl --data-binary @z.npy sends application/x-www-form-urlencoded; a client may send none.
    x = latents()
    assert np.array_equal(parse(npy_bytes(x), media_type)[0], x)
    assert np.array_equal(parse(safetensors.numpy.save({"z": x}), media_type)[0], x)
    assert np.array_equal(parse(x.tobytes(), media_type, x.shape, "float32")[0], x)  # a shape: raw bytes
    gif = problem_of(parse, b"GIF89a" + bytes(64), media_type)
    assert (gif.status, gif.received) == (415, "a GIF image") and "application/x-npy" in gif.detail
    assert problem_of(parse, x.tobytes(), media_type).slug == "missing-shape"  # unrecognized bytes: raw


def test_a_content_type_of_no_tensor_format_is_a_415_that_names_the_formats():
    problem = problem_of(parse, npy_bytes(latents()), "text/plain")
    assert (problem.status, problem.received) == (415, "text/plain")
    assert "-H 'Content-Type: application/x-npy'" in problem.detail and "application/x-npy" in problem.expected


def test_channels_last_latents_get_a_hint_naming_the_layout():
    channels_last = problem_of(parse, npy_bytes(latents().transpose(0, 2, 3, 4, 1)), NPY)  # (1, 2, 4, 4, 16)
    assert (channels_last.slug, channels_last.expected, channels_last.received) == ("invalid-channels", 16, 2)
    assert "channels-last (B, T, H, W, C)" in channels_last.detail and "(B, C, T, H, W)" in channels_last.detail
    other = problem_of(parse, npy_bytes(latents((1, 8, 2, 4, 4))), NPY)  # not a layout mistake
    assert "channels-last" not in other.detail and "NCTHW" in other.detail


# ---- the hostile run's bodies: 422 at parse time, the same for every format ---------------------

ZERO_SIZED = [(1, 16, 0, 4, 4), (1, 16, 2, 0, 4), (1, 16, 2, 4, 0), (0, 16, 2, 4, 4)]


@pytest.mark.parametrize("shape", ZERO_SIZED, ids=["T0", "H0", "W0", "B0"])
@pytest.mark.parametrize("media_type", [RAW, NPY, SAFETENSORS])
def test_zero_sizes_are_refused_in_every_format(shape, media_type):
    # npy and safetensors used to pass these on (B=0 answered 200 with an empty array; T/H/W=0
    # reached the device and failed there as a 500).
    body = {RAW: b"", NPY: npy_bytes(np.zeros(shape, np.float32)),
            SAFETENSORS: safetensors_body(list(shape), 0)}[media_type]
    problem = problem_of(parse, body, media_type, shape, "float32")
    assert (problem.status, problem.slug, problem.received) == (422, "invalid-shape", list(shape))


@pytest.mark.parametrize("media_type", [RAW, SAFETENSORS])
def test_more_than_64_dims_is_a_422_not_a_numpy_error(media_type):
    shape = (1,) * 65
    body = {RAW: b"\0" * 4, SAFETENSORS: safetensors_body(list(shape), 4)}[media_type]
    problem = problem_of(parse, body, media_type, shape, "float32")
    assert (problem.status, problem.slug, problem.received) == (422, "invalid-ndim", "65 dimensions")


def test_safetensors_negative_sizes_with_a_positive_product():
    body = safetensors_body([-1, 16, -2, 4, 4], 2048)  # -1 * 16 * -2 * 4 * 4 * 4 bytes = 2048
    problem = problem_of(parse, body, SAFETENSORS)
    assert (problem.slug, problem.received) == ("invalid-shape", [-1, 16, -2, 4, 4])


def test_safetensors_deeply_nested_header():
    problem = problem_of(parse, safetensors_body(None, 0, header=b"[" * 100_000 + b"]" * 100_000), SAFETENSORS)
    assert (problem.status, problem.slug) == (422, "invalid-safetensors")


@pytest.mark.parametrize("shape", [[1.5, 16, 2, 4, 4], [True, 16, 2, 4, 4], ["1", 16, 2, 4, 4], "12"])
def test_safetensors_shape_must_be_integers(shape):
    assert problem_of(parse, safetensors_body(shape, 2048), SAFETENSORS).slug == "invalid-safetensors"


@pytest.mark.parametrize("text", ["1,1_6,2,4,4", "1,\uff11\uff16,2,4,4", "1,+16,2,4,4", "1,16.0,2,4,4", "1,16,x"])
def test_query_shape_takes_ascii_digits_only(text):
    # int() accepts "1_6", full-width digits and a sign: the query must not.
    problem = problem_of(latents_shape, [text])
    assert (problem.status, problem.slug) == (422, "invalid-shape")


def test_query_shape_checks_dims_and_sizes():
    assert problem_of(latents_shape, ["1,16,0,4,4"]).received == [1, 16, 0, 4, 4]
    assert problem_of(latents_shape, ["4,4"]).slug == "invalid-ndim"
    assert problem_of(latents_shape, [",".join(["1"] * 100)]).received == "100 dimensions"


def test_scaling_follows_diffusers_remote_convention():
    """Decode input ``z / scaling_factor + shift_factor``; encode output ``(z − shift_factor) ·
    scaling_factor``, its inverse. The numbers tell every confusion apart: ``*`` for ``/`` gives
    1.25, ``-`` for ``+`` 3.75, shifting before scaling 4.5."""
    z = np.array([2.0, -1.0], np.float32)
    for got, want in [(unscale_latents(z, 0.5, 0.25), [4.25, -1.75]), (unscale_latents(z, 0.5, None), [4.0, -2.0]),
                      (unscale_latents(z, None, 0.25), [2.25, -0.75]), (unscale_latents(z, None, None), [2.0, -1.0]),
                      (scale_latents(np.array([4.25, -1.75], np.float32), 0.5, 0.25), [2.0, -1.0]),
                      (scale_latents(z, 0.5, None), [1.0, -0.5]), (scale_latents(z, None, 0.25), [1.75, -1.25])]:
        assert got.dtype == np.float32 and got.tolist() == want
    x = latents()
    assert np.abs(scale_latents(unscale_latents(x, 0.476986, 0.1), 0.476986, 0.1) - x).max() <= 1e-6


def test_finiteness_is_checked_where_asked():
    x = latents()
    check_finite(x, "latents")
    with np.errstate(over="ignore"):
        scaled = unscale_latents(x, None, 1e39)  # finite input and factor, inf in float32
    problem = problem_of(check_finite, scaled, "latents", where=" after scaling")
    assert problem.slug == "non-finite" and problem.received == f"{x.size} non-finite of {x.size}"
    assert problem.detail == f"latents contain {x.size} NaN/Inf values after scaling"


# ---- encoders -----------------------------------------------------------------------------------


def test_png_encoder_matches_pil():
    from PIL import Image

    frame = np.random.default_rng(0).integers(0, 256, (24, 40, 3), dtype=np.uint8)
    image = Image.open(io.BytesIO(png_bytes(frame)))
    assert image.size == (40, 24) and np.array_equal(np.asarray(image), frame)


def test_mp4_has_its_index_before_the_media():
    frames = np.random.default_rng(0).integers(0, 256, (5, 32, 48, 3), dtype=np.uint8)
    video = mp4_bytes(frames, fps=16, crf=18)
    boxes = mp4_boxes(video)
    assert boxes[0] == "ftyp" and boxes.index("moov") < boxes.index("mdat"), boxes
    assert read_mp4(video).shape == frames.shape
