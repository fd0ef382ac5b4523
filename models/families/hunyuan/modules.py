"""The HunyuanVideo (1.0) VAE in Flax nnx, channels-last inside (diffusers' ``AutoencoderKLHunyuanVideo``).

Causal 3x3x3 convs that pad with ``mode="replicate"`` (the frame's edge rows/columns, and copies of
the first frame before the clip), GroupNorm(32) whose statistics span (C/32, T, H, W) — the whole
clip and the whole frame — and a mid-block attention over every latent token of the clip with a
frame-causal mask. Because every norm sees the whole clip, the model is a function of the whole
clip: it decodes (and encodes) all frames at once, ``causal = False``. The spatial context
supplies what crosses a band of the frame: halos, the GroupNorm statistics of the whole frame
(``SpatialContext.group_moments``) and the keys/values of every band (``attend_frames``).

Memory: a whole clip at full resolution is large (720p x 129 frames of 128 channels: 30 GB in
bfloat16), so every "GroupNorm → SiLU → conv" runs block by block in time once the clip's
statistics are known (``normalized_conv``): only one block of the normalized clip exists at a time,
beside the conv's input and output. ``inner_frames`` sets the frames per block (None: blocks of
about ``CLIP_BLOCK_BYTES``); the result is the same computation, reordered.

Names mirror diffusers (each causal conv holds its kernel under ``.conv``), so loading is a rename
(``models.keys``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from vaeserve.models.conv import cache_frames, downsample2x_causal_conv3x3x3, initial_past, upsample2x_causal_conv3x3x3
from vaeserve.models.frame_groups import scan_frame_groups
from vaeserve.models.layers import GroupNorm, PointwiseConv, ReplicateConv3d, carried_cache, next_carried_cache, scoped
from vaeserve.models.shapes import output_frames
from vaeserve.models.spatial import SpatialContext

from .config import HunyuanVideoConfig
from .estimate import CLIP_BLOCK_BYTES

# diffusers' framewise decode of clips longer than one tile (``use_framewise_decoding``, on by
# default): tiles of ``tile_sample_min_num_frames`` frames (16: 4 latent frames, plus one of
# overlap) every ``tile_sample_stride_num_frames`` (12), blended over the 4 frames they share.
# These are diffusers' defaults, kept so that the option reproduces what a pipeline shows.
FRAMEWISE_TILE_FRAMES = 16
FRAMEWISE_STRIDE_FRAMES = 12


def block_frames(x: jax.Array, inner_frames: int | None) -> int:
    """Frames per block of a whole-clip conv over ``x (B, T, H, W, C)``: ``inner_frames`` if given,
    else as many as fit ``CLIP_BLOCK_BYTES`` (at least one)."""
    if inner_frames is not None:
        return inner_frames
    frame_bytes = x[:, 0].size * jnp.dtype(x.dtype).itemsize
    return max(1, CLIP_BLOCK_BYTES // frame_bytes)


class PointwiseHolder(nnx.Module):
    """A 1x1x1 conv held under ``.conv`` (a resnet's ``conv_shortcut.conv.weight``)."""

    def __init__(self, cin: int, cout: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.conv = PointwiseConv(cin, cout, rngs=rngs, dtype=dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.conv(x)


def whole_clip_conv(conv: ReplicateConv3d, x: jax.Array, ctx: SpatialContext) -> jax.Array:
    """A replicate-padded causal conv over a whole clip (its past: copies of the first frame)."""
    y, _ = conv(x, None, ctx)
    return y


def normalized_conv(norm: GroupNorm, conv: ReplicateConv3d, x: jax.Array, ctx: SpatialContext, *,
                    inner_frames: int | None) -> jax.Array:
    """``conv(silu(norm(x)))`` over a whole clip ``x (B, T, H, W, C)``, block by block in time: the
    clip's statistics first (they span it), then each block of frames normalized, activated and
    convolved after the previous block's last two (padded) frames, as a stream's caches carry them.
    The sums are the same; only one block of the normalized clip is alive at a time."""
    mean, var = ctx.group_moments(x, norm.groups)

    def activated(frames: jax.Array) -> jax.Array:
        return jax.nn.silu(norm.apply(frames, mean, var))

    past = carried_cache(initial_past(ctx.pad_hw(activated(x[:, :1]), edge="replicate"), "replicate"), ctx)
    y, _ = scan_frame_groups(lambda frames, cache: conv(activated(frames), cache, ctx), x, past,
                             block_frames(x, inner_frames))
    return y


class ResnetBlock(nnx.Module):
    """GroupNorm → SiLU → conv → GroupNorm → SiLU → conv, plus a 1x1x1 shortcut when widths differ.
    ``(B, T, H, W, C)`` → ``(B, T, H, W, O)``, the whole clip."""

    def __init__(self, cin: int, cout: int, groups: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.norm1 = GroupNorm(cin, groups, dtype=dtype)
        self.conv1 = ReplicateConv3d(cin, cout, rngs=rngs, dtype=dtype)
        self.norm2 = GroupNorm(cout, groups, dtype=dtype)
        self.conv2 = ReplicateConv3d(cout, cout, rngs=rngs, dtype=dtype)
        self.conv_shortcut = PointwiseHolder(cin, cout, rngs=rngs, dtype=dtype) if cin != cout else None

    @scoped
    def __call__(self, x: jax.Array, ctx: SpatialContext, *, inner_frames: int | None = None) -> jax.Array:
        shortcut = x if self.conv_shortcut is None else self.conv_shortcut(x)
        with jax.named_scope("conv1"):
            h = normalized_conv(self.norm1, self.conv1, x, ctx, inner_frames=inner_frames)
        with jax.named_scope("conv2"):
            h = normalized_conv(self.norm2, self.conv2, h, ctx, inner_frames=inner_frames)
        return h + shortcut


class FrameCausalAttention(nnx.Module):
    """diffusers' ``Attention`` as HunyuanVideo's mid block builds it: GroupNorm, one head of width
    C, linear q/k/v/out with biases, residual; every token of the clip attends to the tokens of its
    own and earlier frames. ``(B, T, H, W, C)`` → same."""

    def __init__(self, dim: int, groups: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.group_norm = GroupNorm(dim, groups, dtype=dtype)
        self.to_q = PointwiseConv(dim, dim, rngs=rngs, dtype=dtype, torch_layout="linear")
        self.to_k = PointwiseConv(dim, dim, rngs=rngs, dtype=dtype, torch_layout="linear")
        self.to_v = PointwiseConv(dim, dim, rngs=rngs, dtype=dtype, torch_layout="linear")
        self.to_out = nnx.List([PointwiseConv(dim, dim, rngs=rngs, dtype=dtype, torch_layout="linear")])

    @scoped
    def __call__(self, x: jax.Array, ctx: SpatialContext) -> jax.Array:
        h = self.group_norm(x, ctx)
        attended = ctx.attend_frames(self.to_q(h), self.to_k(h), self.to_v(h), first_query_frame=0)
        return x + self.to_out[0](attended)


class MidBlock(nnx.Module):
    """Resnet → (attention) → resnet, at latent resolution. ``(B, T, H, W, C)`` → same."""

    def __init__(self, dim: int, groups: int, *, attention: bool, rngs: nnx.Rngs, dtype=jnp.float32):
        self.resnets = nnx.List([ResnetBlock(dim, dim, groups, rngs=rngs, dtype=dtype) for _ in range(2)])
        self.attentions = nnx.List([FrameCausalAttention(dim, groups, rngs=rngs, dtype=dtype)] if attention else [])

    @scoped
    def __call__(self, x: jax.Array, ctx: SpatialContext, *, inner_frames: int | None = None) -> jax.Array:
        x = self.resnets[0](x, ctx, inner_frames=inner_frames)
        for attention in self.attentions:
            x = attention(x, ctx)
        return self.resnets[1](x, ctx, inner_frames=inner_frames)


def upsample_time(x: jax.Array) -> jax.Array:
    """Nearest 2x in time after the first frame: ``[x0, x1, x1, x2, x2, …]`` (``(B, T, …)`` →
    ``(B, 2T − 1, …)``), as diffusers' upsampler interpolates all but the first frame."""
    return jnp.concatenate([x[:, :1], jnp.repeat(x[:, 1:], 2, axis=1)], axis=1)


class Upsample(nnx.Module):
    """``HunyuanVideoUpsampleCausal3D``: nearest upsampling (2x in time after the first frame when
    ``temporal``, 2x in space when ``spatial``), then a replicate-padded causal 3x3x3 conv.

    The spatial upsampling is folded into the conv (``upsample2x_causal_conv3x3x3``): the padded
    low-resolution band is exactly what the upsampled band's padding holds."""

    def __init__(self, dim: int, *, temporal: bool, spatial: bool, rngs: nnx.Rngs, dtype=jnp.float32):
        self.temporal, self.spatial = temporal, spatial
        self.conv = ReplicateConv3d(dim, dim, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, x: jax.Array, ctx: SpatialContext, *, inner_frames: int | None = None) -> jax.Array:
        if self.temporal:
            x = upsample_time(x)
        if not self.spatial:
            return whole_clip_conv(self.conv, x, ctx)
        conv = self.conv.conv

        def upsampled(frames: jax.Array, cache: jax.Array) -> tuple[jax.Array, jax.Array]:
            padded = ctx.pad_hw(frames, edge="replicate")
            past = cache_frames(cache, padded)
            return (upsample2x_causal_conv3x3x3(past, padded, conv.kernel[...], conv.bias[...],
                                                native=ctx.native_conv, rounded_sums=ctx.rounded_conv_sums),
                    next_carried_cache(past, padded, ctx))

        # Block by block in time, as normalized_conv: one block's 4x larger output at a time.
        past = carried_cache(initial_past(ctx.pad_hw(x[:, :1], edge="replicate"), "replicate"), ctx)
        y, _ = scan_frame_groups(upsampled, x, past, block_frames(x, inner_frames))
        return y


def _resnets(cin: int, cout: int, layers: int, groups: int, *, rngs: nnx.Rngs, dtype) -> nnx.List:
    """A block's ``layers`` resnets, ``cin`` → ``cout`` in the first (diffusers' ``resnets.{i}``)."""
    dims = [cin] + [cout] * layers
    return nnx.List([ResnetBlock(a, b, groups, rngs=rngs, dtype=dtype)
                     for a, b in zip(dims[:-1], dims[1:], strict=True)])


def _resampler(kind: type, channels: int, factors: tuple[bool, bool], *, rngs: nnx.Rngs, dtype) -> nnx.List:
    """A block's ``{up,down}samplers``: one when it scales in time or space (``factors``), else none."""
    temporal, spatial = factors
    return nnx.List([kind(channels, temporal=temporal, spatial=spatial, rngs=rngs, dtype=dtype)]
                    if temporal or spatial else [])


class UpBlock(nnx.Module):
    """``layers_per_block + 1`` resnets, then (unless the last) an upsampler."""

    def __init__(self, cin: int, cout: int, layers: int, groups: int, factors: tuple[bool, bool], *,
                 rngs: nnx.Rngs, dtype=jnp.float32):
        self.resnets = _resnets(cin, cout, layers, groups, rngs=rngs, dtype=dtype)
        self.upsamplers = _resampler(Upsample, cout, factors, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, x: jax.Array, ctx: SpatialContext, *, inner_frames: int | None = None) -> jax.Array:
        for resnet in self.resnets:
            x = resnet(x, ctx, inner_frames=inner_frames)
        for upsampler in self.upsamplers:
            x = upsampler(x, ctx, inner_frames=inner_frames)
        return x


class Decoder3d(nnx.Module):
    """conv_in → mid block → up blocks → GroupNorm → SiLU → conv_out, over the whole clip:
    ``(B, T, H, W, z)`` → ``(B, 1 + 4(T − 1), 8H, 8W, 3)`` for the real config."""

    def __init__(self, config: HunyuanVideoConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        dims, groups = tuple(reversed(config.block_out_channels)), config.norm_num_groups
        self.conv_in = ReplicateConv3d(config.latent_channels, dims[0], rngs=rngs, dtype=dtype)
        self.mid_block = MidBlock(dims[0], groups, attention=config.mid_block_add_attention, rngs=rngs, dtype=dtype)
        ins = (dims[0], *dims[:-1])
        self.up_blocks = nnx.List([UpBlock(cin, cout, config.layers_per_block + 1, groups, factors, rngs=rngs,
                                           dtype=dtype)
                                   for cin, cout, factors in zip(ins, dims, config.up_factors(), strict=True)])
        self.conv_norm_out = GroupNorm(dims[-1], groups, dtype=dtype)
        self.conv_out = ReplicateConv3d(dims[-1], config.out_channels, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, x: jax.Array, ctx: SpatialContext, *, inner_frames: int | None = None) -> jax.Array:
        with jax.named_scope("conv_in"):
            x = whole_clip_conv(self.conv_in, x, ctx)
        x = self.mid_block(x, ctx, inner_frames=inner_frames)
        for i, block in enumerate(self.up_blocks):
            with jax.named_scope(f"up_blocks.{i}"):
                x = block(x, ctx, inner_frames=inner_frames)
        with jax.named_scope("conv_out"):
            return normalized_conv(self.conv_norm_out, self.conv_out, x, ctx, inner_frames=inner_frames)


class HunyuanVideoDecoder(nnx.Module):
    """``post_quant_conv`` + decoder: latents ``(B, T, H, W, z)`` → frames ``(B, 1 + 4(T − 1), 8H, 8W,
    3)``, the whole clip in one call (``caches`` must be None; none are returned)."""

    steps_with_caches = False  # every GroupNorm spans the clip: no exact frame-by-frame decode
    lookahead = None
    needs_clip_frames = False
    runtime_clip_frames = False

    def __init__(self, config: HunyuanVideoConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.temporal_scale = config.temporal_scale
        self.post_quant_conv = PointwiseConv(config.latent_channels, config.latent_channels, rngs=rngs, dtype=dtype)
        self.decoder = Decoder3d(config, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, z: jax.Array, caches: None, ctx: SpatialContext, *, inner_frames: int | None = None,
                 clip_frames: int | None = None, conditions: None = None) -> tuple[jax.Array, None]:
        """``inner_frames``: frames per block of the whole-clip convs (None: automatic; see the
        module docstring)."""
        del clip_frames, conditions  # the whole clip runs at once
        if caches is not None:
            raise ValueError("HunyuanVideo decodes a whole clip at once; it takes no caches")
        with jax.named_scope("post_quant_conv"):
            z = self.post_quant_conv(z)
        with jax.named_scope("decoder"):
            return self.decoder(z, ctx, inner_frames=inner_frames), None

    @scoped
    def decode_framewise(self, z: jax.Array, ctx: SpatialContext) -> jax.Array:
        """diffusers' default decode (``use_framewise_decoding``): the clip in overlapping tiles of
        5 latent frames, each decoded as a clip of its own, blended (``blend_tiles``). Not the model
        (each tile's GroupNorm sees only the tile): an option for comparing with a pipeline's frames.
        ``(B, T, H, W, z)`` → float32 ``(B, 1 + 4(T − 1), 8H, 8W, 3)``. Tiles of equal length run
        in one ``lax.map`` (one tile's activations alive at a time)."""
        tiles = framewise_tiles(z.shape[1], self.temporal_scale)
        full = [start for start, stop in tiles if stop - start == tiles[0][1] - tiles[0][0]]

        def decode(tile: jax.Array) -> jax.Array:
            frames, _ = self(tile, None, ctx)
            return frames.astype(jnp.float32)

        stacked = jnp.stack([lax.dynamic_slice_in_dim(z, start, tiles[0][1], axis=1) for start in full])
        decoded = list(lax.map(decode, stacked)) if len(full) > 1 else [decode(stacked[0])]
        decoded += [decode(z[:, start:stop]) for start, stop in tiles[len(full):]]
        return blend_tiles(decoded, output_frames(z.shape[1], self.temporal_scale))


def framewise_tiles(latent_frames: int, temporal_scale: int) -> list[tuple[int, int]]:
    """``[start, stop)`` latent frames of each tile of diffusers' framewise decode (one tile, the
    whole clip, when it is no longer than a tile)."""
    tile, stride = FRAMEWISE_TILE_FRAMES // temporal_scale, FRAMEWISE_STRIDE_FRAMES // temporal_scale
    if latent_frames <= tile:
        return [(0, latent_frames)]
    return [(start, min(start + tile + 1, latent_frames)) for start in range(0, latent_frames, stride)]


def blend_tiles(tiles: list[jax.Array], output_frames: int) -> jax.Array:
    """diffusers' ``_temporal_tiled_decode`` after the tiles are decoded: each tile after the first
    drops its first frame, its first frames fade in from the previous tile's last ones (over
    ``blend = tile − stride`` frames: weight ``x / blend`` on frame ``x``, the previous tile — as
    blended — the rest), then each tile keeps ``stride`` frames (the first ``stride + 1``). Tiles
    ``(B, F_i, H, W, C)`` float32 → ``(B, output_frames, H, W, C)``."""
    blend, stride = FRAMEWISE_TILE_FRAMES - FRAMEWISE_STRIDE_FRAMES, FRAMEWISE_STRIDE_FRAMES
    kept, previous = [tiles[0][:, : stride + 1]], tiles[0]
    for tile in tiles[1:]:
        tile = tile[:, 1:]
        extent = min(previous.shape[1], tile.shape[1], blend)
        if extent:
            weights = (jnp.arange(extent, dtype=jnp.float32) / extent).reshape(1, extent, 1, 1, 1)
            head = previous[:, previous.shape[1] - extent :] * (1 - weights) + tile[:, :extent] * weights
            tile = jnp.concatenate([head, tile[:, extent:]], axis=1)
        kept.append(tile[:, :stride])
        previous = tile
    return jnp.concatenate(kept, axis=1)[:, :output_frames]


# -- encoder ----------------------------------------------------------------------------------------
class Downsample(nnx.Module):
    """``HunyuanVideoDownsampleCausal3D``: a replicate-padded causal 3x3x3 conv with stride
    (2 when ``temporal`` else 1, 2 when ``spatial`` else 1, same)."""

    def __init__(self, dim: int, *, temporal: bool, spatial: bool, rngs: nnx.Rngs, dtype=jnp.float32):
        self.temporal, self.spatial = temporal, spatial
        self.conv = ReplicateConv3d(dim, dim, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, x: jax.Array, ctx: SpatialContext) -> jax.Array:
        time_stride = 2 if self.temporal else 1
        if not self.spatial:  # output frame j of a stride-2 conv is frame 2j of the stride-1 one
            return whole_clip_conv(self.conv, x, ctx)[:, ::time_stride]
        padded = ctx.pad_hw(x, edge="replicate")
        conv = self.conv.conv
        return downsample2x_causal_conv3x3x3(None, padded, conv.kernel[...], conv.bias[...], time_stride=time_stride,
                                             start="replicate", native=ctx.native_conv,
                                             rounded_sums=ctx.rounded_conv_sums, onednn=ctx.onednn_conv)


class DownBlock(nnx.Module):
    """``layers_per_block`` resnets, then (unless the last) a downsampler."""

    def __init__(self, cin: int, cout: int, layers: int, groups: int, factors: tuple[bool, bool], *,
                 rngs: nnx.Rngs, dtype=jnp.float32):
        self.resnets = _resnets(cin, cout, layers, groups, rngs=rngs, dtype=dtype)
        self.downsamplers = _resampler(Downsample, cout, factors, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, x: jax.Array, ctx: SpatialContext) -> jax.Array:
        for resnet in self.resnets:
            x = resnet(x, ctx, inner_frames=None)
        for downsampler in self.downsamplers:
            x = downsampler(x, ctx)
        return x


class Encoder3d(nnx.Module):
    """conv_in → down blocks → mid block → GroupNorm → SiLU → conv_out, over the whole clip:
    ``(B, 1 + 4k, H, W, 3)`` → ``(B, 1 + k, H/8, W/8, 2z)`` for the real config."""

    def __init__(self, config: HunyuanVideoConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        dims, groups = config.block_out_channels, config.norm_num_groups
        self.conv_in = ReplicateConv3d(config.in_channels, dims[0], rngs=rngs, dtype=dtype)
        ins = (dims[0], *dims[:-1])
        self.down_blocks = nnx.List([DownBlock(cin, cout, config.layers_per_block, groups, factors, rngs=rngs,
                                               dtype=dtype)
                                     for cin, cout, factors in zip(ins, dims, config.down_factors(), strict=True)])
        self.mid_block = MidBlock(dims[-1], groups, attention=config.mid_block_add_attention, rngs=rngs, dtype=dtype)
        self.conv_norm_out = GroupNorm(dims[-1], groups, dtype=dtype)
        self.conv_out = ReplicateConv3d(dims[-1], 2 * config.latent_channels, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, x: jax.Array, ctx: SpatialContext) -> jax.Array:
        with jax.named_scope("conv_in"):
            x = whole_clip_conv(self.conv_in, x, ctx)
        for i, block in enumerate(self.down_blocks):
            with jax.named_scope(f"down_blocks.{i}"):
                x = block(x, ctx)
        x = self.mid_block(x, ctx)
        with jax.named_scope("conv_out"):
            return normalized_conv(self.conv_norm_out, self.conv_out, x, ctx, inner_frames=None)


class HunyuanVideoEncoder(nnx.Module):
    """Encoder + ``quant_conv``: frames ``(B, 1 + 4k, H, W, 3)`` in [-1, 1] → posterior moments
    ``(B, 1 + k, H/8, W/8, 2z)`` (mean, then log-variance), the whole clip in one call."""

    steps_with_caches = False
    needs_clip_frames = False

    def __init__(self, config: HunyuanVideoConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.temporal_scale = config.temporal_scale
        self.encoder = Encoder3d(config, rngs=rngs, dtype=dtype)
        self.quant_conv = PointwiseConv(2 * config.latent_channels, 2 * config.latent_channels, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, x: jax.Array, caches: None, ctx: SpatialContext, *,
                 clip_frames: int | None = None) -> tuple[jax.Array, None]:
        del clip_frames
        if caches is not None:
            raise ValueError("HunyuanVideo encodes a whole clip at once; it takes no caches")
        with jax.named_scope("encoder"):
            x = self.encoder(x, ctx)
        with jax.named_scope("quant_conv"):
            return self.quant_conv(x), None
