"""Deterministic LTX-Video and LTX-2 VAE weights and cases shared by the fixtures, the live diffusers
tests and ours (as ``tests/helpers/hunyuan_reference.py`` for HunyuanVideo).

Weights come from NumPy's seeded generator in diffusers' names and layouts, so the committed fixtures
can be re-derived without torch. LayerNorm weights and biases, the timestep tables and the latents'
statistics are perturbed away from their init values; the noise scales stay 0 (diffusers' init) so
that diffusers' decode, which injects noise from torch's generator, is comparable: the scale has its
own test. The timestep multiplier is diffusers' 1000.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from flax import nnx

from vaeserve import models
from vaeserve.models import keys
from vaeserve.models.family_modules import family_modules as family_of

# Four variants, small enough to compile in seconds: 8 latent channels, patch 1 or 2 (8x or 16x),
# one resnet per block. ``lookahead`` is 10 (0.9.0), 7 (0.9.5, LTX-2.3) and 0 (the causal LTX-2).
TINY: dict[str, Any] = dict(latent_channels=8, layers_per_block=(1, 1, 1, 1, 1), patch_size=1)
# LTX-Video 0.9.0: strided-conv encoder, up blocks with width-changing resnets, no timestep.
LTX090 = models.LTXVideoConfig(block_out_channels=(8, 16, 16, 16), decoder_block_out_channels=(8, 16, 16, 16),
                                      decoder_layers_per_block=(1, 1, 1, 1, 1), **TINY)
# LTX-Video 0.9.5 – 0.9.8 (a timestep-conditioned decoder, space-to-depth encoder), with 0.9.1's noise
# injection in two up blocks.
LTX095 = models.LTXVideoConfig.v095(block_out_channels=(8, 8, 16, 16, 32),
                                           decoder_block_out_channels=(16, 32, 64), decoder_layers_per_block=(1, 1, 1, 1),
                                           decoder_inject_noise=(False, True, True, False), spatial_compression_ratio=None,
                                           temporal_compression_ratio=None, **TINY)
# LTX-2 as diffusers' class builds it by default: a causal decoder that pads by reflection.
LTX2_CAUSAL = models.LTX2VideoConfig(block_out_channels=(8, 8, 8, 8), decoder_block_out_channels=(16, 32, 64),
                                            decoder_layers_per_block=(1, 1, 1, 1), **TINY)
# LTX-2.3 / 2.5: zero padding, a decoder that sees ahead, temporal-only and spatial-only upsamplers.
LTX23 = models.LTX2VideoConfig.ltx23(block_out_channels=(8, 8, 16, 16), decoder_block_out_channels=(8, 16, 16, 32),
                                            decoder_layers_per_block=(1, 1, 1, 1, 1), spatial_compression_ratio=None,
                                            temporal_compression_ratio=None, **{**TINY, "patch_size": 2})

# The sharding tests' model: LTX-2.0's decoder (reflect padding, sees ahead), timestep-conditioned and
# injecting noise (so every exactness test also checks the seeded noise is the split's own), in two
# levels (4x in space and time) to keep its sharded compiles short.
LTX2_SHARD = models.LTX2VideoConfig.ltx2(block_out_channels=(8, 8, 8), decoder_block_out_channels=(16, 32),
                                         layers_per_block=(1, 1, 1, 1), decoder_layers_per_block=(1, 0, 1),
                                         decoder_spatio_temporal_scaling=(True, True),
                                         upsample_type=("spatiotemporal", "spatiotemporal"), upsample_factor=(2, 2),
                                         upsample_residual=(True, True), timestep_conditioning=True,
                                         decoder_inject_noise=(True, False, False),
                                         downsample_type=("spatial", "temporal", "spatiotemporal"),
                                         spatio_temporal_scaling=(True, True, False),
                                         spatial_compression_ratio=None, temporal_compression_ratio=None,
                                         latent_channels=8, patch_size=1)

# name: (config, seed, decode latent shapes (B, 8, T, H, W), encode frame shapes (B, 3, F, H, W)).
# Batch 2, odd sizes; reflect padding needs ≥ 2 latent rows and columns.
CASES: dict[str, tuple[models.VAEConfig, int, list[tuple[int, ...]], list[tuple[int, ...]]]] = {
    "ltx090": (LTX090, 21, [(2, 8, 3, 3, 2)], [(2, 3, 9, 24, 16)]),
    "ltx095": (LTX095, 22, [(2, 8, 3, 3, 2)], [(2, 3, 9, 24, 16)]),
    "ltx2_causal": (LTX2_CAUSAL, 23, [(2, 8, 3, 3, 2)], [(2, 3, 9, 24, 16)]),
    "ltx23": (LTX23, 24, [(2, 8, 3, 3, 2)], [(2, 3, 9, 48, 32)]),
}
DECODE_TIMESTEP = 0.05  # what the timestep-conditioned cases decode with
OUTPUT_CONV_SCALE = 0.5


def seeded_weights(config: models.VAEConfig, seed: int, *, encoder: bool = True) -> dict[str, np.ndarray]:
    """Decoder (and encoder) weights and the latents' statistics in diffusers' names and layouts,
    float32; the encoder's from a stream of its own."""
    family = family_of(config)
    rng = np.random.default_rng(seed)
    weights = _seeded(family.decoder, config, rng)
    if encoder:
        weights.update(_seeded(family.encoder, config, np.random.default_rng([seed, 1])))
    weights["latents_mean"] = (0.2 * rng.standard_normal(config.z_dim)).astype(np.float32)
    weights["latents_std"] = (1 + 0.2 * rng.random(config.z_dim)).astype(np.float32)
    return weights


