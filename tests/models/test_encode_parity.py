"""Encoder float32 parity with diffusers' AutoencoderKLWan: the posterior mean ≤ 2e-5 max abs.

The committed fixtures hold diffusers' own posterior mean and std for seeded frames, so these run
without torch (``test_encode_live.py`` compares against diffusers itself). Also: sampling and
normalization, and the frame shapes the encoder refuses.
"""

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.helpers.wan_reference import (
    ENCODE_CASES,
    PARITY_PROMISE,
    PARITY_TOL,
    case_config,
    encode_fixture_path,
    seeded_frames,
    seeded_vae_weights,
    write_diffusers_folder,
)
from vaeserve import models
from vaeserve.models.encode import PosteriorOptions, posterior_options, prng_key

# Wan 2.1 cases; Wan 2.2's are in test_encode_parity_wan22.py (its real config without a full checkpoint).
CASE_SHAPES = [(name, shape) for name, (_, _, shapes) in ENCODE_CASES.items() if not case_config(name).is_residual
               for shape in shapes]
SCANNED = ("tiny_r1", ENCODE_CASES["tiny_r1"][2][1])  # F = 9: frame 0, then two 4-frame steps


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """``loaded(name)``: the case's full checkpoint (decoder + encoder) written and loaded once."""
    root = tmp_path_factory.mktemp("encode")
    cache = {}

    def get(name):
        if name not in cache:
            config = case_config(name)
            weights = seeded_vae_weights(config, ENCODE_CASES[name][1])
            cache[name] = models.load_vae(write_diffusers_folder(root / name, config, weights))
        return cache[name]

    return get


def _case(name, shape):
    return seeded_frames(shape, ENCODE_CASES[name][1]), load_file(str(encode_fixture_path(name, shape)))


