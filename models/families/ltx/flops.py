"""LTX-Video's and LTX-2's nominal decode FLOPs over the whole clip (``models.flops``)."""

from __future__ import annotations

from vaeserve.models.flops import ClipFlops

from .config import LTX2VideoConfig, LTXVideoConfig


def decode_flops(config: LTXVideoConfig | LTX2VideoConfig, t: int, h: int, w: int) -> float:
    """The whole clip's convs (a stream's steps past the clip's end add a few latent frames more)."""
    plan = config.decoder_plan()
    clip = ClipFlops(t, h, w)
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
