"""HunyuanVideo 1.5's layers as the memory estimate sees them (``models.estimate``), and its
fitted coefficients."""

from __future__ import annotations

from vaeserve.models.estimate import (
    AttentionLayer,
    ConvLayer,
    FamilyEstimate,
    Grid,
    Layer,
    coefficients,
    residual_convs,
)
from vaeserve.models.shapes import FRAMES_PER_CHUNK

from .config import HunyuanVideo15Config


def hunyuan15_decoder(config: HunyuanVideo15Config, grid: Grid, *, first: bool, itemsize: int) -> list[Layer]:
    """The layers of one decode step of HunyuanVideo 1.5 (``models.families.hunyuan15.modules``)."""
    del itemsize
    dims = config.decoder_channels
    frames = 1 if first else grid.frames
    tokens, keys = grid.rows * grid.cols, grid.full_rows * grid.cols
    layers: list[Layer] = [ConvLayer(frames, 1, config.latent_channels, dims[0])]
    layers += residual_convs(frames, 1, dims[0], dims[0])
    layers.append(AttentionLayer(frames * tokens, grid.clip_frames * keys, dims[0], kept=grid.clip_frames * tokens))
    layers += residual_convs(frames, 1, dims[0], dims[0])
    scale = 1
    for cin, cout, up, temporal in config.up_blocks():
        for _ in range(config.layers_per_block + 1):
            layers += residual_convs(frames, scale, cin, cout)
            cin = cout
        if up is not None:
            layers.append(ConvLayer(frames, scale, cout, up * (8 if temporal else 4)))
            frames = frames if first or not temporal else 2 * frames
            scale *= 2
    layers.append(ConvLayer(frames, scale, dims[-1], config.out_channels))
    return layers


def hunyuan15_encoder(config: HunyuanVideo15Config, grid: Grid, *, first: bool, itemsize: int) -> list[Layer]:
    """The layers of one encode step of HunyuanVideo 1.5: frame 0, or 4 frames."""
    del itemsize
    frames = 1 if first else FRAMES_PER_CHUNK
    scale: float = config.spatial_compression_ratio
    dims = config.block_out_channels
    layers: list[Layer] = [ConvLayer(frames, scale, config.in_channels, dims[0])]
    for cin, cout, down, temporal in config.down_blocks():
        for _ in range(config.layers_per_block):
            layers += residual_convs(frames, scale, cin, cout)
            cin = cout
        if down is not None:
            layers.append(ConvLayer(frames, scale, cout, down // (8 if temporal else 4)))
            scale /= 2
            frames = frames if first or not temporal else frames // 2
    layers += residual_convs(frames, scale, dims[-1], dims[-1])
    layers.append(AttentionLayer(frames * grid.rows * grid.cols, frames * grid.full_rows * grid.cols, dims[-1]))
    layers += residual_convs(frames, scale, dims[-1], dims[-1])
    layers.append(ConvLayer(frames, scale, dims[-1], 2 * config.latent_channels))
    return layers


HUNYUAN15 = FamilyEstimate(hunyuan15_decoder, hunyuan15_encoder,
    matmul={"decode": coefficients(2.571, 0.0, 0.0, 1.906, 1.0, 0.340), "encode": coefficients(0.0, 0.0, 1.653, 2.632, 1.0, 0.953)},
    onednn={"decode": coefficients(1.089, 0.0, 0.145, 0.078, 1.0, 0.015), "encode": coefficients(0.0, 3.869, 0.119, 0.0, 1.0, 0.0)})


def family_estimate(config: HunyuanVideo15Config) -> FamilyEstimate:
    del config
    return HUNYUAN15