@pytest.mark.parametrize("name,shape", CASE_SHAPES, ids=[f"{n}-{'x'.join(map(str, s))}" for n, s in CASE_SHAPES])
def test_posterior_mean_matches_diffusers_fixture(loaded, name, shape):
    frames, fixture = _case(name, shape)
    latents = np.asarray(loaded(name).encode(frames))
    batch, _, count, height, width = shape
    assert latents.shape == fixture["mean"].shape == (batch, 16, 1 + (count - 1) // 4, height // 8, width // 8)
    assert latents.dtype == np.float32
    error = np.abs(latents - fixture["mean"]).max()
    assert error <= PARITY_TOL, f"max abs diff {error:.3g}"
    assert fixture["mean"].std() > 0.05  # the reference is not flat: the comparison can detect something


def test_a_misplaced_encoder_weight_breaks_parity(loaded, tmp_path):
    """Negative control: one encoder gamma scaled by 1.5 moves the mean far beyond the tolerance.

    The compiled program takes the weights as an argument, so the good model's program runs the
    wrong weights without another compile.
    """
    name, shape = SCANNED
    frames, fixture = _case(name, shape)
    config = case_config(name)
    weights = seeded_vae_weights(config, ENCODE_CASES[name][1])
    weights["encoder.down_blocks.2.norm2.gamma"] *= 1.5  # a residual block of the second stage
    wrong = models.load_vae(write_diffusers_folder(tmp_path, config, weights))
    program = loaded(name).compile_encode(shape)
    latents = np.asarray(program(wrong.encoder_state, frames, posterior_options(shape[0])))
    assert np.abs(latents - fixture["mean"]).max() > 100 * PARITY_PROMISE


def _noise(seed: int, shape) -> np.ndarray:
    """Row ``b``: ``jax.random.normal(fold_in(PRNGKey(seed), b), shape[1:])`` (the documented noise)."""
    key = jax.random.PRNGKey(seed)
    return np.stack([np.asarray(jax.random.normal(jax.random.fold_in(key, b), shape[1:])) for b in range(shape[0])])


def test_sample_is_the_mean_plus_diffusers_std_times_seeded_noise(loaded):
    name, shape = SCANNED
    frames, fixture = _case(name, shape)
    vae = loaded(name)
    sample = np.asarray(vae.encode(frames, sample=True, seed=7))
    # The log-variance path (clamped, exp(·/2)) agrees with diffusers' std.
    expected = fixture["mean"] + fixture["std"] * _noise(7, fixture["mean"].shape)
    assert np.abs(sample - expected).max() <= PARITY_TOL
    assert np.array_equal(np.asarray(vae.encode(frames, sample=True, seed=7)), sample)
    assert np.abs(np.asarray(vae.encode(frames, sample=True, seed=8)) - sample).max() > 0.1
    assert np.array_equal(np.asarray(vae.encode(frames, seed=7)), np.asarray(vae.encode(frames)))  # no sample: the mean
    with pytest.raises(ValueError, match="seed must be an integer"):
        vae.encode(frames, sample=True, seed=2**32)


def test_host_seed_keys_are_jax_prng_keys():
    for seed in (0, 1, 12345, 2**31, 2**32 - 1):
        assert np.array_equal(prng_key(seed), np.asarray(jax.random.PRNGKey(seed))), seed


def test_one_batch_serves_rows_with_different_options(loaded):
    """Options are per row, so requests with different seeds and flags share one device batch and
    each row is what encoding that request alone gives (the service batches this way)."""
    name, shape = SCANNED
    frames, fixture = _case(name, shape)
    vae = loaded(name)
    config = vae.config
    options = PosteriorOptions.concatenate([posterior_options(1, sample=True, seed=7),
                                            posterior_options(1, normalize=True)], batch=2)
    latents = np.asarray(vae.compile_encode(shape)(vae.encoder_state, frames, options))
    first = fixture["mean"][:1] + fixture["std"][:1] * _noise(7, fixture["mean"][:1].shape)
    mean = np.asarray(config.latents_mean, np.float32)[:, None, None, None]
    std = np.asarray(config.latents_std, np.float32)[:, None, None, None]
    assert np.abs(latents[0] - first[0]).max() <= PARITY_TOL
    assert np.abs(latents[1] - (fixture["mean"][1] - mean) / std).max() <= PARITY_TOL


def test_normalize_is_the_inverse_of_decode_denormalize(loaded):
    name, shape = SCANNED
    frames, fixture = _case(name, shape)
    vae = loaded(name)
    config = vae.config
    mean = np.asarray(config.latents_mean, np.float32)[None, :, None, None, None]
    std = np.asarray(config.latents_std, np.float32)[None, :, None, None, None]
    normalized = np.asarray(vae.encode(frames, normalize=True))
    assert np.abs(normalized - (fixture["mean"] - mean) / std).max() <= PARITY_TOL
    channels_last = np.moveaxis(normalized, 1, -1)
    back = np.moveaxis(np.asarray(models.denormalize_latents(channels_last, config)), -1, 1)
    assert np.abs(back - fixture["mean"]).max() <= PARITY_TOL


@pytest.mark.parametrize(
    "shape,expected,received",
    [((1, 3, 4, 24, 24), [1, 5], 4), ((1, 3, 7, 24, 24), [5, 9], 7), ((1, 3, 1, 20, 24), [16, 24], 20),
     ((1, 3, 1, 24, 5), [8], 5), ((1, 4, 1, 24, 24), 3, 4), ((3, 1, 24, 24), "5 dimensions", 4)],
    ids=["frames-4", "frames-7", "height-20", "width-5", "channels-4", "ndim-4"],
)
def test_frame_shapes_that_do_not_fit_are_refused_with_the_nearest_valid_values(loaded, shape, expected, received):
    with pytest.raises(models.FramesError) as info:
        loaded("tiny_r1").encode(np.zeros(shape, np.float32))
    assert (info.value.expected, info.value.received) == (expected, received)


def test_bfloat16_close_to_float32(loaded, tmp_path):
    """bfloat16 (opt-in) keeps float32 accumulation: relative L2 vs diffusers' float32 ≤ 2e-2."""
    name, shape = "tiny_r1", ENCODE_CASES["tiny_r1"][2][0]
    frames, fixture = _case(name, shape)
    config = case_config(name)
    folder = write_diffusers_folder(tmp_path, config, seeded_vae_weights(config, ENCODE_CASES[name][1]))
    half = models.load_vae(folder, dtype="bfloat16")
    assert half.encoder_state["encoder"]["conv_in"]["kernel"][...].dtype.name == "bfloat16"
    latents = np.asarray(half.encode(frames), np.float64)
    rel_l2 = np.linalg.norm(latents - fixture["mean"]) / np.linalg.norm(fixture["mean"])
    assert 0 < rel_l2 <= 2e-2, rel_l2
