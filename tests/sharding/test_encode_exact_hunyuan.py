"""The sharded HunyuanVideo encode equals the single-device encode (float32, ≤ 1e-5), on uneven
splits (tp = 3: bands of 3, 3 and 1 latent rows; tp = 4: the last band wholly padded) and dp = 2,
with negative controls: 1.0's GroupNorm with each band's own statistics, 1.5's clip attention
without its frame-causal mask (its encoder keeps earlier latent frames' keys and values too)."""

import functools

import numpy as np
import pytest

from vaeserve import sharding
from vaeserve.sharding._controls import encode_with

TOLERANCE = 1e-5
LATENT_HW = (7, 4)


def _frames(vae, batch: int = 1) -> np.ndarray:
    """``(B, 3, 9, 7s, 4s)`` frames in [-1, 1] (latents 7 x 4, odd height)."""
    s = vae.config.spatial_scale
    shape = (batch, 3, 9, LATENT_HW[0] * s, LATENT_HW[1] * s)
    return np.random.default_rng([batch, s]).uniform(-1, 1, shape).astype(np.float32)


@pytest.fixture(scope="module")
def reference(hunyuan):
    @functools.cache
    def encode(name, batch=1):
        return np.asarray(hunyuan[name].encode(_frames(hunyuan[name], batch)))

    return encode


def _error(a, b) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(np.asarray(a, np.float64) - b)))


@pytest.mark.parametrize("name, tp", [("hy10", 3), ("hy10", 4), ("hy15", 3)])
def test_encode_matches_single_device(hunyuan, reference, name, tp):
    vae = hunyuan[name]
    got = sharding.sharded_encode(vae, _frames(vae), sharding.make_mesh(tp), split="height")
    assert _error(got, reference(name)) <= TOLERANCE


def test_encode_batch_over_dp(hunyuan, reference):
    vae = hunyuan["hy15"]
    got = sharding.sharded_encode(vae, _frames(vae, 2), sharding.make_mesh(2, dp=2), split="height")
    assert _error(got, reference("hy15", 2)) <= TOLERANCE


@pytest.mark.parametrize("name, control", [("hy10", "band-statistics"), ("hy15", "no-frame-mask")])
def test_encode_controls_differ(hunyuan, reference, name, control):
    vae = hunyuan[name]
    broken = encode_with(control, vae, _frames(vae), sharding.make_mesh(3), split="height")
    assert _error(broken, reference(name)) > 1e-2
