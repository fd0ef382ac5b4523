"""Wan 2.2 (TI2V-5B) decoder parity with diffusers' AutoencoderKLWan: float32 ≤ 2e-5 max abs.

Committed fixtures (``tests/fixtures/make_fixtures.py``) hold diffusers' decodes of a small 2.2
config (T ∈ {1, 2, 5}, odd H and W, batch 2) and of the real 2.2 config (tiny latents), so these
run without torch. Negative controls swap the unpatchify order and mishandle the first chunk of
the DupUp3D shortcut: each must break parity far beyond the tolerance.
"""

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.helpers.wan_reference import (
    CASES22,
    PARITY_PROMISE,
    PARITY_TOL,
    case_config,
    fixture_path,
    seeded_decoder_weights,
    write_diffusers_folder,
)
from vaeserve import models
from vaeserve.models import layers
from vaeserve.models.families.wan import decoder
from vaeserve.models.loading import build_vae

SMALL = "wan22_small"
SMALL_SHAPES = CASES22[SMALL][2]


def _fixture(name, shape):
    return load_file(str(fixture_path(name, shape)))


def _error(vae, fixture) -> float:
    frames = np.asarray(vae.decode(fixture["latents"]))
    assert frames.shape == fixture["frames"].shape and frames.dtype == np.float32
    return float(np.abs(frames - fixture["frames"]).max())


@pytest.fixture(scope="module")
def small_folder(tmp_path_factory):
    config = case_config(SMALL)
    return write_diffusers_folder(tmp_path_factory.mktemp("wan22"), config,
                                  seeded_decoder_weights(config, CASES22[SMALL][1]))


@pytest.fixture(scope="module")
def small(small_folder):
    return models.load_vae(small_folder)


@pytest.mark.parametrize("shape", SMALL_SHAPES, ids=["x".join(map(str, s)) for s in SMALL_SHAPES])
def test_small_config_matches_diffusers_fixture(small, shape):
    fixture = _fixture(SMALL, shape)
    assert small.config.spatial_scale == 16 and small.config.z_dim == 48
    # (B, 3, 1 + 4(T-1), 16H, 16W): 2x2 patches on top of the decoder's 8x
    b, _, t, h, w = shape
    assert fixture["frames"].shape == (b, 3, 1 + 4 * (t - 1), 16 * h, 16 * w)
    assert _error(small, fixture) <= PARITY_TOL
    assert fixture["frames"].std() > 0.05  # the reference is not flat: the comparison can detect


def test_real_config_matches_diffusers_fixture():
    """The real TI2V-5B architecture (555 M decoder parameters), built from the seeded tensors
    without a 2 GB round trip through disk (the folder path is the small config's)."""
    name = "wan22"
    (shape,) = CASES22[name][2]
    config = case_config(name)
    assert config == models.WanVAEConfig.wan22()
    vae = build_vae(config, seeded_decoder_weights(config, CASES22[name][1]), dtype="float32",
                    metadata={"source": "seeded"})
    assert 554e6 < vae.metadata["parameters"] < 556e6
    fixture = _fixture(name, shape)
    assert _error(vae, fixture) <= PARITY_TOL
    assert fixture["frames"].std() > 0.05


def _wrong_unpatchify(x, patch):
    """Row and column offsets swapped: channel c·4 + q·2 + r instead of c·4 + r·2 + q."""
    b, t, h, w, cp = x.shape
    x = x.reshape(b, t, h, w, cp // 4, 2, 2).swapaxes(-1, -2)
    return layers.unpatchify(x.reshape(b, t, h, w, cp), patch)


_duplicate_up = layers.duplicate_up


def _first_chunk_keeps_the_wrong_frame(x, cout, *, factor_t, factor_s, first_chunk):
    """On the first chunk the shortcut keeps its *leading* frame (the one the reference drops)."""
    full = _duplicate_up(x, cout, factor_t=factor_t, factor_s=factor_s, first_chunk=False)
    return full[:, :1] if first_chunk else full


def _first_chunk_drop_skipped(x, cout, *, factor_t, factor_s, first_chunk):
    """The first chunk drops nothing (diffusers #12039/#12529: tiled paths that lost first_chunk)."""
    return _duplicate_up(x, cout, factor_t=factor_t, factor_s=factor_s, first_chunk=False)


@pytest.mark.parametrize("target, name, replacement", [
    (decoder, "unpatchify", _wrong_unpatchify),
    (layers, "duplicate_up", _first_chunk_keeps_the_wrong_frame),
], ids=["unpatchify-order", "first-chunk-frame"])
def test_negative_controls_break_parity(small_folder, monkeypatch, target, name, replacement):
    fixture = _fixture(SMALL, SMALL_SHAPES[0])  # T = 1: the first chunk is the whole decode
    monkeypatch.setattr(target, name, replacement)
    broken = models.load_vae(small_folder)  # a new model: its programs are traced with the replacement
    assert _error(broken, fixture) > 100 * PARITY_PROMISE


def test_skipping_the_first_chunk_drop_cannot_decode(small_folder, monkeypatch):
    """Without the drop, frame 0's shortcut keeps a frame the main path does not have: further up,
    a residual sum meets 2 frames against 4 and the program cannot be built (the reference would
    broadcast into an extra frame). Matched by its message, so no other error passes for it."""
    monkeypatch.setattr(layers, "duplicate_up", _first_chunk_drop_skipped)
    frames_2_and_4 = r"add got incompatible shapes for broadcasting: \(1, 2, \d+, \d+, \d+\), \(1, 4, "
    with pytest.raises(TypeError, match=frames_2_and_4):
        models.load_vae(small_folder).compile(SMALL_SHAPES[0])


def test_bfloat16_close_to_float32(small_folder, small):
    latents = _fixture(SMALL, SMALL_SHAPES[2])["latents"]  # T = 5
    full = np.asarray(small.decode(latents), np.float64)
    half_vae = models.load_vae(small_folder, dtype="bfloat16")
    assert half_vae.state["decoder"]["conv_in"]["kernel"][...].dtype == jax.numpy.bfloat16
    half = np.asarray(half_vae.decode(latents), np.float64)
    rel_l2 = np.linalg.norm(half - full) / np.linalg.norm(full)
    assert 0 < rel_l2 <= 2e-2, rel_l2

