"""``vaeserve decode`` offline: latents files to frames and MP4 on this machine's devices (an image
model's to images), and ``vaeserve encode`` of an image."""

from __future__ import annotations

import numpy as np
import safetensors.numpy
from PIL import Image

from tests.helpers.frames import assert_uint8_frames_match
from tests.helpers.service_helpers import latents
from vaeserve.service.codecs.video import read_mp4


def test_offline_decode_cli(tmp_path, tiny_model_dir, tiny_vae, capsys):
    from vaeserve.service.cli import main

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


def test_offline_decode_and_encode_of_an_image_model(tmp_path):
    """An image model's latents ``(B, C, H, W)`` to a PNG and uint8 ``(B, H, W, 3)``; the PNG back to
    latents ``(1, C, H, W)``. (KL_SHARD: a 2x AutoencoderKL whose programs compile in seconds.)"""
    from tests.helpers.image_reference import KL_SHARD
    from vaeserve import models
    from vaeserve.service.cli import main

    vae = models.init_vae(KL_SHARD, seed=3)
    models.save_vae(vae, tmp_path / "vae")
    x = latents((2, KL_SHARD.latent_channels, 5, 6), seed=31)
    np.save(tmp_path / "z.npy", x)
    common = ["--model", str(tmp_path / "vae")]
    assert main(["decode", str(tmp_path / "z.npy"), "-o", str(tmp_path / "images.npy"), *common]) == 0
    assert main(["decode", str(tmp_path / "z.npy"), "-o", str(tmp_path / "first.png"), *common]) == 0
    images = np.load(tmp_path / "images.npy", allow_pickle=False)
    assert images.shape == (2, 10, 12, 3)  # no time axis
    assert_uint8_frames_match(images, np.asarray(vae.decode(x, output="uint8")))
    first = np.asarray(Image.open(tmp_path / "first.png"))
    assert np.array_equal(first, images[0]) and not np.array_equal(first, images[1])
    assert main(["encode", str(tmp_path / "first.png"), "-o", str(tmp_path / "z0.npy"), *common]) == 0
    encoded = np.load(tmp_path / "z0.npy", allow_pickle=False)
    unit = 2 * (first.astype(np.float32) / 255) - 1
    assert encoded.shape == (1, KL_SHARD.latent_channels, 5, 6)
    assert np.abs(encoded - np.asarray(vae.encode(np.moveaxis(unit, -1, 0)[None]))).max() <= 1e-5
