"""The HunyuanVideo 1.5 VAE in Flax nnx, channels-last inside (diffusers' ``AutoencoderKLHunyuanVideo15``).

Per-pixel RMS norms and replicate-padded causal convs (Wan's ``ResidualBlock`` with
``ReplicateConv3d``), up/down-sampling that packs (time, row, column) sub-positions into channels
(DC-AE style: a conv at the coarse scale plus a parameter-free shortcut that repeats or averages
channels), and a mid-block attention over every latent token of the clip with a frame-causal mask.

Nothing spans the clip but that attention, and it only looks back: the model is causal in time and
runs like Wan's, latent frame 0 first (``caches=None``), then later chunks with the caches it
returned. The mid-block keeps the keys and values of every earlier latent frame in its cache
(``KVCache``, sized for ``clip_frames`` latent frames): the only state that grows with the clip.
The encoder runs the same way: frame 0, then chunks of 4 frames.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from vaeserve.models.config import ConfigError
from vaeserve.models.layers import PointwiseConv, ReplicateConv3d, ResidualBlock, ResidualCache, RMSNorm, scoped
from vaeserve.models.shapes import FRAMES_PER_CHUNK
from vaeserve.models.spatial import SpatialContext

from .config import HunyuanVideo15Config


# -- channel ↔ sub-position rearrangements (pure; local to a band of rows) -------------------------
def depth_to_space(x: jax.Array, frames: int, rows: int = 2, columns: int = 2) -> jax.Array:
    """diffusers' ``_dcae_upsample_rearrange``, channels-last: ``(B, T, H, W, f·r·s·C)`` →
    ``(B, f·T, r·H, s·W, C)``; channel ``((i·r + a)·s + d)·C + o`` goes to frame offset ``i``, row
    offset ``a``, column offset ``d``, channel ``o``."""
    b, t, h, w, packed = x.shape
    c = packed // (frames * rows * columns)
    x = x.reshape(b, t, h, w, frames, rows, columns, c).transpose(0, 1, 4, 2, 5, 3, 6, 7)
    return x.reshape(b, t * frames, h * rows, w * columns, c)


def space_to_depth(x: jax.Array, frames: int, rows: int = 2, columns: int = 2) -> jax.Array:
    """diffusers' ``_dcae_downsample_rearrange``, the inverse of ``depth_to_space``."""
    b, tf, hr, ws, c = x.shape
    x = x.reshape(b, tf // frames, frames, hr // rows, rows, ws // columns, columns, c)
    x = x.transpose(0, 1, 3, 5, 2, 4, 6, 7)
    return x.reshape(b, tf // frames, hr // rows, ws // columns, frames * rows * columns * c)


def group_mean(x: jax.Array, groups: int) -> jax.Array:
    """``(..., groups·g)`` → ``(..., groups)``: the mean of each run of ``g`` consecutive channels,
    summed in float32."""
    return x.astype(jnp.float32).reshape(*x.shape[:-1], groups, -1).mean(axis=-1).astype(x.dtype)


# -- attention with the keys and values of earlier frames ----------------------------------------
class KVCache(NamedTuple):
    """The mid-block attention's memory of the clip: keys and values of latent frames
    ``0..frames − 1`` in ``(B, clip_frames, H, W, C)`` buffers (later slots are zeros, never seen:
    the frame-causal mask hides them), and ``frames`` as ``(B, 1, 1, 1, 1)`` int32 (shaped like a
    band of a cache, so a sharded cache splits it like the others: each band keeps its copy)."""

    keys: jax.Array
    values: jax.Array
    frames: jax.Array


class CachedFrameCausalAttention(nnx.Module):
    """``HunyuanVideo15AttnBlock``: RMS norm, 1x1x1 q/k/v/proj_out, one head of width C, residual;
    each token attends to the tokens of its own and earlier latent frames. ``(B, T, H, W, C)`` → same.

    The first call (``cache`` None) allocates a ``KVCache`` for ``clip_frames`` latent frames; each
    call appends its frames to it and attends over it."""

    def __init__(self, dim: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.norm = RMSNorm(dim, dtype=dtype)
        self.to_q = PointwiseConv(dim, dim, rngs=rngs, dtype=dtype)
        self.to_k = PointwiseConv(dim, dim, rngs=rngs, dtype=dtype)
        self.to_v = PointwiseConv(dim, dim, rngs=rngs, dtype=dtype)
        self.proj_out = PointwiseConv(dim, dim, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, x: jax.Array, cache: KVCache | None, ctx: SpatialContext, *,
                 clip_frames: int | None) -> tuple[jax.Array, KVCache]:
        h = self.norm(x)
        q, k, v = self.to_q(h), self.to_k(h), self.to_v(h)
        if cache is None:
            if clip_frames is None or clip_frames < k.shape[1]:
                raise ValueError(f"the first attention step needs clip_frames ≥ {k.shape[1]} (the clip's latent "
                                 f"frames, to size its KVCache); received {clip_frames}")
            empty = jnp.zeros((k.shape[0], clip_frames, *k.shape[2:]), k.dtype)
            cache = KVCache(empty, empty, jnp.zeros((k.shape[0], 1, 1, 1, 1), jnp.int32))
        start = cache.frames[0, 0, 0, 0, 0]
        keys = lax.dynamic_update_slice_in_dim(cache.keys, k, start, axis=1)
        values = lax.dynamic_update_slice_in_dim(cache.values, v, start, axis=1)
        attended = ctx.attend_frames(q, keys, values, first_query_frame=start)
        return x + self.proj_out(attended), KVCache(keys, values, cache.frames + k.shape[1])


MidBlockCache = tuple[ResidualCache, KVCache, ResidualCache]


class MidBlock(nnx.Module):
    """Resnet → attention → resnet at latent resolution. ``(B, T, H, W, C)`` → same."""

    def __init__(self, dim: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.resnets = nnx.List([ResidualBlock(dim, dim, rngs=rngs, dtype=dtype, conv=ReplicateConv3d)
                                 for _ in range(2)])
        self.attentions = nnx.List([CachedFrameCausalAttention(dim, rngs=rngs, dtype=dtype)])

    @scoped
    def __call__(self, x: jax.Array, caches: MidBlockCache | None, ctx: SpatialContext, *,
                 clip_frames: int | None) -> tuple[jax.Array, MidBlockCache]:
        first, attention, second = caches if caches is not None else (None, None, None)
        with jax.named_scope("resnets.0"):
            x, first = self.resnets[0](x, first, ctx)
        with jax.named_scope("attentions.0"):
            x, attention = self.attentions[0](x, attention, ctx, clip_frames=clip_frames)
        with jax.named_scope("resnets.1"):
            x, second = self.resnets[1](x, second, ctx)
        return x, (first, attention, second)


# -- up/down-sampling -------------------------------------------------------------------------------
class Upsample(nnx.Module):
    """``HunyuanVideo15Upsample``: a causal conv to ``f·cout`` channels at the coarse scale, unpacked
    into 2x2 (``f = 4``) or 2x2x2 (``f = 8``, ``temporal``) sub-positions, plus the input's channels
    repeated ``f·cout / cin`` times and unpacked the same way.

    ``(B, T, H, W, cin)`` → ``(B, T', 2H, 2W, cout)``, ``T' = 2T`` when ``temporal``, except on the
    clip's first frame, which unpacks into one frame (half the conv's channels, half the repeats)."""

    def __init__(self, cin: int, cout: int, *, temporal: bool, rngs: nnx.Rngs, dtype=jnp.float32):
        self.temporal = temporal
        factor = 8 if temporal else 4
        self.conv = ReplicateConv3d(cin, cout * factor, rngs=rngs, dtype=dtype)
        self.cout, self.repeats = cout, factor * cout // cin

    @scoped
    def __call__(self, x: jax.Array, cache: jax.Array | None, ctx: SpatialContext, *,
                 first_chunk: bool) -> tuple[jax.Array, jax.Array]:
        h, cache = self.conv(x, cache, ctx)
        if not self.temporal:
            return depth_to_space(h, 1) + depth_to_space(jnp.repeat(x, self.repeats, axis=-1), 1), cache
        pieces = []
        if first_chunk:
            first = depth_to_space(h[:, :1], 1)[..., : self.cout]
            pieces.append(first + jnp.repeat(depth_to_space(x[:, :1], 1), self.repeats // 2, axis=-1))
            h, x = h[:, 1:], x[:, 1:]
        if x.shape[1]:
            pieces.append(depth_to_space(h, 2) + jnp.repeat(depth_to_space(x, 2), self.repeats, axis=-1))
        return jnp.concatenate(pieces, axis=1) if len(pieces) > 1 else pieces[0], cache


class Downsample(nnx.Module):
    """``HunyuanVideo15Downsample``, the inverse: a causal conv to ``cout / f`` channels at the fine
    scale, packed from 2x2 (or 2x2x2, ``temporal``: consecutive frame pairs) sub-positions, plus the
    packed input averaged over groups of ``f·cin / cout`` channels. The clip's first frame packs
    alone: the conv's channels twice, groups half as large."""

    def __init__(self, cin: int, cout: int, *, temporal: bool, rngs: nnx.Rngs, dtype=jnp.float32):
        self.temporal = temporal
        factor = 8 if temporal else 4
        self.conv = ReplicateConv3d(cin, cout // factor, rngs=rngs, dtype=dtype)
        self.cout = cout

    @scoped
    def __call__(self, x: jax.Array, cache: jax.Array | None, ctx: SpatialContext, *,
                 first_chunk: bool) -> tuple[jax.Array, jax.Array]:
        h, cache = self.conv(x, cache, ctx)
        if not self.temporal:
            return space_to_depth(h, 1) + group_mean(space_to_depth(x, 1), self.cout), cache
        pieces = []
        if first_chunk:
            first = space_to_depth(h[:, :1], 1)
            pieces.append(jnp.concatenate([first, first], axis=-1) + group_mean(space_to_depth(x[:, :1], 1), self.cout))
            h, x = h[:, 1:], x[:, 1:]
        if x.shape[1]:
            pieces.append(space_to_depth(h, 2) + group_mean(space_to_depth(x, 2), self.cout))
        return jnp.concatenate(pieces, axis=1) if len(pieces) > 1 else pieces[0], cache


# A block's caches: its resnets' (one per conv), then its resampler's conv cache (absent without one).
BlockCache = tuple[Any, ...]


class Block(nnx.Module):
    """An up (or down) block: resnets, then optionally a resampler, held in a list named
    ``resamplers_name`` (``"upsamplers"`` or ``"downsamplers"``, as diffusers names it)."""

    def __init__(self, cin: int, cout: int, layers: int, resampler: Upsample | Downsample | None, *,
                 resamplers_name: str, rngs: nnx.Rngs, dtype=jnp.float32):
        dims = [cin] + [cout] * layers
        self.resnets = nnx.List([ResidualBlock(a, b, rngs=rngs, dtype=dtype, conv=ReplicateConv3d)
                                 for a, b in zip(dims[:-1], dims[1:], strict=True)])
        self.resamplers_name = resamplers_name
        setattr(self, resamplers_name, nnx.List([resampler] if resampler is not None else []))

    @scoped
    def __call__(self, x: jax.Array, caches: BlockCache | None, ctx: SpatialContext, *,
                 first_chunk: bool) -> tuple[jax.Array, BlockCache]:
        resamplers = getattr(self, self.resamplers_name)
        layer_caches = caches if caches is not None else (None,) * (len(self.resnets) + len(resamplers))
        new = []
        for i, resnet in enumerate(self.resnets):
            with jax.named_scope(f"resnets.{i}"):
                x, cache = resnet(x, layer_caches[i], ctx)
            new.append(cache)
        for resampler in resamplers:
            x, cache = resampler(x, layer_caches[-1], ctx, first_chunk=first_chunk)
            new.append(cache)
        return x, tuple(new)


# -- decoder ----------------------------------------------------------------------------------------
DecoderCache = tuple[Any, ...]  # (conv_in, mid_block, *up_blocks, conv_out)


class Decoder3d(nnx.Module):
    """conv_in (+ the latents repeated to its width) → mid block → up blocks → RMS norm → SiLU →
    conv_out: ``(B, T, H, W, z)`` → ``(B, T', 16H, 16W, 3)`` for the real config."""

    def __init__(self, config: HunyuanVideo15Config, *, rngs: nnx.Rngs, dtype=jnp.float32):
        dims = config.decoder_channels
        self.repeat = dims[0] // config.latent_channels
        self.conv_in = ReplicateConv3d(config.latent_channels, dims[0], rngs=rngs, dtype=dtype)
        self.mid_block = MidBlock(dims[0], rngs=rngs, dtype=dtype)
        self.up_blocks = nnx.List([
            Block(cin, cout, config.layers_per_block + 1,
                  Upsample(cout, up, temporal=temporal, rngs=rngs, dtype=dtype) if up is not None else None,
                  resamplers_name="upsamplers", rngs=rngs, dtype=dtype)
            for cin, cout, up, temporal in config.up_blocks()])
        self.norm_out = RMSNorm(dims[-1], dtype=dtype)
        self.conv_out = ReplicateConv3d(dims[-1], config.out_channels, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, x: jax.Array, caches: DecoderCache | None, ctx: SpatialContext, *,
                 clip_frames: int | None) -> tuple[jax.Array, DecoderCache]:
        first_chunk = caches is None
        layer_caches = caches if caches is not None else (None,) * (3 + len(self.up_blocks))
        with jax.named_scope("conv_in"):
            h, conv_in = self.conv_in(x, layer_caches[0], ctx)
            x = h + jnp.repeat(x, self.repeat, axis=-1)
        with jax.named_scope("mid_block"):
            x, mid = self.mid_block(x, layer_caches[1], ctx, clip_frames=clip_frames)
        ups = []
        for i, block in enumerate(self.up_blocks):
            with jax.named_scope(f"up_blocks.{i}"):
                x, cache = block(x, layer_caches[2 + i], ctx, first_chunk=first_chunk)
            ups.append(cache)
        with jax.named_scope("conv_out"):
            x, conv_out = self.conv_out(jax.nn.silu(self.norm_out(x)), layer_caches[-1], ctx)
        return x, (conv_in, mid, *ups, conv_out)


class HunyuanVideo15Decoder(nnx.Module):
    """The decoder (no ``post_quant_conv`` in 1.5): latents ``(B, T, H, W, z)`` → frames.

    Call with ``caches=None`` for latent frame 0 (alone: it yields 1 frame) and with the returned
    caches for every later chunk (4 frames per latent frame), passing ``clip_frames`` — the clip's
    latent frames, for the mid-block's ``KVCache`` — to the first call. ``inner_frames`` is accepted
    for the common decode loop and has no effect (a step runs whole).
    """

    steps_with_caches = True
    lookahead = None
    needs_clip_frames = True  # the first step sizes the attention's KVCache
    runtime_clip_frames = False

    def __init__(self, config: HunyuanVideo15Config, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.temporal_scale = config.temporal_scale
        self.decoder = Decoder3d(config, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, z: jax.Array, caches: DecoderCache | None, ctx: SpatialContext, *,
                 inner_frames: int | None = None, clip_frames: int | None = None,
                 conditions: None = None) -> tuple[jax.Array, DecoderCache]:
        del inner_frames, conditions
        if caches is None and z.shape[1] != 1:
            raise ValueError(f"the first decode step takes exactly 1 latent frame; got {z.shape[1]}")
        with jax.named_scope("decoder"):
            return self.decoder(z, caches, ctx, clip_frames=clip_frames)


# -- encoder ----------------------------------------------------------------------------------------
class Encoder3d(nnx.Module):
    """conv_in → down blocks → mid block → RMS norm → SiLU → conv_out (+ the mid block's output
    averaged over channel groups): ``(B, T, H, W, 3)`` → ``(B, T', H/16, W/16, 2z)``."""

    def __init__(self, config: HunyuanVideo15Config, *, rngs: nnx.Rngs, dtype=jnp.float32):
        dims = config.block_out_channels
        self.moments = 2 * config.latent_channels
        self.conv_in = ReplicateConv3d(config.in_channels, dims[0], rngs=rngs, dtype=dtype)
        self.down_blocks = nnx.List([
            Block(cin, cout, config.layers_per_block,
                  Downsample(cout, down, temporal=temporal, rngs=rngs, dtype=dtype) if down is not None else None,
                  resamplers_name="downsamplers", rngs=rngs, dtype=dtype)
            for cin, cout, down, temporal in config.down_blocks()])
        self.mid_block = MidBlock(dims[-1], rngs=rngs, dtype=dtype)
        self.norm_out = RMSNorm(dims[-1], dtype=dtype)
        self.conv_out = ReplicateConv3d(dims[-1], self.moments, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, x: jax.Array, caches: DecoderCache | None, ctx: SpatialContext, *,
                 clip_frames: int | None) -> tuple[jax.Array, DecoderCache]:
        first_chunk = caches is None
        layer_caches = caches if caches is not None else (None,) * (3 + len(self.down_blocks))
        with jax.named_scope("conv_in"):
            x, conv_in = self.conv_in(x, layer_caches[0], ctx)
        downs = []
        for i, block in enumerate(self.down_blocks):
            with jax.named_scope(f"down_blocks.{i}"):
                x, cache = block(x, layer_caches[1 + i], ctx, first_chunk=first_chunk)
            downs.append(cache)
        with jax.named_scope("mid_block"):
            x, mid = self.mid_block(x, layer_caches[-2], ctx, clip_frames=clip_frames)
        with jax.named_scope("conv_out"):
            h, conv_out = self.conv_out(jax.nn.silu(self.norm_out(x)), layer_caches[-1], ctx)
        return h + group_mean(x, self.moments), (conv_in, *downs, mid, conv_out)


class HunyuanVideo15Encoder(nnx.Module):
    """The encoder (no ``quant_conv`` in 1.5): frames ``(B, T, H, W, 3)`` in [-1, 1] → posterior
    moments ``(B, T', H/16, W/16, 2z)``. Frame 0 alone (``caches=None``; pass ``clip_frames``, the
    clip's latent frames), then chunks of 4 frames with the returned caches (one latent frame each)."""

    steps_with_caches = True
    needs_clip_frames = True

    def __init__(self, config: HunyuanVideo15Config, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.temporal_scale = config.temporal_scale
        self.encoder = Encoder3d(config, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, x: jax.Array, caches: DecoderCache | None, ctx: SpatialContext, *,
                 clip_frames: int | None = None) -> tuple[jax.Array, DecoderCache]:
        if caches is None and x.shape[1] != 1:
            raise ValueError(f"the first encode step takes exactly 1 frame; got {x.shape[1]}")
        if caches is not None and x.shape[1] % FRAMES_PER_CHUNK:
            raise ValueError(f"later encode steps take multiples of {FRAMES_PER_CHUNK} frames; got {x.shape[1]}")
        with jax.named_scope("encoder"):
            return self.encoder(x, caches, ctx, clip_frames=clip_frames)


def check_encoder_config(config: HunyuanVideo15Config) -> None:
    """Raise ``ConfigError`` for a config whose decoder runs but whose encoder does not."""
    problems = config.encoder_problems()
    if problems:
        raise ConfigError("this HunyuanVideo 1.5 config's encoder cannot run: " + "; ".join(problems))
