"""What the sound tests share (docs/audio.md): a diffusers component folder written from tensors,
a safetensors body of named tensors, a decode posted as one, the npy waveforms of an answer, and
the signal-to-noise ratio a lossy track is held to."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save, save_file

SAFETENSORS = {"Content-Type": "application/x-safetensors"}
# AAC keeps noise-like sound at 192 kb/s about 16 dB above its error; another sound is ~0 dB.
SNR_DB = 10.0


def write_folder(folder: Path, config: dict, tensors: dict[str, np.ndarray]) -> None:
    """A diffusers component folder: ``config.json`` and ``diffusion_pytorch_model.safetensors``."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "diffusion_pytorch_model.safetensors"))


def body(**tensors: np.ndarray) -> bytes:
    return save({name: np.ascontiguousarray(value) for name, value in tensors.items()})


def post_decode(client, content: bytes, *, fps: float, **params):
    """A safetensors body posted to ``/v1/decode`` at ``fps``, lossless video (crf 0)."""
    return client.post("/v1/decode", content=content, params={"fps": fps, "crf": 0, **params}, headers=SAFETENSORS)


def npy_of(answer) -> np.ndarray:
    assert answer.status_code == 200, answer.text
    return np.load(io.BytesIO(answer.content))


def snr_db(reference: np.ndarray, other: np.ndarray) -> float:
    return float(10 * np.log10(np.mean(reference**2) / np.mean((other - reference) ** 2)))
