"""MiniMax-H3's video VAE (diffusers' ``AutoencoderKLMiniMaxH3``) in Flax nnx, channels-last inside.

The encoder is a causal 3-D CNN: every conv pads the frame by reflection (``spatial_padding_mode``)
and the past with zero frames, GroupNorm normalises each frame alone, a stride-2 downsample first
reflects one row and column at the bottom/right. The decoder is a non-causal ViT: each latent voxel
of a clip is a token, learned register tokens and one zero token join them, and a 3-axis RoPE
places each token by its coordinates normalised to [-1, 1) over the clip it sees — so a spatial
tile is decoded as a picture of its own (``decode``: the released decode blends such tiles).

Norms, the encoder and the residual stream stay in float32 whatever the weights' dtype, as
diffusers pins them (``_keep_in_fp32_modules``). Parameter paths mirror diffusers' module names
(``decoder.transformer_blocks.3.attn.to_q.weight``), so loading is ``models.loading``'s rename.
These modules are not the frame-stepped ``DecoderModule``/``EncoderModule`` of
``models.family_modules``: a clip (or a tile of one) goes through whole, and ``decode``/``encode``
in this folder run the released chunking and tiling around them.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from vaeserve.models.layers import PointwiseConv, scoped

from .config import AutoencoderKLMiniMaxH3Config

H3Config = AutoencoderKLMiniMaxH3Config
# jnp.pad's names for PyTorch's F.pad modes.
_PAD_MODES = {"reflect": "reflect", "replicate": "edge", "constant": "constant"}


def _linear(cin: int, cout: int, *, rngs: nnx.Rngs, dtype) -> PointwiseConv:
    return PointwiseConv(cin, cout, rngs=rngs, dtype=dtype, torch_layout="linear")


# -- the encoder ------------------------------------------------------------------------------------
class CausalConv3d(nnx.Module):
    """A 3-D conv (``k``³ kernel, ``(O, I, k, k, k)`` in PyTorch) after ``spatial_padding`` rows and
    columns of ``pad_mode`` around each frame and ``temporal_padding`` zero frames before the clip.
    ``(B, T, H, W, C)`` → ``(B, T', H', W', O)``, float32."""

    def __init__(self, cin: int, cout: int, kernel: int, *, stride: tuple[int, int, int] = (1, 1, 1),
                 spatial_padding: int = 0, temporal_padding: int = 0, pad_mode: str = "reflect",
                 rngs: nnx.Rngs, dtype=jnp.float32):
        self.stride, self.spatial_padding, self.temporal_padding = stride, spatial_padding, temporal_padding
        self.pad_mode = _PAD_MODES[pad_mode]
        shape = (kernel, kernel, kernel, cin, cout) if kernel > 1 else (cin, cout)
        self.kernel = nnx.Param(jax.random.normal(rngs.params(), shape, dtype) / math.sqrt(cin * kernel ** 3),
                                torch_layout="conv3d" if kernel > 1 else "pointwise3d")
        self.bias = nnx.Param(jnp.zeros((cout,), dtype), torch_layout="vector")

    @scoped
    def __call__(self, x: jax.Array) -> jax.Array:
        p = self.spatial_padding
        if p:
            x = jnp.pad(x, ((0, 0), (0, 0), (p, p), (p, p), (0, 0)), mode=self.pad_mode)
        if self.temporal_padding:
            x = jnp.pad(x, ((0, 0), (self.temporal_padding, 0), (0, 0), (0, 0), (0, 0)))
        kernel = self.kernel[...].astype(jnp.float32)
        kernel = kernel.reshape((1, 1, 1, *kernel.shape)) if kernel.ndim == 2 else kernel  # a 1x1x1 conv
        y = lax.conv_general_dilated(x.astype(jnp.float32), kernel, self.stride, "VALID",
                                     dimension_numbers=("NDHWC", "DHWIO", "NDHWC"),
                                     precision=lax.Precision.HIGHEST)
        return y + self.bias[...].astype(jnp.float32)


class FrameGroupNorm(nnx.Module):
    """GroupNorm whose statistics span one frame's group (diffusers folds time into the batch),
    in float32. ``(B, T, H, W, C)`` → same."""

    def __init__(self, dim: int, groups: int, eps: float, *, dtype=jnp.float32):
        self.groups, self.eps = groups, eps
        self.weight = nnx.Param(jnp.ones((dim,), dtype), torch_layout="vector")
        self.bias = nnx.Param(jnp.zeros((dim,), dtype), torch_layout="vector")

    @scoped
    def __call__(self, x: jax.Array) -> jax.Array:
        b, t, h, w, c = x.shape
        grouped = x.astype(jnp.float32).reshape(b, t, h, w, self.groups, c // self.groups)
        mean = grouped.mean(axis=(2, 3, 5), keepdims=True)
        var = jnp.square(grouped - mean).mean(axis=(2, 3, 5), keepdims=True)
        y = ((grouped - mean) * lax.rsqrt(var + self.eps)).reshape(x.shape)
        return y * self.weight[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)


class ResnetBlock3d(nnx.Module):
    """GroupNorm → SiLU → conv → GroupNorm → SiLU → conv, plus a 1x1x1 ``conv_shortcut`` when the
    widths differ. ``(B, T, H, W, C)`` → ``(B, T, H, W, O)``."""

    def __init__(self, cin: int, cout: int, config: H3Config, *, rngs: nnx.Rngs, dtype=jnp.float32):
        groups, eps, mode = config.norm_num_groups, config.norm_eps, config.spatial_padding_mode
        self.norm1 = FrameGroupNorm(cin, groups, eps, dtype=dtype)
        self.conv1 = CausalConv3d(cin, cout, 3, spatial_padding=1, temporal_padding=2, pad_mode=mode, rngs=rngs,
                                  dtype=dtype)
        self.norm2 = FrameGroupNorm(cout, groups, eps, dtype=dtype)
        self.conv2 = CausalConv3d(cout, cout, 3, spatial_padding=1, temporal_padding=2, pad_mode=mode, rngs=rngs,
                                  dtype=dtype)
        self.conv_shortcut = CausalConv3d(cin, cout, 1, rngs=rngs, dtype=dtype) if cin != cout else None

    @scoped
    def __call__(self, x: jax.Array) -> jax.Array:
        h = self.conv1(jax.nn.silu(self.norm1(x)))
        h = self.conv2(jax.nn.silu(self.norm2(h)))
        return (x if self.conv_shortcut is None else self.conv_shortcut(x)) + h


class Downsample3d(nnx.Module):
    """A strided 3x3x3 conv (held as ``conv``): one reflected row and column at the bottom/right
    first, so ``H`` becomes ``ceil(H / 2)``; ``temporal_stride`` 2 halves time (causally padded)."""

    def __init__(self, dim: int, temporal_stride: int, config: H3Config, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.pad_mode = _PAD_MODES[config.spatial_padding_mode]
        self.conv = CausalConv3d(dim, dim, 3, stride=(temporal_stride, 2, 2), temporal_padding=2,
                                 pad_mode=config.spatial_padding_mode, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, x: jax.Array) -> jax.Array:
        return self.conv(jnp.pad(x, ((0, 0), (0, 0), (0, 1), (0, 1), (0, 0)), mode=self.pad_mode))


class DownBlock3d(nnx.Module):
    """``layers_per_block`` resnets, then (where the level downsamples) ``downsamplers.0``."""

    def __init__(self, cin: int, cout: int, level: int, config: H3Config, *, rngs: nnx.Rngs, dtype=jnp.float32):
        dims = [cin] + [cout] * config.layers_per_block
        self.resnets = nnx.List([ResnetBlock3d(a, b, config, rngs=rngs, dtype=dtype)
                                 for a, b in zip(dims[:-1], dims[1:], strict=True)])
        downsamples = config.spatial_downsample_factors[level] > 1
        self.downsamplers = nnx.List([Downsample3d(cout, config.temporal_downsample_factors[level], config,
                                                   rngs=rngs, dtype=dtype)] if downsamples else [])

    @scoped
    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in (*self.resnets, *self.downsamplers):
            x = layer(x)
        return x


class Encoder3d(nnx.Module):
    """conv_in → down blocks → GroupNorm → SiLU → conv_out: a clip ``(B, F, H, W, 3)`` →
    ``(B, ceil(F / t), H / s, W / s, 2z)``."""

    def __init__(self, config: H3Config, *, rngs: nnx.Rngs, dtype=jnp.float32):
        dims, mode = config.block_out_channels, config.spatial_padding_mode
        self.conv_in = CausalConv3d(config.in_channels, dims[0], 3, spatial_padding=1, temporal_padding=2,
                                    pad_mode=mode, rngs=rngs, dtype=dtype)
        self.down_blocks = nnx.List([DownBlock3d(cin, cout, level, config, rngs=rngs, dtype=dtype)
                                     for level, (cin, cout) in enumerate(zip((dims[0], *dims[:-1]), dims,
                                                                             strict=True))])
        self.norm_out = FrameGroupNorm(dims[-1], config.norm_num_groups, config.norm_eps, dtype=dtype)
        self.conv_out = CausalConv3d(dims[-1], 2 * config.latent_channels, 3, spatial_padding=1, temporal_padding=2,
                                     pad_mode=mode, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.conv_in(x)
        for block in self.down_blocks:
            x = block(x)
        return self.conv_out(jax.nn.silu(self.norm_out(x)))


class H3Encoder(nnx.Module):
    """Encoder + ``quant_conv``: clips ``(N, F, H, W, 3)`` (ImageNet-normalised) → posterior moments
    ``(N, ceil(F / t), H / s, W / s, 2z)`` (mean, then log-variance), float32."""

    def __init__(self, config: H3Config, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.encoder = Encoder3d(config, rngs=rngs, dtype=dtype)
        self.quant_conv = CausalConv3d(2 * config.latent_channels, 2 * config.latent_channels, 1, rngs=rngs,
                                       dtype=dtype)

    @scoped
    def __call__(self, x: jax.Array) -> jax.Array:
        return self.quant_conv(self.encoder(x))


# -- the decoder ------------------------------------------------------------------------------------
def rms_normalize(x: jax.Array, eps: float) -> jax.Array:
    """``x / sqrt(mean(x²) + eps)`` over the last axis, in float32."""
    x32 = x.astype(jnp.float32)
    return x32 * lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)


def rope_frequencies(rope_dim: int, theta: float) -> np.ndarray:
    """Each axis's ``rope_dim / 6`` inverse frequencies, as diffusers computes them (float32)."""
    steps = np.arange(0, 1, 6 / rope_dim, dtype=np.float32)
    return (np.float32(1.0) / np.power(np.float32(theta), steps)).astype(np.float32)


def token_positions(frames: int, height: int, width: int, suffix: int) -> np.ndarray:
    """``(frames·height·width + suffix, 3)`` coordinates: each axis's cell centres normalised to
    [-1, 1) over the clip the ViT sees, row-major; the ``suffix`` tokens (registers, the zero
    token) at 0."""
    axes = [2.0 * (np.arange(0.5, size, dtype=np.float32) / np.float32(size)) - 1.0 for size in (frames, height, width)]
    grid = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, 3)
    return np.concatenate([grid, np.zeros((suffix, 3), np.float32)]).astype(np.float32)


def rope_angles(positions: np.ndarray, frequencies: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin ``(L, rope_dim)`` of ``2π · position · frequency``, the three axes' angles
    concatenated, then repeated (the rotation pairs channel ``i`` with ``i + rope_dim / 2``)."""
    angles = np.float32(2.0 * math.pi) * positions[:, :, None] * frequencies[None, None, :]
    angles = np.tile(angles.reshape(len(positions), -1), 2)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """The RoPE rotation of the first ``cos.shape[-1]`` channels of each head: ``x (N, L, H, D)``,
    ``cos``/``sin`` ``(L, R)`` → ``x``'s shape."""
    r = cos.shape[-1]
    rotary, rest = x[..., :r], x[..., r:]
    first, second = rotary[..., : r // 2], rotary[..., r // 2:]
    rotated = jnp.concatenate([-second, first], axis=-1)
    cos, sin = cos[:, None, :].astype(x.dtype), sin[:, None, :].astype(x.dtype)
    return jnp.concatenate([rotary * cos + rotated * sin, rest], axis=-1)


class RMSNorm(nnx.Module):
    """``nn.RMSNorm(dim, eps)`` with a weight, in float32: ``(..., D)`` → ``(..., D)`` in ``dtype``."""

    def __init__(self, dim: int, eps: float, *, dtype=jnp.float32):
        self.eps, self.dtype = eps, dtype
        self.weight = nnx.Param(jnp.ones((dim,), dtype), torch_layout="vector")

    @scoped
    def __call__(self, x: jax.Array) -> jax.Array:
        return (rms_normalize(x, self.eps) * self.weight[...].astype(jnp.float32)).astype(self.dtype)


class Attention(nnx.Module):
    """Multi-head self-attention over every token: q/k/v, RMS-normalised q and k per head (float32),
    RoPE, ``jax.nn.dot_product_attention``, ``to_out.0``. ``(N, L, D)`` → same."""

    def __init__(self, config: H3Config, *, rngs: nnx.Rngs, dtype=jnp.float32):
        dim = config.decoder_dim
        self.heads, self.eps = config.decoder_num_attention_heads, config.decoder_norm_eps
        self.to_q = _linear(dim, dim, rngs=rngs, dtype=dtype)
        self.to_k = _linear(dim, dim, rngs=rngs, dtype=dtype)
        self.to_v = _linear(dim, dim, rngs=rngs, dtype=dtype)
        self.to_out = nnx.List([_linear(dim, dim, rngs=rngs, dtype=dtype)])

    @scoped
    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
        n, length, dim = x.shape
        q, k, v = (proj(x).reshape(n, length, self.heads, -1) for proj in (self.to_q, self.to_k, self.to_v))
        q = rotate(rms_normalize(q, self.eps).astype(x.dtype), cos, sin)
        k = rotate(rms_normalize(k, self.eps).astype(x.dtype), cos, sin)
        out = jax.nn.dot_product_attention(q, k, v)
        return self.to_out[0](out.reshape(n, length, dim))


class SwiGLU(nnx.Module):
    """``proj`` to twice the hidden width, then ``hidden · silu(gate)``."""

    def __init__(self, dim: int, hidden: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.proj = _linear(dim, 2 * hidden, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, x: jax.Array) -> jax.Array:
        hidden, gate = jnp.split(self.proj(x), 2, axis=-1)
        return hidden * jax.nn.silu(gate)


class NoWeights(nnx.Module):
    """Holds the place of diffusers' dropout in ``ff.net`` (``net.0`` the SwiGLU, ``net.2`` the
    output projection), so that the parameter paths are diffusers' names."""


class FeedForward(nnx.Module):
    """diffusers' ``FeedForward(activation_fn="swiglu")``: ``(N, L, D)`` → same."""

    def __init__(self, dim: int, mult: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
        hidden = int(dim * mult)
        self.net = nnx.List([SwiGLU(dim, hidden, rngs=rngs, dtype=dtype), NoWeights(),
                             _linear(hidden, dim, rngs=rngs, dtype=dtype)])

    @scoped
    def __call__(self, x: jax.Array) -> jax.Array:
        return self.net[2](self.net[0](x))


class TransformerBlock(nnx.Module):
    """Pre-norm block: ``x + attn(norm1(x)) · scale1``, then ``x + ff(norm2(x)) · scale2``; the
    residual stream and the RMS norms in float32. ``(N, L, D)`` float32 → same."""

    def __init__(self, config: H3Config, *, rngs: nnx.Rngs, dtype=jnp.float32):
        dim, eps = config.decoder_dim, config.decoder_norm_eps
        self.norm1 = RMSNorm(dim, eps, dtype=dtype)
        self.attn = Attention(config, rngs=rngs, dtype=dtype)
        self.scale1 = nnx.Param(jnp.zeros((dim,), dtype), torch_layout="vector")
        self.norm2 = RMSNorm(dim, eps, dtype=dtype)
        self.ff = FeedForward(dim, config.decoder_ffn_mult, rngs=rngs, dtype=dtype)
        self.scale2 = nnx.Param(jnp.zeros((dim,), dtype), torch_layout="vector")

    @scoped
    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
        x = x + self.attn(self.norm1(x), cos, sin).astype(jnp.float32) * self.scale1[...].astype(jnp.float32)
        return x + self.ff(self.norm2(x)).astype(jnp.float32) * self.scale2[...].astype(jnp.float32)


class LayerNorm(nnx.Module):
    """``nn.LayerNorm(dim, eps)`` in float32: ``(..., D)`` → float32."""

    def __init__(self, dim: int, eps: float, *, dtype=jnp.float32):
        self.eps = eps
        self.weight = nnx.Param(jnp.ones((dim,), dtype), torch_layout="vector")
        self.bias = nnx.Param(jnp.zeros((dim,), dtype), torch_layout="vector")

    @scoped
    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        mean = x32.mean(axis=-1, keepdims=True)
        var = jnp.square(x32 - mean).mean(axis=-1, keepdims=True)
        return (x32 - mean) * lax.rsqrt(var + self.eps) * self.weight[...].astype(jnp.float32) \
            + self.bias[...].astype(jnp.float32)


class ViTDecoder3d(nnx.Module):
    """The ViT decoder: clips of latents ``(N, T, h, w, z)`` → pixels ``(N, t·T, s·h, s·w, 3)``,
    float32. The RoPE coordinates span the clip it is given (a tile: the tile)."""

    def __init__(self, config: H3Config, *, rngs: nnx.Rngs, dtype=jnp.float32):
        dim = config.decoder_dim
        self.dtype = dtype
        self.patch, self.patch_t = config.spatial_scale, config.temporal_scale
        self.out_channels = config.out_channels
        self.rope_dim, self.rope_theta = config.rope_dim, config.decoder_rope_theta
        self.proj_in = _linear(config.latent_channels, dim, rngs=rngs, dtype=dtype)
        self.register_tokens = nnx.Param(
            0.02 * jax.random.normal(rngs.params(), (1, config.decoder_num_register_tokens, dim), dtype),
            torch_layout="table")
        self.transformer_blocks = nnx.List([TransformerBlock(config, rngs=rngs, dtype=dtype)
                                            for _ in range(config.decoder_num_layers)])
        self.norm_out = LayerNorm(dim, config.decoder_norm_eps, dtype=dtype)
        self.proj_out = _linear(dim, config.out_channels * self.patch_t * self.patch ** 2, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, z: jax.Array) -> jax.Array:
        n, t, h, w, c = z.shape
        x = self.proj_in(z.reshape(n, t * h * w, c).astype(self.dtype)).astype(jnp.float32)
        registers = jnp.broadcast_to(self.register_tokens[...].astype(jnp.float32), (n, *self.register_tokens.shape[1:]))
        x = jnp.concatenate([x, registers, jnp.zeros((n, 1, x.shape[-1]), jnp.float32)], axis=1)
        # Computed at trace time from the clip's shape: constants of the program.
        cos, sin = rope_angles(token_positions(t, h, w, registers.shape[1] + 1),
                               rope_frequencies(self.rope_dim, self.rope_theta))
        for block in self.transformer_blocks:
            x = block(x, jnp.asarray(cos), jnp.asarray(sin))
        y = self.proj_out(self.norm_out(x).astype(self.dtype))[:, : t * h * w]
        p, pt = self.patch, self.patch_t
        y = y.reshape(n, t, h, w, self.out_channels, pt, p, p).transpose(0, 1, 5, 2, 6, 3, 7, 4)
        return y.reshape(n, t * pt, h * p, w * p, self.out_channels).astype(jnp.float32)


class H3Decoder(nnx.Module):
    """``post_quant_conv`` + the ViT decoder: clips ``(N, T, h, w, z)`` → ``(N, t·T, s·h, s·w, 3)``
    (ImageNet-normalised pixels), each clip on its own coordinates."""

    def __init__(self, config: H3Config, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.post_quant_conv = PointwiseConv(config.latent_channels, config.latent_channels, rngs=rngs, dtype=dtype)
        self.decoder = ViTDecoder3d(config, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, z: jax.Array) -> jax.Array:
        return self.decoder(self.post_quant_conv(z.astype(self.post_quant_conv.kernel.dtype)))
