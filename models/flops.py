"""Nominal decoder and encoder FLOPs (multiply-add = 2), the work the reference implementation does.

Counted layer by layer from the config (Wan per latent frame; HunyuanVideo over the whole clip; the
image models as one-frame clips: AutoencoderKL's 3x3 convs are 2-D, Qwen-Image's are Wan's), so
the same figure serves every implementation (ours skips the zero taps of frame 0 and never builds
the upsampled input of HunyuanVideo's upsampler; those savings are not counted as work).
Attention counts the full ``L x L`` scores the reference computes, masked or not.
"""

from __future__ import annotations

from typing import Any

from .config import (
    AutoencoderKLConfig,
    AutoencoderKLFlux2Config,
    HunyuanVideo15Config,
    HunyuanVideoConfig,
    LTX2VideoConfig,
    LTXVideoConfig,
    QwenImageConfig,
    VAEConfig,
    WanVAEConfig,
)
from .shapes import clip_shape


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


def decode_flops(config: VAEConfig, shape: tuple[int, ...]) -> float:
    """FLOPs of decoding latents ``(B, z, T, H, W)`` (an image model's ``(B, z, H, W)``)."""
    b, _, t, h, w = clip_shape(shape)
    if isinstance(config, HunyuanVideoConfig):
        return b * _hunyuan_decode_flops(config, t, h, w)
    if isinstance(config, HunyuanVideo15Config):
        return b * _hunyuan15_decode_flops(config, t, h, w)
    if isinstance(config, LTXVideoConfig | LTX2VideoConfig):
        return b * _ltx_decode_flops(config, t, h, w)
    if isinstance(config, AutoencoderKLConfig | AutoencoderKLFlux2Config):
        return b * _kl_decode_flops(config, h, w)
    if isinstance(config, QwenImageConfig):
        config = config.wan()
    assert isinstance(config, WanVAEConfig)
    return b * (_step_flops(config, h, w, True) + (t - 1) * _step_flops(config, h, w, False))


class _Clip:
    """FLOP counting over a whole clip of ``frames`` frames of ``h x w``, as its sizes change."""

    def __init__(self, frames: int, h: int, w: int):
        self.frames, self.h, self.w, self.total = frames, h, w, 0.0

    @property
    def pixels(self) -> int:
        return self.frames * self.h * self.w

    def conv(self, cin: int, cout: int, taps: int = 27) -> None:
        self.total += 2.0 * taps * cin * cout * self.pixels

    def resnet(self, cin: int, cout: int) -> None:
        self.conv(cin, cout)
        self.conv(cout, cout)
        if cin != cout:
            self.conv(cin, cout, taps=1)

    def attention(self, dim: int) -> None:
        tokens = self.pixels
        self.total += 2.0 * tokens * (4 * dim * dim + 2 * tokens * dim)

    def upsample(self, temporal: bool, spatial: bool) -> None:
        self.frames = 1 + 2 * (self.frames - 1) if temporal else self.frames
        self.h, self.w = (2 * self.h, 2 * self.w) if spatial else (self.h, self.w)


def _hunyuan_decode_flops(config: HunyuanVideoConfig, t: int, h: int, w: int) -> float:
    clip = _Clip(t, h, w)
    dims = tuple(reversed(config.block_out_channels))
    clip.conv(config.latent_channels, config.latent_channels, taps=1)  # post_quant_conv
    clip.conv(config.latent_channels, dims[0])
    clip.resnet(dims[0], dims[0])
    clip.resnet(dims[0], dims[0])
    if config.mid_block_add_attention:
        clip.attention(dims[0])
    for cin, cout, (temporal, spatial) in zip((dims[0], *dims[:-1]), dims, config.up_factors(), strict=True):
        for _ in range(config.layers_per_block + 1):
            clip.resnet(cin, cout)
            cin = cout
        if temporal or spatial:
            clip.upsample(temporal, spatial)
            clip.conv(cout, cout)  # the conv of the upsampled clip
    clip.conv(dims[-1], config.out_channels)
    return clip.total


def _hunyuan15_decode_flops(config: HunyuanVideo15Config, t: int, h: int, w: int) -> float:
    clip = _Clip(t, h, w)
    dims: Any = config.decoder_channels
    clip.conv(config.latent_channels, dims[0])
    clip.resnet(dims[0], dims[0])
    clip.resnet(dims[0], dims[0])
    clip.attention(dims[0])
    for cin, cout, up, temporal in config.up_blocks():
        for _ in range(config.layers_per_block + 1):
            clip.resnet(cin, cout)
            cin = cout
        if up is not None:
            clip.conv(cout, up * (8 if temporal else 4))  # at the coarse scale, then unpacked
            clip.upsample(temporal, True)
    clip.conv(dims[-1], config.out_channels)
    return clip.total


