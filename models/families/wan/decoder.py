"""The Wan 2.1 and Wan 2.2 causal video VAE decoders in Flax nnx, channels-last inside.

Built from the shared layers (``models.layers``); the config picks the up blocks (``UpBlock`` for
Wan 2.1, ``ResidualUpBlock`` for Wan 2.2's ``is_residual``) and whether the output is unpatchified.
Call the decoder on latent frame 0 with ``caches=None`` (it yields one frame), then on each later
chunk of latent frames with the caches it returned (4 frames per latent frame): ``models.decode``
runs that loop.

Every up block is a callable ``(x, caches, ctx, *, first_chunk) -> (x, caches)`` whose caches have
a fixed shape after latent frame 0, so a block can also be stepped on its own (frame by frame).
``first_chunk`` (latent frame 0) is passed explicitly; only Wan 2.2's shortcut needs it.

Frame-level streaming (``inner_frames``): after each temporal upsampler, the later stages see
2, then 4 frames per latent frame, at up to full resolution. Their only dependence on the past is
the causal caches, so they run on ``inner_frames`` frames at a time in an inner ``lax.scan`` that
carries those caches: the same computation, reordered, holding one group's activations instead of
the whole step's.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import jax
import jax.numpy as jnp
from flax import nnx

from vaeserve.models.frame_groups import scan_frame_groups, stream_group
from vaeserve.models.layers import (
    CausalConv3d,
    ConvCache,
    DupUp3D,
    MidBlock,
    MidBlockCache,
    PointwiseConv,
    Resample,
    ResidualBlock,
    RMSNorm,
    UpBlockCache,
    scoped,
    unpatchify,
)
from vaeserve.models.spatial import SpatialContext

from .config import WanVAEConfig

# (conv_in, mid_block, *up_blocks, conv_out): what one decode step hands to the next.
DecoderCache: TypeAlias = tuple[ConvCache | MidBlockCache | UpBlockCache, ...]
# A block's caches while it runs: entry i belongs to its i-th layer, whose own signature types it
# (None before latent frame 0). A variable-length tuple cannot say which entry has which type.
LayerCaches: TypeAlias = tuple[Any, ...]

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
    def __call__(self, x: jax.Array, caches: UpBlockCache | None, ctx: SpatialContext, *,
                 first_chunk: bool) -> tuple[jax.Array, UpBlockCache]:
        del first_chunk  # Wan 2.1 has no shortcut; its upsampler sees frame 0 from its empty cache
        n = len(self.resnets) + len(self.upsamplers)
        layer_caches: LayerCaches = caches if caches is not None else (None,) * n
        x, new = _resnets(self.resnets, x, layer_caches, ctx)
        for upsampler in self.upsamplers:
            with jax.named_scope("upsamplers.0"):
                x, cache = upsampler(x, layer_caches[-1], ctx)
            new.append(cache)
        return x, tuple(new)


def _resnets(resnets, x: jax.Array, caches, ctx: SpatialContext) -> tuple[jax.Array, list]:
    """Run an up block's residual blocks in order; their new caches, in order."""
    new = []
    for i, resnet in enumerate(resnets):
        with jax.named_scope(f"resnets.{i}"):
            x, cache = resnet(x, caches[i], ctx)
        new.append(cache)
    return x, new


