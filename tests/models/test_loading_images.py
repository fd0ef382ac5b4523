"""Loading the image VAEs from every form they are published in: diffusers and pipeline folders,
bare ``.safetensors`` files, latent diffusion's single files (SD/SDXL checkpoints, stand-alone VAE
files, Flux's ``ae.safetensors``), Qwen-Image in Wan's original names, and the embedded names. Each
load is checked by comparing the weights it holds with those written (no decode, no compile)."""

import importlib.util
import json

import jax
import numpy as np
import pytest
from safetensors.numpy import save_file

from tests.helpers.hunyuan_reference import seeded_weights
from tests.helpers.image_reference import CASES
from tests.helpers.wan_reference import write_diffusers_folder
from vaeserve import models
from vaeserve.models import keys
from vaeserve.models.families.kl import weights as kl_weights
from vaeserve.models.families.wan import weights as wan_weights
from vaeserve.models.loading import MODEL_NAMES, config_for_names


def _weights(name: str) -> dict[str, np.ndarray]:
    config, seed, _, _ = CASES[name]
    return seeded_weights(config, seed)


def _same_weights(a: models.VAE, b: models.VAE) -> bool:
    leaves = jax.tree.leaves((a.state, a.encoder_state)), jax.tree.leaves((b.state, b.encoder_state))
    return len(leaves[0]) == len(leaves[1]) and all(np.array_equal(x, y) for x, y in zip(*leaves, strict=True))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Each case loaded from its diffusers folder: what every other form must give."""
    root = tmp_path_factory.mktemp("reference")
    return {name: models.load_vae(write_diffusers_folder(root / name, config, _weights(name)))
            for name, (config, _, _, _) in CASES.items()}


def _ldm(weights: dict[str, np.ndarray], blocks: int, prefix: str = "") -> dict[str, np.ndarray]:
    """Weights in latent diffusion's names, the attention's linear layers as 1x1 convs."""
    out = {}
    for name, tensor in weights.items():
        ldm = prefix + kl_weights.diffusers_to_ldm(name, blocks)
        out[ldm] = tensor[:, :, None, None] if ".mid.attn_1." in ldm and ldm.endswith(("q.weight", "k.weight",
                                                                                          "v.weight", "out.weight")) \
            else tensor
    return out


@pytest.mark.parametrize("name", CASES)
def test_pipeline_folder_and_bare_file(tmp_path, reference, name):
    config = CASES[name][0]
    write_diffusers_folder(tmp_path / "pipeline" / "vae", config, _weights(name))
    (tmp_path / "pipeline" / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))
    assert models.load_config(tmp_path / "pipeline") == config
    assert _same_weights(models.load_vae(tmp_path / "pipeline"), reference[name])
    bare = tmp_path / "bare" / "vae.safetensors"  # no config.json: the family comes from the names
    bare.parent.mkdir()
    save_file(_weights(name), str(bare))
    real = {"sd_tiny": models.AutoencoderKLConfig.sd(), "flux1_tiny": models.AutoencoderKLConfig.flux1(),
            "flux2_tiny": models.AutoencoderKLFlux2Config(), "qwen_tiny": models.WanVAEConfig()}[name]
    assert models.load_config(bare) == real  # Qwen-Image's names are Wan's: its config.json says which


@pytest.mark.parametrize("name, prefix", [("sd_tiny", "first_stage_model."), ("flux1_tiny", ""), ("flux2_tiny", "")])
def test_latent_diffusion_single_file(tmp_path, reference, name, prefix):
    """An SD checkpoint holds its VAE under ``first_stage_model.`` beside the UNet and text encoder
    (passed over); Flux's ``ae.safetensors`` is the VAE alone (Flux.2's with its BatchNorm count,
    a training bookkeeping tensor, passed over too)."""
    config = CASES[name][0]
    ldm = _ldm(_weights(name), len(config.block_out_channels), prefix)
    assert f"{prefix}decoder.up.0.block.0.norm1.weight" in ldm and f"{prefix}encoder.mid.attn_1.q.weight" in ldm
    ldm |= {"model.diffusion_model.out.0.weight": np.zeros(3, np.float32)} if prefix else {}
    ldm |= {"bn.num_batches_tracked": np.array(7, np.int64)} if name == "flux2_tiny" else {}
    file = tmp_path / "checkpoint.safetensors"
    save_file(ldm, str(file))
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    assert _same_weights(models.load_vae(file), reference[name])
    converted = models.convert_checkpoint(file, tmp_path / "converted", config=config)
    assert _same_weights(models.load_vae(converted), reference[name])


def test_latent_diffusion_names_tell_the_real_config():
    """Without a config.json the names decide: Flux.2 (bn), Flux.1 (no post_quant_conv), SDXL (a
    whole checkpoint with SDXL's text encoders), else SD; diffusers' names of AutoencoderKL (plain
    ``conv_in``) are not HunyuanVideo's (wrapped ``conv_in.conv``)."""
    sd = list(_ldm(_weights("sd_tiny"), 3, "first_stage_model."))
    assert config_for_names(sd) == models.AutoencoderKLConfig.sd()
    assert config_for_names([*sd, "conditioner.embedders.1.model.ln_final.weight"]) == models.AutoencoderKLConfig.sdxl()
    assert config_for_names(list(_ldm(_weights("flux1_tiny"), 2))) == models.AutoencoderKLConfig.flux1()
    assert config_for_names(list(_ldm(_weights("flux2_tiny"), 3))) == models.AutoencoderKLFlux2Config()
    assert config_for_names(list(_weights("sd_tiny"))) == models.AutoencoderKLConfig.sd()
    assert type(config_for_names(["decoder.conv_norm_out.weight", "decoder.conv_in.conv.weight"])) is \
        models.HunyuanVideoConfig


def test_qwen_image_in_wan_original_names_with_its_config(tmp_path, reference):
    """Qwen-Image's weights in the original Wan release's names (ComfyUI's file): with Qwen-Image's
    config.json beside them they load as Qwen-Image."""
    config = CASES["qwen_tiny"][0]
    original = {wan_weights.diffusers_to_original(n, config.num_res_blocks): t for n, t in _weights("qwen_tiny").items()}
    assert "decoder.middle.1.norm.gamma" in original
    save_file(original, str(tmp_path / "qwen_image_vae.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    vae = models.load_vae(tmp_path / "qwen_image_vae.safetensors")
    assert vae.config == config and _same_weights(vae, reference["qwen_tiny"])


def test_flux2_batch_norm_statistics_round_trip(tmp_path, reference):
    vae = reference["flux2_tiny"]
    stats = _weights("flux2_tiny")
    assert np.array_equal(vae.state["bn"]["running_var"][...], stats["bn.running_var"])
    folder = models.save_vae(vae, tmp_path / "saved")
    assert _same_weights(models.load_vae(folder), vae)


EMBEDDED = {"sd": (models.AutoencoderKLConfig, 4, 0.18215), "sdxl": (models.AutoencoderKLConfig, 4, 0.13025),
            "flux1": (models.AutoencoderKLConfig, 16, 0.3611), "flux2": (models.AutoencoderKLFlux2Config, 32, None),
            "qwen-image": (models.QwenImageConfig, 16, None)}


@pytest.mark.parametrize("name", EMBEDDED)
def test_embedded_names_are_the_real_architectures(name):
    """Every embedded image name is the real config; with torch, diffusers builds the same tensors
    (names and shapes) from it as our modules hold (on the meta device: nothing is drawn)."""
    kind, channels, scaling = EMBEDDED[name]
    config = models.load_config(name)
    assert type(config) is kind and config.z_dim == channels and config.is_image and config.spatial_scale == 8
    assert getattr(config, "scaling_factor", None) == scaling
    assert name in MODEL_NAMES
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    from flax import nnx

    from vaeserve.models.family_modules import family_modules as family_of
    from vaeserve.models.vae import abstract_module

    with torch.device("meta"):
        theirs = getattr(diffusers, config.class_name)(**{k: v for k, v in config.to_dict().items()
                                                          if k != "_class_name"})
    expected = {k: tuple(v.shape) for k, v in theirs.state_dict().items() if k != "bn.num_batches_tracked"}
    family = family_of(config)
    ours = {}
    for module in (family.decoder, family.encoder):
        for path, var in nnx.to_flat_state(nnx.state(abstract_module(module, config, np.float32))):
            ours[keys.diffusers_key(path)] = keys.torch_shape(var)
    assert ours == expected


@pytest.mark.skipif(importlib.util.find_spec("diffusers") is None, reason="needs diffusers + torch")
def test_diffusers_reads_our_latent_diffusion_names_as_we_do(tmp_path):
    """diffusers' own single-file loader reads the latent-diffusion file we write into the weights we
    wrote: our renames are its renames (two implementations agree on every key)."""
    import diffusers

    config = CASES["sd_tiny"][0]
    weights = _weights("sd_tiny")
    save_file(_ldm(weights, 3), str(tmp_path / "vae.safetensors"))
    write_diffusers_folder(tmp_path / "config" / "vae", config, weights)
    model = diffusers.AutoencoderKL.from_single_file(str(tmp_path / "vae.safetensors"),
                                                     config=str(tmp_path / "config"), subfolder="vae")
    theirs = {k: v.numpy() for k, v in model.state_dict().items()}
    assert theirs.keys() == weights.keys()
    assert all(np.array_equal(theirs[k], weights[k]) for k in weights)


@pytest.mark.parametrize("kind", [models.AutoencoderKLConfig, models.AutoencoderKLFlux2Config, models.QwenImageConfig])
def test_configs_hold_every_diffusers_key(kind):
    """Our config classes take (and write back) exactly the keys of diffusers' classes."""
    diffusers = pytest.importorskip("diffusers")
    import inspect

    theirs = set(inspect.signature(getattr(diffusers, kind.class_name).__init__).parameters) - {"self"}
    assert set(kind().to_dict()) - {"_class_name"} == theirs
    assert kind.from_dict(kind().to_dict()) == kind()
