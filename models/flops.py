"""Nominal decoder FLOPs (multiply-add = 2), the work the reference implementation does.

Counted layer by layer from the config, per latent frame, so the same figure serves every
implementation (ours skips the zero taps of frame 0; that saving is not counted as work).
"""

from __future__ import annotations

from .config import WanVAEConfig


def _step_flops(config: WanVAEConfig, h: int, w: int, first: bool) -> float:
    """FLOPs to decode one latent frame of ``h x w`` (the first one when ``first``)."""
    total = 2.0 * config.z_dim * config.z_dim * h * w  # post_quant_conv
    frames = 1

    def conv3(cin, cout):
        return 2.0 * 27 * cin * cout * frames * h * w

    def residual(cin, cout):
        shortcut = 2.0 * cin * cout * frames * h * w if cin != cout else 0.0
        return conv3(cin, cout) + conv3(cout, cout) + shortcut

    dims = config.decoder_dims
    total += conv3(config.z_dim, dims[0])
    tokens = h * w
    attention = 2.0 * frames * tokens * (3 * dims[0] ** 2 + 2 * tokens * dims[0] + dims[0] ** 2)
    total += residual(dims[0], dims[0]) * 2 + attention
    halves = not config.is_residual  # Wan 2.1's upsamplers halve the width; Wan 2.2's keep it
    for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        cin = cin // 2 if i > 0 and halves else cin
        for _ in range(config.num_res_blocks + 1):
            total += residual(cin, cout)
            cin = cout
        if i == len(config.dim_mult) - 1:
            continue
        if config.temperal_upsample[i] and not first:
            total += 2.0 * 3 * cout * 2 * cout * frames * h * w
            frames *= 2
        h, w = 2 * h, 2 * w
        total += 2.0 * 9 * cout * (cout // 2 if halves else cout) * frames * h * w
    total += conv3(dims[-1], config.out_channels)  # DupUp3D and unpatchify only move values
    return total


def decode_flops(config: WanVAEConfig, shape: tuple[int, ...]) -> float:
    """FLOPs of decoding latents ``(B, z, T, H, W)``."""
    b, _, t, h, w = shape
    return b * (_step_flops(config, h, w, True) + (t - 1) * _step_flops(config, h, w, False))
