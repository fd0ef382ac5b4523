"""Checkpoint formats, the original-Wan key mapping, and the errors for checkpoints that do not fit."""

import json
import re

import jax
import numpy as np
import pytest

from tests.helpers.wan_reference import (
    seeded_decoder_weights,
    seeded_encoder_weights,
    seeded_latents,
    write_diffusers_folder,
)
from vaeserve import models
from vaeserve.models import keys
from vaeserve.models.families.wan import weights as wan_weights
from vaeserve.models.loading import WEIGHTS_NAME

CONFIG = models.WanVAEConfig(base_dim=8, num_res_blocks=1)
LATENTS = seeded_latents((1, 16, 2, 3, 4), 11)


@pytest.fixture(scope="module")
def weights():
    return seeded_decoder_weights(CONFIG, 5)


@pytest.fixture(scope="module")
def reference_frames(weights, tmp_path_factory):
    folder = write_diffusers_folder(tmp_path_factory.mktemp("ref"), CONFIG, weights)
    return np.asarray(models.load_vae(folder).decode(LATENTS))


def test_pipeline_folder_uses_its_vae_subfolder(tmp_path, weights, reference_frames):
    write_diffusers_folder(tmp_path / "vae", CONFIG, weights)
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline", "vae": ["diffusers", "AutoencoderKLWan"]}))
    vae = models.load_vae(tmp_path)
    assert vae.metadata["random_weights"] is False
    assert np.array_equal(np.asarray(vae.decode(LATENTS)), reference_frames)


def test_bfloat16_checkpoint_loads(tmp_path, weights):
    import jax.numpy as jnp
    from safetensors.flax import save_file

    folder = write_diffusers_folder(tmp_path, CONFIG, weights)
    save_file({k: jnp.asarray(v, jnp.bfloat16) for k, v in weights.items()}, str(folder / WEIGHTS_NAME))
    vae = models.load_vae(folder)  # float32 model from bfloat16 weights
    variable = vae.state["decoder"]["conv_in"]["kernel"]
    kernel = np.asarray(variable[...])
    assert kernel.dtype == np.float32
    expected = keys.from_torch(variable, weights["decoder.conv_in.weight"])
    assert 0 < np.abs(kernel - expected).max() <= 1e-2 * np.abs(expected).max()  # bf16 rounding, nothing else


def test_every_key_problem_is_reported_at_once(tmp_path, weights):
    broken = dict(weights)
    del broken["decoder.conv_in.weight"]
    del broken["decoder.mid_block.attentions.0.proj.bias"]
    broken["decoder.extra_layer.weight"] = np.zeros(3, np.float32)
    broken["decoder.norm_out.gamma"] = np.ones((5, 1, 1, 1), np.float32)
    with pytest.raises(models.WeightsError) as info:
        models.load_vae(write_diffusers_folder(tmp_path, CONFIG, broken))
    error = info.value
    assert error.missing == ["decoder.conv_in.weight", "decoder.mid_block.attentions.0.proj.bias"]
    assert error.unexpected == ["decoder.extra_layer.weight"]
    assert error.misshaped == ["decoder.norm_out.gamma: expected (8, 1, 1, 1), received (5, 1, 1, 1)"]
    assert "2 missing" in str(error) and "1 unexpected" in str(error) and "1 mis-shaped" in str(error)


# -- the encoder: optional as a whole ------------------------------------------------------------------
def test_decode_only_checkpoint_says_it_cannot_encode(tmp_path, weights):
    """(Every other test here decodes from decoder-only checkpoints.)"""
    vae = models.load_vae(write_diffusers_folder(tmp_path, CONFIG, weights))
    assert not vae.has_encoder and vae.metadata["encoder_parameters"] == 0
    with pytest.raises(models.NoEncoderError, match=r"can decode but not encode: it has no encoder weights"):
        vae.encode(np.zeros((1, 3, 1, 8, 8), np.float32))


def test_a_partial_encoder_is_reported_like_any_missing_tensor(tmp_path, weights):
    encoder = seeded_encoder_weights(CONFIG, 5)
    del encoder["encoder.conv_out.bias"]
    encoder["quant_conv.weight"] = np.zeros((32, 32, 1, 1), np.float32)  # a 2-D kernel where diffusers has 3-D
    with pytest.raises(models.WeightsError) as info:
        models.load_vae(write_diffusers_folder(tmp_path, CONFIG, {**weights, **encoder}))
    assert info.value.missing == ["encoder.conv_out.bias"] and not info.value.unexpected
    assert info.value.misshaped == ["quant_conv.weight: expected (32, 32, 1, 1, 1), received (32, 32, 1, 1)"]


