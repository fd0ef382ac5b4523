"""HunyuanVideo 1.5's nominal decode FLOPs over the whole clip (``models.flops``)."""

from __future__ import annotations

from typing import Any

from vaeserve.models.flops import ClipFlops

from .config import HunyuanVideo15Config


def decode_flops(config: HunyuanVideo15Config, t: int, h: int, w: int) -> float:
    clip = ClipFlops(t, h, w)
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
