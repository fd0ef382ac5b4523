"""Helpers for the sharding tests: the tiny model configs and deterministic latents."""

import numpy as np

TINY = dict(base_dim=8, num_res_blocks=1)
# Wan 2.2 in small: residual up blocks, a time+space and a space-only DupUp3D shortcut, 2x2
# unpatchify, 48 latent channels; three stages (8x spatial, 2x temporal) to keep compiles short.
TINY22 = dict(base_dim=8, decoder_base_dim=8, num_res_blocks=1, dim_mult=(1, 2, 2), temperal_downsample=(False, True),
              scale_factor_spatial=8, scale_factor_temporal=2)
WIDTH = 4  # latent width for the height-split tests: never divisible by 3, so splits are forced


def make_latents(batch: int, frames: int, height: int, width: int, seed: int = 0, channels: int = 16) -> np.ndarray:
    """``(B, C, T, H, W)`` float32 standard-normal latents, deterministic in the shape and seed."""
    rng = np.random.default_rng([seed, batch, frames, height, width])
    return rng.standard_normal((batch, channels, frames, height, width)).astype(np.float32)
