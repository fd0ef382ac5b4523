"""The Wan 2.1 causal video VAE decoder in Flax nnx, channels-last inside.

Built from the shared layers (``models.layers``). Call it on latent frame 0 with ``caches=None``
(it yields one frame), then on each later chunk of latent frames with the caches it returned (4
frames per latent frame): ``models.decode`` runs that loop.
"""

from __future__ import annotations

from typing import TypeAlias

import jax
import jax.numpy as jnp
from flax import nnx

from .config import WanVAEConfig
from .layers import (
    CausalConv3d,
    ConvCache,
    MidBlock,
    MidBlockCache,
    PointwiseConv,
    Resample,
    ResidualBlock,
    RMSNorm,
    UpBlockCache,
    scoped,
)
from .spatial import SpatialContext

# (conv_in, mid_block, *up_blocks, conv_out): what one decode step hands to the next.
DecoderCache: TypeAlias = tuple[ConvCache | MidBlockCache | UpBlockCache, ...]


class UpBlock(nnx.Module):
    """``num_res_blocks + 1`` residual blocks, then (except in the last stage) a 2x upsampler.

    ``(B, T, H, W, cin)`` → ``(B, T', 2H, 2W, cout // 2)`` (no upsampler: ``(B, T, H, W, cout)``).
    """

    def __init__(self, cin: int, cout: int, num_res_blocks: int, mode: str | None, *, rngs: nnx.Rngs,
                 dtype=jnp.float32):
        dims = [cin] + [cout] * (num_res_blocks + 1)
        self.resnets = nnx.List(
            [ResidualBlock(a, b, rngs=rngs, dtype=dtype) for a, b in zip(dims[:-1], dims[1:], strict=True)]
        )
        self.upsamplers = nnx.List([Resample(cout, mode, rngs=rngs, dtype=dtype)] if mode else [])

    @scoped
    def __call__(self, x: jax.Array, caches: UpBlockCache | None,
                 ctx: SpatialContext) -> tuple[jax.Array, UpBlockCache]:
        n = len(self.resnets) + len(self.upsamplers)
        caches = caches if caches is not None else (None,) * n
        new = []
        for i, resnet in enumerate(self.resnets):
            with jax.named_scope(f"resnets.{i}"):
                x, cache = resnet(x, caches[i], ctx)
            new.append(cache)
        for upsampler in self.upsamplers:
            with jax.named_scope("upsamplers.0"):
                x, cache = upsampler(x, caches[-1], ctx)
            new.append(cache)
        return x, tuple(new)


class Decoder3d(nnx.Module):
    """conv_in → mid block → up blocks → RMS norm → SiLU → conv_out.

    ``(B, T, H, W, z)`` → ``(B, T', 8H, 8W, out_channels)`` for the Wan 2.1 config; the channel plan
    is ``config.decoder_dims`` (``[384, 384, 384, 192, 96]``), each upsampler halving the width.
    """

    def __init__(self, config: WanVAEConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        dims = config.decoder_dims
        self.conv_in = CausalConv3d(config.z_dim, dims[0], rngs=rngs, dtype=dtype)
        self.mid_block = MidBlock(dims[0], rngs=rngs, dtype=dtype)
        blocks = []
        num_stages = len(config.dim_mult)
        for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
            cin = cin // 2 if i > 0 else cin  # each Wan 2.1 upsampler halves the width
            mode = None
            if i != num_stages - 1:
                mode = "upsample3d" if config.temperal_upsample[i] else "upsample2d"
            blocks.append(UpBlock(cin, cout, config.num_res_blocks, mode, rngs=rngs, dtype=dtype))
        self.up_blocks = nnx.List(blocks)
        self.norm_out = RMSNorm(dims[-1], dtype=dtype)
        self.conv_out = CausalConv3d(dims[-1], config.out_channels, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, x: jax.Array, caches: DecoderCache | None,
                 ctx: SpatialContext) -> tuple[jax.Array, DecoderCache]:
        caches = caches if caches is not None else (None,) * (3 + len(self.up_blocks))
        with jax.named_scope("conv_in"):
            x, conv_in_cache = self.conv_in(x, caches[0], ctx)
        with jax.named_scope("mid_block"):
            x, mid_cache = self.mid_block(x, caches[1], ctx)
        up_caches = []
        for i, block in enumerate(self.up_blocks):
            with jax.named_scope(f"up_blocks.{i}"):
                x, cache = block(x, caches[2 + i], ctx)
            up_caches.append(cache)
        with jax.named_scope("conv_out"):
            x, conv_out_cache = self.conv_out(jax.nn.silu(self.norm_out(x)), caches[-1], ctx)
        return x, (conv_in_cache, mid_cache, *up_caches, conv_out_cache)


class WanDecoder(nnx.Module):
    """``post_quant_conv`` + decoder: latents ``(B, T, H, W, z)`` → frames ``(B, T', 8H, 8W, 3)``.

    Call with ``caches=None`` for latent frame 0 (which must then be the only frame: it yields 1
    frame) and with the returned caches for every later chunk of frames (4 frames each).
    """

    def __init__(self, config: WanVAEConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.temporal_scale = config.temporal_scale  # frames per latent frame after frame 0 (static)
        self.post_quant_conv = PointwiseConv(config.z_dim, config.z_dim, rngs=rngs, dtype=dtype)
        self.decoder = Decoder3d(config, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, z: jax.Array, caches: DecoderCache | None,
                 ctx: SpatialContext) -> tuple[jax.Array, DecoderCache]:
        if caches is None and z.shape[1] != 1:
            raise ValueError(f"the first decode step takes exactly 1 latent frame; got {z.shape[1]}")
        with jax.named_scope("post_quant_conv"):
            z = self.post_quant_conv(z)
        with jax.named_scope("decoder"):
            return self.decoder(z, caches, ctx)
