"""Wan 2.1's and Wan 2.2's layers as the memory estimate sees them (``models.estimate``), and
their fitted coefficients."""

from __future__ import annotations

from vaeserve.models.estimate import (
    STREAM_MIN_FRAME_BYTES,
    AttentionLayer,
    ConvLayer,
    FamilyEstimate,
    Grid,
    Layer,
    coefficients,
    residual_convs,
)
from vaeserve.models.shapes import FRAMES_PER_CHUNK

from .config import WanVAEConfig


def wan_decoder(config: WanVAEConfig, grid: Grid, *, first: bool, itemsize: int) -> list[Layer]:
    """The layers of one decode step of a Wan decoder (``models.families.wan.decoder``)."""
    dims = config.decoder_dims
    frames = 1 if first else grid.frames
    layers: list[Layer] = [ConvLayer(frames, 1, config.z_dim, dims[0])]
    layers += residual_convs(frames, 1, dims[0], dims[0])
    layers.append(AttentionLayer(grid.rows * grid.cols, grid.full_rows * grid.cols, dims[0]))
    layers += residual_convs(frames, 1, dims[0], dims[0])
    stages = len(config.dim_mult)
    last_pixel = (2 ** (stages - 1)) ** 2 * dims[-1] * itemsize * grid.batch * grid.rows * grid.cols
    group = None if first or last_pixel < STREAM_MIN_FRAME_BYTES else 1
    scale, halves = 1, not config.is_residual
    for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        cin = cin // 2 if i > 0 and halves else cin
        for _ in range(config.num_res_blocks + 1):
            layers += residual_convs(frames, scale, cin, cout)
            cin = cout
        if i == stages - 1:
            continue
        if config.temperal_upsample[i]:
            layers.append(ConvLayer(frames, scale, cout, 2 * cout, cache="plain"))
            frames = frames if first else 2 * frames
            frames = min(frames, group) if group else frames
        scale *= 2
        layers.append(ConvLayer(frames, scale / 2, cout, 4 * (cout // 2 if halves else cout), cache=None))
    layers.append(ConvLayer(frames, scale, dims[-1], config.out_channels))
    return layers


def wan_first_step_unused(config: WanVAEConfig) -> int:
    """Parameters latent frame 0 does not use (its upsamplers skip their time convs): the compiled
    first step does not take them."""
    dims = config.decoder_dims
    return sum(3 * cout * 2 * cout + 2 * cout
               for cout, temporal in zip(dims[1:], config.temperal_upsample, strict=False) if temporal)


def wan_encoder(config: WanVAEConfig, grid: Grid, *, first: bool, itemsize: int) -> list[Layer]:
    """The layers of one encode step of a Wan encoder (``models.families.wan.encoder``): frame 0, or 4 frames."""
    del itemsize
    dims = tuple(config.base_dim * m for m in (1, *config.dim_mult))
    frames = 1 if first else FRAMES_PER_CHUNK
    scale: float = 2 ** (len(config.dim_mult) - 1)  # rows of the (patchified) input per latent row
    layers: list[Layer] = [ConvLayer(frames, scale, config.in_channels, dims[0])]
    for stage, (cin, cout) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        for _ in range(config.num_res_blocks):
            layers += residual_convs(frames, scale, cin, cout)
            cin = cout
        if stage == len(config.dim_mult) - 1:
            continue
        layers.append(ConvLayer(frames, scale / 2, 4 * cout, cout, cache=None))  # stride-2 conv, seen at the output
        scale /= 2
        if config.temperal_downsample[stage] and not first:
            layers.append(ConvLayer(frames, scale, cout, cout, cache="plain"))
            frames //= 2
    layers += residual_convs(frames, scale, dims[-1], dims[-1])
    layers.append(AttentionLayer(grid.rows * grid.cols, grid.full_rows * grid.cols, dims[-1]))
    layers += residual_convs(frames, scale, dims[-1], dims[-1])
    layers.append(ConvLayer(frames, scale, dims[-1], 2 * config.z_dim))
    return layers


def wan21_frame_encode_unused(config: WanVAEConfig) -> int:
    """Parameters the encode of one frame does not use: its temporal downsamplers' time convs."""
    dims = tuple(config.base_dim * m for m in (1, *config.dim_mult))
    return sum(3 * cout * cout + cout for cout, temporal in zip(dims[1:], config.temperal_downsample, strict=False)
               if temporal)


# Fitted to memory_analysis() on XLA:CPU (the generic module's docstring says how; bench/memory.py
# --fit refits them): Wan 2.1's and Wan 2.2's decoders differ, so each has its table.
WAN21 = FamilyEstimate(wan_decoder, wan_encoder,
    matmul={"decode": coefficients(0.667, 1.006, 0.0, 1.640, 1.0, 0.0), "encode": coefficients(0.0, 6.303, 0.0, 2.175, 1.0, 0.250)},
    onednn={"decode": coefficients(0.59, 0.315, 0.0, 0.509, 1.0, 0.0), "encode": coefficients(0.0, 1.861, 0.599, 0.0, 1.0, 0.163)},
    first_step_unused=wan_first_step_unused, frame_encode_unused=wan21_frame_encode_unused)
WAN22 = FamilyEstimate(wan_decoder, wan_encoder,
    matmul={"decode": coefficients(0.872, 0.379, 0.0, 0.464, 1.0, 0.367), "encode": coefficients(0.0, 0.0, 1.556, 2.752, 1.0, 0.784)},
    onednn={"decode": coefficients(0.614, 0.44, 0.0, 0.36, 1.0, 0.287), "encode": coefficients(0.0, 0.0, 1.025, 0.467, 1.0, 0.054)},
    first_step_unused=wan_first_step_unused)


def family_estimate(config: WanVAEConfig) -> FamilyEstimate:
    return WAN22 if config.is_residual else WAN21
