"""Float32 parity with diffusers' image VAEs: AutoencoderKL (as SD and as Flux.1),
AutoencoderKLFlux2 and AutoencoderKLQwenImage, decode (clamped) and encode (posterior mean).

The promise is ≤ 1e-4 max abs; these small configs meet 2e-5 (measured ≤ 2e-6), which is what the
tests hold them to. The committed fixtures hold diffusers' own outputs (batch 2, odd latent sizes;
Qwen-Image in both of its layouts), so these run without torch; ``test_live_*`` repeat a comparison
against diffusers itself on fresh inputs of the same shapes (no new compile). Each comparison has a
negative control: a weight out of place must move the output far beyond the tolerance.
"""

import dataclasses
import importlib.util

import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.helpers.hunyuan_reference import seeded_weights
from tests.helpers.image_reference import CASES, FLUX1_TINY, SD_TINY, seeded_images
from tests.helpers.wan_reference import encode_fixture_path, fixture_path, seeded_latents, write_diffusers_folder
from vaeserve import models
from vaeserve.models.loading import WeightsError, build_vae
from vaeserve.models.shapes import FramesError, LatentsError

TOLERANCE = 2e-5
has_diffusers = importlib.util.find_spec("diffusers") is not None


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """One diffusers-format folder per case (decoder and encoder), written from the seeded weights."""
    root = tmp_path_factory.mktemp("images")
    return {name: write_diffusers_folder(root / name, config, seeded_weights(config, seed))
            for name, (config, seed, _, _) in CASES.items()}


@pytest.fixture(scope="module")
def loaded(folders):
    return {name: models.load_vae(folder) for name, folder in folders.items()}


def _max_diff(a, b) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


DECODES = [(name, shape) for name, (_, _, shapes, _) in CASES.items() for shape in shapes]
ENCODES = [(name, shape) for name, (_, _, _, shapes) in CASES.items() for shape in shapes]


@pytest.mark.parametrize("name,shape", DECODES, ids=[f"{n}-{'x'.join(map(str, s))}" for n, s in DECODES])
def test_decode_matches_diffusers_fixture(loaded, name, shape):
    fixture = load_file(str(fixture_path(name, shape)))
    expected = np.clip(fixture["frames"], -1, 1)  # diffusers returns them unclamped; we clamp, as pipelines do
    images = np.asarray(loaded[name].decode(fixture["latents"]))
    assert images.dtype == np.float32 and images.ndim == len(shape)  # images in, images out
    assert _max_diff(images, expected) <= TOLERANCE
    assert expected.std() > 0.05 and np.mean(np.abs(expected) < 1) > 0.95  # something to compare, not clamped away


@pytest.mark.parametrize("name,shape", ENCODES, ids=[f"{n}-{'x'.join(map(str, s))}" for n, s in ENCODES])
def test_encode_matches_diffusers_fixture(loaded, name, shape):
    fixture = load_file(str(encode_fixture_path(name, shape)))
    latents = np.asarray(loaded[name].encode(seeded_images(shape, CASES[name][1])))
    assert _max_diff(latents, fixture["mean"]) <= TOLERANCE
    assert fixture["mean"].std() > 0.1


@pytest.mark.parametrize("name, weight", [("sd_tiny", "decoder.mid_block.attentions.0.group_norm.weight"),
                                          ("flux2_tiny", "decoder.up_blocks.1.resnets.0.conv_shortcut.bias"),
                                          ("qwen_tiny", "decoder.mid_block.attentions.0.norm.gamma")])
def test_a_misplaced_weight_breaks_parity(loaded, folders, name, weight):
    """Negative control: the attention's GroupNorm weight (1.0), a shortcut's bias or Qwen-Image's
    RMS gamma scaled by 1.5 (run by the program compiled for the right weights: only the weights differ)."""
    config, seed, shapes, _ = CASES[name]
    fixture = load_file(str(fixture_path(name, shapes[0])))
    weights = seeded_weights(config, seed)
    weights[weight] *= 1.5
    wrong = models.load_vae(write_diffusers_folder(folders[name].parent / f"{name}-wrong", config, weights))
    images, _ = loaded[name].compile(shapes[0])(wrong.state, fixture["latents"])
    assert _max_diff(np.asarray(images), np.clip(fixture["frames"], -1, 1)) > 1e-2


