"""HunyuanVideo 1.0's nominal decode FLOPs over the whole clip (``models.flops``)."""

from __future__ import annotations

from vaeserve.models.flops import ClipFlops

from .config import HunyuanVideoConfig


def decode_flops(config: HunyuanVideoConfig, t: int, h: int, w: int) -> float:
    clip = ClipFlops(t, h, w)
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
