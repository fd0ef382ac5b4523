"""The Flax nnx layers of the Wan VAE, shared by every decoder (and encoder) of the family.

Names mirror diffusers' ``AutoencoderKLWan`` so that weight loading is a mechanical rename
(``models.keys``). Every layer is a function of its input ``(B, T, H, W, C)``, its causal cache and
a spatial context (``models.spatial``); caches are plain pytrees so decode loops can live in
``lax.scan`` with fixed shapes. ``cache=None`` means "first latent frame": the past is all zeros,
exactly what the reference's empty cache means.

Every ``__call__`` runs under ``jax.named_scope`` of its class, and containers name their
children by attribute path, so a profile of the 30+ convolutions reads
``decoder/up_blocks.1/UpBlock/resnets.0/ResidualBlock/conv1/CausalConv3d``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TypeAlias, TypeVar

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from .conv import (
    CACHE_FRAMES,
    cache_frames,
    causal_conv3x3x3,
    conv2d_frames,
    downsample2x_conv2d_frames,
    initial_past,
    interleave_time,
    next_cache,
    past_or_zeros,
    rms_norm,
    stored_cache,
    time_downsample,
    upsample2x_conv2d_frames,
)
from .spatial import Edge, SpatialContext, check_edge, matmul_precision

# Causal caches. A conv cache holds the last two spatially padded input frames ``(B, 2, H+2, W+2,
# C)`` (on accelerators at tp > 1 flattened, ``(B, 2, H+2, (W+2)·C)``: ``models.conv.stored_cache``);
# a time-conv cache the last two unpadded frames ``(B, 2, H, W, C)``.
ConvCache: TypeAlias = jax.Array
ResidualCache: TypeAlias = tuple[ConvCache, ConvCache]
MidBlockCache: TypeAlias = tuple[ResidualCache, ResidualCache]
# An up block's: its resnets' caches, then its resampler's (None for 'upsample2d', which has no time conv).
UpBlockCache: TypeAlias = tuple[ResidualCache | ConvCache | None, ...]

F = TypeVar("F", bound=Callable)


def scoped(method: F) -> F:
    """Run a layer's ``__call__`` under ``jax.named_scope(<class name>)`` (readable profiles/HLO)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with jax.named_scope(type(self).__name__):
            return method(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _kernel(rngs: nnx.Rngs, shape: tuple[int, ...], fan_in: int, dtype, torch_layout: str) -> nnx.Param:
    """A kernel N(0, 1/fan_in); ``torch_layout`` names its PyTorch layout (``models.keys``)."""
    return nnx.Param(_scaled_normal(rngs.params(), shape, jnp.dtype(dtype), math.sqrt(fan_in)),
                     torch_layout=torch_layout)


@functools.partial(jax.jit, static_argnames=("shape", "dtype"))
def _scaled_normal(key: jax.Array, shape: tuple[int, ...], dtype, divisor: float) -> jax.Array:
    # One fused program per shape: drawing the real Wan 2.2's 555 M weights eagerly (normal, cast,
    # divide as three passes) takes twice as long. The values are the eager ones.
    return jax.random.normal(key, shape, jnp.float32).astype(dtype) / divisor


def _bias(rngs: nnx.Rngs, size: int, dtype) -> nnx.Param:
    return nnx.Param((0.02 * jax.random.normal(rngs.params(), (size,), jnp.float32)).astype(dtype),
                     torch_layout="vector")


class PointwiseConv(nnx.Module):
    """1x1(x1) conv or linear layer: ``(..., C)`` → ``(..., O)``. Kernel ``(C, O)``; ``torch_layout``:
    the reference's ``"pointwise3d"`` (Conv3d 1x1x1), ``"pointwise2d"`` (Conv2d 1x1) or ``"linear"``."""

    def __init__(self, cin: int, cout: int, *, rngs: nnx.Rngs, dtype=jnp.float32, torch_layout: str = "pointwise3d"):
        self.kernel = _kernel(rngs, (cin, cout), cin, dtype, torch_layout)
        self.bias = _bias(rngs, cout, dtype)

    @scoped
    def __call__(self, x: jax.Array) -> jax.Array:
        y = jnp.einsum("...c,co->...o", x, self.kernel[...], precision=matmul_precision(x.dtype),
                       preferred_element_type=jnp.float32)
        return (y + self.bias[...]).astype(x.dtype)


class Conv2d(nnx.Module):
    """``nn.Conv2d(cin, cout, 3, padding=1)`` of every frame (zeros around it): ``(B, T, H, W, C)`` →
    ``(B, T, H, W, O)``. Kernel ``(3, 3, C, O)``."""

    def __init__(self, cin: int, cout: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.kernel = _kernel(rngs, (3, 3, cin, cout), 9 * cin, dtype, "conv2d")
        self.bias = _bias(rngs, cout, dtype)

    @scoped
    def __call__(self, x: jax.Array, ctx: SpatialContext) -> jax.Array:
        return conv2d_frames(ctx.pad_hw(x), self.kernel[...], self.bias[...], native=ctx.native_conv,
                             rounded_sums=ctx.rounded_conv_sums, onednn=ctx.onednn_conv)


def banded_caches(ctx: SpatialContext) -> bool:
    """Whether causal caches are built window-free and kept flattened (``models.conv.next_cache``,
    ``stored_cache``): native convs on a frame split over devices that trade halos."""
    return ctx.native_conv and ctx.exchanges_halos


def carried_cache(frames: jax.Array, ctx: SpatialContext) -> jax.Array:
    """A conv's two past frames as steps carry them in ``ctx`` (``stored_cache``)."""
    return stored_cache(frames, flat=banded_caches(ctx))


def next_carried_cache(past: jax.Array, x_padded: jax.Array, ctx: SpatialContext) -> jax.Array:
    """The last two frames of ``past ++ x_padded`` (``next_cache``), as steps carry them in ``ctx``."""
    return carried_cache(next_cache(past, x_padded, window_free=banded_caches(ctx)), ctx)


class CausalConv3d(nnx.Module):
    """Causal 3x3x3 conv. Kernel ``(3, 3, 3, C, O)`` (time, height, width, in, out).

    ``edge``: how the frame and the clip's start are padded: ``"zero"`` (Wan: zeros around the
    frame, two zero frames before the clip) or ``"replicate"`` (HunyuanVideo: the edge rows and
    columns repeated, two copies of the first frame before the clip).
    """

    def __init__(self, cin: int, cout: int, *, rngs: nnx.Rngs, dtype=jnp.float32, edge: Edge = "zero"):
        self.edge = check_edge(edge)
        self.kernel = _kernel(rngs, (3, 3, 3, cin, cout), 27 * cin, dtype, "conv3d")
        self.bias = _bias(rngs, cout, dtype)

    @scoped
    def __call__(self, x: jax.Array, cache: ConvCache | None, ctx: SpatialContext) -> tuple[jax.Array, ConvCache]:
        """``x (B, T, H, W, C)``, ``cache`` (``(B, 2, H+2, W+2, C)``, as ``stored_cache`` keeps it) or
        None → ``(B, T, H, W, O)``, new cache."""
        x_padded = ctx.pad_hw(x, edge=self.edge)
        cache = None if cache is None else cache_frames(cache, x_padded)
        if cache is None and x.shape[1] == 1:
            # The clip's first frame alone: its past is zeros (only the last time tap sees data) or
            # copies of itself (the time taps sum): one 2-D conv, 2/3 fewer FLOPs.
            kernel = self.kernel[2] if self.edge == "zero" else first_frame_kernel(self.kernel[...])
            y = conv2d_frames(x_padded, kernel, self.bias[...], native=ctx.native_conv,
                              rounded_sums=ctx.rounded_conv_sums, onednn=ctx.onednn_conv)
        else:
            y = causal_conv3x3x3(cache, x_padded, self.kernel[...], self.bias[...], start=self.edge,
                                 native=ctx.native_conv, rounded_sums=ctx.rounded_conv_sums, onednn=ctx.onednn_conv)
        past = initial_past(x_padded, self.edge) if cache is None else cache
        return y, next_carried_cache(past, x_padded, ctx)


def first_frame_kernel(kernel: jax.Array) -> jax.Array:
    """The 2-D kernel a replicate-padded causal conv applies to a clip's first frame: its past is two
    copies of it, so the three time taps add up (summed in float32, rounded once)."""
    return kernel.astype(jnp.float32).sum(axis=0).astype(kernel.dtype)


GROUP_NORM_EPS = 1e-6  # diffusers builds every HunyuanVideo and AutoencoderKL GroupNorm with eps=1e-6


def group_normalize(x: jax.Array, mean: jax.Array, var: jax.Array, weight: jax.Array, bias: jax.Array, *,
                    eps: float) -> jax.Array:
    """``(x − mean) / sqrt(var + eps) · weight + bias`` per group, in float32: ``x (B, T, H, W, C)``,
    ``mean``/``var`` ``(B, G)``, ``weight``/``bias`` ``(C,)`` → ``x``'s shape and dtype."""
    b, t, h, w, c = x.shape
    groups = mean.shape[1]
    x32 = x.astype(jnp.float32).reshape(b, t, h, w, groups, c // groups)
    y = (x32 - mean[:, None, None, None, :, None]) * lax.rsqrt(var + eps)[:, None, None, None, :, None]
    return (y.reshape(x.shape) * weight.astype(jnp.float32) + bias.astype(jnp.float32)).astype(x.dtype)


class GroupNorm(nnx.Module):
    """``nn.GroupNorm(groups, dim, eps=1e-6)`` over a clip ``(B, T, H, W, C)`` (HunyuanVideo 1.0) or an
    image ``(B, 1, H, W, C)`` (``AutoencoderKL``): the statistics of each group span (C/groups, T, H,
    W), asked of the spatial context (on a band: the whole frame's)."""

    def __init__(self, dim: int, groups: int, *, dtype=jnp.float32):
        self.groups = groups
        self.weight = nnx.Param(jnp.ones((dim,), dtype), torch_layout="vector")
        self.bias = nnx.Param(jnp.zeros((dim,), dtype), torch_layout="vector")

    @scoped
    def __call__(self, x: jax.Array, ctx: SpatialContext) -> jax.Array:
        return self.apply(x, *ctx.group_moments(x, self.groups))

    def apply(self, x: jax.Array, mean: jax.Array, var: jax.Array) -> jax.Array:
        """Normalize ``x`` (the clip, or some of its frames) by the clip's ``mean``/``var`` ``(B, G)``."""
        return group_normalize(x, mean, var, self.weight[...], self.bias[...], eps=GROUP_NORM_EPS)


class RMSNorm(nnx.Module):
    """Per-pixel RMS norm over channels, ``F.normalize(x, dim=C) · sqrt(C) · gamma``.

    No statistics cross pixels, so it needs nothing from a neighbouring band. ``(..., C)`` → same.
    """

    def __init__(self, dim: int, *, dtype=jnp.float32, torch_layout: str = "gamma3d"):
        self.gamma = nnx.Param(jnp.ones((dim,), dtype), torch_layout=torch_layout)

    @scoped
    def __call__(self, x: jax.Array) -> jax.Array:
        return rms_norm(x, self.gamma[...])


class ReplicateConv3d(nnx.Module):
    """diffusers' ``HunyuanVideo(15)CausalConv3d``: a causal 3x3x3 conv with replicate padding, held
    under ``.conv`` as the reference holds its ``nn.Conv3d`` (the weights are ``<name>.conv.weight``).
    Called like ``CausalConv3d``."""

    def __init__(self, cin: int, cout: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.conv = CausalConv3d(cin, cout, rngs=rngs, dtype=dtype, edge="replicate")

    def __call__(self, x: jax.Array, cache: ConvCache | None, ctx: SpatialContext) -> tuple[jax.Array, ConvCache]:
        return self.conv(x, cache, ctx)


class ResidualBlock(nnx.Module):
    """RMSNorm → SiLU → conv → RMSNorm → SiLU → conv, plus a (1x1x1 when widths differ) shortcut.

    ``(B, T, H, W, C)`` → ``(B, T, H, W, O)``; caches: one per causal conv. ``conv``: the causal
    conv type, ``CausalConv3d`` (Wan) or ``ReplicateConv3d`` (HunyuanVideo 1.5).
    """

    def __init__(self, cin: int, cout: int, *, rngs: nnx.Rngs, dtype=jnp.float32,
                 conv: type[CausalConv3d] | type[ReplicateConv3d] = CausalConv3d):
        self.norm1 = RMSNorm(cin, dtype=dtype)
        self.conv1 = conv(cin, cout, rngs=rngs, dtype=dtype)
        self.norm2 = RMSNorm(cout, dtype=dtype)
        self.conv2 = conv(cout, cout, rngs=rngs, dtype=dtype)
        self.conv_shortcut = PointwiseConv(cin, cout, rngs=rngs, dtype=dtype) if cin != cout else None

    @scoped
    def __call__(self, x: jax.Array, caches: ResidualCache | None,
                 ctx: SpatialContext) -> tuple[jax.Array, ResidualCache]:
        cache1, cache2 = caches if caches is not None else (None, None)
        shortcut = x if self.conv_shortcut is None else self.conv_shortcut(x)
        with jax.named_scope("norm1"):
            h = jax.nn.silu(self.norm1(x))
        with jax.named_scope("conv1"):
            h, cache1 = self.conv1(h, cache1, ctx)
        with jax.named_scope("norm2"):
            h = jax.nn.silu(self.norm2(h))
        with jax.named_scope("conv2"):
            h, cache2 = self.conv2(h, cache2, ctx)
        return h + shortcut, (cache1, cache2)


class FrameAttentionBlock(nnx.Module):
    """Single-head self-attention over the H·W tokens of each frame (no mixing across time).

    ``(B, T, H, W, C)`` → same; the spatial context supplies the frame's keys and values.
    """

    def __init__(self, dim: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.norm = RMSNorm(dim, dtype=dtype, torch_layout="gamma2d")
        self.to_qkv = PointwiseConv(dim, 3 * dim, rngs=rngs, dtype=dtype, torch_layout="pointwise2d")
        self.proj = PointwiseConv(dim, dim, rngs=rngs, dtype=dtype, torch_layout="pointwise2d")

    @scoped
    def __call__(self, x: jax.Array, ctx: SpatialContext) -> jax.Array:
        b, t, h, w, c = x.shape
        q, k, v = jnp.split(self.to_qkv(self.norm(x)).reshape(b * t, h, w, 3 * c), 3, axis=-1)
        return x + self.proj(ctx.attend(q, k, v).reshape(b, t, h, w, c))


class MidBlock(nnx.Module):
    """Residual block → attention → residual block, at latent resolution. ``(B, T, H, W, C)`` → same."""

    def __init__(self, dim: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.resnets = nnx.List([ResidualBlock(dim, dim, rngs=rngs, dtype=dtype) for _ in range(2)])
        self.attentions = nnx.List([FrameAttentionBlock(dim, rngs=rngs, dtype=dtype)])

    @scoped
    def __call__(self, x: jax.Array, caches: MidBlockCache | None,
                 ctx: SpatialContext) -> tuple[jax.Array, MidBlockCache]:
        cache0, cache1 = caches if caches is not None else (None, None)
        with jax.named_scope("resnets.0"):
            x, cache0 = self.resnets[0](x, cache0, ctx)
        with jax.named_scope("attentions.0"):
            x = self.attentions[0](x, ctx)
        with jax.named_scope("resnets.1"):
            x, cache1 = self.resnets[1](x, cache1, ctx)
        return x, (cache0, cache1)


class Resample(nnx.Module):
    """Nearest 2x spatial upsampling + 3x3 conv to ``cout`` channels; 'upsample3d' first doubles
    time with a causal (3, 1, 1) conv to 2C channels interleaved into 2T frames.

    ``(B, T, H, W, C)`` → ``(B, T', 2H, 2W, cout)`` with ``T' = 2T`` for upsample3d after latent
    frame 0 (which skips the time conv, the reference's "Rep" marker), else ``T``. Wan 2.1 halves
    the width (``cout = C // 2``).
    """

    def __init__(self, dim: int, mode: str, *, rngs: nnx.Rngs, dtype=jnp.float32, cout: int | None = None):
        cout = dim // 2 if cout is None else cout
        self.mode = mode
        self.resample_kernel = _kernel(rngs, (3, 3, dim, cout), 9 * dim, dtype, "conv2d")
        self.resample_bias = _bias(rngs, cout, dtype)
        if mode == "upsample3d":
            self.time_kernel = _kernel(rngs, (3, dim, 2 * dim), 3 * dim, dtype, "timeconv")
            self.time_bias = _bias(rngs, 2 * dim, dtype)

    def _time_conv(self, x: jax.Array, cache: ConvCache) -> tuple[jax.Array, ConvCache]:
        past = jnp.concatenate([cache, x], axis=1)
        t = x.shape[1]
        kernel = self.time_kernel[...]
        y = sum(
            jnp.einsum("bthwc,co->bthwo", past[:, i : i + t], kernel[i], precision=matmul_precision(x.dtype),
                       preferred_element_type=jnp.float32)
            for i in range(3)
        )
        return interleave_time((y + self.time_bias[...]).astype(x.dtype)), past[:, -CACHE_FRAMES:]

    @scoped
    def __call__(self, x: jax.Array, cache: ConvCache | None,
                 ctx: SpatialContext) -> tuple[jax.Array, ConvCache | None]:
        if self.mode == "upsample3d":
            if cache is None:  # first latent frame: the reference skips the time conv ("Rep")
                cache = past_or_zeros(None, x)
            else:
                with jax.named_scope("time_conv"):
                    x, cache = self._time_conv(x, cache)
        # Pad (or fetch halos) at low resolution: the upsampled frame's border rows are copies of it.
        with jax.named_scope("resample"):
            frames = upsample2x_conv2d_frames(ctx.pad_hw(x), self.resample_kernel[...], self.resample_bias[...],
                                              native=ctx.native_conv, rounded_sums=ctx.rounded_conv_sums)
        return frames, cache


# -- encoder ----------------------------------------------------------------------------------------
# A downsampler's cache: for 'downsample3d' the last spatially downsampled frame ``(B, 1, H, W, C)``
# of the previous chunk; 'downsample2d' carries nothing (None).
DownsampleCache: TypeAlias = jax.Array | None


class Downsample(nnx.Module):
    """The encoder's 2x downsampler at constant width: a 3x3 stride-2 conv over the frame zero-padded
    by one row/column at the bottom/right; 'downsample3d' then halves time with a stride-2 causal
    (3, 1, 1) conv over the previous chunk's last frame and this chunk's frames.

    ``(B, T, H, W, C)`` (``H``, ``W`` even) → ``(B, T', H/2, W/2, C)`` with ``T' = T/2`` for
    downsample3d after frame 0, else ``T``: on frame 0 the reference skips the time conv and only
    caches its input. The strided conv needs one row from *below* a band only (``pad_hw_after``).
    """

    def __init__(self, dim: int, mode: str, *, rngs: nnx.Rngs, dtype=jnp.float32):
        if mode not in ("downsample2d", "downsample3d"):
            raise ValueError(f"mode must be 'downsample2d' or 'downsample3d'; received {mode!r}")
        self.mode = mode
        self.resample_kernel = _kernel(rngs, (3, 3, dim, dim), 9 * dim, dtype, "conv2d")
        self.resample_bias = _bias(rngs, dim, dtype)
        if mode == "downsample3d":
            self.time_kernel = _kernel(rngs, (3, dim, dim), 3 * dim, dtype, "timeconv")
            self.time_bias = _bias(rngs, dim, dtype)

    @scoped
    def __call__(self, x: jax.Array, cache: DownsampleCache,
                 ctx: SpatialContext) -> tuple[jax.Array, DownsampleCache]:
        """``cache`` None on frame 0 (and always for downsample2d)."""
        with jax.named_scope("resample"):
            x = downsample2x_conv2d_frames(ctx.pad_hw_after(x), self.resample_kernel[...], self.resample_bias[...],
                                           native=ctx.native_conv, rounded_sums=ctx.rounded_conv_sums,
                                           onednn=ctx.onednn_conv)
        if self.mode == "downsample2d":
            return x, None
        if cache is None:  # frame 0: no time conv, its frame is the next chunk's past
            return x, x[:, -1:]
        with jax.named_scope("time_conv"):
            return time_downsample(cache, x, self.time_kernel[...], self.time_bias[...]), x[:, -1:]


# -- Wan 2.2: the DupUp3D / AvgDown3D shortcuts and (un)patchify ---------------------------------
# DupUp3D and (un)patchify only move values between channels and (time, row, column)
# sub-positions: an output pixel depends on exactly one input pixel, so they are local to a band
# of rows (no halo) as long as band boundaries scale with the image (they do: a band of h rows
# becomes 2h rows). AvgDown3D averages the 2x2 pixels under one output pixel: local too, as long
# as bands start on even rows at every scale (the encoder's do: see ``sharding.encode``).
def duplicate_up(x: jax.Array, cout: int, *, factor_t: int, factor_s: int, first_chunk: bool) -> jax.Array:
    """diffusers' ``DupUp3D``: channels → (time, row, column) sub-positions, channels-last.

    ``x (B, T, H, W, C)`` → ``(B, T·ft, H·fs, W·fs, cout)`` with
    ``out[b, t·ft+i, h·fs+a, w·fs+c, o] = x[b, t, h, w, (o·F + i·fs² + a·fs + c) // r]``,
    ``F = ft·fs²`` and ``r = cout·F / C`` (the reference's ``repeat_interleave`` + view + permute).
    On the first chunk the leading ``ft − 1`` frames are dropped, matching the upsampler, which
    skips its time conv on latent frame 0: the first latent frame then yields one frame, not ``ft``.
    """
    b, t, h, w, c = x.shape
    factor = factor_t * factor_s * factor_s
    repeats, remainder = divmod(cout * factor, c)
    if remainder:
        raise ValueError(f"DupUp3D: {c} input channels do not divide {cout} x {factor}")
    x = jnp.repeat(x, repeats, axis=-1).reshape(b, t, h, w, cout, factor_t, factor_s, factor_s)
    x = x.transpose(0, 1, 5, 2, 6, 3, 7, 4).reshape(b, t * factor_t, h * factor_s, w * factor_s, cout)
    return x[:, factor_t - 1 :] if first_chunk else x


def unpatchify(x: jax.Array, patch: int) -> jax.Array:
    """``(B, T, H, W, C·p²)`` → ``(B, T, p·H, p·W, C)``: channel ``c·p² + r·p + q`` goes to row
    offset ``q`` and column offset ``r`` (einops ``b (c r q) f h w -> b c f (h q) (w r)``, as in
    Wan 2.2 and diffusers: the column offset is the more significant one)."""
    if patch == 1:
        return x
    b, t, h, w, cp = x.shape
    c = cp // (patch * patch)
    x = x.reshape(b, t, h, w, c, patch, patch)  # (..., c, r, q)
    return x.transpose(0, 1, 2, 6, 3, 5, 4).reshape(b, t, h * patch, w * patch, c)


def patchify(x: jax.Array, patch: int) -> jax.Array:
    """Inverse of ``unpatchify``: ``(B, T, p·H, p·W, C)`` → ``(B, T, H, W, C·p²)`` (the encoder's input)."""
    if patch == 1:
        return x
    b, t, hp, wp, c = x.shape
    h, w = hp // patch, wp // patch
    x = x.reshape(b, t, h, patch, w, patch, c)  # (b, t, h, q, w, r, c)
    return x.transpose(0, 1, 2, 4, 6, 5, 3).reshape(b, t, h, w, c * patch * patch)


def average_down(x: jax.Array, cout: int, *, factor_t: int, factor_s: int) -> jax.Array:
    """diffusers' ``AvgDown3D``: (time, row, column) sub-positions → channels, then group means.

    ``x (B, T, H, W, C)`` → ``(B, ⌈T/ft⌉, H/fs, W/fs, cout)``. The ``F = ft·fs²`` sub-positions
    of each output pixel become channels ``k = c·F + i·fs² + a·fs + d`` (input channel ``c``,
    frame offset ``i``, row offset ``a``, column offset ``d``), and output channel ``o`` is the
    mean of channels ``[o·g, (o+1)·g)``, ``g = C·F / cout`` (the reference's view + permute + mean).
    The reference pads ``(−T) mod ft`` zero frames in *front* on every call, so the encoder's
    first chunk (one frame) averages its frame with a zero frame, and a later chunk of 4 frames
    pairs its frames (0, 1), (2, 3): the shortcut is local per chunk, with no cache. It is the
    inverse arrangement of ``duplicate_up`` (which repeats where this averages).
    """
    b, t, h, w, c = x.shape
    factor = factor_t * factor_s * factor_s
    group, remainder = divmod(c * factor, cout)
    if remainder or h % factor_s or w % factor_s:
        raise ValueError(f"AvgDown3D: {c} channels x {factor} must split into {cout} groups "
                         f"and {h}x{w} into {factor_s}x{factor_s} blocks")
    front = -t % factor_t
    if front:
        x = jnp.pad(x, ((0, 0), (front, 0), (0, 0), (0, 0), (0, 0)))
    t_out, h_out, w_out = (t + front) // factor_t, h // factor_s, w // factor_s
    x = x.reshape(b, t_out, factor_t, h_out, factor_s, w_out, factor_s, c)
    x = x.transpose(0, 1, 3, 5, 7, 2, 4, 6).reshape(b, t_out, h_out, w_out, cout, group)
    # Sum in float32: a bfloat16 model still averages without rounding each partial sum.
    return x.astype(jnp.float32).mean(axis=-1).astype(x.dtype)


class AvgDown3D(nnx.Module):
    """Wan 2.2's parameter-free down-block shortcut (see ``average_down``).

    ``(B, T, H, W, cin)`` → ``(B, T', H/2, W/2, cout)`` when ``spatial`` (else ``H``, ``W``), with
    ``T' = ⌈T/2⌉`` when ``temporal`` (one frame on the first chunk), else ``T``.
    """

    def __init__(self, cout: int, *, temporal: bool, spatial: bool):
        self.cout, self.factor_t, self.factor_s = cout, 2 if temporal else 1, 2 if spatial else 1

    @scoped
    def __call__(self, x: jax.Array) -> jax.Array:
        return average_down(x, self.cout, factor_t=self.factor_t, factor_s=self.factor_s)


class DupUp3D(nnx.Module):
    """Wan 2.2's parameter-free up-block shortcut (see ``duplicate_up``).

    ``(B, T, H, W, cin)`` → ``(B, T', 2H, 2W, cout)``, ``T' = 2T`` (``T' = 2T − 1`` on the first
    chunk) when ``temporal``, else ``T``.
    """

    def __init__(self, cout: int, *, temporal: bool):
        self.cout, self.factor_t = cout, 2 if temporal else 1

    @scoped
    def __call__(self, x: jax.Array, *, first_chunk: bool) -> jax.Array:
        return duplicate_up(x, self.cout, factor_t=self.factor_t, factor_s=2, first_chunk=first_chunk)
