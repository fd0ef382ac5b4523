"""The Wan 2.1 and Wan 2.2 causal video VAE encoders in Flax nnx, channels-last inside.

Built from the shared layers (``models.layers``): (2x2 patchify) → conv_in → down blocks → mid
block → RMS norm → SiLU → conv_out, then ``quant_conv``. Call it on frame 0 with ``caches=None``
(one frame in, one latent frame out), then on each later chunk of 4 frames with the caches it
returned (one latent frame out per chunk for the real configs): ``models.encode`` runs that loop,
as diffusers' ``_encode`` does.

The config picks the down blocks: Wan 2.1 a flat list of residual blocks and downsamplers;
Wan 2.2 (``is_residual``) ``ResidualDownBlock``s, each with a parameter-free AvgDown3D shortcut;
with ``patch_size`` the frames are patchified first (12 channels in, the exact inverse of the
decoder's unpatchify). Both are local per band, so the spatial seam stays as is.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from vaeserve.models.config import ConfigError
from vaeserve.models.layers import (
    AvgDown3D,
    CausalConv3d,
    ConvCache,
    Downsample,
    DownsampleCache,
    MidBlock,
    MidBlockCache,
    PointwiseConv,
    ResidualBlock,
    ResidualCache,
    RMSNorm,
    patchify,
    scoped,
)
from vaeserve.models.shapes import FRAMES_PER_CHUNK
from vaeserve.models.spatial import SpatialContext

from .config import WanVAEConfig


class ResidualDownCache(NamedTuple):
    """A Wan 2.2 down block's caches: its residual blocks', then its downsampler's (None for
    'downsample2d' and for the last stage, which has no downsampler)."""

    resnets: tuple[ResidualCache, ...]
    downsampler: DownsampleCache


class EncoderCache(NamedTuple):
    """What one encode step hands to the next (a pytree: it is the ``lax.scan`` carry)."""

    conv_in: ConvCache
    down_blocks: tuple[ResidualCache | DownsampleCache | ResidualDownCache, ...]
    mid_block: MidBlockCache
    conv_out: ConvCache


def encoder_dims(config: WanVAEConfig) -> tuple[int, ...]:
    """Channel widths of the encoder stages: ``[96, 96, 192, 384, 384]`` for Wan 2.1,
    ``[160, 160, 320, 640, 640]`` for Wan 2.2."""
    return tuple(config.base_dim * m for m in (1, *config.dim_mult))


def check_encoder_config(config: WanVAEConfig) -> None:
    """Configs this encoder reproduces faithfully; anything else raises ``ConfigError``."""
    if FRAMES_PER_CHUNK % config.temporal_scale:
        raise ConfigError(f"temporal downsampling x{config.temporal_scale} does not divide the reference's "
                          f"chunks of {FRAMES_PER_CHUNK} frames")
    if config.num_res_blocks < 1 and len(set(encoder_dims(config))) > 1:
        # The residual blocks are what widen each stage; without them the mid block gets the
        # wrong width (diffusers' encoder fails on such a config too).
        raise ConfigError(f"num_res_blocks=0 with encoder widths {list(encoder_dims(config))} leaves them "
                          "unmatched")


def _down_mode(config: WanVAEConfig, stage: int) -> str | None:
    """The downsampler after ``stage``: none after the last one."""
    if stage == len(config.dim_mult) - 1:
        return None
    return "downsample3d" if config.temperal_downsample[stage] else "downsample2d"


def _down_blocks(config: WanVAEConfig, *, rngs: nnx.Rngs, dtype) -> list[nnx.Module]:
    """Wan 2.1: one flat list, per stage ``num_res_blocks`` residual blocks and (except after the
    last stage) a downsampler — diffusers' ``encoder.down_blocks.{k}`` numbering. Wan 2.2: one
    ``ResidualDownBlock`` per stage (``encoder.down_blocks.{stage}.resnets.{j}`` / ``.downsampler``)."""
    dims = encoder_dims(config)
    blocks: list[nnx.Module] = []
    for stage, (cin, cout) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        mode = _down_mode(config, stage)
        if config.is_residual:
            blocks.append(ResidualDownBlock(cin, cout, config.num_res_blocks, mode, rngs=rngs, dtype=dtype))
            continue
        for _ in range(config.num_res_blocks):
            blocks.append(ResidualBlock(cin, cout, rngs=rngs, dtype=dtype))
            cin = cout
        if mode is not None:
            blocks.append(Downsample(cout, mode, rngs=rngs, dtype=dtype))
    return blocks


class ResidualDownBlock(nnx.Module):
    """Wan 2.2 down block: ``num_res_blocks`` residual blocks and (except in the last stage) a 2x
    downsampler, plus the parameter-free ``AvgDown3D`` shortcut from the block's input (diffusers'
    ``WanResidualDownBlock``).

    ``(B, T, H, W, cin)`` → ``(B, T', H/2, W/2, cout)`` (last stage: ``(B, T, H, W, cout)``, the
    shortcut then only regroups channels). For 'downsample3d', ``T' = T/2`` on later chunks and 1
    on the first chunk, where the downsampler skips its time conv and the shortcut averages the
    frame with the zero frame it pads in front.
    """

    def __init__(self, cin: int, cout: int, num_res_blocks: int, mode: str | None, *, rngs: nnx.Rngs,
                 dtype=jnp.float32):
        dims = [cin] + [cout] * num_res_blocks
        self.resnets = nnx.List(
            [ResidualBlock(a, b, rngs=rngs, dtype=dtype) for a, b in zip(dims[:-1], dims[1:], strict=True)]
        )
        self.downsampler = Downsample(cout, mode, rngs=rngs, dtype=dtype) if mode else None
        self.avg_shortcut = AvgDown3D(cout, temporal=mode == "downsample3d", spatial=mode is not None)

    @scoped
    def __call__(self, x: jax.Array, caches: ResidualDownCache | None,
                 ctx: SpatialContext) -> tuple[jax.Array, ResidualDownCache]:
        shortcut = x
        resnet_caches = []
        for i, resnet in enumerate(self.resnets):
            with jax.named_scope(f"resnets.{i}"):
                x, cache = resnet(x, None if caches is None else caches.resnets[i], ctx)
            resnet_caches.append(cache)
        down_cache = None
        if self.downsampler is not None:
            with jax.named_scope("downsampler"):
                x, down_cache = self.downsampler(x, None if caches is None else caches.downsampler, ctx)
        with jax.named_scope("avg_shortcut"):
            x = x + self.avg_shortcut(shortcut)
        return x, ResidualDownCache(tuple(resnet_caches), down_cache)


class Encoder3d(nnx.Module):
    """conv_in → down blocks → mid block → RMS norm → SiLU → conv_out.

    ``(B, T, H, W, in_channels)`` → ``(B, T', H/8, W/8, 2·z_dim)`` (posterior mean and log-variance)
    for the real configs (Wan 2.2's input is already patchified: 12 channels at half the size);
    ``T' = 1`` for frame 0, ``T / 4`` for later chunks.
    """

    def __init__(self, config: WanVAEConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        dims = encoder_dims(config)
        self.conv_in = CausalConv3d(config.in_channels, dims[0], rngs=rngs, dtype=dtype)
        self.down_blocks = nnx.List(_down_blocks(config, rngs=rngs, dtype=dtype))
        self.mid_block = MidBlock(dims[-1], rngs=rngs, dtype=dtype)
        self.norm_out = RMSNorm(dims[-1], dtype=dtype)
        self.conv_out = CausalConv3d(dims[-1], 2 * config.z_dim, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, x: jax.Array, caches: EncoderCache | None,
                 ctx: SpatialContext) -> tuple[jax.Array, EncoderCache]:
        with jax.named_scope("conv_in"):
            x, conv_in_cache = self.conv_in(x, None if caches is None else caches.conv_in, ctx)
        down_caches = []
        for i, block in enumerate(self.down_blocks):
            with jax.named_scope(f"down_blocks.{i}"):
                x, cache = block(x, None if caches is None else caches.down_blocks[i], ctx)
            down_caches.append(cache)
        with jax.named_scope("mid_block"):
            x, mid_cache = self.mid_block(x, None if caches is None else caches.mid_block, ctx)
        with jax.named_scope("conv_out"):
            x = jax.nn.silu(self.norm_out(x))
            x, conv_out_cache = self.conv_out(x, None if caches is None else caches.conv_out, ctx)
        return x, EncoderCache(conv_in_cache, tuple(down_caches), mid_cache, conv_out_cache)


class WanEncoder(nnx.Module):
    """(Patchify +) encoder + ``quant_conv``: frames ``(B, T, H, W, 3)`` in [-1, 1] → posterior
    moments ``(B, T', H/s, W/s, 2·z_dim)``, ``s = config.spatial_scale`` (8 for Wan 2.1, 16 for
    Wan 2.2), channels ``[0:z]`` the mean and ``[z:2z]`` the log-variance.

    Call with ``caches=None`` for frame 0 (which must then be the only frame) and with the returned
    caches for every later chunk of 4 frames.
    """

    steps_with_caches = True  # frame 0, then chunks of 4 frames with the caches (models.family_modules)
    needs_clip_frames = False

    def __init__(self, config: WanVAEConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        check_encoder_config(config)
        self.temporal_scale = config.temporal_scale
        self.patch = config.patch  # static: 2 for Wan 2.2's 2x2 patches, else 1
        self.encoder = Encoder3d(config, rngs=rngs, dtype=dtype)
        self.quant_conv = PointwiseConv(2 * config.z_dim, 2 * config.z_dim, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, x: jax.Array, caches: EncoderCache | None, ctx: SpatialContext, *,
                 clip_frames: int | None = None) -> tuple[jax.Array, EncoderCache]:
        del clip_frames  # its caches hold a fixed number of frames
        if caches is None and x.shape[1] != 1:
            raise ValueError(f"the first encode step takes exactly 1 frame; got {x.shape[1]}")
        with jax.named_scope("patchify"):
            x = patchify(x, self.patch)
        with jax.named_scope("encoder"):
            x, caches = self.encoder(x, caches, ctx)
        with jax.named_scope("quant_conv"):
            return self.quant_conv(x), caches
