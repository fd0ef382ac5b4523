"""Encode bodies without a server (``service.codecs.frames``): format recognition, the pixel
conversion against diffusers' own image processor, shape rules with the nearest valid values,
limits. (Hostile and odd bodies: test_encode_inputs.py.)"""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
from PIL import Image

from tests.helpers.service_helpers import problem_of
from vaeserve import models
from vaeserve.service.codecs.frames import body_format, check_frames_content_type, check_shape, parse_frames
from vaeserve.service.codecs.latents import scale_latents, serialize_latents
from vaeserve.service.limits import Limits

CONFIG = models.WanVAEConfig(base_dim=8, num_res_blocks=1)
LIMITS = Limits(channels=16, max_batch=2, max_frames=9, max_height=64, max_width=64)


def parse_image(body: bytes, limits: Limits) -> np.ndarray:
    return parse_frames(body, "", None, None, CONFIG, limits)


def parse_tensor(body: bytes, shape: tuple[int, ...] | None, dtype: str | None) -> np.ndarray:
    return parse_frames(body, "tensor/binary", shape, dtype, CONFIG, LIMITS)


def image_bytes(rgb: np.ndarray, fmt: str = "PNG", mode: str | None = None) -> bytes:
    buffer = io.BytesIO()
    image = Image.fromarray(rgb)
    (image.convert(mode) if mode else image).save(buffer, format=fmt)
    return buffer.getvalue()


def test_pixels_convert_exactly_as_diffusers_image_processor_does():
    torch = pytest.importorskip("torch")
    VaeImageProcessor = pytest.importorskip("diffusers.image_processor").VaeImageProcessor

    rgb = np.random.default_rng(0).integers(0, 256, (16, 24, 3), dtype=np.uint8)
    theirs = VaeImageProcessor().preprocess(Image.fromarray(rgb)).to(torch.float32).numpy()  # (1, 3, H, W)
    ours = parse_image(image_bytes(rgb), LIMITS)  # (1, 3, 1, H, W)
    assert ours.dtype == np.float32 and np.array_equal(ours[:, :, 0], theirs)


@pytest.mark.parametrize(
    "media_type,body,has_shape,expected",
    [("", b"\x89PNG\r\n\x1a\n....", False, "png"), ("", b"\xff\xd8\xff\xe0..", False, "jpeg"),
     ("application/octet-stream", b"\0\0\0\x20ftypisom", False, "mp4"), ("", b"\x93NUMPY\x01\x00", False, "npy"),
     ("application/x-www-form-urlencoded", b"\x89PNG\r\n\x1a\n", False, "png"),  # curl --data-binary
     ("", b"\x89PNG\r\n\x1a\n", True, "raw"),  # shape given: a raw tensor, whatever its bytes
     ("application/octet-stream", b"\0" * 8, False, "raw"), ("tensor/binary", b"\x89PNG\r\n\x1a\n", False, "raw"),
     ("image/jpeg", b"", False, "jpeg"), ("video/mp4", b"", False, "mp4"),
     ("application/x-safetensors", b"", False, "safetensors")],
)
def test_body_format_from_content_type_shape_or_magic_bytes(media_type, body, has_shape, expected):
    assert body_format(media_type, body, has_shape) == expected


def test_content_types_outside_the_route_are_415():
    assert check_frames_content_type(None) == "" and check_frames_content_type("Image/PNG; x=1") == "image/png"
    assert problem_of(check_frames_content_type, "text/plain").status == 415


def test_palette_grey_and_rgba_images_become_rgb_and_16_bit_is_refused():
    rgb = np.random.default_rng(1).integers(0, 256, (8, 16, 3), dtype=np.uint8)
    grey = parse_image(image_bytes(rgb, mode="L"), LIMITS)
    assert grey.shape == (1, 3, 1, 8, 16) and np.array_equal(grey[0, 0], grey[0, 2])
    rgba = parse_image(image_bytes(rgb, mode="RGBA"), LIMITS)
    assert np.array_equal(rgba, parse_image(image_bytes(rgb), LIMITS))  # alpha dropped
    deep = Image.fromarray(rgb[..., 0].astype(np.uint16) * 257)
    buffer = io.BytesIO()
    deep.save(buffer, format="PNG")
    assert problem_of(parse_image, buffer.getvalue(), LIMITS).slug == "unsupported-bit-depth"


