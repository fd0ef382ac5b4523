"""Shared fixtures for the sharding tests: one tiny model, cached references.

Compiles dominate the runtime here, so every shape is reused across tests where it can be and the
single-device reference decode of each shape is computed once per session.
"""

import functools

import numpy as np
import pytest

from tests.helpers.sharding_helpers import TINY, TINY22, make_latents
from vaeserve import models


@pytest.fixture(scope="session")
def vae():
    return models.init_vae(models.WanVAEConfig(**TINY), seed=0)


@pytest.fixture(scope="session")
def vae22():
    return models.init_vae(models.WanVAEConfig.wan22(**TINY22), seed=0)


@pytest.fixture(scope="session")
def reference(vae):
    """``reference(shape, output=..., denormalize=...)``: the single-device decode as numpy (cached)."""

    @functools.cache
    def decode(shape, output="float", denormalize=False):
        return np.asarray(vae.decode(make_latents(*shape), output=output, denormalize=denormalize))

    return decode


@pytest.fixture(scope="session")
def hunyuan():
    """Small HunyuanVideo 1.0 and 1.5 models (``tests/helpers/hunyuan_reference``), seeded weights."""
    from tests.helpers.hunyuan_reference import HY10_SHARD, HY15_SHARD

    return {"hy10": models.init_vae(HY10_SHARD, seed=0), "hy15": models.init_vae(HY15_SHARD, seed=0)}


@pytest.fixture(scope="session")
def hunyuan_reference(hunyuan):
    """``hunyuan_reference(name, (B, T, H, W), output=...)``: the single-device decode of
    ``make_latents(B, T, H, W, channels=16)`` as numpy (cached)."""

    @functools.cache
    def decode(name, shape, output="float"):
        return np.asarray(hunyuan[name].decode(make_latents(*shape, channels=16), output=output))

    return decode


# The LTX decode's timestep and noise in the sharding tests: latent noise mixed in and injected noise,
# all from one seed, so every exactness test also checks that the noise is the same however it is split.
LTX_CONDITIONS = {"timestep": 0.05, "noise_scale": 0.2, "seed": 3}


@pytest.fixture(scope="session")
def ltx():
    """The small LTX-2.0-style decoder (``tests/helpers/ltx_reference.LTX2_SHARD``: reflect padding,
    sees one frame ahead, timestep-conditioned, injects noise), seeded weights (noise scales ≠ 0)."""
    from tests.helpers.ltx_reference import LTX2_SHARD

    return models.init_vae(LTX2_SHARD, seed=0, encoder=False)


@pytest.fixture(scope="session")
def ltx_reference(ltx):
    """``ltx_reference((B, T, H, W))``: the single-device decode of ``make_latents(B, T, H, W,
    channels=8)`` with ``LTX_CONDITIONS``, as numpy (cached)."""

    @functools.cache
    def decode(shape):
        return np.asarray(ltx.decode(make_latents(*shape, channels=8), **LTX_CONDITIONS))

    return decode
