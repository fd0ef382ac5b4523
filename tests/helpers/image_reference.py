"""Small image-VAE configs and cases (``AutoencoderKL`` as SD and as Flux.1, ``AutoencoderKLFlux2``,
``AutoencoderKLQwenImage``) shared by the fixtures, the live diffusers tests and ours.

Weights come from ``hunyuan_reference.seeded_weights`` (any family: NumPy's seeded generator in
diffusers' names and layouts), so the committed fixtures can be re-derived without torch.
"""

from __future__ import annotations

import numpy as np

from vaeserve import models
from vaeserve.models.families.kl.config import KL_BLOCKS

# A few channels each; every class's own options in play: SD's quant convs, Flux.1's absence of
# them and its shift factor (two resnets per block), Flux.2's decoder widths of its own, Qwen-Image
# as the Wan 2.1 layers (8x, all four stages).
SD_TINY = models.AutoencoderKLConfig(block_out_channels=(8, 16, 16), down_block_types=(KL_BLOCKS[0],) * 3,
                                     up_block_types=(KL_BLOCKS[1],) * 3, norm_num_groups=4, latent_channels=4)
FLUX1_TINY = models.AutoencoderKLConfig(block_out_channels=(8, 16), down_block_types=(KL_BLOCKS[0],) * 2,
                                        up_block_types=(KL_BLOCKS[1],) * 2, norm_num_groups=4, layers_per_block=2,
                                        latent_channels=16, scaling_factor=0.3611, shift_factor=0.1159,
                                        use_quant_conv=False, use_post_quant_conv=False)
FLUX2_TINY = models.AutoencoderKLFlux2Config(block_out_channels=(8, 16, 16), decoder_block_out_channels=(8, 16, 32),
                                             down_block_types=(KL_BLOCKS[0],) * 3, up_block_types=(KL_BLOCKS[1],) * 3,
                                             norm_num_groups=4, layers_per_block=1, latent_channels=8)
QWEN_TINY = models.QwenImageConfig(base_dim=8, num_res_blocks=1)

# Smaller still, for the sharding tests (compiles dominate there): two blocks (2x), GroupNorm(4).
KL_SHARD = models.AutoencoderKLConfig(block_out_channels=(8, 16), down_block_types=(KL_BLOCKS[0],) * 2,
                                      up_block_types=(KL_BLOCKS[1],) * 2, norm_num_groups=4, latent_channels=4)

# name: (config, seed, decode latent shapes, encode image shapes). Batch 2 and odd latent sizes;
# Qwen-Image in both of its layouts, (B, z, 1, H, W) and (B, z, H, W).
CASES: dict[str, tuple[models.VAEConfig, int, list[tuple[int, ...]], list[tuple[int, ...]]]] = {
    "sd_tiny": (SD_TINY, 21, [(2, 4, 3, 5)], [(2, 3, 12, 20)]),
    "flux1_tiny": (FLUX1_TINY, 22, [(2, 16, 5, 3)], [(2, 3, 6, 10)]),
    "flux2_tiny": (FLUX2_TINY, 23, [(2, 8, 3, 5)], [(2, 3, 20, 12)]),
    "qwen_tiny": (QWEN_TINY, 24, [(2, 16, 1, 3, 5), (1, 16, 5, 3)], [(2, 3, 24, 40)]),
}


def seeded_images(shape, seed: int) -> np.ndarray:
    """Images ``(B, 3, H, W)`` (or one-frame clips) uniform in [-1, 1], deterministic in the shape and seed."""
    return np.random.default_rng([seed, *shape]).uniform(-1.0, 1.0, shape).astype(np.float32)


def reference_decode(model, latents: np.ndarray) -> np.ndarray:
    """diffusers' float32 decode (unclamped) of latents in either layout; Qwen-Image's class takes
    (and returns) one-frame clips only."""
    import torch

    video = type(model).__name__ == "AutoencoderKLQwenImage"
    x = torch.from_numpy(latents[:, :, None] if video and latents.ndim == 4 else latents)
    with torch.no_grad():
        out = model.decode(x).sample.numpy()
    return out[:, :, 0] if video and latents.ndim == 4 else out


def reference_posterior(model, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """diffusers' posterior mean and std of images in either layout (as ``reference_decode``)."""
    import torch

    video = type(model).__name__ == "AutoencoderKLQwenImage"
    x = torch.from_numpy(images[:, :, None] if video and images.ndim == 4 else images)
    with torch.no_grad():
        posterior = model.encode(x).latent_dist
    mean, std = posterior.mean.numpy(), posterior.std.numpy()
    if video and images.ndim == 4:
        mean, std = mean[:, :, 0], std[:, :, 0]
    return np.ascontiguousarray(mean), np.ascontiguousarray(std)
