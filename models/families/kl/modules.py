"""The image VAE of Stable Diffusion, SDXL and Flux.1 (diffusers' ``AutoencoderKL``) and Flux.2's
(``AutoencoderKLFlux2``) in Flax nnx, channels-last inside.

An image runs as a one-frame clip ``(B, 1, H, W, C)`` (``models.shapes``), so the decode and encode
programs and the band sharding serve it as they serve a video; every layer here is 2-D (frame by
frame). 3x3 convs zero-pad (``SpatialContext.pad_hw``), GroupNorm(``norm_num_groups``, eps 1e-6)
takes its statistics over the whole image (``SpatialContext.group_moments``: on a band, the sums of
every band), and the mid block's single-head attention sees every token of the image
(``SpatialContext.attend``: on a band, the keys and values of every band). The upsampler is nearest
2x then a 3x3 conv (computed from the low-resolution input, ``upsample2x_conv2d_frames``); the
encoder's downsampler a 3x3 stride-2 conv after one zero row/column at the bottom/right.

The whole image is decoded (and encoded) at once: ``causal = False``, no caches. Names mirror
diffusers' (``decoder.up_blocks.0.resnets.1.conv2.weight``), so loading is a rename (``models.keys``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from vaeserve.models.conv import downsample2x_conv2d_frames, upsample2x_conv2d_frames
from vaeserve.models.layers import Conv2d, GroupNorm, PointwiseConv, scoped
from vaeserve.models.spatial import SpatialContext

from .config import AutoencoderKLConfig, AutoencoderKLFlux2Config

KLConfig = AutoencoderKLConfig | AutoencoderKLFlux2Config


class ResnetBlock2D(nnx.Module):
    """GroupNorm → SiLU → conv → GroupNorm → SiLU → conv, plus a 1x1 ``conv_shortcut`` when the
    widths differ. ``(B, T, H, W, C)`` → ``(B, T, H, W, O)``."""

    def __init__(self, cin: int, cout: int, groups: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.norm1 = GroupNorm(cin, groups, dtype=dtype)
        self.conv1 = Conv2d(cin, cout, rngs=rngs, dtype=dtype)
        self.norm2 = GroupNorm(cout, groups, dtype=dtype)
        self.conv2 = Conv2d(cout, cout, rngs=rngs, dtype=dtype)
        self.conv_shortcut = (PointwiseConv(cin, cout, rngs=rngs, dtype=dtype, torch_layout="pointwise2d")
                              if cin != cout else None)

    @scoped
    def __call__(self, x: jax.Array, ctx: SpatialContext) -> jax.Array:
        shortcut = x if self.conv_shortcut is None else self.conv_shortcut(x)
        h = self.conv1(jax.nn.silu(self.norm1(x, ctx)), ctx)
        return self.conv2(jax.nn.silu(self.norm2(h, ctx)), ctx) + shortcut


class ImageAttention(nnx.Module):
    """diffusers' ``Attention`` as the mid block builds it: GroupNorm, one head of width C, linear
    q/k/v/out with biases, residual; every token attends to every token of its image.
    ``(B, T, H, W, C)`` → same."""

    def __init__(self, dim: int, groups: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.group_norm = GroupNorm(dim, groups, dtype=dtype)
        self.to_q = PointwiseConv(dim, dim, rngs=rngs, dtype=dtype, torch_layout="linear")
        self.to_k = PointwiseConv(dim, dim, rngs=rngs, dtype=dtype, torch_layout="linear")
        self.to_v = PointwiseConv(dim, dim, rngs=rngs, dtype=dtype, torch_layout="linear")
        self.to_out = nnx.List([PointwiseConv(dim, dim, rngs=rngs, dtype=dtype, torch_layout="linear")])

    @scoped
    def __call__(self, x: jax.Array, ctx: SpatialContext) -> jax.Array:
        b, t, h, w, c = x.shape
        normed = self.group_norm(x, ctx)
        q, k, v = (proj(normed).reshape(b * t, h, w, c) for proj in (self.to_q, self.to_k, self.to_v))
        return x + self.to_out[0](ctx.attend(q, k, v).reshape(x.shape))


class MidBlock(nnx.Module):
    """Resnet → (attention) → resnet (``UNetMidBlock2D``). ``(B, T, H, W, C)`` → same."""

    def __init__(self, dim: int, groups: int, *, attention: bool, rngs: nnx.Rngs, dtype=jnp.float32):
        self.resnets = nnx.List([ResnetBlock2D(dim, dim, groups, rngs=rngs, dtype=dtype) for _ in range(2)])
        self.attentions = nnx.List([ImageAttention(dim, groups, rngs=rngs, dtype=dtype)] if attention else [])

    @scoped
    def __call__(self, x: jax.Array, ctx: SpatialContext) -> jax.Array:
        x = self.resnets[0](x, ctx)
        for attention in self.attentions:
            x = attention(x, ctx)
        return self.resnets[1](x, ctx)


class Upsample2D(nnx.Module):
    """Nearest 2x, then a 3x3 conv (held as ``conv``), from the padded low-resolution frames: the
    4x larger input never exists. ``(B, T, H, W, C)`` → ``(B, T, 2H, 2W, C)``."""

    def __init__(self, dim: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.conv = Conv2d(dim, dim, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, x: jax.Array, ctx: SpatialContext) -> jax.Array:
        return upsample2x_conv2d_frames(ctx.pad_hw(x), self.conv.kernel[...], self.conv.bias[...],
                                        native=ctx.native_conv, rounded_sums=ctx.rounded_conv_sums)


class Downsample2D(nnx.Module):
    """A 3x3 stride-2 conv (held as ``conv``) after one zero row/column at the bottom/right.
    ``(B, T, H, W, C)`` (``H``, ``W`` even) → ``(B, T, H/2, W/2, C)``."""

    def __init__(self, dim: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.conv = Conv2d(dim, dim, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, x: jax.Array, ctx: SpatialContext) -> jax.Array:
        return downsample2x_conv2d_frames(ctx.pad_hw_after(x), self.conv.kernel[...], self.conv.bias[...],
                                          native=ctx.native_conv, rounded_sums=ctx.rounded_conv_sums,
                                          onednn=ctx.onednn_conv)


def _resnets(cin: int, cout: int, layers: int, groups: int, *, rngs: nnx.Rngs, dtype) -> nnx.List:
    """A block's ``layers`` resnets, ``cin`` → ``cout`` in the first (diffusers' ``resnets.{i}``)."""
    dims = [cin] + [cout] * layers
    return nnx.List([ResnetBlock2D(a, b, groups, rngs=rngs, dtype=dtype) for a, b in zip(dims[:-1], dims[1:],
                                                                                          strict=True)])


class UpBlock(nnx.Module):
    """``UpDecoderBlock2D``: resnets, then (unless it is the last block) ``upsamplers.0``."""

    def __init__(self, cin: int, cout: int, layers: int, groups: int, *, upsample: bool, rngs: nnx.Rngs,
                 dtype=jnp.float32):
        self.resnets = _resnets(cin, cout, layers, groups, rngs=rngs, dtype=dtype)
        self.upsamplers = nnx.List([Upsample2D(cout, rngs=rngs, dtype=dtype)] if upsample else [])

    @scoped
    def __call__(self, x: jax.Array, ctx: SpatialContext) -> jax.Array:
        for layer in (*self.resnets, *self.upsamplers):
            x = layer(x, ctx)
        return x


class DownBlock(nnx.Module):
    """``DownEncoderBlock2D``: resnets, then (unless it is the last block) ``downsamplers.0``."""

    def __init__(self, cin: int, cout: int, layers: int, groups: int, *, downsample: bool, rngs: nnx.Rngs,
                 dtype=jnp.float32):
        self.resnets = _resnets(cin, cout, layers, groups, rngs=rngs, dtype=dtype)
        self.downsamplers = nnx.List([Downsample2D(cout, rngs=rngs, dtype=dtype)] if downsample else [])

    @scoped
    def __call__(self, x: jax.Array, ctx: SpatialContext) -> jax.Array:
        for layer in (*self.resnets, *self.downsamplers):
            x = layer(x, ctx)
        return x


class Decoder(nnx.Module):
    """conv_in → mid block → up blocks → GroupNorm → SiLU → conv_out: ``(B, T, h, w, z)`` →
    ``(B, T, s·h, s·w, 3)``, ``s = 2^(blocks − 1)`` (8 for the real configs)."""

    def __init__(self, config: KLConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        dims, groups = tuple(reversed(config.decoder_channels)), config.norm_num_groups
        self.conv_in = Conv2d(config.latent_channels, dims[0], rngs=rngs, dtype=dtype)
        self.mid_block = MidBlock(dims[0], groups, attention=config.mid_block_add_attention, rngs=rngs, dtype=dtype)
        self.up_blocks = nnx.List([UpBlock(cin, cout, config.layers_per_block + 1, groups,
                                           upsample=i < len(dims) - 1, rngs=rngs, dtype=dtype)
                                   for i, (cin, cout) in enumerate(zip((dims[0], *dims[:-1]), dims, strict=True))])
        self.conv_norm_out = GroupNorm(dims[-1], groups, dtype=dtype)
        self.conv_out = Conv2d(dims[-1], config.out_channels, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, x: jax.Array, ctx: SpatialContext) -> jax.Array:
        with jax.named_scope("conv_in"):
            x = self.conv_in(x, ctx)
        with jax.named_scope("mid_block"):
            x = self.mid_block(x, ctx)
        for i, block in enumerate(self.up_blocks):
            with jax.named_scope(f"up_blocks.{i}"):
                x = block(x, ctx)
        with jax.named_scope("conv_out"):
            return self.conv_out(jax.nn.silu(self.conv_norm_out(x, ctx)), ctx)


class Encoder(nnx.Module):
    """conv_in → down blocks → mid block → GroupNorm → SiLU → conv_out: ``(B, T, H, W, 3)`` →
    ``(B, T, H/s, W/s, 2z)``."""

    def __init__(self, config: KLConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        dims, groups = config.block_out_channels, config.norm_num_groups
        self.conv_in = Conv2d(config.in_channels, dims[0], rngs=rngs, dtype=dtype)
        self.down_blocks = nnx.List([DownBlock(cin, cout, config.layers_per_block, groups,
                                               downsample=i < len(dims) - 1, rngs=rngs, dtype=dtype)
                                     for i, (cin, cout) in enumerate(zip((dims[0], *dims[:-1]), dims, strict=True))])
        self.mid_block = MidBlock(dims[-1], groups, attention=config.mid_block_add_attention, rngs=rngs, dtype=dtype)
        self.conv_norm_out = GroupNorm(dims[-1], groups, dtype=dtype)
        self.conv_out = Conv2d(dims[-1], 2 * config.latent_channels, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, x: jax.Array, ctx: SpatialContext) -> jax.Array:
        with jax.named_scope("conv_in"):
            x = self.conv_in(x, ctx)
        for i, block in enumerate(self.down_blocks):
            with jax.named_scope(f"down_blocks.{i}"):
                x = block(x, ctx)
        with jax.named_scope("mid_block"):
            x = self.mid_block(x, ctx)
        with jax.named_scope("conv_out"):
            return self.conv_out(jax.nn.silu(self.conv_norm_out(x, ctx)), ctx)


def _pointwise(use: bool, channels: int, *, rngs: nnx.Rngs, dtype) -> PointwiseConv | None:
    """A 1x1 ``(post_)quant_conv``, or None where the config has none (Flux.1)."""
    return PointwiseConv(channels, channels, rngs=rngs, dtype=dtype, torch_layout="pointwise2d") if use else None


class KLDecoder(nnx.Module):
    """(``post_quant_conv`` +) decoder: latents ``(B, 1, h, w, z)`` → images ``(B, 1, s·h, s·w, 3)``,
    the whole image in one call (``caches`` must be None; none are returned)."""

    steps_with_caches = False  # every GroupNorm spans the image (models.family_modules)
    lookahead = None
    needs_clip_frames = False
    runtime_clip_frames = False
    temporal_scale = 1

    def __init__(self, config: KLConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.post_quant_conv = _pointwise(config.use_post_quant_conv, config.latent_channels, rngs=rngs, dtype=dtype)
        self.decoder = Decoder(config, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, z: jax.Array, caches: None, ctx: SpatialContext, *, inner_frames: int | None = None,
                 clip_frames: int | None = None, conditions: None = None) -> tuple[jax.Array, None]:
        del inner_frames, clip_frames, conditions  # one frame: nothing to stream; no timestep
        if caches is not None:
            raise ValueError("an AutoencoderKL decodes a whole image at once; it takes no caches")
        if self.post_quant_conv is not None:
            with jax.named_scope("post_quant_conv"):
                z = self.post_quant_conv(z)
        with jax.named_scope("decoder"):
            return self.decoder(z, ctx), None


class KLEncoder(nnx.Module):
    """Encoder (+ ``quant_conv``): images ``(B, 1, H, W, 3)`` in [-1, 1] → posterior moments
    ``(B, 1, H/s, W/s, 2z)`` (mean, then log-variance), the whole image in one call."""

    steps_with_caches = False
    needs_clip_frames = False
    temporal_scale = 1

    def __init__(self, config: KLConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.encoder = Encoder(config, rngs=rngs, dtype=dtype)
        self.quant_conv = _pointwise(config.use_quant_conv, 2 * config.latent_channels, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, x: jax.Array, caches: None, ctx: SpatialContext, *,
                 clip_frames: int | None = None) -> tuple[jax.Array, None]:
        del clip_frames
        if caches is not None:
            raise ValueError("an AutoencoderKL encodes a whole image at once; it takes no caches")
        with jax.named_scope("encoder"):
            x = self.encoder(x, ctx)
        if self.quant_conv is not None:
            with jax.named_scope("quant_conv"):
                x = self.quant_conv(x)
        return x, None


class BatchNormStatistics(nnx.Module):
    """Flux.2's ``bn``: the running mean and variance of its pipelines' patchified latents
    (``config.batch_norm_channels`` values each). The decode does not use them (pipelines apply
    them before unpatchifying); they are kept with the weights so a checkpoint survives the round
    trip, and read as ``vae.state["bn"]``. (The buffer ``num_batches_tracked`` is a training count:
    not kept.)"""

    def __init__(self, channels: int, *, dtype=jnp.float32):
        self.running_mean = nnx.Param(jnp.zeros((channels,), dtype), torch_layout="vector")
        self.running_var = nnx.Param(jnp.ones((channels,), dtype), torch_layout="vector")


class Flux2Decoder(KLDecoder):
    """``KLDecoder`` of an ``AutoencoderKLFlux2`` config, holding the checkpoint's ``bn`` statistics."""

    def __init__(self, config: AutoencoderKLFlux2Config, *, rngs: nnx.Rngs, dtype=jnp.float32):
        super().__init__(config, rngs=rngs, dtype=dtype)
        self.bn = BatchNormStatistics(config.batch_norm_channels, dtype=dtype)