def test_quant_convs_follow_the_config():
    """Flux.1 has no quant convs, SD has both: each config's checkpoint fits only its own layout."""
    flux1 = seeded_weights(FLUX1_TINY, 1)
    assert not any(n.startswith(("quant_conv.", "post_quant_conv.")) for n in flux1)
    sd_layout = dataclasses.replace(FLUX1_TINY, use_quant_conv=True, use_post_quant_conv=True)
    with pytest.raises(WeightsError, match="post_quant_conv.weight") as raised:
        build_vae(sd_layout, flux1, dtype="float32", metadata={})
    assert sorted(raised.value.missing) == ["post_quant_conv.bias", "post_quant_conv.weight", "quant_conv.bias",
                                            "quant_conv.weight"]


def test_normalisation_is_the_scaling_and_shift_factors():
    """A pipeline's latents decode as ``z / scaling_factor + shift_factor`` (SD: no shift), or with
    per-channel statistics ``z · latents_std / scaling_factor + latents_mean``; Flux.2's statistics
    are the pipeline's (patchified) business: identity here; Qwen-Image's are Wan 2.1's."""
    assert FLUX1_TINY.latents_mean == (0.1159,) * 16 and FLUX1_TINY.latents_std == (1 / 0.3611,) * 16
    assert SD_TINY.latents_mean == (0.0,) * 4 and SD_TINY.latents_std == (1 / 0.18215,) * 4
    sdxl = models.AutoencoderKLConfig.sdxl().to_dict()
    stats = models.config_from_dict({**sdxl, "latents_mean": [0.1, 0.2, 0.3, 0.4], "latents_std": [1, 2, 3, 4]})
    assert stats.latents_mean == (0.1, 0.2, 0.3, 0.4) and stats.latents_std == tuple(s / 0.13025 for s in (1, 2, 3, 4))
    assert stats.to_dict()["latents_std"] == [1, 2, 3, 4] and models.config_from_dict(stats.to_dict()) == stats
    assert CASES["flux2_tiny"][0].latents_std == (1.0,) * 8
    assert models.QwenImageConfig().latents_mean == models.WanVAEConfig().latents_mean


def test_image_shape_rules():
    """Images have no time axis; Qwen-Image also takes diffusers' one-frame clips, never longer ones."""
    sd, qwen = SD_TINY, models.QwenImageConfig()
    with pytest.raises(LatentsError, match=r"\(B, C, H, W\)") as raised:
        models.shapes.check_latents_shape((1, 4, 1, 3, 5), sd)
    assert raised.value.expected == "4 dimensions"
    models.shapes.check_latents_shape((1, 16, 1, 3, 5), qwen)
    with pytest.raises(LatentsError, match="one latent frame"):
        models.shapes.check_latents_shape((1, 16, 2, 3, 5), qwen)
    with pytest.raises(FramesError, match="one frame"):
        models.shapes.check_frames_shape((1, 3, 5, 16, 16), qwen)
    with pytest.raises(FramesError, match="multiple of 4") as raised:
        models.shapes.check_frames_shape((1, 3, 12, 18), sd)
    assert raised.value.expected == [16, 20]
    assert models.shapes.decoded_shape(sd, (2, 4, 3, 5)) == (2, 3, 12, 20)
    assert models.shapes.decoded_shape(sd, (2, 4, 3, 5), "uint8") == (2, 12, 20, 3)
    assert models.shapes.decoded_shape(qwen, (2, 16, 1, 3, 5)) == (2, 3, 1, 24, 40)
    assert models.shapes.clip_shape((2, 4, 3, 5)) == (2, 4, 1, 3, 5)


@pytest.mark.skipif(not has_diffusers, reason="needs diffusers + torch")
@pytest.mark.parametrize("name", CASES)
def test_live_decode_and_encode_match_diffusers(loaded, name):
    """Against diffusers itself, on inputs no fixture holds (the fixtures' shapes: no new compile)."""
    from tests.helpers.hunyuan_reference import reference_model
    from tests.helpers.image_reference import reference_decode, reference_posterior

    config, seed, decode_shapes, encode_shapes = CASES[name]
    reference = reference_model(config, seeded_weights(config, seed))
    latents = seeded_latents(decode_shapes[0], seed + 1000)
    assert _max_diff(np.asarray(loaded[name].decode(latents)), np.clip(reference_decode(reference, latents), -1, 1)) \
        <= TOLERANCE
    images = seeded_images(encode_shapes[0], seed + 1000)
    mean, _ = reference_posterior(reference, images)
    assert _max_diff(np.asarray(loaded[name].encode(images)), mean) <= TOLERANCE
