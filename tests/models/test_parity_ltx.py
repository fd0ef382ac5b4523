"""Float32 parity with diffusers' AutoencoderKLLTXVideo and AutoencoderKLLTX2Video, on a small config
of every variant: LTX-Video 0.9.0 (no timestep), 0.9.5 (timestep-conditioned, with 0.9.1's noise
injection switched off by zero scales), LTX-2 with a causal decoder that pads by reflection, and
LTX-2.3 (zero padding, a decoder that sees one frame ahead, temporal-only and spatial-only
upsamplers).

The promise is ≤ 1e-4 max abs; the tests hold 2e-5. The committed fixtures hold diffusers' own
decodes (the whole clip, clamped to [-1, 1] as we return it) and posterior means, so these run
without torch; ``test_live_*`` repeat the comparison against diffusers itself on new inputs of the
same shapes (no new compile). Negative control: one weight out of place moves the output far.
"""

import importlib.util

import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.helpers.ltx_reference import CASES, decode_kwargs, seeded_weights
from tests.helpers.wan_reference import (
    encode_fixture_path,
    fixture_path,
    seeded_frames,
    seeded_latents,
    write_diffusers_folder,
)
from vaeserve import models

TOLERANCE = 2e-5
has_diffusers = importlib.util.find_spec("diffusers") is not None


def _max_diff(a, b) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """One diffusers-format folder per case (decoder, encoder, statistics), from the seeded weights."""
    root = tmp_path_factory.mktemp("ltx")
    return {name: write_diffusers_folder(root / name, config, seeded_weights(config, seed))
            for name, (config, seed, _, _) in CASES.items()}


@pytest.fixture(scope="module")
def loaded(folders):
    return {name: models.load_vae(folder) for name, folder in folders.items()}


DECODES = [(name, shape) for name, (_, _, shapes, _) in CASES.items() for shape in shapes]
ENCODES = [(name, shape) for name, (_, _, _, shapes) in CASES.items() for shape in shapes]


@pytest.mark.parametrize("name,shape", DECODES, ids=[n for n, _ in DECODES])
def test_decode_matches_diffusers_fixture(loaded, name, shape):
    fixture = load_file(str(fixture_path(name, shape)))
    expected = np.clip(fixture["frames"], -1, 1)
    vae = loaded[name]
    frames = np.asarray(vae.decode(fixture["latents"], **decode_kwargs(vae.config)))
    assert frames.dtype == np.float32
    assert _max_diff(frames, expected) <= TOLERANCE
    assert expected.std() > 0.1 and np.mean(np.abs(expected) < 1) > 0.9  # something to compare, not clamped away


@pytest.mark.parametrize("name,shape", ENCODES, ids=[n for n, _ in ENCODES])
def test_encode_matches_diffusers_fixture(loaded, name, shape):
    fixture = load_file(str(encode_fixture_path(name, shape)))
    latents = np.asarray(loaded[name].encode(seeded_frames(shape, CASES[name][1])))
    assert _max_diff(latents, fixture["mean"]) <= TOLERANCE
    assert fixture["mean"].std() > 0.1


@pytest.mark.parametrize("name, weight", [("ltx090", "decoder.up_blocks.3.conv_in.norm3.weight"),
                                          ("ltx095", "decoder.up_blocks.1.resnets.0.scale_shift_table"),
                                          ("ltx2_causal", "decoder.up_blocks.0.upsamplers.0.conv.conv.bias"),
                                          ("ltx23", "decoder.up_blocks.2.upsamplers.0.conv.conv.weight")])
def test_a_misplaced_weight_breaks_parity(loaded, folders, name, weight):
    """Negative control: one weight scaled by 1.5, run by the program compiled for the right weights."""
    config, seed, shapes, _ = CASES[name]
    fixture = load_file(str(fixture_path(name, shapes[0])))
    weights = seeded_weights(config, seed)
    weights[weight] = weights[weight] * 1.5
    wrong = models.load_vae(write_diffusers_folder(folders[name].parent / f"{name}-wrong", config, weights))
    vae = loaded[name]
    conditions = vae.conditions(shapes[0][0], **decode_kwargs(config))
    frames, _ = vae.compile(shapes[0])(wrong.state, fixture["latents"], *([conditions] if conditions else []))
    assert _max_diff(np.asarray(frames), np.clip(fixture["frames"], -1, 1)) > 1e-2


def test_statistics_come_from_the_weights(loaded):
    """The latents' statistics are tensors beside the weights (diffusers' buffers), read into the config:
    ``denormalize`` and ``normalize`` use them, divided by ``scaling_factor``."""
    name = "ltx090"
    config, seed, _, shapes = CASES[name]
    weights = seeded_weights(config, seed)
    vae = loaded[name]
    np.testing.assert_allclose(vae.config.latents_mean, weights["latents_mean"], rtol=1e-6)
    np.testing.assert_allclose(vae.config.latents_std, weights["latents_std"], rtol=1e-6)
    frames = seeded_frames(shapes[0], seed)
    expected = (np.asarray(vae.encode(frames)) - weights["latents_mean"][:, None, None, None]) \
        / weights["latents_std"][:, None, None, None]
    assert _max_diff(np.asarray(vae.encode(frames, normalize=True)), expected) <= 1e-5
    assert "latents_mean" not in vae.config.to_dict()  # diffusers' config.json has no such key


@pytest.mark.skipif(not has_diffusers, reason="needs diffusers + torch")
@pytest.mark.parametrize("name", CASES)
def test_live_decode_and_encode_match_diffusers(loaded, name):
    """Against diffusers itself, on inputs no fixture holds (the fixtures' shapes: no new compile)."""
    from tests.helpers.ltx_reference import reference_decode, reference_model, reference_posterior_mean

    config, seed, decode_shapes, encode_shapes = CASES[name]
    reference = reference_model(config, seeded_weights(config, seed))
    latents = seeded_latents(decode_shapes[0], seed + 1000)
    frames = np.asarray(loaded[name].decode(latents, **decode_kwargs(config)))
    assert _max_diff(frames, np.clip(reference_decode(reference, config, latents), -1, 1)) <= TOLERANCE
    pixels = seeded_frames(encode_shapes[0], seed + 1000)
    assert _max_diff(np.asarray(loaded[name].encode(pixels)), reference_posterior_mean(reference, pixels)) <= TOLERANCE
