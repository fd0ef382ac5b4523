"""The AutoencoderKL family's nominal FLOPs (2-D convs, one image as a one-frame clip; ``models.flops``)."""

from __future__ import annotations

from vaeserve.models.flops import ClipFlops

from .config import AutoencoderKLConfig, AutoencoderKLFlux2Config

KLConfig = AutoencoderKLConfig | AutoencoderKLFlux2Config



def _kl_decode_flops(config: KLConfig, h: int, w: int) -> float:
    clip = ClipFlops(1, h, w)
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


def _kl_resnet(clip: ClipFlops, cin: int, cout: int) -> None:
    clip.conv(cin, cout, taps=9)
    clip.conv(cout, cout, taps=9)
    if cin != cout:
        clip.conv(cin, cout, taps=1)


def _kl_mid_block(clip: ClipFlops, dim: int, attention: bool) -> None:
    _kl_resnet(clip, dim, dim)
    _kl_resnet(clip, dim, dim)
    if attention:
        clip.attention(dim)


def _kl_encode_flops(config: KLConfig, h: int, w: int) -> float:
    clip = ClipFlops(1, h, w)
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


def decode_flops(config: KLConfig, t: int, h: int, w: int) -> float:
    del t  # an image: one frame
    return _kl_decode_flops(config, h, w)


def encode_flops(config: KLConfig, f: int, h: int, w: int) -> float:
    del f
    return _kl_encode_flops(config, h, w)
