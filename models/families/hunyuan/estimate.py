"""HunyuanVideo 1.0's whole-clip layers as the memory estimate sees them (``models.estimate``),
and its fitted coefficients."""

from __future__ import annotations

import math

from vaeserve.models.estimate import AttentionLayer, ConvLayer, FamilyEstimate, Grid, Layer, coefficients

from .config import HunyuanVideoConfig

# Frames of a whole clip's conv input taken per block (``modules.normalized_conv``) when ``inner_frames``
# is None: as many as hold about this many bytes (one 720p frame of 256 channels in a band of tp = 8
# holds 59 MB in bfloat16: blocks of 4 frames). Small clips run in one block.
CLIP_BLOCK_BYTES = 256 * 2**20



def _block(frames: int, pixels: int, channels: int, itemsize: int) -> int:
    """Frames of a whole-clip conv taken per block (``models.families.hunyuan.modules.block_frames``)."""
    return max(1, min(frames, CLIP_BLOCK_BYTES // max(1, pixels * channels * itemsize)))


def hunyuan_decoder(config: HunyuanVideoConfig, grid: Grid, *, first: bool, itemsize: int) -> list[Layer]:
    """The layers of HunyuanVideo 1.0's whole-clip decode (``models.families.hunyuan.modules``): every conv reads and
    writes the whole clip, block by block in time."""
    del first
    dims = tuple(reversed(config.block_out_channels))
    frames, scale = grid.clip_frames, 1
    tokens = grid.rows * grid.cols

    def conv(cin: int, cout: int) -> ConvLayer:
        pixels = grid.batch * math.ceil(scale * grid.rows) * math.ceil(scale * grid.cols)
        return ConvLayer(_block(frames, pixels, cin, itemsize), scale, cin, cout, cache=None, clip_frames=frames)

    layers: list[Layer] = [conv(config.latent_channels, dims[0]), conv(dims[0], dims[0]), conv(dims[0], dims[0])]
    if config.mid_block_add_attention:
        layers.append(AttentionLayer(frames * tokens, frames * grid.full_rows * grid.cols, dims[0]))
    layers += [conv(dims[0], dims[0]), conv(dims[0], dims[0])]
    for cin, cout, (temporal, spatial) in zip((dims[0], *dims[:-1]), dims, config.up_factors(), strict=True):
        for _ in range(config.layers_per_block + 1):
            layers += [conv(cin, cout), conv(cout, cout)]
            cin = cout
        if temporal or spatial:
            frames = 1 + 2 * (frames - 1) if temporal else frames
            scale *= 2 if spatial else 1
            layers.append(conv(cout, cout))
    layers.append(conv(dims[-1], config.out_channels))
    return layers


def hunyuan_encoder(config: HunyuanVideoConfig, grid: Grid, *, first: bool, itemsize: int) -> list[Layer]:
    """The layers of HunyuanVideo 1.0's whole-clip encode."""
    del first
    dims = config.block_out_channels
    frames, scale = grid.clip_frames, float(config.spatial_compression_ratio)

    def conv(cin: int, cout: int) -> ConvLayer:
        pixels = grid.batch * math.ceil(scale * grid.rows) * math.ceil(scale * grid.cols)
        return ConvLayer(_block(frames, pixels, cin, itemsize), scale, cin, cout, cache=None, clip_frames=frames)

    layers: list[Layer] = [conv(config.in_channels, dims[0])]
    cin = dims[0]
    for cout, (temporal, spatial) in zip(dims, config.down_factors(), strict=True):
        for _ in range(config.layers_per_block):
            layers += [conv(cin, cout), conv(cout, cout)]
            cin = cout
        if temporal or spatial:
            layers.append(conv(cout, cout))
            frames = 1 + (frames - 1) // 2 if temporal else frames
            scale /= 2 if spatial else 1
    layers += [conv(dims[-1], dims[-1])] * 2
    if config.mid_block_add_attention:
        layers.append(AttentionLayer(frames * grid.rows * grid.cols, frames * grid.full_rows * grid.cols, dims[-1]))
    layers += [conv(dims[-1], dims[-1])] * 2 + [conv(dims[-1], 2 * config.latent_channels)]
    return layers


HUNYUAN = FamilyEstimate(hunyuan_decoder, hunyuan_encoder,
    matmul={"decode": coefficients(0.0, 3.604, 0.0, 0.108, 1.0, 0.532), "encode": coefficients(0.0, 0.0, 0.199, 2.188, 1.0, 1.295)},
    # Its whole-clip temp is 3.5-3.7x the largest activation from 17 x 256x256 up
    # (clips convolved in blocks), 1.4x at 9 x 128x128 (one block): 3.0 keeps
    # every size measured within 0.83-1.47 (the large ones under 1.0).
    onednn={"decode": coefficients(0.0, 3.0, 0.0, 0.0, 1.0, 0.0),
    "encode": coefficients(0.0, 0.0, 0.45, 0.159, 1.0, 0.183)})


def family_estimate(config: HunyuanVideoConfig) -> FamilyEstimate:
    del config
    return HUNYUAN
