"""Fixtures shared by the multi-host tests: the single-process references and the saved model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.helpers.slice_process import micro_encoder_vae, micro_vae, slice_frames, slice_latents
from vaeserve import models, sharding
from vaeserve.service.engine.runner import encode_rows

# The sharded references against the single-device decode and encode (float32; see tests/sharding).
TOLERANCE = 1e-5


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


def _assert_single_device(sharded: dict[str, np.ndarray], single: dict[str, np.ndarray]) -> None:
    """The references are anchored to ``vae.decode``/``vae.encode`` on one device: a halo bug that
    the slice and this process's mesh share cannot hide behind the slice's byte equality with them."""
    for name in ("tp4_float", "tp2dp2_float"):
        assert _max_diff(sharded[name], single["float"]) <= TOLERANCE, name
    for name in ("tp4_uint8", "tp4_stream"):  # ~1e-6 apart in float: a rounding at .5 may flip
        assert _max_diff(sharded[name], single["uint8"]) <= 1, name
        assert np.mean(sharded[name] == single["uint8"]) >= 0.999, name
    assert _max_diff(sharded["tp4_encode"], single["encode"]) <= TOLERANCE


@pytest.fixture(scope="session")
def references():
    """The single-process decodes of ``slice_latents()`` with the MICRO model (this pytest process
    has 8 CPU devices): tp = 4 (uint8, float, stream) and tp = 2 x dp = 2 (float); and the tp = 4
    encode of ``slice_frames()``. Each is checked against the single-device decode (encode) first."""
    vae, encoder_vae = micro_vae(), micro_encoder_vae()
    z = slice_latents()
    tp4, tp2dp2 = sharding.make_mesh(4), sharding.make_mesh(2, dp=2)
    frames, requests = slice_frames()
    options = encode_rows(requests, len(frames))
    sharded = {
        "tp4_encode": sharding.to_host(sharding.sharded_encode(encoder_vae, frames, tp4, options=options)),
        "tp4_uint8": sharding.to_host(sharding.sharded_decode(vae, z, tp4, output="uint8")),
        "tp4_float": sharding.to_host(sharding.sharded_decode(vae, z, tp4, output="float")),
        "tp4_stream": np.concatenate([step.frames for step in sharding.sharded_decode_stream(vae, z, tp4)], axis=1),
        "tp2dp2_float": sharding.to_host(sharding.sharded_decode(vae, z, tp2dp2, output="float")),
    }
    (sampled, _), (normalized, _) = requests  # one row each: row 0 sampled with a seed, row 1 normalized
    assert sampled.sample and normalized.normalize and not normalized.sample
    single = {
        "float": np.asarray(vae.decode(z)),
        "uint8": np.asarray(vae.decode(z, output="uint8")),
        "encode": np.concatenate([
            np.asarray(encoder_vae.encode(frames[:1], sample=True, seed=sampled.seed)),
            np.asarray(encoder_vae.encode(frames[1:], normalize=True)),
        ]),
    }
    _assert_single_device(sharded, single)
    return sharded


@pytest.fixture(scope="session")
def micro_model_dir(tmp_path_factory) -> Path:
    """The MICRO model as a diffusers-format folder, for ``vaeserve serve --model``."""
    return models.save_vae(micro_vae(), tmp_path_factory.mktemp("micro-vae"))