def _kl_decode_flops(config: AutoencoderKLConfig | AutoencoderKLFlux2Config, h: int, w: int) -> float:
    clip = _Clip(1, h, w)
    dims = tuple(reversed(config.decoder_channels))
    if config.use_post_quant_conv:
        clip.conv(config.latent_channels, config.latent_channels, taps=1)
    clip.conv(config.latent_channels, dims[0], taps=9)
    _kl_mid_block(clip, dims[0], config.mid_block_add_attention)
    for i, (cin, cout) in enumerate(zip((dims[0], *dims[:-1]), dims, strict=True)):
        for _ in range(config.layers_per_block + 1):
            _kl_resnet(clip, cin, cout)
            cin = cout
        if i < len(dims) - 1:
            clip.upsample(False, True)
            clip.conv(cout, cout, taps=9)
    clip.conv(dims[-1], config.out_channels, taps=9)
    return clip.total


def _kl_resnet(clip: _Clip, cin: int, cout: int) -> None:
    clip.conv(cin, cout, taps=9)
    clip.conv(cout, cout, taps=9)
    if cin != cout:
        clip.conv(cin, cout, taps=1)


def _kl_mid_block(clip: _Clip, dim: int, attention: bool) -> None:
    _kl_resnet(clip, dim, dim)
    _kl_resnet(clip, dim, dim)
    if attention:
        clip.attention(dim)


def _kl_encode_flops(config: AutoencoderKLConfig | AutoencoderKLFlux2Config, h: int, w: int) -> float:
    clip = _Clip(1, h, w)
    dims = config.block_out_channels
    clip.conv(config.in_channels, dims[0], taps=9)
    for i, (cin, cout) in enumerate(zip((dims[0], *dims[:-1]), dims, strict=True)):
        for _ in range(config.layers_per_block):
            _kl_resnet(clip, cin, cout)
            cin = cout
        if i < len(dims) - 1:
            clip.h, clip.w = clip.h // 2, clip.w // 2
            clip.conv(cout, cout, taps=9)  # the stride-2 conv, counted at its output
    _kl_mid_block(clip, dims[-1], config.mid_block_add_attention)
    clip.conv(dims[-1], 2 * config.latent_channels, taps=9)
    if config.use_quant_conv:
        clip.conv(2 * config.latent_channels, 2 * config.latent_channels, taps=1)
    return clip.total


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


def encode_flops(config: VAEConfig, shape: tuple[int, ...]) -> float:
    """FLOPs of encoding frames ``(B, 3, F, H, W)``, ``F = 1 + 4k``: frame 0, then k steps of 4
    (an image model's images ``(B, 3, H, W)``: one frame).
    Wan 2.2's encoder runs on the 2x2-patchified frames (its AvgDown3D shortcuts only average)."""
    b, _, f, h, w = clip_shape(shape)
    if isinstance(config, AutoencoderKLConfig | AutoencoderKLFlux2Config):
        return b * _kl_encode_flops(config, h, w)
    if isinstance(config, QwenImageConfig):
        config = config.wan()
    if not isinstance(config, WanVAEConfig):
        raise NotImplementedError(f"encoder FLOPs are counted for Wan and the image configs; received {config.family}")
    h, w = h // config.patch, w // config.patch
    return b * (_encode_step_flops(config, h, w, 1, True) + (f - 1) // 4 * _encode_step_flops(config, h, w, 4, False))


def _ltx_decode_flops(config: LTXVideoConfig | LTX2VideoConfig, t: int, h: int, w: int) -> float:
    """The whole clip's convs (a stream's steps past the clip's end add a few latent frames more)."""
    plan = config.decoder_plan()
    clip = _Clip(t, h, w)
    clip.conv(plan.latent_channels, plan.mid_channels)
    for _ in range(plan.mid_layers):
        clip.resnet(plan.mid_channels, plan.mid_channels)
    for block in plan.up_blocks:
        if block.cin != block.cout:
            clip.resnet(block.cin, block.cout)
        if block.stride:
            frames, pixels = block.stride
            width = block.cout * block.factor
            clip.conv(width, width * frames * pixels * pixels // block.factor)  # at the coarse scale, then unpacked
            clip.upsample(frames == 2, pixels == 2)
        for _ in range(block.layers):
            clip.resnet(block.cout, block.cout)
    clip.conv(plan.head_channels, 3 * plan.patch ** 2)
    return clip.total