def _seeded(module_type, config: models.VAEConfig, rng: np.random.Generator) -> dict[str, np.ndarray]:
    abstract = nnx.eval_shape(lambda: module_type(config, rngs=nnx.Rngs(0)))
    weights = {}
    for path, var in nnx.to_flat_state(nnx.state(abstract)):
        name, shape = keys.diffusers_key(path), keys.torch_shape(var)
        if name.endswith("timestep_scale_multiplier"):
            value = np.full(shape, 1000.0)
        elif "per_channel_scale" in name:
            value = np.zeros(shape)
        elif name.endswith("bias") or name.endswith("scale_shift_table"):
            value = 0.1 * rng.standard_normal(shape)
        elif len(shape) == 1:  # LayerNorm weights
            value = 1.0 + 0.3 * rng.standard_normal(shape)
        else:
            value = rng.standard_normal(shape) / math.sqrt(math.prod(shape[1:]))
            value *= OUTPUT_CONV_SCALE if name == "decoder.conv_out.conv.weight" else 1.0
        weights[name] = np.asarray(value, np.float32)
    return weights


def decode_kwargs(config: models.VAEConfig) -> dict:
    """Our decode's arguments matching the reference's: the timestep, no noise in the latents."""
    return {"timestep": DECODE_TIMESTEP, "noise_scale": 0.0, "seed": 0} if config.decode_conditions else {}


def reference_model(config: models.VAEConfig, weights: dict[str, np.ndarray]):
    """diffusers' model of ``config`` holding ``weights`` (strictly: every one, statistics included)."""
    import diffusers
    import torch

    model = getattr(diffusers, config.class_name)(**{k: v for k, v in config.to_dict().items()
                                                      if k != "_class_name"}).eval()
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=False)
    assert not unexpected, unexpected
    assert all(k.startswith("encoder.") for k in missing), missing
    return model


def reference_decode(model, config: models.VAEConfig, latents: np.ndarray) -> np.ndarray:
    """diffusers' float32 decode (unclamped) of the whole clip, with the cases' timestep."""
    import torch

    timestep = torch.full((latents.shape[0],), DECODE_TIMESTEP) if config.decode_conditions else None
    with torch.no_grad():
        return model.decode(torch.from_numpy(latents), timestep).sample.numpy()


def reference_posterior_mean(model, frames: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model.encode(torch.from_numpy(frames)).latent_dist.mean.numpy()
