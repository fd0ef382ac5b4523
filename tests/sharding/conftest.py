"""Shared fixtures for the sharding tests: one tiny model, deterministic latents, cached references.

Compiles dominate the runtime here, so every shape is reused across tests where it can be and the
single-device reference decode of each shape is computed once per session.
"""

import functools

import numpy as np
import pytest

import models

TINY = dict(base_dim=8, num_res_blocks=1)
# Wan 2.2 in small: residual up blocks, a time+space and a space-only DupUp3D shortcut, 2x2
# unpatchify, 48 latent channels; three stages (8x spatial, 2x temporal) to keep compiles short.
TINY22 = dict(base_dim=8, decoder_base_dim=8, num_res_blocks=1, dim_mult=(1, 2, 2), temperal_downsample=(False, True),
              scale_factor_spatial=8, scale_factor_temporal=2)
WIDTH = 4  # latent width for the height-split tests: never divisible by 3, so splits are forced


@pytest.fixture(scope="session")
def vae():
    return models.init_vae(models.WanVAEConfig(**TINY), seed=0)


@pytest.fixture(scope="session")
def vae22():
    return models.init_vae(models.WanVAEConfig.wan22(**TINY22), seed=0)


def make_latents(batch: int, frames: int, height: int, width: int, seed: int = 0, channels: int = 16) -> np.ndarray:
    """``(B, C, T, H, W)`` float32 standard-normal latents, deterministic in the shape and seed."""
    rng = np.random.default_rng([seed, batch, frames, height, width])
    return rng.standard_normal((batch, channels, frames, height, width)).astype(np.float32)


@pytest.fixture(scope="session")
def reference(vae):
    """``reference(shape, output=..., denormalize=...)``: the single-device decode as numpy (cached)."""

    @functools.cache
    def decode(shape, output="float", denormalize=False):
        return np.asarray(vae.decode(make_latents(*shape), output=output, denormalize=denormalize))

    return decode
