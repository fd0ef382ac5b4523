"""The service's pure parts without a server: stream framing, batch buckets, settings, the offline CLI."""

from __future__ import annotations

import numpy as np
import pytest
import safetensors.numpy

from service.client import read_stream
from service.codecs.stream import stream_message
from service.codecs.video import read_mp4
from service.engine.batches import batch_buckets, bucket_for, pad_batch
from service.settings import Settings, parse_latent_shape
from tests.helpers.frames import assert_uint8_frames_match
from tests.helpers.service_helpers import latents


def test_stream_framing_survives_any_chunking():
    payloads = [bytes(range(7)), b"", b"\x01" * 100]
    stream = b"".join(stream_message({"type": "frames", "i": i}, p) for i, p in enumerate(payloads))
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
    assert [w.shape for w in s.warmup] == [(16, 2, 4, 4), (16, 1, 8, 8)]
    assert s.warmup[0].outputs == ("uint8", "float", "stream")  # every output by default
    assert s.api_key.get_secret_value() == "zq-secret-91" and "zq-secret-91" not in repr(s)
    (only,) = Settings(warmup=["16x1x2x2:uint8,stream"]).warmup
    assert only.shape == (16, 1, 2, 2) and only.outputs == ("uint8", "stream")
    with pytest.raises(ValueError):
        parse_latent_shape("16x2x4")
    with pytest.raises(ValueError):
        Settings(warmup=["16x2x4x4:gif"])
    with pytest.raises(ValueError):  # a body of max_body_bytes could never be read
        Settings(max_body_bytes=2048, max_reading_bytes=1024)


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
    assert_uint8_frames_match(frames, direct)
    assert main(["decode", str(tmp_path / "z.safetensors"), "-o", str(tmp_path / "v.mp4"),
                 "--model", str(tiny_model_dir)]) == 0
    video = read_mp4((tmp_path / "v.mp4").read_bytes())
    assert video.shape == (9, 32, 32, 3)
    # H.264 (4:2:0, lossy) against the frames: compare luma. The frames upside down are the control.
    error = np.abs(_luma(video) - _luma(direct[0])).mean()
    assert error < 5, error
    assert np.abs(_luma(video) - _luma(direct[0, :, ::-1])).mean() > 3 * error
    assert "wrote" in capsys.readouterr().out


def _luma(frames: np.ndarray) -> np.ndarray:
    return frames.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