def test_an_encoder_this_config_cannot_run_is_skipped_with_the_reason(tmp_path, caplog):
    """diffusers builds an encoder for num_res_blocks=0 that fails at run time; we load such a
    checkpoint for decoding and say why it cannot encode."""
    config = models.WanVAEConfig(base_dim=8, num_res_blocks=0, dim_mult=(1, 2), temperal_downsample=(True,),
                                 scale_factor_spatial=2, scale_factor_temporal=2)
    weights = {**seeded_decoder_weights(config, 5), "encoder.conv_in.weight": np.zeros((8, 3, 3, 3, 3), np.float32)}
    with caplog.at_level("WARNING", logger="vaeserve.models"):
        vae = models.load_vae(write_diffusers_folder(tmp_path, config, weights))
    assert not vae.has_encoder and "encoder weights skipped" in caplog.text
    with pytest.raises(models.NoEncoderError, match="num_res_blocks=0 with encoder widths \\[8, 8, 16\\]"):
        vae.require_encoder()
    assert not models.init_vae(config).has_encoder  # the same for random weights


def test_save_vae_writes_both_halves_and_they_load_back(tmp_path):
    vae = models.init_vae(CONFIG, seed=3)
    again = models.load_vae(models.save_vae(vae, tmp_path))
    assert again.has_encoder and again.metadata["encoder_parameters"] == vae.metadata["encoder_parameters"] > 0
    for ours, theirs in ((vae.state, again.state), (vae.encoder_state, again.encoder_state)):
        assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True))
    decode_only = models.load_vae(models.save_vae(models.init_vae(CONFIG, encoder=False), tmp_path / "decoder"))
    assert not decode_only.has_encoder


@pytest.mark.parametrize(
    "change,message",
    [({"out_channels": 4}, "out_channels=4; expected 3"),
     ({"patch_size": 2}, "out_channels=3; expected 12 (RGB x patch_size²)"),
     ({"is_residual": True, "dim_mult": [1, 2, 3, 3]}, "up block 2: DupUp3D needs 24 | 16·4"),
     ({"new_knob": 1}, "unknown AutoencoderKLWan config keys: ['new_knob']"),
     ({"_class_name": "AutoencoderKLMochi"}, "config _class_name is 'AutoencoderKLMochi'; expected one of"),
     ({"latents_mean": [0.0] * 4}, "latents_mean/latents_std")],
)
def test_unsupported_configs_are_refused(tmp_path, weights, change, message):
    folder = write_diffusers_folder(tmp_path, CONFIG, weights)
    raw = json.loads((folder / "config.json").read_text())
    raw.update(change)
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(models.ConfigError, match=re.escape(message)):
        models.load_vae(folder)


def test_config_round_trips_every_diffusers_key():
    diffusers = pytest.importorskip("diffusers")
    import inspect

    diffusers_keys = set(inspect.signature(diffusers.AutoencoderKLWan.__init__).parameters) - {"self"}
    ours = set(models.WanVAEConfig().to_dict()) - {"_class_name"}
    assert diffusers_keys == ours
    assert models.WanVAEConfig.from_dict(models.WanVAEConfig().to_dict()) == models.WanVAEConfig()


def test_default_model_is_the_real_architecture_with_random_weights(caplog):
    with caplog.at_level("WARNING", logger="vaeserve.models"):
        vae = models.load_vae()
    assert "RANDOM weights" in caplog.text
    assert vae.metadata["random_weights"] is True and "embedded default" in vae.metadata["source"]
    assert vae.config == models.WanVAEConfig()
    decoder_params = vae.metadata["parameters"] - 16 * 16 - 16  # minus post_quant_conv
    assert 72e6 < decoder_params < 74e6  # ≈ 73 M decoder parameters
    assert vae.metadata["encoder_parameters"] == 53_596_928  # diffusers' encoder + quant_conv, exactly
    again = models.load_vae()
    first = vae.state["decoder"]["conv_out"]["kernel"][...]
    assert np.array_equal(np.asarray(first), np.asarray(again.state["decoder"]["conv_out"]["kernel"][...]))


