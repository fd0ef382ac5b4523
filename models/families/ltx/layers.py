"""The layers shared by the LTX-Video and LTX-2 VAEs, in Flax nnx, channels-last, and their stream
arithmetic (diffusers' ``autoencoder_kl_ltx.py`` and ``autoencoder_kl_ltx2.py``).

Every 3x3x3 conv pads time with copies of the clip's edge frames. A causal one (the encoders, and
decoders with ``decoder_causal``) puts two copies of the first frame before the clip; one that is
not (released decoders) sees one frame ahead: a copy of the first frame before the clip, of the
last after it. Norms are per pixel (no statistics cross a band), and up/down-sampling moves values
between channels and (time, row, column) positions of one pixel: local to a band, as long as
bands start on even rows at every scale (they do: see ``sharding.encode``).

Streaming a decoder that sees one frame ahead. Each step, every conv takes the frames the layer
before it emitted, after the two it keeps from the last step (``ConvCache``), and emits one frame
for each frame it takes, one frame behind: output frame ``i`` needs input frame ``i + 1``. On the
clip's first step its past is one copy of frame 0, so it emits one fewer. A residual adds its
input to its convs' output through a delay line that holds the frames the convs still owe. So a
stream's first step takes ``1 + lookahead`` latent frames (``models.families.ltx.config.lookahead``) to get
a frame out of the last layer, and every later step takes ``chunk`` latent frames and gives
``temporal_scale · chunk`` frames, behind its input. Past the clip's end the stream takes zero
latents: each conv knows how many frames its input has in the whole clip (its time scale and the
clip's latent frames) and how many it has taken (``ConvCache.seen``), and replaces every frame
past the end by the last one — the reference's padding — so steps keep one shape, and the frames
past the end are cropped. Nothing reads the frames a conv would emit past the end, so it skips
them: on the first step (whose frames' places are static) it computes only the clip's frames, and
a later step whose frames all lie past the end computes none (``lax.cond``). A short clip, or the
steps that drain a stream, then cost about what the whole-clip decode costs. The result is the
whole-clip decode, exactly, in memory flat in ``T``.

Names mirror diffusers (each conv holds its kernel under ``.conv``), so loading is a rename.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from vaeserve.models.conv import causal_conv3x3x3
from vaeserve.models.layers import PointwiseConv, _bias, _kernel, scoped
from vaeserve.models.spatial import SpatialContext, check_edge

from .config import PIXEL_NORM_EPS, TIME_PROJECTION_CHANNELS

# Keys of the noise a decode draws: the latents' noise (``noise_scale``) and each resnet's.
LATENT_NOISE, INJECTED_NOISE = 0, 1


# -- pure functions ----------------------------------------------------------------------------------
def pixel_norm(x: jax.Array, eps: float = PIXEL_NORM_EPS) -> jax.Array:
    """``x / sqrt(mean(x², channels) + eps)`` per pixel, in float32 (``RMSNorm`` without weight,
    ``PerChannelRMSNorm``). ``(..., C)`` → same shape and dtype."""
    x32 = x.astype(jnp.float32)
    return (x32 * lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)).astype(x.dtype)


def layer_norm(x: jax.Array, weight: jax.Array, bias: jax.Array, eps: float) -> jax.Array:
    """``nn.LayerNorm`` over channels, in float32. ``(..., C)`` → same."""
    x32 = x.astype(jnp.float32)
    mean = x32.mean(axis=-1, keepdims=True)
    centred = x32 - mean
    y = centred * lax.rsqrt((centred * centred).mean(axis=-1, keepdims=True) + eps)
    return (y * weight.astype(jnp.float32) + bias.astype(jnp.float32)).astype(x.dtype)


def depth_to_space(x: jax.Array, frames: int, pixels: int) -> jax.Array:
    """The upsamplers' rearrangement, channels-last: ``(B, T, H, W, C·f·p·p)`` → ``(B, f·T, p·H, p·W, C)``;
    channel ``((c·f + i)·p + a)·p + d`` goes to frame offset ``i``, row ``a``, column ``d`` (the
    reference's ``reshape(B, −1, f, p, p, T, H, W)`` + permute)."""
    b, t, h, w, packed = x.shape
    c = packed // (frames * pixels * pixels)
    x = x.reshape(b, t, h, w, c, frames, pixels, pixels).transpose(0, 1, 5, 2, 6, 3, 7, 4)
    return x.reshape(b, t * frames, h * pixels, w * pixels, c)


def space_to_depth(x: jax.Array, frames: int, pixels: int) -> jax.Array:
    """The inverse, for the encoder's downsamplers: ``(B, f·T, p·H, p·W, C)`` → ``(B, T, H, W, C·f·p·p)``."""
    b, tf, hp, wp, c = x.shape
    x = x.reshape(b, tf // frames, frames, hp // pixels, pixels, wp // pixels, pixels, c)
    return x.transpose(0, 1, 3, 5, 7, 2, 4, 6).reshape(b, tf // frames, hp // pixels, wp // pixels, -1)


def timestep_projection(timestep: jax.Array) -> jax.Array:
    """diffusers' ``Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0)``: ``(B,)`` →
    ``(B, 256)`` float32, ``[cos(t·f), sin(t·f)]`` with ``f_k = 10000^(−k/128)``."""
    half = TIME_PROJECTION_CHANNELS // 2
    frequencies = jnp.exp(-math.log(10000.0) * jnp.arange(half, dtype=jnp.float32) / half)
    angles = timestep.astype(jnp.float32)[:, None] * frequencies[None, :]
    return jnp.concatenate([jnp.cos(angles), jnp.sin(angles)], axis=-1)


def delayed(line: jax.Array | None, x: jax.Array, count: int) -> tuple[jax.Array, jax.Array | None]:
    """A delay line: the first ``count`` frames of ``line ++ x``, and the rest (None when empty), which
    the next step's call takes first. A residual adds its input to frames its convs emit later."""
    pending = x if line is None else jnp.concatenate([line, x], axis=1)
    rest = pending[:, count:]
    return pending[:, :count], (rest if rest.shape[1] else None)


def past_the_end(seq: jax.Array, first_index: jax.Array, end: jax.Array) -> jax.Array:
    """``seq (B, n, ...)`` whose frame ``i`` is frame ``first_index + i`` of a clip of ``end`` frames:
    every frame past the end replaced by the last one (``first_index``, ``end``: int32 scalars,
    traced in a stream's later steps). Only frames that some real output reads need be right."""
    n = seq.shape[1]
    index = first_index + jnp.arange(n)
    last = lax.dynamic_slice_in_dim(seq, jnp.clip(end - 1 - first_index, 0, n - 1), 1, axis=1)
    shape = (1, n) + (1,) * (seq.ndim - 2)
    return jnp.where((index >= end).reshape(shape), last, seq)


def emitted(frames: int, *, first_index: int, end: int) -> int:
    """Of ``frames`` output frames of a conv that sees one frame ahead, whose input sequence starts at
    clip frame ``first_index`` (its output frame ``j`` is clip frame ``first_index + 1 + j``), how
    many are frames of the clip (of ``end``): the ones worth computing."""
    return max(0, min(frames, end - first_index - 1))


# -- the stream's step --------------------------------------------------------------------------------
class Step(NamedTuple):
    """What every layer of one decode (or encode) step knows: ``first`` (static: the clip's first
    step) and the clip's length in latent frames, ``clip`` (an int32 scalar when traced: after the
    first step, and on a first step that takes it at run time). A layer at time scale ``r`` (frames
    per latent frame) has ``1 + r·(clip − 1)`` input frames in the whole clip. ``bound``, on a first
    step: the longest clip its program serves (static), so that the frames past it are not computed."""

    first: bool
    clip: Any
    bound: int = 0

    def frames_at(self, scale: int) -> Any:
        """An int where ``clip`` is static, an int32 scalar where it is traced."""
        return 1 + scale * (self.clip - 1)

    def bound_at(self, scale: int) -> int:
        """``frames_at`` of the longest clip the first step serves (static)."""
        return 1 + scale * (self.bound - 1)


class ConvCache(NamedTuple):
    """A conv's memory between steps: its last two (spatially padded) input frames ``(B, 2, h+2, w+2, C)``
    and how many input frames it has taken, ``seen`` ``(B, 1, 1, 1, 1)`` int32 (shaped like a band
    of a cache, so a sharded cache splits it like the others: each band keeps its copy)."""

    past: jax.Array
    seen: jax.Array


class Weights(nnx.Module):
    """A 3x3x3 conv's kernel ``(3, 3, 3, C, O)`` and bias (diffusers' ``nn.Conv3d``)."""

    def __init__(self, cin: int, cout: int, *, rngs: nnx.Rngs, dtype):
        self.kernel = _kernel(rngs, (3, 3, 3, cin, cout), 27 * cin, dtype, "conv3d")
        self.bias = _bias(rngs, cout, dtype)


class Conv(nnx.Module):
    """``LTX(2)VideoCausalConv3d``, kernel 3, stride 1, its weights under ``.conv``.

    Args:
      causal: two copies of the clip's first frame before it (else one before, and one copy of the
        last frame after it: the conv sees one frame ahead).
      edge: the frame's spatial padding, ``"zero"`` or ``"reflect"``.
      scale: frames of its input per latent frame (the decoder's time scale at this layer).
    """

    def __init__(self, cin: int, cout: int, *, causal: bool, edge: str, scale: int = 1, rngs: nnx.Rngs,
                 dtype=jnp.float32):
        self.causal, self.edge, self.scale = causal, check_edge(edge), scale
        self.conv = Weights(cin, cout, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, x: jax.Array, cache: ConvCache | None, ctx: SpatialContext,
                 step: Step) -> tuple[jax.Array, ConvCache]:
        """``x (B, n, h, w, C)`` → ``(B, m, h, w, O)``: ``m = n`` (causal, or a later step), ``n − 1`` on
        a first step that sees ahead (``cache`` None there)."""
        padded = ctx.pad_hw(x, edge=self.edge)
        if cache is None:
            before = 2 if self.causal else 1
            seq = jnp.concatenate([jnp.repeat(padded[:, :1], before, axis=1), padded], axis=1)
            seen = jnp.zeros((x.shape[0], 1, 1, 1, 1), jnp.int32)
        else:
            seq, seen = jnp.concatenate([cache.past, padded], axis=1), cache.seen
        if self.causal:
            return self._conv(seq, ctx), ConvCache(seq[:, -2:], seen + x.shape[1])
        # The frames it reads past the clip's end are copies of the last. The frames it would emit
        # past the end are read by nobody (every conv after it reads copies of the last instead, and
        # the decode crops them), so it does not compute them: zeros stand in (``emitted``).
        first_index = seen[0, 0, 0, 0, 0] - (seq.shape[1] - x.shape[1])
        end = step.frames_at(self.scale)
        seq = past_the_end(seq, first_index, end)
        cache = ConvCache(seq[:, -2:], seen + x.shape[1])
        frames = seq.shape[1] - 2
        if step.first:  # the frames' places are static: compute those of the longest clip served
            real = emitted(frames, first_index=-1, end=step.bound_at(self.scale))
            if real == frames:
                return self._conv(seq, ctx), cache
            y = self._conv(seq[:, :real + 2], ctx)
            return jnp.pad(y, [(0, 0), (0, frames - real)] + [(0, 0)] * 3), cache
        # A later step: all of its frames, or (past the clip's end, as the stream drains) none.
        skipped = jnp.zeros((x.shape[0], frames, *x.shape[2:4], self.conv.kernel.shape[-1]), x.dtype)
        return lax.cond(first_index + 1 < end, lambda s: self._conv(s, ctx), lambda s: skipped, seq), cache

    def _conv(self, seq: jax.Array, ctx: SpatialContext) -> jax.Array:
        """The conv of every frame of ``seq`` after its first two (their past)."""
        return causal_conv3x3x3(seq[:, :2], seq[:, 2:], self.conv.kernel[...], self.conv.bias[...],
                                native=ctx.native_conv, rounded_sums=ctx.rounded_conv_sums, onednn=ctx.onednn_conv)


class Pointwise(nnx.Module):
    """LTX-Video's kernel-1 ``LTXVideoCausalConv3d`` shortcut, its weights under ``.conv``."""

    def __init__(self, cin: int, cout: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.conv = PointwiseConv(cin, cout, rngs=rngs, dtype=dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.conv(x)


class LayerNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, *, dtype=jnp.float32):
        self.eps = eps
        self.weight = nnx.Param(jnp.ones((dim,), dtype), torch_layout="vector")
        self.bias = nnx.Param(jnp.zeros((dim,), dtype), torch_layout="vector")

    def __call__(self, x: jax.Array) -> jax.Array:
        return layer_norm(x, self.weight[...], self.bias[...], self.eps)


class Linear(nnx.Module):
    def __init__(self, cin: int, cout: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.layer = PointwiseConv(cin, cout, rngs=rngs, dtype=dtype, torch_layout="linear")

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.layer(x)


class TimestepEmbedding(nnx.Module):
    """``PixArtAlphaCombinedTimestepSizeEmbeddings(dim, 0)``: the 256 sinusoidal channels, then
    linear → SiLU → linear. ``(B,)`` → ``(B, dim)`` float32."""

    def __init__(self, dim: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.linear_1 = PointwiseConv(TIME_PROJECTION_CHANNELS, dim, rngs=rngs, dtype=dtype, torch_layout="linear")
        self.linear_2 = PointwiseConv(dim, dim, rngs=rngs, dtype=dtype, torch_layout="linear")

    def __call__(self, timestep: jax.Array) -> jax.Array:
        return self.linear_2(jax.nn.silu(self.linear_1(timestep_projection(timestep))))


class TimeEmbedder(nnx.Module):
    """Held as diffusers holds it: ``time_embedder.timestep_embedder.linear_{1,2}``."""

    def __init__(self, dim: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.timestep_embedder = TimestepEmbedding(dim, rngs=rngs, dtype=dtype)

    def __call__(self, timestep: jax.Array) -> jax.Array:
        return self.timestep_embedder(timestep).astype(jnp.float32)


def inject(h: jax.Array, scale: jax.Array, keys: jax.Array, ctx: SpatialContext, index: int) -> jax.Array:
    """``h + noise · scale``: one standard normal map per row over the frame (the same for every frame
    of the clip, as the reference draws one ``(H, W)`` map per call), times the learned per-channel
    ``scale``. ``h (B, T, H, W, C)``; the map comes from ``fold_in(key, index)``."""
    b, _, height, width, _ = h.shape
    layer_keys = jax.vmap(lambda key: jax.random.fold_in(jax.random.fold_in(key, INJECTED_NOISE), index))(keys)
    noise = ctx.frame_noise(layer_keys, (height, width, 1))  # (B, H, W, 1)
    return (h.astype(jnp.float32) + noise[:, None] * scale.astype(jnp.float32)).astype(h.dtype)


class Resnet(nnx.Module):
    """``LTX(2)VideoResnetBlock3d``: pixel norm → (scale, shift by the timestep) → SiLU → conv → (noise)
    → pixel norm → (scale, shift) → SiLU → conv → (noise), plus the input (LayerNorm and a 1x1x1
    conv when the width changes), through a delay line when the convs see ahead.

    ``(B, n, H, W, cin)`` → ``(B, m, H, W, cout)``, ``m = n − 2`` on a first step that sees ahead."""

    def __init__(self, cin: int, cout: int, *, causal: bool, edge: str, scale: int, eps: float,
                 timestep: bool = False, noise: bool = False, noise_index: int = 0, wrapped_shortcut: bool = True,
                 rngs: nnx.Rngs, dtype=jnp.float32):
        self.noise_index = noise_index
        self.conv1 = Conv(cin, cout, causal=causal, edge=edge, scale=scale, rngs=rngs, dtype=dtype)
        self.conv2 = Conv(cout, cout, causal=causal, edge=edge, scale=scale, rngs=rngs, dtype=dtype)
        self.norm3 = LayerNorm(cin, eps, dtype=dtype) if cin != cout else None
        shortcut = Pointwise if wrapped_shortcut else PointwiseConv
        self.conv_shortcut = shortcut(cin, cout, rngs=rngs, dtype=dtype) if cin != cout else None
        self.scale_shift_table = (nnx.Param(jnp.zeros((4, cin), dtype), torch_layout="table") if timestep else None)
        self.per_channel_scale1 = nnx.Param(jnp.zeros((cin,), dtype), torch_layout="gamma2d") if noise else None
        self.per_channel_scale2 = nnx.Param(jnp.zeros((cin,), dtype), torch_layout="gamma2d") if noise else None

    def _modulated(self, h: jax.Array, temb: jax.Array | None, which: int) -> jax.Array:
        """``h · (1 + scale) + shift`` of the timestep embedding ``temb (B, 4C)`` and the table."""
        if self.scale_shift_table is None or temb is None:
            return h
        table = temb.reshape(temb.shape[0], 4, -1) + self.scale_shift_table[...].astype(jnp.float32)[None]
        shift, scale = table[:, 2 * which], table[:, 2 * which + 1]
        h32 = h.astype(jnp.float32) * (1 + scale[:, None, None, None]) + shift[:, None, None, None]
        return h32.astype(h.dtype)

    @scoped
    def __call__(self, x: jax.Array, caches: Any, ctx: SpatialContext, step: Step, *, temb: jax.Array | None = None,
                 noise_keys: jax.Array | None = None) -> tuple[jax.Array, Any]:
        cache1, cache2, line = caches if caches is not None else (None, None, None)
        h = jax.nn.silu(self._modulated(pixel_norm(x), temb, 0))
        h, cache1 = self.conv1(h, cache1, ctx, step)
        if self.per_channel_scale1 is not None and noise_keys is not None:
            h = inject(h, self.per_channel_scale1[...], noise_keys, ctx, 2 * self.noise_index)
        h = jax.nn.silu(self._modulated(pixel_norm(h), temb, 1))
        h, cache2 = self.conv2(h, cache2, ctx, step)
        if self.per_channel_scale2 is not None and noise_keys is not None:
            h = inject(h, self.per_channel_scale2[...], noise_keys, ctx, 2 * self.noise_index + 1)
        shortcut, line = delayed(line, x, h.shape[1])
        if self.norm3 is not None and self.conv_shortcut is not None:
            shortcut = self.conv_shortcut(self.norm3(shortcut))
        return h + shortcut, (cache1, cache2, line)


class Upsampler(nnx.Module):
    """``LTX(2)VideoUpsampler3d``: a conv to ``cin·f·p²/factor`` channels rearranged into ``f`` frames and
    ``p x p`` pixels (``depth_to_space``), plus (``residual``) the input rearranged the same way and
    its channels tiled ``f·p²/factor`` times; on the clip's first step the ``f − 1`` frames before its
    first are dropped. ``(B, n, H, W, cin)`` → ``(B, f·m − …, p·H, p·W, cin/factor)``."""

    def __init__(self, cin: int, stride: tuple[int, int], *, residual: bool, factor: int, causal: bool, edge: str,
                 scale: int, rngs: nnx.Rngs, dtype=jnp.float32):
        self.frames, self.pixels = stride
        self.residual, self.repeats = residual, self.frames * self.pixels ** 2 // factor
        self.conv = Conv(cin, cin * self.frames * self.pixels ** 2 // factor, causal=causal, edge=edge, scale=scale,
                         rngs=rngs, dtype=dtype)

    def _rearranged(self, x: jax.Array, first: bool) -> jax.Array:
        x = depth_to_space(x, self.frames, self.pixels)
        return x[:, self.frames - 1:] if first else x

    @scoped
    def __call__(self, x: jax.Array, caches: Any, ctx: SpatialContext, step: Step) -> tuple[jax.Array, Any]:
        cache, line = caches if caches is not None else (None, None)
        h, cache = self.conv(x, cache, ctx, step)
        if self.residual:  # the input frames of the frames the conv emitted
            shortcut, line = delayed(line, x, h.shape[1])
            h = self._rearranged(h, step.first) + jnp.tile(self._rearranged(shortcut, step.first),
                                                            (1, 1, 1, 1, self.repeats))
            return h, (cache, line)
        return self._rearranged(h, step.first), (cache, line)