class ResidualUpBlock(nnx.Module):
    """Wan 2.2 up block: ``num_res_blocks + 1`` residual blocks and (except in the last stage) a 2x
    upsampler that keeps the block's width, plus the parameter-free ``DupUp3D`` shortcut from the
    block's input (diffusers' ``WanResidualUpBlock``).

    ``(B, T, H, W, cin)`` → ``(B, T', 2H, 2W, cout)`` (last stage: ``(B, T, H, W, cout)``, no
    shortcut). On the first chunk the upsampler skips its time conv and the shortcut drops its
    leading frame, so both paths have ``T' = T`` frames there (``2T`` later, for upsample3d).
    """

    def __init__(self, cin: int, cout: int, num_res_blocks: int, mode: str | None, *, rngs: nnx.Rngs,
                 dtype=jnp.float32):
        dims = [cin] + [cout] * (num_res_blocks + 1)
        self.resnets = nnx.List(
            [ResidualBlock(a, b, rngs=rngs, dtype=dtype) for a, b in zip(dims[:-1], dims[1:], strict=True)]
        )
        # diffusers names it ``upsampler`` (no list) here: the weights are ``upsampler.resample.1.*``.
        self.upsampler = Resample(cout, mode, rngs=rngs, dtype=dtype, cout=cout) if mode else None
        self.avg_shortcut = DupUp3D(cout, temporal=mode == "upsample3d") if mode else None

    @scoped
    def __call__(self, x: jax.Array, caches: UpBlockCache | None, ctx: SpatialContext, *,
                 first_chunk: bool) -> tuple[jax.Array, UpBlockCache]:
        n = len(self.resnets) + (self.upsampler is not None)
        layer_caches: LayerCaches = caches if caches is not None else (None,) * n
        shortcut = x
        x, new = _resnets(self.resnets, x, layer_caches, ctx)
        if self.upsampler is not None and self.avg_shortcut is not None:
            with jax.named_scope("upsampler"):
                x, cache = self.upsampler(x, layer_caches[-1], ctx)
            new.append(cache)
            with jax.named_scope("avg_shortcut"):
                x = x + self.avg_shortcut(shortcut, first_chunk=first_chunk)
        return x, tuple(new)


