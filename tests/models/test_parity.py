"""Float32 parity with diffusers' AutoencoderKLWan (≤ 2e-5 max abs), bfloat16 within 2e-2 rel L2.

The committed fixtures hold diffusers' own decodes, so these run without torch; the live tests at
the bottom repeat the comparison against diffusers itself when it is installed.
"""

import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.helpers.frames import assert_uint8_frames_match
from tests.helpers.wan_reference import (
    CASES,
    PARITY_PROMISE,
    PARITY_TOL,
    case_config,
    fixture_path,
    seeded_decoder_weights,
    write_diffusers_folder,
)
from vaeserve import models


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """One diffusers-format folder per case, written from the seeded weights."""
    root = tmp_path_factory.mktemp("parity")
    return {
        name: write_diffusers_folder(root / name, case_config(name), seeded_decoder_weights(case_config(name), seed))
        for name, (_, seed, _) in CASES.items()
    }


@pytest.fixture(scope="module")
def loaded(folders):
    cache = {}

    def get(name, dtype="float32"):
        if (name, dtype) not in cache:
            cache[name, dtype] = models.load_vae(folders[name], dtype=dtype)
        return cache[name, dtype]

    return get


CASE_SHAPES = [(name, shape) for name, (_, _, shapes) in CASES.items() for shape in shapes]


@pytest.mark.parametrize("name,shape", CASE_SHAPES, ids=[f"{n}-{'x'.join(map(str, s))}" for n, s in CASE_SHAPES])
def test_float32_matches_diffusers_fixture(loaded, name, shape):
    fixture = load_file(str(fixture_path(name, shape)))
    frames = np.asarray(loaded(name).decode(fixture["latents"]))
    assert frames.shape == fixture["frames"].shape
    assert frames.dtype == np.float32
    error = np.abs(frames - fixture["frames"]).max()
    assert error <= PARITY_TOL, f"max abs diff {error:.3g}"
    # The reference output is not trivially flat: the comparison has something to detect.
    assert fixture["frames"].std() > 0.05


def test_a_misplaced_weight_breaks_parity(folders):
    """Negative control: one gamma scaled by 1.5 must move the output far beyond the tolerance."""
    name, shape = "tiny_r1", CASES["tiny_r1"][2][1]
    fixture = load_file(str(fixture_path(name, shape)))
    weights = seeded_decoder_weights(case_config(name), CASES[name][1])
    weights["decoder.up_blocks.1.resnets.0.norm2.gamma"] *= 1.5
    vae = models.load_vae(write_diffusers_folder(folders[name].parent / "wrong", case_config(name), weights))
    error = np.abs(np.asarray(vae.decode(fixture["latents"])) - fixture["frames"]).max()
    assert error > 100 * PARITY_PROMISE


def test_uint8_output_is_rounded_float_output(loaded):
    name, shape = "tiny_r1", CASES["tiny_r1"][2][1]
    latents = load_file(str(fixture_path(name, shape)))["latents"]
    vae = loaded(name)
    floats = np.asarray(vae.decode(latents))
    frames = np.asarray(vae.decode(latents, output="uint8"))
    assert frames.dtype == np.uint8 and frames.shape == np.moveaxis(floats, 1, -1).shape
    expected = np.round((np.moveaxis(floats, 1, -1) + 1.0) * 127.5)
    assert_uint8_frames_match(frames, expected)  # float rounding at .5 only
    assert frames.min() < 64 and frames.max() > 192  # the full range is used


def test_chunked_scan_equals_one_frame_steps(loaded):
    name, shape = "tiny_r2", CASES["tiny_r2"][2][0]
    latents = load_file(str(fixture_path(name, shape)))["latents"]
    vae = loaded(name)
    one = np.asarray(vae.decode(latents, chunk=1))
    three = np.asarray(vae.decode(latents, chunk=3))  # 4 later frames: one chunk of 3 + remainder 1
    assert np.abs(one - three).max() <= 1e-5


def test_stream_concatenates_to_the_full_decode(loaded):
    name, shape = "tiny_r1", CASES["tiny_r1"][2][1]
    latents = load_file(str(fixture_path(name, shape)))["latents"]
    vae = loaded(name)
    pieces = list(vae.decode_stream(latents))
    assert [p.shape[1] for p in pieces] == [1, 4]
    assert_uint8_frames_match(np.concatenate(pieces, axis=1), np.asarray(vae.decode(latents, output="uint8")))


def test_denormalize_applies_latents_mean_and_std(loaded):
    name, shape = "tiny_r1", CASES["tiny_r1"][2][0]
    latents = load_file(str(fixture_path(name, shape)))["latents"]
    vae = loaded(name)
    config = vae.config
    mean = np.asarray(config.latents_mean, np.float32)[None, :, None, None, None]
    std = np.asarray(config.latents_std, np.float32)[None, :, None, None, None]
    by_hand = np.asarray(vae.decode(latents * std + mean))
    assert np.abs(np.asarray(vae.decode(latents, denormalize=True)) - by_hand).max() <= 1e-5
    assert np.abs(by_hand - np.asarray(vae.decode(latents))).max() > 1e-2


@pytest.mark.parametrize("name", ["tiny_r2", "wan21"])
def test_bfloat16_close_to_float32(loaded, name):
    shape = CASES[name][2][0]
    latents = load_file(str(fixture_path(name, shape)))["latents"]
    full = np.asarray(loaded(name).decode(latents), np.float64)
    half = np.asarray(loaded(name, "bfloat16").decode(latents), np.float64)
    assert loaded(name, "bfloat16").state["decoder"]["conv_in"]["kernel"][...].dtype.name == "bfloat16"
    rel_l2 = np.linalg.norm(half - full) / np.linalg.norm(full)
    assert 0 < rel_l2 <= 2e-2, rel_l2
