"""Wan 2.2 (TI2V-5B) encoder parity with diffusers' AutoencoderKLWan: posterior mean ≤ 2e-5 max abs.

Committed fixtures (``python -m tests.fixtures.make_fixtures encode_wan22_small encode_wan22``) hold
diffusers' posterior mean and std for seeded frames: a small 2.2 config (F ∈ {1, 5, 9}, odd
latent sizes, batch 2; its time downsamplers sit in stages 0 and 1, so an AvgDown3D shortcut
averages frame pairs while it widens the channels) and the real 2.2 config (one frame: its
compile is what costs). Negative controls swap the patchify order, and pad the first chunk's
zero frame behind its frame instead of in front (the AvgDown3D shortcut's first-chunk subtlety):
each must break parity.
"""

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.helpers.wan_reference import (
    ENCODE_CASES,
    PARITY_PROMISE,
    PARITY_TOL,
    case_config,
    encode_fixture_path,
    encoder_only_vae,
    seeded_encoder_weights,
    seeded_frames,
    seeded_vae_weights,
    write_diffusers_folder,
)
from vaeserve import models
from vaeserve.models import layers
from vaeserve.models.families.wan import encoder

SMALL = "wan22_small"
SMALL_SHAPES = ENCODE_CASES[SMALL][2]
FIRST_CHUNK = SMALL_SHAPES[0]  # F = 1: the first chunk is the whole encode


def _fixture(name, shape):
    return load_file(str(encode_fixture_path(name, shape)))


def _error(vae, name, shape) -> float:
    fixture = _fixture(name, shape)
    latents = np.asarray(vae.encode(seeded_frames(shape, ENCODE_CASES[name][1])))
    batch, _, count, height, width = shape
    assert latents.shape == fixture["mean"].shape == (batch, 48, 1 + (count - 1) // 4, height // 16, width // 16)
    assert latents.dtype == np.float32
    assert fixture["mean"].std() > 0.05  # the reference is not flat: the comparison can detect something
    return float(np.abs(latents - fixture["mean"]).max())


@pytest.fixture(scope="module")
def small_folder(tmp_path_factory):
    """The small config's full checkpoint (decoder + encoder), as a diffusers folder."""
    config = case_config(SMALL)
    return write_diffusers_folder(tmp_path_factory.mktemp("wan22"), config,
                                  seeded_vae_weights(config, ENCODE_CASES[SMALL][1]))


@pytest.fixture(scope="module")
def small(small_folder):
    vae = models.load_vae(small_folder)
    assert vae.has_encoder and vae.config.is_residual and vae.config.patch == 2
    return vae


@pytest.mark.parametrize("shape", SMALL_SHAPES, ids=["x".join(map(str, s)) for s in SMALL_SHAPES])
def test_small_config_matches_diffusers_fixture(small, shape):
    assert _error(small, SMALL, shape) <= PARITY_TOL


def test_real_config_matches_diffusers_fixture():
    """The real TI2V-5B encoder (150 M parameters with quant_conv), from the seeded tensors."""
    name = "wan22"
    (shape,) = ENCODE_CASES[name][2]
    config = case_config(name)
    assert config == models.WanVAEConfig.wan22()
    vae = encoder_only_vae(config, seeded_encoder_weights(config, ENCODE_CASES[name][1]))
    assert vae.metadata["encoder_parameters"] == 149_637_088  # diffusers' encoder + quant_conv, exactly
    assert _error(vae, name, shape) <= PARITY_TOL


def _swapped_patchify(x, patch):
    """Row and column offsets swapped: channel c·4 + q·2 + r instead of c·4 + r·2 + q."""
    return layers.patchify(x.swapaxes(-2, -3), patch).swapaxes(-2, -3)


_average_down = layers.average_down


def _zero_frame_behind(x, cout, *, factor_t, factor_s):
    """The first chunk's lone frame averaged with a zero frame padded *after* it (the reference pads before)."""
    if x.shape[1] % factor_t:
        x = jnp.pad(x, ((0, 0), (0, factor_t - x.shape[1] % factor_t), (0, 0), (0, 0), (0, 0)))
    return _average_down(x, cout, factor_t=factor_t, factor_s=factor_s)


@pytest.mark.parametrize("target, name, replacement", [
    (encoder, "patchify", _swapped_patchify),
    (layers, "average_down", _zero_frame_behind),
], ids=["patchify-order", "first-chunk-zero-frame-behind"])
def test_negative_controls_break_parity(small_folder, monkeypatch, target, name, replacement):
    monkeypatch.setattr(target, name, replacement)
    broken = models.load_vae(small_folder)  # a new model: its programs are traced with the replacement
    assert _error(broken, SMALL, FIRST_CHUNK) > 100 * PARITY_PROMISE
