"""Wan 2.2 checkpoints: the original ``Wan2.2_VAE.pth`` naming, full (encoder + decoder) folders, the
published config, and the embedded ``"wan2.2"`` model."""

import json

import numpy as np
import pytest
from flax import nnx

from tests.helpers.wan_reference import WAN22_SMALL, perturbed_diffusers_vae
from vaeserve import models
from vaeserve.models.families.wan import weights as wan_weights
from vaeserve.models.families.wan.config import WAN22_LATENTS_MEAN, WAN22_LATENTS_STD
from vaeserve.models.loading import embedded_vae

# The published vae/config.json of Wan-AI/Wan2.2-TI2V-5B-Diffusers, including ``clip_output``,
# which diffusers' AutoencoderKLWan drops.
PUBLISHED = {
    "latents_mean": list(WAN22_LATENTS_MEAN), "latents_std": list(WAN22_LATENTS_STD),
    "_class_name": "AutoencoderKLWan", "_diffusers_version": "0.35.0.dev0", "attn_scales": [], "base_dim": 160,
    "clip_output": False, "decoder_base_dim": 256, "dim_mult": [1, 2, 4, 4], "dropout": 0.0, "in_channels": 12,
    "is_residual": True, "num_res_blocks": 2, "out_channels": 12, "patch_size": 2, "scale_factor_spatial": 16,
    "scale_factor_temporal": 4, "temperal_downsample": [False, True, True], "z_dim": 48,
}

# Real key names of the original release (Wan2.2 ``wan/modules/vae2_2.py``: blocks nest their layers;
# the decoder's upsampler is layer R+1 = 3 of its block, the encoder's downsampler layer R = 2).
ORIGINAL_22 = {
    "conv2.weight": "post_quant_conv.weight",
    "decoder.conv1.bias": "decoder.conv_in.bias",
    "decoder.middle.1.to_qkv.weight": "decoder.mid_block.attentions.0.to_qkv.weight",
    "decoder.upsamples.0.upsamples.0.residual.0.gamma": "decoder.up_blocks.0.resnets.0.norm1.gamma",
    "decoder.upsamples.0.upsamples.3.time_conv.weight": "decoder.up_blocks.0.upsampler.time_conv.weight",
    "decoder.upsamples.2.upsamples.3.resample.1.bias": "decoder.up_blocks.2.upsampler.resample.1.bias",
    "decoder.upsamples.2.upsamples.0.shortcut.weight": "decoder.up_blocks.2.resnets.0.conv_shortcut.weight",
    "decoder.upsamples.3.upsamples.2.residual.6.bias": "decoder.up_blocks.3.resnets.2.conv2.bias",
    "decoder.head.2.weight": "decoder.conv_out.weight",
    "encoder.downsamples.0.downsamples.2.resample.1.weight": "encoder.down_blocks.0.downsampler.resample.1.weight",
    "encoder.downsamples.1.downsamples.2.time_conv.weight": "encoder.down_blocks.1.downsampler.time_conv.weight",
    "encoder.downsamples.1.downsamples.0.shortcut.weight": "encoder.down_blocks.1.resnets.0.conv_shortcut.weight",
}


def test_published_config_is_the_real_wan22():
    config = models.WanVAEConfig.from_dict(PUBLISHED)
    assert config == models.WanVAEConfig.wan22()
    assert (config.z_dim, config.spatial_scale, config.temporal_scale, config.patch) == (48, 16, 4, 2)
    assert config.decoder_dims == (1024, 1024, 1024, 512, 256)
    assert config.num_output_frames(31) == 121  # TI2V-5B's native 121 frames


def test_original_names_map_both_ways():
    for original, diffusers_name in ORIGINAL_22.items():
        assert wan_weights.original_to_diffusers(original, 2) == diffusers_name
        assert wan_weights.diffusers_to_original(diffusers_name, 2, residual=True) == original
    assert wan_weights.release_naming_config(ORIGINAL_22) == models.WanVAEConfig.wan22()
    assert wan_weights.release_naming_config(["decoder.upsamples.3.time_conv.weight"]) == models.WanVAEConfig()


