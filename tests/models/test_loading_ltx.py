"""Loading LTX-Video and LTX-2 from every form a user has: diffusers and pipeline folders (with the
pipeline's decode defaults), bare ``.safetensors`` files, Lightricks' single files (``vae.*`` among
the transformer's tensors), embedded names. Checked by comparing the weights held with those
written (no decode, no compile); the rename of Lightricks' names against diffusers' own converter."""

import importlib.util
import json

import jax
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import save_file

from tests.helpers.ltx_reference import CASES, seeded_weights
from tests.helpers.wan_reference import write_diffusers_folder
from vaeserve import models
from vaeserve.models import keys
from vaeserve.models.families.ltx import weights as ltx_weights
from vaeserve.models.family_modules import family_modules as family_of
from vaeserve.models.loading import (
    MODEL_NAMES,
    WeightsError,
    config_for_names,
    iter_diffusers_tensors,
)
from vaeserve.models.vae import abstract_module

has_diffusers = importlib.util.find_spec("diffusers") is not None
REAL = {"0.9.0": models.LTXVideoConfig(), "0.9.1": models.LTXVideoConfig.v091(), "0.9.5": models.LTXVideoConfig.v095(),
        "2.0": models.LTX2VideoConfig.ltx2(), "2.3": models.LTX2VideoConfig.ltx23()}


def _weights(name: str) -> dict[str, np.ndarray]:
    config, seed, _, _ = CASES[name]
    return seeded_weights(config, seed)


def _same_weights(a: models.VAE, b: models.VAE) -> bool:
    leaves = jax.tree.leaves((a.state, a.encoder_state)), jax.tree.leaves((b.state, b.encoder_state))
    return len(leaves[0]) == len(leaves[1]) and all(np.array_equal(x, y) for x, y in zip(*leaves, strict=True))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("reference")
    return {name: models.load_vae(write_diffusers_folder(root / name, config, _weights(name)))
            for name, (config, _, _, _) in CASES.items()}


def _names(config) -> list[str]:
    """Every parameter's diffusers name (decoder and encoder) of ``config``, from shapes alone."""
    family = family_of(config)
    return [keys.diffusers_key(path) for module in (family.decoder, family.encoder)
            for path, _ in nnx.to_flat_state(nnx.state(abstract_module(module, config, np.float32)))]


