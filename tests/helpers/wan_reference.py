"""Deterministic Wan VAE weights shared by the fixtures, the live diffusers tests and ours.

Weights come from NumPy's seeded generator in diffusers' names and layouts, so the committed
fixtures can be re-derived without torch. RMS gammas and biases are perturbed away from their
init values (1 and 0) so that a gamma or bias loaded into the wrong place cannot hide.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from flax import nnx

from vaeserve import models
from vaeserve.models import keys
from vaeserve.models.families.wan.decoder import WanDecoder
from vaeserve.models.families.wan.encoder import WanEncoder
from vaeserve.models.loading import WEIGHTS_NAME

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

# float32 parity with diffusers (max abs). The promise, in docs/models.md, is 1e-4; the tests hold
# to what the numerics give: measured 1.3e-7 – 6.7e-6 (the most: the real Wan 2.2 decoder), so
# 2e-5 leaves 3x. Negative controls must break parity far beyond the promise.
PARITY_TOL = 2e-5
PARITY_PROMISE = 1e-4

# name: (config overrides, seed, latent shapes (B, 16, T, H, W))
CASES = {
    "tiny_r1": ({"base_dim": 8, "num_res_blocks": 1}, 1, [(1, 16, 1, 3, 5), (2, 16, 2, 5, 3)]),
    "small_r2": ({"base_dim": 16, "num_res_blocks": 2}, 2, [(1, 16, 5, 3, 3)]),
    "tiny_r2": ({"base_dim": 8, "num_res_blocks": 2}, 3, [(2, 16, 5, 3, 5)]),
    "wan21": ({}, 4, [(1, 16, 2, 3, 3)]),
}


# Wan 2.2 (is_residual, 2x2 patchify, 48 latent channels): a small config whose time upsamplers
# sit in stages 1 and 2 (the real one: 0 and 1), so one DupUp3D shortcut halves the width while
# doubling time — its two frames per latent frame then differ, and the first chunk's dropped frame
# matters — and the real TI2V-5B config (555 M decoder parameters: tiny latents, decoded once).
WAN22_SMALL = {**models.WanVAEConfig.wan22(base_dim=16, decoder_base_dim=24, num_res_blocks=1,
                                           temperal_downsample=(True, True, False)).to_dict(),
               "latents_mean": [0.0] * 48, "latents_std": [1.0] * 48}
WAN22_REAL = models.WanVAEConfig.wan22().to_dict()
for _config in (WAN22_SMALL, WAN22_REAL):
    del _config["_class_name"]
CASES22 = {
    "wan22_small": (WAN22_SMALL, 5, [(1, 48, 1, 3, 5), (2, 48, 2, 5, 3), (1, 48, 5, 3, 3)]),
    "wan22": (WAN22_REAL, 6, [(1, 48, 2, 3, 3)]),
}
ALL_CASES = {**CASES, **CASES22}

# Encoder cases: name: (config overrides, seed, frame shapes (B, 3, F, H, W)). F ∈ {1, 5, 9}; H
# and W odd multiples of the spatial scale (odd latent sizes: 8 for Wan 2.1, 16 for Wan 2.2);
# batch 2 on the small configs; the real configs with the fewest frames their compile allows.
# A name shared with a decoder case has its config and seed (both halves come from one seed).
ENCODE_CASES = {
    "tiny_r1": ({"base_dim": 8, "num_res_blocks": 1}, 1, [(2, 3, 1, 24, 40), (2, 3, 9, 40, 24)]),
    "wan21": ({}, 4, [(1, 3, 5, 24, 24)]),
    "wan22_small": (WAN22_SMALL, 5, [(2, 3, 1, 48, 80), (1, 3, 5, 48, 48), (2, 3, 9, 16, 48)]),
    "wan22": (WAN22_REAL, 6, [(1, 3, 1, 16, 48)]),
}


def case_config(name: str) -> models.WanVAEConfig:
    return models.WanVAEConfig(**{**ALL_CASES, **ENCODE_CASES}[name][0])


def seeded_decoder_weights(config: models.WanVAEConfig, seed: int) -> dict[str, np.ndarray]:
    """Decoder + post_quant_conv weights, diffusers names and layouts, float32."""
    return _seeded_weights(WanDecoder, config, np.random.default_rng(seed))


def seeded_encoder_weights(config: models.WanVAEConfig, seed: int) -> dict[str, np.ndarray]:
    """Encoder + quant_conv weights, diffusers names and layouts, float32 (a stream of their own,
    so the decoder's weights for a seed stay what the decoder fixtures were made with)."""
    return _seeded_weights(WanEncoder, config, np.random.default_rng([seed, 1]))


def seeded_vae_weights(config: models.WanVAEConfig, seed: int) -> dict[str, np.ndarray]:
    """Every weight of a full checkpoint."""
    return {**seeded_decoder_weights(config, seed), **seeded_encoder_weights(config, seed)}


def _seeded_weights(module_type, config: models.WanVAEConfig, rng: np.random.Generator) -> dict[str, np.ndarray]:
    # Only the parameter paths and shapes of our module are used: no values are computed.
    abstract = nnx.eval_shape(lambda: module_type(config, rngs=nnx.Rngs(0)))
    weights = {}
    for path, var in nnx.to_flat_state(nnx.state(abstract)):
        name = keys.diffusers_key(path)
        shape = keys.torch_shape(var)
        if name.endswith("gamma"):
            value = 1.0 + 0.3 * rng.standard_normal(shape)
        elif name.endswith("bias"):
            value = 0.1 * rng.standard_normal(shape)
        else:
            fan_in = math.prod(shape[1:])
            value = rng.standard_normal(shape) / math.sqrt(fan_in)
        weights[name] = value.astype(np.float32)
    return weights


def encoder_only_vae(config: models.WanVAEConfig, weights: dict[str, np.ndarray]) -> models.VAE:
    """A ``VAE`` whose encoder holds ``weights`` (diffusers names and layouts, every one checked
    for shape) and whose decoder is abstract (shapes only, as in ``abstract_vae``): the real
    Wan 2.2 encoder without drawing the 555 M weights of its decoder. It encodes; it cannot decode."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: WanEncoder(config, rngs=nnx.Rngs(0))))
    leaves = []
    for path, var in nnx.to_flat_state(state):
        array = weights.pop(keys.diffusers_key(path))
        assert array.shape == keys.torch_shape(var), (path, array.shape)
        leaves.append((path, var.replace(jnp.asarray(keys.from_torch(var, array)))))
    assert not weights, sorted(weights)  # every tensor found a parameter
    decoder = nnx.eval_shape(lambda: WanDecoder(config, rngs=nnx.Rngs(0)))
    return models.VAE(config, decoder, dtype="float32", encoder=nnx.merge(graphdef, nnx.from_flat_state(leaves)),
                         metadata={"source": "seeded encoder, abstract decoder"})


def seeded_latents(shape, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def seeded_frames(shape, seed: int) -> np.ndarray:
    """Frames ``(B, 3, F, H, W)`` uniform in [-1, 1], deterministic in the shape and seed."""
    return np.random.default_rng([seed, *shape]).uniform(-1.0, 1.0, shape).astype(np.float32)


def write_diffusers_folder(folder: Path, config: models.WanVAEConfig, weights: dict[str, np.ndarray]) -> Path:
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config.to_dict()))
    save_file(weights, str(folder / WEIGHTS_NAME))
    return folder


def fixture_path(name: str, shape) -> Path:
    return FIXTURES / f"{name}__{'x'.join(map(str, shape))}.safetensors"


def encode_fixture_path(name: str, shape) -> Path:
    """diffusers' posterior ``mean`` and ``std`` for ``seeded_frames(shape, seed)`` of case ``name``."""
    return FIXTURES / f"encode_{name}__{'x'.join(map(str, shape))}.safetensors"


def perturbed_diffusers_vae(overrides: dict, seed: int):
    """diffusers' ``AutoencoderKLWan`` with torch-seeded weights, gammas and biases perturbed."""
    import torch
    from diffusers.models.autoencoders.autoencoder_kl_wan import AutoencoderKLWan

    torch.manual_seed(seed)
    model = AutoencoderKLWan(**overrides).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("gamma"):
                parameter.copy_(1 + 0.3 * torch.randn_like(parameter))
            elif name.endswith("bias"):
                parameter.copy_(0.1 * torch.randn_like(parameter))
    return model
