"""Wan 2.1's and Wan 2.2's nominal FLOPs (multiply-add = 2), counted per latent frame from the
config (``models.flops``)."""

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


def _encode_step_flops(config: WanVAEConfig, h: int, w: int, frames: int, first: bool) -> float:
    """FLOPs to encode one step of ``frames`` frames of ``h x w`` (frame 0 when ``first``)."""
    dims = [config.base_dim * m for m in (1, *config.dim_mult)]

    def conv3(cin, cout):
        return 2.0 * 27 * cin * cout * frames * h * w

    def residual(cin, cout):
        shortcut = 2.0 * cin * cout * frames * h * w if cin != cout else 0.0
        return conv3(cin, cout) + conv3(cout, cout) + shortcut

    total = conv3(config.in_channels, dims[0])
    for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        for _ in range(config.num_res_blocks):
            total += residual(cin, cout)
            cin = cout
        if i == len(config.dim_mult) - 1:
            continue
        h, w = h // 2, w // 2
        total += 2.0 * 9 * cout * cout * frames * h * w  # stride-2 3x3 conv
        if config.temperal_downsample[i] and not first:
            frames //= 2
            total += 2.0 * 3 * cout * cout * frames * h * w  # stride-2 time conv
    tokens = h * w
    attention = 2.0 * frames * tokens * (3 * dims[-1] ** 2 + 2 * tokens * dims[-1] + dims[-1] ** 2)
    total += residual(dims[-1], dims[-1]) * 2 + attention
    total += conv3(dims[-1], 2 * config.z_dim) + 2.0 * (2 * config.z_dim) ** 2 * frames * h * w  # conv_out, quant_conv
    return total


def decode_flops(config: WanVAEConfig, t: int, h: int, w: int) -> float:
    """FLOPs of one row of latents ``(z, t, h, w)``: frame 0, then ``t - 1`` later frames."""
    return _step_flops(config, h, w, True) + (t - 1) * _step_flops(config, h, w, False)


def encode_flops(config: WanVAEConfig, f: int, h: int, w: int) -> float:
    """FLOPs of encoding one row of ``f = 1 + 4k`` frames of ``h x w``: frame 0, then k steps of 4.
    Wan 2.2's encoder runs on the 2x2-patchified frames (its AvgDown3D shortcuts only average)."""
    h, w = h // config.patch, w // config.patch
    return _encode_step_flops(config, h, w, 1, True) + (f - 1) // 4 * _encode_step_flops(config, h, w, 4, False)