class Decoder3d(nnx.Module):
    """conv_in → mid block → up blocks → RMS norm → SiLU → conv_out.

    ``(B, T, H, W, z)`` → ``(B, T', 8H, 8W, out_channels)`` for the real configs. The channel plan
    is ``config.decoder_dims``: Wan 2.1 ``[384, 384, 384, 192, 96]``, each upsampler halving the
    width (a block's input is the previous block's width / 2); Wan 2.2 ``[1024, 1024, 1024, 512,
    256]`` with residual up blocks whose upsamplers keep the width.
    """

    def __init__(self, config: WanVAEConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        dims = config.decoder_dims
        self.conv_in = CausalConv3d(config.z_dim, dims[0], rngs=rngs, dtype=dtype)
        self.mid_block = MidBlock(dims[0], rngs=rngs, dtype=dtype)
        blocks: list[UpBlock | ResidualUpBlock] = []
        num_stages = len(config.dim_mult)
        for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
            mode = None
            if i != num_stages - 1:
                mode = "upsample3d" if config.temperal_upsample[i] else "upsample2d"
            if config.is_residual:
                blocks.append(ResidualUpBlock(cin, cout, config.num_res_blocks, mode, rngs=rngs, dtype=dtype))
            else:
                cin = cin // 2 if i > 0 else cin  # each Wan 2.1 upsampler halves the width
                blocks.append(UpBlock(cin, cout, config.num_res_blocks, mode, rngs=rngs, dtype=dtype))
        self.up_blocks = nnx.List(blocks)
        self.norm_out = RMSNorm(dims[-1], dtype=dtype)
        self.conv_out = CausalConv3d(dims[-1], config.out_channels, rngs=rngs, dtype=dtype)
        # Static: the up blocks whose upsampler doubles time (the later stages stream frame groups),
        # and the size of a last-stage frame relative to a latent pixel (to pick the group size).
        self.temporal_blocks = tuple(i for i, up in enumerate(config.temperal_upsample[: num_stages - 1]) if up)
        self.last_stage_pixel = (2 ** (num_stages - 1)) ** 2 * dims[-1]  # channels·pixels per latent pixel

    @scoped
    def __call__(self, x: jax.Array, caches: DecoderCache | None, ctx: SpatialContext, *,
                 first_chunk: bool, inner_frames: int | None = None) -> tuple[jax.Array, DecoderCache]:
        """``inner_frames``: frames per inner step of the stages after each temporal upsampler (None:
        automatic, see ``stream_group``; ≥ the step's frames: no inner loop). Latent frame 0 yields
        one frame and never loops."""
        layer_caches: LayerCaches = caches if caches is not None else (None,) * (3 + len(self.up_blocks))
        with jax.named_scope("conv_in"):
            x, conv_in_cache = self.conv_in(x, layer_caches[0], ctx)
        with jax.named_scope("mid_block"):
            x, mid_cache = self.mid_block(x, layer_caches[1], ctx)
        b, _, h, w, _ = x.shape
        group = None if first_chunk else stream_group(inner_frames, b * h * w * self.last_stage_pixel
                                                      * jnp.dtype(x.dtype).itemsize)
        x, upper = self._upper(0, x, tuple(layer_caches[2:]), ctx, first_chunk=first_chunk, group=group)
        return x, (conv_in_cache, mid_cache, *upper)

    def _upper(self, start: int, x: jax.Array, caches: tuple, ctx: SpatialContext, *, first_chunk: bool,
               group: int | None) -> tuple[jax.Array, tuple]:
        """Up blocks ``start…`` then the head, on ``x``; ``caches`` are theirs, then conv_out's.

        After a temporal upsampler (and ``group`` set) the rest runs ``group`` frames at a time.
        """
        new = []
        for i in range(start, len(self.up_blocks)):
            with jax.named_scope(f"up_blocks.{i}"):
                x, cache = self.up_blocks[i](x, caches[i - start], ctx, first_chunk=first_chunk)
            new.append(cache)
            if group is not None and i in self.temporal_blocks:
                def later_stages(frames, later_caches, after=i + 1):
                    return self._upper(after, frames, later_caches, ctx, first_chunk=False, group=group)

                with jax.named_scope(f"frame_groups_after_up_blocks.{i}"):
                    x, later = scan_frame_groups(later_stages, x, caches[i + 1 - start :], group)
                return x, (*new, *later)
        with jax.named_scope("conv_out"):
            x, conv_out_cache = self.conv_out(jax.nn.silu(self.norm_out(x)), caches[-1], ctx)
        return x, (*new, conv_out_cache)


class WanDecoder(nnx.Module):
    """``post_quant_conv`` + decoder (+ unpatchify): latents ``(B, T, H, W, z)`` → frames
    ``(B, T', s·H, s·W, 3)``, ``s = config.spatial_scale`` (8 for Wan 2.1, 16 for Wan 2.2).

    Call with ``caches=None`` for latent frame 0 (which must then be the only frame: it yields 1
    frame) and with the returned caches for every later chunk of frames (4 frames each).
    ``inner_frames``: frames per inner step after each temporal upsampler (``Decoder3d``).
    """

    steps_with_caches = True  # latent frame 0, then later chunks with the caches (models.family_modules)
    lookahead = None
    needs_clip_frames = False
    runtime_clip_frames = False

    def __init__(self, config: WanVAEConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.temporal_scale = config.temporal_scale  # frames per latent frame after frame 0 (static)
        self.patch = config.patch  # static: 2 for Wan 2.2's 2x2 patches, else 1
        self.post_quant_conv = PointwiseConv(config.z_dim, config.z_dim, rngs=rngs, dtype=dtype)
        self.decoder = Decoder3d(config, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, z: jax.Array, caches: DecoderCache | None, ctx: SpatialContext, *,
                 inner_frames: int | None = None, clip_frames: int | None = None,
                 conditions: None = None) -> tuple[jax.Array, DecoderCache]:
        del clip_frames, conditions  # its caches hold two frames whatever the clip's length; no timestep
        first_chunk = caches is None  # latent frame 0: the reference's first_chunk=True
        if first_chunk and z.shape[1] != 1:
            raise ValueError(f"the first decode step takes exactly 1 latent frame; got {z.shape[1]}")
        with jax.named_scope("post_quant_conv"):
            z = self.post_quant_conv(z)
        with jax.named_scope("decoder"):
            frames, caches = self.decoder(z, caches, ctx, first_chunk=first_chunk, inner_frames=inner_frames)
        with jax.named_scope("unpatchify"):
            return unpatchify(frames, self.patch), caches
