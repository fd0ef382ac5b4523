"""Deterministic HunyuanVideo (1.0 and 1.5) VAE weights and cases shared by the fixtures, the live
diffusers tests and ours (``seeded_weights`` and ``reference_model`` serve any family: the image
VAEs' cases, ``tests/helpers/image_reference.py``, use them too).

Weights come from NumPy's seeded generator in diffusers' names and layouts (as for Wan:
``tests/helpers/wan_reference.py``), so the committed fixtures can be re-derived without torch.
GroupNorm weights, RMS gammas and biases are perturbed away from their init values (1 and 0) so
that one loaded into the wrong place cannot hide; the decoder's last conv is scaled down so that
most frames lie inside [-1, 1], where the clamp of the output leaves them to compare.
"""

from __future__ import annotations

import math

import numpy as np
from flax import nnx

from vaeserve import models
from vaeserve.models import keys
from vaeserve.models.family_modules import family_modules as family_of

# Small configs that run in about a second on CPU. 1.0: GroupNorm(4) over 8 and 16 channels.
# 1.5: every up/down block's shortcut repeats or averages more than one channel (64 channels at
# the mid block, 16 latent channels: the decoder's input repeats each 4 times, the encoder's output
# averages pairs), two temporal and four spatial resamplers as in the real one.
HY10_TINY = models.HunyuanVideoConfig(block_out_channels=(8, 16, 16, 16), norm_num_groups=4, layers_per_block=1)
HY15_TINY = models.HunyuanVideo15Config(block_out_channels=(8, 16, 16, 32, 64), layers_per_block=1,
                                        latent_channels=16)

# Smaller still, for the sharding tests (compiles dominate there): three blocks, 4x spatial. 1.0
# doubles time in two up blocks (as the real one); 1.5 in one (2x temporal), space in two.
HY10_SHARD = models.HunyuanVideoConfig(block_out_channels=(8, 16, 16), norm_num_groups=4, layers_per_block=1,
                                       spatial_compression_ratio=4, down_block_types=("HunyuanVideoDownBlock3D",) * 3,
                                       up_block_types=("HunyuanVideoUpBlock3D",) * 3)
HY15_SHARD = models.HunyuanVideo15Config(block_out_channels=(8, 16, 32), layers_per_block=1, latent_channels=16,
                                         spatial_compression_ratio=4, temporal_compression_ratio=2)

# name: (config, seed, decode latent shapes (B, z, T, H, W), encode frame shapes (B, 3, F, H, W)).
# Batch 2 and odd latent sizes; 1.0's 3-frame clip lets its GroupNorm statistics span frames of
# different sizes of time history (its decode is not causal: frame 0 depends on frame 2).
CASES: dict[str, tuple[models.VAEConfig, int, list[tuple[int, ...]], list[tuple[int, ...]]]] = {
    "hy10_tiny": (HY10_TINY, 11, [(2, 16, 3, 3, 5), (1, 16, 1, 5, 3)], [(2, 3, 9, 24, 40)]),
    "hy15_tiny": (HY15_TINY, 12, [(2, 16, 3, 3, 5), (1, 16, 1, 5, 3)], [(2, 3, 9, 48, 80)]),
}
# diffusers decodes HunyuanVideo clips of more than 4 latent frames framewise by default (tiles of
# 5 latent frames every 3, blended over 4 frames): 7 latent frames are three tiles, the last short.
FRAMEWISE_CASE, FRAMEWISE_SHAPE = "hy10_tiny", (1, 16, 7, 2, 3)


OUTPUT_CONV_SCALE = 0.3
# The decoder's last conv, as each family names it (HunyuanVideo wraps it; AutoencoderKL and Wan do not).
OUTPUT_CONVS = ("decoder.conv_out.conv.weight", "decoder.conv_out.weight")


def seeded_weights(config: models.VAEConfig, seed: int, *, encoder: bool = True) -> dict[str, np.ndarray]:
    """Decoder (and encoder) weights in diffusers' names and layouts, float32; the encoder's from a
    stream of its own, so the decoder's weights for a seed do not depend on whether it is drawn."""
    family = family_of(config)
    weights = _seeded(family.decoder, config, np.random.default_rng(seed))
    if encoder:
        weights.update(_seeded(family.encoder, config, np.random.default_rng([seed, 1])))
    return weights


def _seeded(module_type, config: models.VAEConfig, rng: np.random.Generator) -> dict[str, np.ndarray]:
    abstract = nnx.eval_shape(lambda: module_type(config, rngs=nnx.Rngs(0)))
    weights = {}
    for path, var in nnx.to_flat_state(nnx.state(abstract)):
        name, shape = keys.diffusers_key(path), keys.torch_shape(var)
        if name.endswith("gamma") or (name.endswith(".weight") and len(shape) == 1):  # RMS gammas, GroupNorm
            value = 1.0 + 0.3 * rng.standard_normal(shape)
        elif name.endswith("bias"):
            value = 0.1 * rng.standard_normal(shape)
        elif name.endswith("running_var"):  # Flux.2's BatchNorm statistics: a variance is positive
            value = 1.0 + 0.3 * np.abs(rng.standard_normal(shape))
        else:
            value = rng.standard_normal(shape) / math.sqrt(math.prod(shape[1:]))
            value *= OUTPUT_CONV_SCALE if name in OUTPUT_CONVS else 1.0
        weights[name] = value.astype(np.float32)
    return weights


def reference_model(config: models.VAEConfig, weights: dict[str, np.ndarray]):
    """diffusers' model of ``config`` holding ``weights`` (every one of them, strictly), float32."""
    import diffusers
    import torch

    model = getattr(diffusers, config.class_name)(**{k: v for k, v in config.to_dict().items()
                                                      if k != "_class_name"}).eval()
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=False)
    assert not unexpected, unexpected
    # Flux.2's BatchNorm keeps a training count we do not hold (models.kl.BatchNormStatistics).
    assert all(k.startswith(("encoder.", "quant_conv.")) or k == "bn.num_batches_tracked" for k in missing), missing
    return model


def reference_decode(model, latents: np.ndarray, *, framewise: bool = False) -> np.ndarray:
    """diffusers' float32 decode (unclamped), row by row (HunyuanVideo 1.5's attention mask does not
    broadcast over a batch in diffusers 0.42); ``framewise``: HunyuanVideo's default tiling of clips
    longer than 4 latent frames, else the whole clip (the model)."""
    import torch

    if hasattr(model, "use_framewise_decoding"):
        model.use_framewise_decoding = framewise
    with torch.no_grad():
        return np.concatenate([model.decode(torch.from_numpy(row[None])).sample.numpy() for row in latents])


def reference_posterior(model, frames: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """diffusers' posterior mean and std of ``frames``, row by row, whole clips."""
    import torch

    if hasattr(model, "use_framewise_encoding"):
        model.use_framewise_encoding = False
    with torch.no_grad():
        rows = [model.encode(torch.from_numpy(row[None])).latent_dist for row in frames]
    return (np.concatenate([r.mean.numpy() for r in rows]), np.concatenate([r.std.numpy() for r in rows]))