def test_every_real_diffusers_name_round_trips():
    """All 2.2 names (encoder included) of diffusers' real-config model map to distinct original
    names and back; Wan 2.1's flat mapping would collide them."""
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    with torch.device("meta"):
        reference = diffusers.AutoencoderKLWan(**{k: v for k, v in PUBLISHED.items()
                                                  if not k.startswith("_") and k != "clip_output"})
    names = list(reference.state_dict())
    original = {wan_weights.diffusers_to_original(n, 2, residual=True): n for n in names}
    assert len(original) == len(names) and set(ORIGINAL_22) <= set(original)
    assert all(wan_weights.original_to_diffusers(old, 2) == new for old, new in original.items())


@pytest.fixture(scope="module")
def reference():
    """diffusers' small 2.2 model (perturbed), encoder included."""
    pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    return perturbed_diffusers_vae(WAN22_SMALL, seed=8)


def _same_weights(a: models.VAE, b: models.VAE) -> bool:
    """Both halves: the decoder's weights and the encoder's (which both models must have)."""
    assert a.has_encoder and b.has_encoder
    return all(_same_state(x, y) for x, y in ((a.state, b.state), (a.encoder_state, b.encoder_state)))


def _same_state(a, b) -> bool:
    left, right = nnx.to_flat_state(a), nnx.to_flat_state(b)
    return [p for p, _ in left] == [p for p, _ in right] and all(
        np.array_equal(np.asarray(x[...]), np.asarray(y[...])) for (_, x), (_, y) in zip(left, right, strict=True))


def test_original_pth_loads_and_converts_to_a_folder_diffusers_loads(tmp_path, reference):
    import diffusers
    import torch

    reference.save_pretrained(tmp_path / "diffusers")  # a full checkpoint: encoder tensors present
    from_folder = models.load_vae(tmp_path / "diffusers")
    encoder_tensors = sum(v.numel() for k, v in reference.state_dict().items()
                          if k.startswith(("encoder.", "quant_conv.")))
    assert from_folder.metadata["encoder_parameters"] == encoder_tensors > 0  # both halves loaded
    assert "encoder.downsamples.1.downsamples.1.resample.1.weight" in {  # R = 1: the downsampler is layer 1
        wan_weights.diffusers_to_original(k, 1, residual=True) for k in reference.state_dict()}
    state = {wan_weights.diffusers_to_original(k, 1, residual=True): v for k, v in reference.state_dict().items()}
    assert "decoder.upsamples.1.upsamples.2.time_conv.weight" in state  # R = 1: the upsampler is layer 2
    torch.save(state, tmp_path / "Wan2.2_VAE.pth")
    (tmp_path / "config.json").write_text(json.dumps(from_folder.config.to_dict()))
    assert _same_weights(models.load_vae(tmp_path / "Wan2.2_VAE.pth"), from_folder)

    out = models.convert_checkpoint(tmp_path / "Wan2.2_VAE.pth", tmp_path / "converted", config=from_folder.config)
    assert _same_weights(models.load_vae(out), from_folder)
    again = diffusers.AutoencoderKLWan.from_pretrained(out)
    for name, value in reference.state_dict().items():
        assert torch.equal(again.state_dict()[name], value), name


def test_embedded_models_by_name():
    """``load_vae("wan2.2")`` builds ``MODEL_NAMES["wan2.2"]`` with seeded random weights, encoder
    included (the service test ``test_embedded_wan22_from_the_environment`` loads it for real:
    555 M decoder + 150 M encoder parameters take ~30 s to draw)."""
    assert models.MODEL_NAMES["wan2.2"]() == models.WanVAEConfig.wan22()
    assert models.MODEL_NAMES["wan2.1"]() == models.WanVAEConfig()
    with pytest.raises(ValueError, match="no embedded model 'wan3'"):
        embedded_vae("wan3")
    assert models.load_config("wan2.2") == models.WanVAEConfig.wan22()


def test_config_of_an_original_checkpoint_from_its_key_names(tmp_path):
    """Without a config.json beside it, ``Wan2.2_VAE.pth`` is known by its nested block names."""
    torch = pytest.importorskip("torch")
    torch.save({name: torch.zeros(1) for name in ORIGINAL_22}, tmp_path / "Wan2.2_VAE.pth")
    assert models.load_config(tmp_path / "Wan2.2_VAE.pth") == models.WanVAEConfig.wan22()
