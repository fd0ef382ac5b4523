"""MiniMax-H3's nominal FLOPs (``models.flops``), per video: the released decode's ViT calls (every
tile of every chunk) and the released encode's CNN calls (every tile of every clip)."""

from __future__ import annotations

import math

from vaeserve.models.flops import ClipFlops

from .config import AutoencoderKLMiniMaxH3Config
from .geometry import frame_tiles

H3Config = AutoencoderKLMiniMaxH3Config


def vit_flops(config: H3Config, t: int, h: int, w: int) -> float:
    """One ViT call on a clip of ``t x h x w`` latents (``post_quant_conv`` included)."""
    voxels = t * h * w
    tokens = voxels + config.decoder_num_register_tokens + 1
    dim, hidden = config.decoder_dim, config.decoder_dim * config.decoder_ffn_mult
    pixels = config.out_channels * config.temporal_scale * config.spatial_scale ** 2
    block = 2.0 * tokens * (4 * dim * dim + 2 * tokens * dim) + 2.0 * tokens * 3 * dim * hidden
    return 2.0 * voxels * config.z_dim * (config.z_dim + dim) + config.decoder_num_layers * block \
        + 2.0 * tokens * dim * pixels


def decode_flops(config: H3Config, t: int, h: int, w: int) -> float:
    s = config.spatial_scale
    rows, columns = frame_tiles(h * s, w * s, config)
    tiles = config.decode_chunks(t) * len(rows.starts) * len(columns.starts)
    return tiles * vit_flops(config, config.chunk_latent_frames, rows.size // s, columns.size // s)


def cnn_flops(config: H3Config, frames: int, h: int, w: int) -> float:
    """One encoder call (``quant_conv`` included) on a clip of ``frames x h x w`` pixels; a strided
    conv counted at its output."""
    dims = config.block_out_channels
    clip = ClipFlops(frames, h, w)
    clip.conv(config.in_channels, dims[0])
    for level, (cin, cout) in enumerate(zip((dims[0], *dims[:-1]), dims, strict=True)):
        for _ in range(config.layers_per_block):
            clip.resnet(cin, cout)
            cin = cout
        if config.spatial_downsample_factors[level] > 1:
            clip.frames = math.ceil(clip.frames / config.temporal_downsample_factors[level])
            clip.h, clip.w = math.ceil(clip.h / 2), math.ceil(clip.w / 2)
            clip.conv(cout, cout)
    clip.conv(dims[-1], 2 * config.z_dim)
    clip.conv(2 * config.z_dim, 2 * config.z_dim, taps=1)
    return clip.total


def encode_flops(config: H3Config, f: int, h: int, w: int) -> float:
    rows, columns = frame_tiles(h, w, config)
    clips, frames = (1, 1) if f == 1 else (math.ceil(f / config.clip_length), config.clip_length)
    return clips * len(rows.starts) * len(columns.starts) * cnn_flops(config, frames, rows.size, columns.size)