def _original(config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Diffusers-named weights in Lightricks' names, as a single file holds them (with the
    statistics diffusers drops, and tensors of other models)."""
    prefixes = ltx_weights.ltx_block_prefixes(config.decoder_plan(), config.encoder_plan())
    wrapped = config.decoder_plan().conv_shortcut_wrapped
    original = {ltx_weights.ltx_diffusers_to_original(n, prefixes, wrapped_shortcut=wrapped): t for n, t in weights.items()}
    z = config.z_dim
    original.update({"vae.per_channel_statistics.channel": np.arange(z, dtype=np.float32),
                     "vae.per_channel_statistics.mean-of-stds": np.ones(z, np.float32),
                     "model.diffusion_model.patchify_proj.weight": np.zeros((4, 4), np.float32),
                     "audio_vae.per_channel_statistics.mean-of-means": np.zeros(4, np.float32)})
    return original


@pytest.mark.parametrize("name", CASES)
def test_folder_roundtrip_keeps_the_statistics(tmp_path, reference, name):
    vae = reference[name]
    assert vae.config.statistics is not None
    again = models.load_vae(models.save_vae(vae, tmp_path / "again"))
    assert _same_weights(again, vae) and again.config == vae.config
    saved = dict(iter_diffusers_tensors(vae))
    np.testing.assert_array_equal(saved["latents_mean"], _weights(name)["latents_mean"])


def test_pipeline_folder_brings_its_decode_defaults(tmp_path, reference):
    config = CASES["ltx095"][0]
    write_diffusers_folder(tmp_path / "pipeline" / "vae", config, _weights("ltx095"))
    index = {"_class_name": "LTXPipeline", "decode_timestep": 0.03, "decode_noise_scale": 0.025}
    (tmp_path / "pipeline" / "model_index.json").write_text(json.dumps(index))
    vae = models.load_vae(tmp_path / "pipeline")
    assert _same_weights(vae, reference["ltx095"])
    assert vae.metadata["decode_timestep"] == 0.03 and vae.metadata["decode_noise_scale"] == 0.025
    conditions = vae.conditions(2, seed=1)
    assert conditions is not None
    assert np.all(conditions.timestep == np.float32(0.03)) and np.all(conditions.noise_scale == np.float32(0.025))
    assert reference["ltx095"].conditions(1, seed=1).timestep[0] == np.float32(0.05)  # a folder without a pipeline
    index["decode_timestep"] = "soon"
    (tmp_path / "pipeline" / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(models.ConfigError, match="decode_timestep"):
        models.load_vae(tmp_path / "pipeline")


@pytest.mark.parametrize("name", ["ltx090", "ltx23"])
def test_lightricks_single_file(tmp_path, reference, name):
    """A single file in Lightricks' names (LTX-Video's flat blocks with width-changing resnets;
    LTX-2.3's with temporal-only and spatial-only upsamplers) converts to a diffusers folder and
    loads; with a diffusers config.json beside it, it loads as it is."""
    config = CASES[name][0]
    original = _original(config, _weights(name))
    assert any(".res_blocks." in n for n in original)
    path = tmp_path / "model.safetensors"
    save_file(original, str(path))
    converted = models.convert_checkpoint(path, tmp_path / "converted", config=config)
    assert _same_weights(models.load_vae(converted), reference[name])
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    loaded = models.load_vae(path)
    assert _same_weights(loaded, reference[name]) and loaded.config == reference[name].config


@pytest.mark.parametrize("release", REAL)
def test_each_release_is_known_by_its_names(release):
    """The real configs' weights, named as Lightricks' single files name them, are recognised as
    their release; so are bare diffusers-named files (no config.json beside them)."""
    config = REAL[release]
    names = _names(config)
    prefixes = ltx_weights.ltx_block_prefixes(config.decoder_plan(), config.encoder_plan())
    wrapped = config.decoder_plan().conv_shortcut_wrapped
    original = [ltx_weights.ltx_diffusers_to_original(n, prefixes, wrapped_shortcut=wrapped) for n in names]
    assert ltx_weights.release_naming_config(original) == config and config_for_names(original) == config
    assert config_for_names([*names, "latents_mean", "latents_std"]) == config
    assert [ltx_weights.ltx_original_to_diffusers(n[4:], prefixes, wrapped_shortcut=wrapped) for n in original] == names


@pytest.mark.skipif(not has_diffusers, reason="needs diffusers")
@pytest.mark.parametrize("release", ["0.9.0", "0.9.1", "0.9.5", "2.0"])  # its LTX-2 table stops at 2.0's 7 blocks
def test_lightricks_names_match_diffusers_converter(release):
    """Our renaming of Lightricks' names agrees with diffusers' single-file converter, key for key."""
    from diffusers.loaders import single_file_utils as single

    config = REAL[release]
    names = [*_names(config), "latents_mean", "latents_std"]
    prefixes = ltx_weights.ltx_block_prefixes(config.decoder_plan(), config.encoder_plan())
    wrapped = config.decoder_plan().conv_shortcut_wrapped
    checkpoint = {ltx_weights.ltx_diffusers_to_original(n, prefixes, wrapped_shortcut=wrapped): np.zeros((1, 1))
                  for n in names}
    if isinstance(config, models.LTXVideoConfig):
        checkpoint["vae.encoder.conv_out.conv.weight"] = np.zeros((129, 2048 if release == "0.9.5" else 512))
        theirs = single.convert_ltx_vae_checkpoint_to_diffusers(checkpoint)
    else:
        theirs = single.convert_ltx2_vae_to_diffusers(checkpoint)
    assert sorted(theirs) == sorted(names)


def test_missing_and_unexpected_tensors_are_listed(tmp_path):
    config = CASES["ltx2_causal"][0]
    weights = _weights("ltx2_causal")
    del weights["decoder.up_blocks.1.upsamplers.0.conv.conv.bias"]
    weights["decoder.up_blocks.1.extra"] = np.zeros(3, np.float32)
    weights["decoder.conv_in.conv.weight"] = weights["decoder.conv_in.conv.weight"][:, :4]
    with pytest.raises(WeightsError) as error:
        models.load_vae(write_diffusers_folder(tmp_path / "broken", config, weights))
    assert error.value.missing == ["decoder.up_blocks.1.upsamplers.0.conv.conv.bias"]
    assert error.value.unexpected == ["decoder.up_blocks.1.extra"]
    assert error.value.misshaped and error.value.misshaped[0].startswith("decoder.conv_in.conv.weight")


def test_embedded_names_are_the_real_architectures():
    assert MODEL_NAMES["ltx-video"]() == REAL["0.9.5"] and MODEL_NAMES["ltx2"]() == REAL["2.0"]
    for name, scale, lookahead in (("ltx-video", 32, 22), ("ltx2", 32, 22)):
        config = models.load_config(name)
        assert (config.spatial_scale, config.temporal_scale, config.z_dim) == (scale, 8, 128)
        assert not config.causal and config.lookahead == lookahead
    assert models.load_config("ltx-video").decode_conditions and not models.load_config("ltx2").decode_conditions
    assert models.load_config("ltx2").min_latent_size == 2  # LTX-2.0 pads by reflection


@pytest.mark.skipif(not has_diffusers, reason="needs diffusers + torch")
@pytest.mark.parametrize("name", ["ltx095", "ltx2_causal"])
def test_folder_saved_by_diffusers(tmp_path, reference, name):
    from tests.helpers.ltx_reference import reference_model

    reference_model(CASES[name][0], _weights(name)).save_pretrained(tmp_path / "saved")
    vae = models.load_vae(tmp_path / "saved")
    assert _same_weights(vae, reference[name]) and vae.config == reference[name].config