def test_sizes_are_checked_from_the_header_before_pixels_are_decoded():
    wide = image_bytes(np.zeros((8, 72, 3), np.uint8))
    problem = problem_of(parse_image, wide, LIMITS)
    assert (problem.slug, problem.expected, problem.received) == ("too-large-width", "width <= 64", 72)


@pytest.mark.parametrize(
    "shape,slug,expected",
    [((1, 3, 6, 16, 16), "invalid-frame-count", [5, 9]), ((1, 3, 5, 16, 30), "invalid-width", [24, 32]),
     ((1, 3, 5, 4, 16), "invalid-height", [8]), ((3, 3, 1, 16, 16), "too-large-batch", "batch <= 2"),
     ((1, 1, 1, 16, 16), "invalid-channels", 3)],
)
def test_shape_rules_name_the_nearest_valid_values(shape, slug, expected):
    problem = problem_of(check_shape, shape, CONFIG, LIMITS)
    assert (problem.slug, problem.expected) == (slug, expected)


def with_size(body: bytes, width: int, height: int) -> bytes:
    """``body`` (a PNG or a JPEG) with its header claiming ``width`` x ``height``."""
    if body.startswith(b"\x89PNG"):
        return body[:16] + struct.pack(">II", width, height) + body[24:]
    sof = body.index(b"\xff\xc0")  # baseline start of frame: length, precision, height, width
    return body[:sof + 5] + struct.pack(">HH", height, width) + body[sof + 9:]


@pytest.mark.parametrize("fmt,size", [("JPEG", 65535), ("PNG", 2**32 - 1)])
def test_a_header_claiming_a_huge_image_gets_the_limit_not_sizes_beyond_it(fmt, size):
    # It was answered "invalid-height", nearest valid 65528 and 65536: fifty times the limit.
    body = with_size(image_bytes(np.zeros((8, 8, 3), np.uint8), fmt), size, size)
    problem = problem_of(parse_image, body, LIMITS)
    assert (problem.slug, problem.expected, problem.received) == ("too-large-height", "height <= 64", size)


def test_the_nearest_valid_values_offered_are_within_the_limits():
    limits = Limits(channels=16, max_batch=2, max_frames=11, max_height=60, max_width=64)
    problem = problem_of(check_shape, (1, 3, 10, 16, 16), CONFIG, limits)
    assert (problem.slug, problem.expected) == ("invalid-frame-count", [9])  # 13 is over max_frames
    assert "[9]" in problem.detail and "13" not in problem.detail
    assert problem_of(check_shape, (1, 3, 5, 59, 16), CONFIG, limits).expected == [56]  # 64 is over max_height
    assert problem_of(check_shape, (1, 3, 5, 16, 59), CONFIG, limits).expected == [56, 64]  # control: both within


def test_tensor_bodies_four_and_five_dims_and_dtypes():
    x = np.random.default_rng(2).uniform(-1, 1, (2, 3, 8, 8)).astype(np.float32)
    raw = parse_tensor(x.astype(np.float16).tobytes(), x.shape, "float16")
    assert raw.shape == (2, 3, 1, 8, 8) and raw.dtype == np.float32
    assert np.array_equal(raw[:, :, 0], x.astype(np.float16).astype(np.float32))
    assert problem_of(parse_tensor, b"", (1, 3, 8), "float32").slug == "invalid-ndim"
    assert problem_of(parse_tensor, b"", None, None).slug == "missing-shape"


def test_latents_out_scaling_and_formats():
    z = np.random.default_rng(3).standard_normal((1, 16, 2, 2, 3)).astype(np.float32)
    assert np.allclose(scale_latents(z, 0.5, 0.25), (z - 0.25) * 0.5)
    body, headers = serialize_latents(z, "pt")
    assert headers == {"shape": "[1, 16, 2, 2, 3]", "dtype": "float32"}
    assert np.array_equal(np.frombuffer(body, "<f4").reshape(z.shape), z)
    assert np.array_equal(np.load(io.BytesIO(serialize_latents(z, "npy")[0]), allow_pickle=False), z)
