"""Loading HunyuanVideo 1.0 / 1.5 from every form a user has: diffusers and pipeline folders, bare
``.safetensors`` files, the original Tencent checkpoints, embedded names. Each load is checked by
comparing the weights it holds with those written (no decode, no compile)."""

import json

import jax
import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

from tests.helpers.hunyuan_reference import CASES, seeded_weights
from tests.helpers.wan_reference import write_diffusers_folder
from vaeserve import models
from vaeserve.models.families.hunyuan15 import weights as hy15_weights
from vaeserve.models.loading import WEIGHTS_NAME, config_for_names


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


@pytest.mark.parametrize("name", CASES)
def test_pipeline_folder_and_bare_file(tmp_path, reference, name):
    config = CASES[name][0]
    write_diffusers_folder(tmp_path / "pipeline" / "vae", config, _weights(name))
    (tmp_path / "pipeline" / "model_index.json").write_text(json.dumps({"_class_name": "HunyuanVideoPipeline"}))
    assert models.load_config(tmp_path / "pipeline") == config
    assert _same_weights(models.load_vae(tmp_path / "pipeline"), reference[name])
    bare = tmp_path / "bare" / "vae.safetensors"  # no config.json: the family comes from the names
    bare.parent.mkdir()
    save_file(_weights(name), str(bare))
    assert models.load_config(bare) == type(config)()  # the real config of that family


def test_original_hunyuan15_names_with_its_own_config(tmp_path, reference):
    """tencent/HunyuanVideo-1.5's ``vae/``: ``decoder.up.{i}.block.{j}`` names and a config.json that
    is no diffusers config: the names decide, and the tensors load renamed."""
    config = CASES["hy15_tiny"][0]
    original = {hy15_weights.hunyuan15_diffusers_to_original(n): t for n, t in _weights("hy15_tiny").items()}
    assert "decoder.up.0.upsample.conv.conv.weight" in original and "decoder.mid.attn_1.q.weight" in original
    folder = tmp_path / "vae"
    folder.mkdir()
    save_file(original, str(folder / WEIGHTS_NAME))
    (folder / "config.json").write_text(json.dumps({"_class_name": "AutoencoderKLConv3D", "latent_channels": 16}))
    assert isinstance(config_for_names(original), models.HunyuanVideo15Config)
    # The real 1.5 config is what the names imply; the tiny weights need their own config: pass it.
    converted = models.convert_checkpoint(folder / WEIGHTS_NAME, tmp_path / "converted", config=config)
    assert models.load_config(converted) == config
    assert _same_weights(models.load_vae(converted), reference["hy15_tiny"])


def test_original_hunyuan10_checkpoint(tmp_path, reference):
    """HunyuanVideo's ``vae/pytorch_model.pt``: diffusers' names under ``vae.`` in a ``state_dict``
    wrapper, other tensors beside them; read with ``weights_only=True``, converted without torch."""
    config = CASES["hy10_tiny"][0]
    state = {f"vae.{n}": torch.from_numpy(t) for n, t in _weights("hy10_tiny").items()}
    state["transformer.unrelated"] = torch.zeros(2)
    torch.save({"state_dict": state}, tmp_path / "pytorch_model.pt")
    assert isinstance(config_for_names(state), models.HunyuanVideoConfig)
    converted = models.convert_checkpoint(tmp_path / "pytorch_model.pt", tmp_path / "converted", config=config)
    assert _same_weights(models.load_vae(converted), reference["hy10_tiny"])
    from diffusers import AutoencoderKLHunyuanVideo

    AutoencoderKLHunyuanVideo.from_pretrained(converted)  # the folder is diffusers' own format


@pytest.mark.parametrize("name, config", [("hunyuan1.0", models.HunyuanVideoConfig()),
                                          ("hunyuan1.5", models.HunyuanVideo15Config())])
def test_embedded_names_are_the_real_architectures(name, config):
    assert models.load_config(name) == config
    assert name in models.MODEL_NAMES
    vae = models.abstract_vae(config)
    expected = {"hunyuan1.0": 146_136_339, "hunyuan1.5": 871_309_571}[name]  # diffusers' decoder parameter count
    assert sum(x.size for x in jax.tree.leaves(vae.state)) == expected


@pytest.mark.parametrize("class_name, expected", [("AutoencoderKLHunyuanVideo", 146_136_339),
                                                  ("AutoencoderKLHunyuanVideo15", 871_309_571)])
def test_diffusers_parameter_counts_agree(class_name, expected):
    """The real configs' decoders hold as many parameters in diffusers (1.0's with post_quant_conv)."""
    import diffusers

    with torch.device("meta"):
        reference = getattr(diffusers, class_name)()
    count = sum(p.numel() for n, p in reference.named_parameters() if n.startswith(("decoder.", "post_quant_conv.")))
    assert count == expected


def test_bad_configs_say_what_is_wrong(tmp_path):
    with pytest.raises(models.ConfigError, match="norm_num_groups=5 must divide"):
        models.HunyuanVideoConfig(norm_num_groups=5)
    with pytest.raises(models.ConfigError, match="expected one of"):
        models.config_from_dict({"_class_name": "AutoencoderKLMochi"})
    with pytest.raises(models.ConfigError, match="unknown AutoencoderKLHunyuanVideo15 config keys"):
        models.config_from_dict({"_class_name": "AutoencoderKLHunyuanVideo15", "tile_size": 3})


def test_missing_tensor_is_reported(tmp_path):
    config = CASES["hy10_tiny"][0]
    weights = _weights("hy10_tiny")
    del weights["decoder.mid_block.attentions.0.to_out.0.weight"]
    with pytest.raises(models.WeightsError, match=r"1 missing: \['decoder.mid_block.attentions.0.to_out.0.weight'\]"):
        models.load_vae(write_diffusers_folder(tmp_path / "broken", config, weights))
