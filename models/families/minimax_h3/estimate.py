"""MiniMax-H3's programs as the memory estimate sees them (``models.estimate``), and their fitted
coefficients. Its work is spread by tiles over every device of the mesh (``programs``), not by
bands: each device decodes its share of the tiles of every chunk, ``config.tiles_per_step`` at a time,
and holds the decoded tiles and the stitched frames whole (``Tensor``s).
"""

from __future__ import annotations

import math

from vaeserve.models.estimate import AttentionLayer, FamilyEstimate, Grid, Layer, Tensor, coefficients

from .config import AutoencoderKLMiniMaxH3Config
from .geometry import frame_tiles

H3Config = AutoencoderKLMiniMaxH3Config


def _devices(grid: Grid) -> int:
    """The devices a batch's tiles are spread over (the grid's ``tp``; ``dp`` took its rows)."""
    return grid.full_rows // grid.rows


def _frame_rows(grid: Grid) -> int:
    """The frame's latent rows: not padded to whole bands (the tiles cover the frame as given)."""
    return grid.frame_rows or grid.full_rows


def _blending_devices(grid: Grid) -> int:
    """The devices the decoded tiles' blends are split over: XLA splits them along the batch's
    videos, over as many devices as divide both (1 for one video: every device blends it all)."""
    return math.gcd(grid.batch, _devices(grid))


def h3_decoder(config: H3Config, grid: Grid, *, first: bool, itemsize: int) -> list[Layer]:
    """The released decode of ``grid.frames`` latent frames: the decoded tiles a device blends
    (float32, every chunk's) and the stitched frames of its videos (``_blending_devices``), the
    ViT's working set of one step of tiles (its attention's scores, its feed-forward)."""
    del first, itemsize
    s = config.spatial_scale
    rows, cols = frame_tiles(s * _frame_rows(grid), s * grid.cols, config)
    tiles = grid.batch * config.decode_chunks(grid.frames) * len(rows.starts) * len(cols.starts)
    step = min(config.tiles_per_step, math.ceil(tiles / _devices(grid)))
    tokens = config.chunk_latent_frames * (rows.size // s) * (cols.size // s) + config.decoder_num_register_tokens + 1
    tile_frames = config.chunk_latent_frames * config.temporal_scale
    heads = config.decoder_num_attention_heads
    blending = _blending_devices(grid)
    video = grid.batch * config.num_output_frames(grid.frames) * s * _frame_rows(grid) * s * grid.cols * 3
    return [Tensor(math.ceil(tiles / blending) * tile_frames * rows.size * cols.size * 3), Tensor(video // blending),
            Tensor(step * tokens * config.decoder_dim * (2 * config.decoder_ffn_mult + 4)),
            AttentionLayer(tokens, step * heads * tokens, config.decoder_attention_head_dim)]


def h3_encoder(config: H3Config, grid: Grid, *, first: bool, itemsize: int) -> list[Layer]:
    """The released encode of ``grid.clip_frames`` frames: each device's clip tiles through the
    causal CNN, ``config.tiles_per_step`` at a time (each level's activations), and the frames whole."""
    del first, itemsize
    s, f = config.spatial_scale, grid.clip_frames
    rows, cols = frame_tiles(s * _frame_rows(grid), s * grid.cols, config)
    clips, frames = (1, 1) if f == 1 else (math.ceil(f / config.clip_length), config.clip_length)
    tiles = grid.batch * clips * len(rows.starts) * len(cols.starts)
    step = min(config.tiles_per_step, math.ceil(tiles / _devices(grid)))
    pixels = rows.size * cols.size
    layers: list[Layer] = [Tensor(grid.batch * clips * frames * s * _frame_rows(grid) * s * grid.cols * 3)]
    for cout, spatial, temporal in zip(config.block_out_channels, config.spatial_downsample_factors,
                                       config.temporal_downsample_factors, strict=True):
        layers.append(Tensor(step * frames * pixels * cout))
        pixels, frames = pixels // (spatial * spatial), math.ceil(frames / temporal)
    return layers


# Minimax fits to memory_analysis() of the programs on XLA:CPU (``python -m bench.memory --fit minimax-h3
# --features outputs attention --real``): every shape of bench/memory.py's ``tiny_configs`` and the
# real width (2048, 32 heads) with 2 of its 36 ViT blocks at 256x384 (``real_configs``), where the
# attention's scores of a step of 1,797-token tiles are most of the temp: decodes 0.75-1.25, encodes
# 0.90-1.10. Its programs have no convs of the CPU paths, so one table serves them all.
H3 = FamilyEstimate(h3_decoder, h3_encoder, matmul={"decode": coefficients(0.0, 0.0, 1.548, 0.0, 1.301, 0.0),
                                                    "encode": coefficients(0.0, 0.0, 2.578, 0.0, 0.0, 0.0)})


def family_estimate(config: H3Config) -> FamilyEstimate:
    del config
    return H3