# -- original Wan release format ---------------------------------------------------------------------
def test_original_key_mapping_agrees_with_diffusers_converter():
    """Our general mapping, inverted on diffusers' real-config names, must be what diffusers'
    own converter maps back: two independent implementations agree on every key."""
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

    with torch.device("meta"):
        reference = diffusers.AutoencoderKLWan()
    names = list(reference.state_dict())
    original = {wan_weights.diffusers_to_original(n, 2): n for n in names}
    assert len(original) == len(names)
    converted = convert_wan_vae_to_diffusers({old: old for old in original})  # value: the original name
    assert sorted(converted) == sorted(names)
    for new, old in converted.items():
        assert wan_weights.diffusers_to_original(new, 2) == old
        assert wan_weights.original_to_diffusers(old, 2) == new
    assert "decoder.upsamples.4.shortcut.weight" in original and "decoder.middle.1.to_qkv.weight" in original


def _write_original_pth(path, weights, num_res_blocks):
    """The original release's names for the decoder and (seeded) encoder, as ``torch.save`` writes them."""
    torch = pytest.importorskip("torch")
    everything = {**weights, **seeded_encoder_weights(CONFIG, 5)}
    state = {wan_weights.diffusers_to_original(k, num_res_blocks): torch.from_numpy(v) for k, v in everything.items()}
    assert "encoder.downsamples.1.resample.1.weight" in state and "conv1.weight" in state
    torch.save(state, path)
    return state


def test_original_pth_loads_and_converts(tmp_path, weights, reference_frames):
    pth = tmp_path / "Wan2.1_VAE.pth"
    _write_original_pth(pth, weights, CONFIG.num_res_blocks)
    (tmp_path / "config.json").write_text(json.dumps(CONFIG.to_dict()))
    from_pth = models.load_vae(pth)
    assert np.array_equal(np.asarray(from_pth.decode(LATENTS)), reference_frames)
    assert from_pth.has_encoder  # the original's encoder.* / conv1.* land in our encoder

    out = models.convert_checkpoint(pth, tmp_path / "converted", config=CONFIG)
    from safetensors import safe_open

    with safe_open(str(out / WEIGHTS_NAME), framework="numpy") as f:
        names = set(f.keys())
    assert "encoder.conv_in.weight" in names and "quant_conv.weight" in names
    converted = models.load_vae(out)
    assert np.array_equal(np.asarray(converted.decode(LATENTS)), reference_frames)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(converted.encoder_state),
                                                    jax.tree.leaves(from_pth.encoder_state), strict=True))


def test_converted_real_config_loads_in_diffusers(tmp_path):
    """A full-size original checkpoint (random) converts into a folder diffusers itself loads."""
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    source = diffusers.AutoencoderKLWan(base_dim=8, num_res_blocks=2).eval()
    state = {wan_weights.diffusers_to_original(k, 2): v for k, v in source.state_dict().items()}
    torch.save(state, tmp_path / "Wan2.1_VAE.pth")
    config = models.WanVAEConfig(base_dim=8, num_res_blocks=2)
    out = models.convert_checkpoint(tmp_path / "Wan2.1_VAE.pth", tmp_path / "out", config=config)
    again = diffusers.AutoencoderKLWan.from_pretrained(out)
    for name, value in source.state_dict().items():
        assert torch.equal(again.state_dict()[name], value), name


def test_convert_command_line(tmp_path, weights, reference_frames):
    from vaeserve.service.cli import main

    _write_original_pth(tmp_path / "Wan2.1_VAE.pth", weights, CONFIG.num_res_blocks)
    (tmp_path / "tiny.json").write_text(json.dumps(CONFIG.to_dict()))
    assert main(["convert", str(tmp_path / "Wan2.1_VAE.pth"), str(tmp_path / "out"), "--config", str(tmp_path / "tiny.json")]) == 0
    assert np.array_equal(np.asarray(models.load_vae(tmp_path / "out").decode(LATENTS)), reference_frames)
    with pytest.raises(models.WeightsError):  # the default (Wan 2.1) config does not fit these weights
        main(["convert", str(tmp_path / "Wan2.1_VAE.pth"), str(tmp_path / "wrong")])
    assert not (tmp_path / "wrong").exists()  # nothing written for a checkpoint that does not fit
