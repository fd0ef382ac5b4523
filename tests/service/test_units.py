"""The service's pure parts without a server: codecs, batch buckets, settings, the offline CLI."""

from __future__ import annotations

import io
import json
import struct

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy

from service import codec
from service.client import read_stream
from service.errors import Problem
from service.runner import batch_buckets, bucket_for, pad_batch
from service.settings import Settings, parse_latent_shape

from service_helpers import latents, make_test_model

LIMITS = codec.Limits(channels=16, max_batch=2, max_frames=9, max_height=64, max_width=64)


def problem_of(fn, *args) -> Problem:
    with pytest.raises(Problem) as info:
        fn(*args)
    return info.value


def test_parse_shape_forms():
    assert codec.parse_shape(["1", "16", "2"]) == (1, 16, 2)  # requests' repeated keys
    assert codec.parse_shape(["1,16,2"]) == (1, 16, 2)
    assert codec.parse_shape(["[1, 16, 2]"]) == (1, 16, 2)
    assert codec.parse_shape(None) is None
    assert problem_of(codec.parse_shape, ["1,x"]).status == 422
    assert problem_of(codec.parse_shape, ["0,16"]).received == [0, 16]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_raw_dtypes_round_trip(dtype):
    x = latents()
    wire = x.astype(codec.WIRE_DTYPES[dtype])
    out, batched = codec.parse_latents(wire.tobytes(), "tensor/binary", x.shape, dtype, LIMITS)
    assert batched and out.dtype == np.float32
    assert np.array_equal(out, wire.astype(np.float32))


def test_safetensors_bf16_and_errors():
    x = latents().astype(ml_dtypes.bfloat16)
    header = json.dumps({"z": {"dtype": "BF16", "shape": list(x.shape), "data_offsets": [0, x.nbytes]}}).encode()
    body = struct.pack("<Q", len(header)) + header + x.tobytes()
    assert np.array_equal(codec.parse_safetensors(body), x)
    two = safetensors.numpy.save({"a": np.zeros(2, np.float32), "b": np.zeros(2, np.float32)})
    assert "exactly one" in problem_of(codec.parse_safetensors, two).detail
    assert problem_of(codec.parse_safetensors, b"\xff" * 16).status == 422
    ints = safetensors.numpy.save({"a": np.zeros(2, np.int32)})
    assert problem_of(codec.parse_safetensors, ints).slug == "invalid-dtype"


def test_npy_refuses_pickles_and_ints():
    buffer = io.BytesIO()
    np.save(buffer, np.array([object()], dtype=object), allow_pickle=True)
    assert problem_of(codec.parse_npy, buffer.getvalue()).slug == "invalid-npy"
    assert problem_of(codec.parse_npy, codec.encode_npy(np.zeros(3, np.int64))).received == "int64"
    big_endian = latents().astype(">f4")
    out, _ = codec.validate_latents(codec.parse_npy(codec.encode_npy(big_endian)), LIMITS)
    assert np.array_equal(out, latents())


def test_limits_are_on_output_sizes():
    ok, _ = codec.validate_latents(np.zeros((2, 16, 3, 8, 8), np.float32), LIMITS)  # 9 frames, 64x64
    assert ok.shape == (2, 16, 3, 8, 8)
    assert problem_of(codec.validate_latents, np.zeros((1, 16, 4, 8, 8), np.float32), LIMITS).received == 13


def test_png_encoder_matches_pil():
    from PIL import Image

    frame = np.random.default_rng(0).integers(0, 256, (24, 40, 3), dtype=np.uint8)
    image = Image.open(io.BytesIO(codec.encode_png(frame)))
    assert image.size == (40, 24) and np.array_equal(np.asarray(image), frame)


def test_stream_framing_survives_any_chunking():
    payloads = [bytes(range(7)), b"", b"\x01" * 100]
    stream = b"".join(codec.stream_message({"type": "frames", "i": i}, p) for i, p in enumerate(payloads))
    for size in (1, 3, 64, len(stream)):
        parts = iter([stream[i : i + size] for i in range(0, len(stream), size)])
        got = list(read_stream(parts))
        assert [p for _, p in got] == payloads and [h["i"] for h, _ in got] == [0, 1, 2]


def test_batch_buckets():
    assert batch_buckets(1, 1) == [1]
    assert batch_buckets(4, 1) == [1, 2, 4]
    assert batch_buckets(6, 1) == [1, 2, 4, 6]
    assert batch_buckets(4, 2) == [2, 4]
    assert batch_buckets(3, 4) == [4]
    assert bucket_for(3, [1, 2, 4]) == 4 and bucket_for(1, [2, 4]) == 2
    with pytest.raises(ValueError):
        bucket_for(5, [1, 2, 4])
    padded = pad_batch(np.ones((3, 2), np.float32), 4)
    assert padded.shape == (4, 2) and padded[3].sum() == 0 and padded[:3].sum() == 6


def test_settings_from_env_and_overrides(monkeypatch):
    monkeypatch.setenv("VAESERVE_MAX_QUEUE", "7")
    monkeypatch.setenv("VAESERVE_WARMUP", '["16x2x4x4", "16,1,8,8"]')
    monkeypatch.setenv("VAESERVE_API_KEY", "zq-secret-91")
    s = Settings(max_batch=3)
    assert s.max_queue == 7 and s.max_batch == 3
    assert s.warmup == [(16, 2, 4, 4), (16, 1, 8, 8)]
    assert s.api_key.get_secret_value() == "zq-secret-91" and "zq-secret-91" not in repr(s)
    assert Settings(warmup=["16x1x2x2"]).warmup == [(16, 1, 2, 2)]
    with pytest.raises(ValueError):
        parse_latent_shape("16x2x4")


def test_offline_decode_cli(tmp_path, tiny_model_dir, tiny_vae, capsys):
    from service.cli import main

    x = latents((1, 16, 3, 4, 4), seed=30)
    np.save(tmp_path / "z.npy", x)
    safetensors.numpy.save_file({"latents": x[0]}, tmp_path / "z.safetensors")
    assert main(["decode", str(tmp_path / "z.npy"), "-o", str(tmp_path / "f.npy"), "--model", str(tiny_model_dir),
                 "--tp", "2"]) == 0
    frames = np.load(tmp_path / "f.npy", allow_pickle=False)
    direct = np.asarray(tiny_vae.decode(x, output="uint8"))
    assert frames.shape == direct.shape == (1, 9, 32, 32, 3)
    assert np.abs(frames.astype(int) - direct).max() <= 1
    assert main(["decode", str(tmp_path / "z.safetensors"), "-o", str(tmp_path / "v.mp4"),
                 "--model", str(tiny_model_dir)]) == 0
    video = codec.decode_mp4((tmp_path / "v.mp4").read_bytes())
    assert video.shape == (9, 32, 32, 3)
    assert "wrote" in capsys.readouterr().out


def test_make_test_model_is_tiny():
    assert make_test_model().metadata["parameters"] < 1_000_000
