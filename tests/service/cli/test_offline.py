"""``vaeserve decode`` offline: latents files to frames and MP4 on this machine's devices."""

from __future__ import annotations

import numpy as np
import safetensors.numpy

from service.codecs.video import read_mp4
from tests.helpers.frames import assert_uint8_frames_match
from tests.helpers.service_helpers import latents


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
