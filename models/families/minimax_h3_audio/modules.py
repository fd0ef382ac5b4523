"""MiniMax-H3's audio VAE in Flax nnx (diffusers' ``autoencoder_kl_minimax_h3_audio.py``): the
decoder, latents ``(B, latent_channels, L)`` → a mono waveform ``(B, 1, L·hop_length)``, and the
encoder, a waveform → the posterior's mean.

Both run over time, channels-last inside ``(B, S, C)``.
  * The decoder is a BigVGAN: ``dec_in_proj`` (1x1) to ``latent_dim``, ``conv_pre``, then per rate a
    transposed conv (halving the width) followed by the mean of a few AMP blocks (dilated convs,
    each after an anti-aliased SnakeBeta: upsampled 2x by a Kaiser-windowed sinc, activated,
    low-passed and decimated back), a last anti-aliased SnakeBeta, ``conv_post``, a clip to [-1, 1].
  * The encoder is DAC's: a conv, per rate three residual units (Snake, dilated conv, Snake, 1x1)
    and a strided conv doubling the width, Snake, a conv to ``latent_dim``; then ``pre_block``
    narrows ``latent_dim`` to ``latent_channels`` (a causal attention whose heads are averaged, not
    concatenated, plus a linear shortcut, then a GeGLU MLP) and ``mean_proj`` gives the mean.

Every conv but the 1x1 projections is weight-normalised: the checkpoint holds ``weight_g`` (a norm
per output channel; per input channel for a transposed conv) and ``weight_v`` (a direction), and the
kernel is ``g · v / ‖v‖``, computed here as diffusers' forward pre-hook does. The sinc filters are
buffers of the checkpoint, read with it. Names and layouts are diffusers'.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vaeserve.models.families.ltx.layers import LayerNorm
from vaeserve.models.families.ltx2_audio.modules import PRECISION, zeros_param
from vaeserve.models.families.ltx2_audio.vocoder import (
    SNAKE_EPS,
    Conv1d,
    SincFilter,
    SnakeBeta,
    conv1d,
    conv_transpose1d,
    kaiser_crop,
    replicate_pad,
)

from .config import ANTIALIAS_KERNEL, ANTIALIAS_RATIO, MLP_RATIO, MiniMaxH3AudioConfig

# ``nn.LayerNorm``'s default epsilon (every norm of ``pre_block``).
LAYER_NORM_EPS = 1e-5
# The DAC residual units' dilations, and their kernel.
RESIDUAL_DILATIONS = (1, 3, 9)
RESIDUAL_KERNEL = 7


# -- pure functions ----------------------------------------------------------------------------------
def kaiser_sinc_taps(cutoff: float, half_width: float, kernel: int) -> np.ndarray:
    """``kaiser_sinc_filter1d``: a Kaiser-windowed sinc low-pass of ``kernel`` taps summing to 1
    (the checkpoint's filter buffers; made here for seeded random weights)."""
    half = kernel // 2
    attenuation = 2.285 * (half - 1) * math.pi * (4 * half_width) + 7.95
    if attenuation > 50.0:
        beta = 0.1102 * (attenuation - 8.7)
    elif attenuation >= 21.0:
        beta = 0.5842 * (attenuation - 21) ** 0.4 + 0.07886 * (attenuation - 21.0)
    else:
        beta = 0.0
    time = np.arange(-half, half) + 0.5 if kernel % 2 == 0 else np.arange(kernel) - half
    taps = 2 * cutoff * np.kaiser(kernel, beta) * np.sinc(2 * cutoff * time)
    return (taps / taps.sum()).astype(np.float32).reshape(1, 1, kernel)


def weight_norm(g: jax.Array, v: jax.Array) -> jax.Array:
    """``torch.nn.utils.weight_norm(dim=0)``'s kernel: ``v`` scaled to norm ``g`` along its first
    axis, in float32 (a bfloat16 model rounds the kernel, not the norm)."""
    g, v = g.astype(jnp.float32), v.astype(jnp.float32)
    norm = jnp.sqrt(jnp.sum(v * v, axis=tuple(range(1, v.ndim)), keepdims=True))
    return v * (g / norm)


def dac_snake(x: jax.Array, alpha: jax.Array) -> jax.Array:
    """DAC's Snake (``alpha`` on a linear scale): ``x + sin²(α·x) / (α + eps)``."""
    alpha = alpha.astype(x.dtype)
    return x + (1.0 / (alpha + SNAKE_EPS)) * jnp.sin(alpha * x) ** 2


def adaptive_average(x: jax.Array, size: int) -> jax.Array:
    """``F.adaptive_avg_pool1d`` over the last axis: output ``i`` is the mean of inputs
    ``floor(i·n/size)`` to ``ceil((i+1)·n/size)``, as a matrix product (the windows overlap when
    ``size`` does not divide ``n``)."""
    n = x.shape[-1]
    pool = np.zeros((n, size), np.float32)
    for i in range(size):
        start, end = (i * n) // size, -(-(i + 1) * n // size)
        pool[start:end, i] = 1.0 / (end - start)
    return jnp.matmul(x, jnp.asarray(pool, x.dtype), precision=PRECISION)


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Softmax attention of ``(B, S, H, D)`` queries, keys, values, each position seeing itself and
    those before it, scaled by ``D^-½``. → ``(B, S, H, D)``."""
    length = q.shape[1]
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision=PRECISION) * q.shape[-1] ** -0.5
    later = np.triu(np.ones((length, length), bool), k=1)
    scores = jnp.where(later, -jnp.inf, scores.astype(jnp.float32))
    weights = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", weights, v, precision=PRECISION)


def upsample_polyphase(x: jax.Array, taps: jax.Array, ratio: int) -> jax.Array:
    """``MiniMaxH3AudioUpSample1d``: ``(B, S, C)`` → ``(B, ratio·S, C)``: edge-replicated, a
    transposed conv with the filter (the same for every channel), times ``ratio``, cropped.

    Computed by phases, not as a depthwise transposed conv: on XLA's CPU backend the depthwise
    convs made these activations about 15x slower and most of a decode's time. Output
    ``ratio·q + p`` is ``Σ_j taps[p + ratio·j] · x[q − j]``: a few shifted slices multiplied and
    added, every channel at once."""
    kernel = taps.shape[-1]
    crop = kaiser_crop(kernel, ratio)
    padded = replicate_pad(x, crop.pad, crop.pad)
    length, per_phase = padded.shape[1], -(-kernel // ratio)
    zeros = jnp.pad(padded, ((0, 0), (per_phase - 1, per_phase - 1), (0, 0)))
    outputs = length + per_phase - 1  # per phase: the transposed conv's full length, rounded up
    phases = [sum(taps[p + ratio * j] * zeros[:, per_phase - 1 - j:per_phase - 1 - j + outputs]
                  for j in range(per_phase) if p + ratio * j < kernel) for p in range(ratio)]
    y = ratio * jnp.stack(phases, axis=2).reshape(x.shape[0], outputs * ratio, x.shape[2])
    full = (length - 1) * ratio + kernel
    return y[:, crop.left:full - crop.right]


def decimate_lowpass(x: jax.Array, taps: jax.Array, ratio: int) -> jax.Array:
    """``MiniMaxH3AudioLowPassFilter1d``: ``(B, S, C)`` → ``(B, S/ratio, C)``: edge-replicated,
    low-passed by the filter, every ``ratio``-th sample kept; as strided slices multiplied and added
    (see ``upsample_polyphase``)."""
    kernel = taps.shape[-1]
    padded = replicate_pad(x, kernel // 2 - 1 + kernel % 2, kernel // 2)
    outputs = (padded.shape[1] - kernel) // ratio + 1
    terms = [taps[k] * padded[:, k:k + ratio * (outputs - 1) + 1:ratio] for k in range(kernel)]
    return sum(terms[1:], terms[0])


# -- layers ------------------------------------------------------------------------------------------
class WeightNormConv1d(nnx.Module):
    """``weight_norm(nn.Conv1d(cin, cout, kernel, stride, padding, dilation))``: ``weight_g``
    ``(cout, 1, 1)``, ``weight_v`` ``(cout, cin, kernel)``. ``(B, S, cin)`` → ``(B, S', cout)``."""

    def __init__(self, cin: int, cout: int, kernel: int, *, stride: int = 1, padding: int = 0, dilation: int = 1,
                 bias: bool = True, dtype=jnp.float32):
        self.weight_g = zeros_param((cout, 1, 1), dtype)
        self.weight_v = zeros_param((cout, cin, kernel), dtype)
        self.bias = zeros_param((cout,), dtype) if bias else None
        self.stride, self.padding, self.dilation = stride, padding, dilation

    def __call__(self, x: jax.Array) -> jax.Array:
        bias = None if self.bias is None else self.bias[...]
        return conv1d(x, weight_norm(self.weight_g[...], self.weight_v[...]), bias, (self.padding, self.padding),
                      stride=self.stride, dilation=self.dilation)


def same_conv(cin: int, cout: int, kernel: int, *, dilation: int = 1, bias: bool = True, dtype) -> WeightNormConv1d:
    """A weight-normalised conv padded by ``dilation·(kernel − 1)/2`` each side (diffusers' padding)."""
    return WeightNormConv1d(cin, cout, kernel, padding=dilation * (kernel - 1) // 2, dilation=dilation, bias=bias,
                            dtype=dtype)


class WeightNormConvTranspose1d(nnx.Module):
    """``weight_norm(nn.ConvTranspose1d(cin, cout, kernel, stride, (kernel − stride)/2))``: ``weight_g``
    ``(cin, 1, 1)``, ``weight_v`` ``(cin, cout, kernel)``. ``(B, S, cin)`` → ``(B, stride·S, cout)``."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, *, dtype=jnp.float32):
        self.weight_g = zeros_param((cin, 1, 1), dtype)
        self.weight_v = zeros_param((cin, cout, kernel), dtype)
        self.bias = zeros_param((cout,), dtype)
        self.stride = stride

    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.weight_v.shape[-1]
        return conv_transpose1d(x, weight_norm(self.weight_g[...], self.weight_v[...]), self.bias[...],
                                stride=self.stride, padding=(kernel - self.stride) // 2)


class DacSnake(nnx.Module):
    """``MiniMaxH3AudioSnake1d``: ``alpha`` ``(1, channels, 1)``, on a linear scale."""

    def __init__(self, channels: int, *, dtype=jnp.float32):
        self.alpha = zeros_param((1, channels, 1), dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        return dac_snake(x, self.alpha[...].reshape(-1))


class Lowpass(nnx.Module):
    """``MiniMaxH3AudioDownSample1d``: its filter under ``.lowpass``."""

    def __init__(self, *, dtype=jnp.float32):
        self.lowpass = SincFilter(ANTIALIAS_KERNEL, dtype=dtype)


class AntiAliasSnakeBeta(nnx.Module):
    """``MiniMaxH3AudioActivation1d`` of a SnakeBeta: upsample 2x, activate, low-pass and decimate."""

    def __init__(self, channels: int, *, dtype=jnp.float32):
        self.act = SnakeBeta(channels, use_beta=True, dtype=dtype)
        self.upsample = SincFilter(ANTIALIAS_KERNEL, dtype=dtype)
        self.downsample = Lowpass(dtype=dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = upsample_polyphase(x, self.upsample.filter[...].reshape(-1).astype(x.dtype), ANTIALIAS_RATIO)
        return decimate_lowpass(self.act(x), self.downsample.lowpass.filter[...].reshape(-1).astype(x.dtype),
                                ANTIALIAS_RATIO)


class AMPBlock(nnx.Module):
    """BigVGAN's ``AMPBlock1``: per dilation, ``x + conv2(act2(conv1(act1(x))))``, ``conv1`` dilated;
    the activations are listed interleaved (``act1`` of the first dilation, its ``act2``, ...)."""

    def __init__(self, channels: int, kernel: int, dilations: tuple[int, ...], *, dtype=jnp.float32):
        self.convs1 = nnx.List([same_conv(channels, channels, kernel, dilation=d, dtype=dtype) for d in dilations])
        self.convs2 = nnx.List([same_conv(channels, channels, kernel, dtype=dtype) for _ in dilations])
        self.activations = nnx.List([AntiAliasSnakeBeta(channels, dtype=dtype) for _ in range(2 * len(dilations))])

    def __call__(self, x: jax.Array) -> jax.Array:
        for i, (conv1, conv2) in enumerate(zip(self.convs1, self.convs2, strict=True)):
            x = x + conv2(self.activations[2 * i + 1](conv1(self.activations[2 * i](x))))
        return x


class BigVGAN(nnx.Module):
    """``MiniMaxH3AudioBigVGANDecoder``: ``(B, S, latent_dim)`` → ``(B, S·hop_length, 1)`` in [-1, 1].
    The upsamplers sit one deep in a list each (``ups.<i>.0``), as in the checkpoint."""

    def __init__(self, config: MiniMaxH3AudioConfig, *, dtype=jnp.float32):
        widths = config.decoder_widths()
        self.conv_pre = same_conv(config.latent_dim, config.decoder_dim, 7, dtype=dtype)
        self.ups = nnx.List([
            nnx.List([WeightNormConvTranspose1d(cin, cout, kernel, rate, dtype=dtype)])
            for cin, cout, kernel, rate in zip([config.decoder_dim, *widths[:-1]], widths, config.decoder_kernel_sizes,
                                               config.decoder_rates, strict=True)])
        self.resblocks = nnx.List([
            AMPBlock(width, kernel, dilations, dtype=dtype) for width in widths
            for kernel, dilations in zip(config.resblock_kernel_sizes, config.resblock_dilation_sizes, strict=True)])
        self.activation_post = AntiAliasSnakeBeta(widths[-1], dtype=dtype)
        self.conv_post = same_conv(widths[-1], 1, 7, bias=False, dtype=dtype)
        self.blocks_per_rate = len(config.resblock_kernel_sizes)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.conv_pre(x)
        for i, up in enumerate(self.ups):
            x = up[0](x)
            blocks = [self.resblocks[j] for j in range(i * self.blocks_per_rate, (i + 1) * self.blocks_per_rate)]
            # Summed, then divided: diffusers' order (a mean's rounding differs).
            x = sum((block(x) for block in blocks[1:]), blocks[0](x)) / self.blocks_per_rate
        return jnp.clip(self.conv_post(self.activation_post(x)), -1.0, 1.0)


class H3AudioDecoder(nnx.Module):
    """``AutoencoderKLMiniMaxH3Audio.decode``: denormalised latents ``(B, latent_channels, L)`` → a
    mono waveform ``(B, 1, L·hop_length)`` in [-1, 1], float32 (diffusers' layouts). Parameters
    under diffusers' names (``dec_in_proj.*``, ``decoder.*``)."""

    def __init__(self, config: MiniMaxH3AudioConfig, *, dtype=jnp.float32):
        self.config = config
        self.dec_in_proj = Conv1d(config.latent_channels, config.latent_dim, 1, dtype=dtype)
        self.decoder = BigVGAN(config, dtype=dtype)

    def __call__(self, latents: jax.Array) -> jax.Array:
        x = latents.transpose(0, 2, 1).astype(self.dec_in_proj.weight.dtype)
        return self.decoder(self.dec_in_proj(x)).astype(jnp.float32).transpose(0, 2, 1)


# -- the encoder ---------------------------------------------------------------------------------------
class ResidualUnit(nnx.Module):
    """DAC's residual unit: ``x + conv(snake(dilated conv(snake(x))))`` (its convs keep the length,
    so diffusers' crop of the shortcut never applies)."""

    def __init__(self, channels: int, dilation: int, *, dtype=jnp.float32):
        self.block = nnx.List([DacSnake(channels, dtype=dtype),
                               same_conv(channels, channels, RESIDUAL_KERNEL, dilation=dilation, dtype=dtype),
                               DacSnake(channels, dtype=dtype), same_conv(channels, channels, 1, dtype=dtype)])

    def __call__(self, x: jax.Array) -> jax.Array:
        h = x
        for layer in self.block:
            h = layer(h)
        return x + h


class EncoderBlock(nnx.Module):
    """Three residual units at ``width/2``, Snake, a conv of stride ``stride`` to ``width``."""

    def __init__(self, width: int, stride: int, *, dtype=jnp.float32):
        half = width // 2
        units: list[nnx.Module] = [ResidualUnit(half, d, dtype=dtype) for d in RESIDUAL_DILATIONS]
        self.block = nnx.List([*units, DacSnake(half, dtype=dtype),
                               WeightNormConv1d(half, width, 2 * stride, stride=stride, padding=-(-stride // 2),
                                                dtype=dtype)])

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.block:
            x = layer(x)
        return x


class DacEncoder(nnx.Module):
    """``MiniMaxH3AudioEncoder``: ``(B, S, 1)`` (``S`` whole hops) → ``(B, S/hop_length, latent_dim)``."""

    def __init__(self, config: MiniMaxH3AudioConfig, *, dtype=jnp.float32):
        widths = config.encoder_widths()
        self.block = nnx.List([
            same_conv(1, widths[0], 7, dtype=dtype),
            *(EncoderBlock(width, stride, dtype=dtype) for width, stride in zip(widths[1:], config.encoder_rates,
                                                                                 strict=True)),
            DacSnake(widths[-1], dtype=dtype), same_conv(widths[-1], config.latent_dim, 3, dtype=dtype)])

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.block:
            x = layer(x)
        return x


class Dense(nnx.Module):
    """``nn.Linear(cin, cout)``: ``weight`` ``(cout, cin)`` (PyTorch's layout and names)."""

    def __init__(self, cin: int, cout: int, *, bias: bool = True, dtype=jnp.float32):
        self.weight = zeros_param((cout, cin), dtype)
        self.bias = zeros_param((cout,), dtype) if bias else None

    def __call__(self, x: jax.Array) -> jax.Array:
        y = jnp.matmul(x, self.weight[...].astype(x.dtype).T, precision=PRECISION)
        return y if self.bias is None else y + self.bias[...].astype(x.dtype)


class H3AudioCausalAttention(nnx.Module):
    """``MiniMaxH3AudioCausalAttention``: ``(B, S, latent_dim)`` → ``(B, S, latent_channels)``. One
    bias-less ``qkv`` projection plus ``q_bias``, the checkpoint's zero ``zero_k_bias`` and
    ``v_bias``; the heads' outputs are averaged, the head width average-pooled to
    ``latent_channels``, then ``proj``."""

    def __init__(self, config: MiniMaxH3AudioConfig, *, dtype=jnp.float32):
        width, out = config.latent_dim, config.latent_channels
        self.qkv = Dense(width, 3 * width, bias=False, dtype=dtype)
        self.q_bias = zeros_param((width,), dtype)
        self.zero_k_bias = zeros_param((width,), dtype)
        self.v_bias = zeros_param((width,), dtype)
        self.proj = Dense(out, out, dtype=dtype)
        self.heads = config.num_attention_heads

    def __call__(self, x: jax.Array) -> jax.Array:
        batch, length, width = x.shape
        bias = jnp.concatenate([self.q_bias[...], self.zero_k_bias[...], self.v_bias[...]]).astype(x.dtype)
        qkv = (self.qkv(x) + bias).reshape(batch, length, 3, self.heads, width // self.heads)
        h = causal_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]).mean(axis=2)
        return self.proj(adaptive_average(h, self.proj.weight.shape[0]))


class GeGluMlp(nnx.Module):
    """``MiniMaxH3AudioGeGluMlp``: a LayerNorm, then ``w2(gelu_tanh(w0(x)) · w1(x))``."""

    def __init__(self, channels: int, *, dtype=jnp.float32):
        self.norm = LayerNorm(channels, LAYER_NORM_EPS, dtype=dtype)
        self.w0 = Dense(channels, MLP_RATIO * channels, dtype=dtype)
        self.w1 = Dense(channels, MLP_RATIO * channels, dtype=dtype)
        self.w2 = Dense(MLP_RATIO * channels, channels, dtype=dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.norm(x)
        return self.w2(jax.nn.gelu(self.w0(x), approximate=True) * self.w1(x))


class AttentionProjection(nnx.Module):
    """``pre_block``: ``(B, S, latent_dim)`` → ``(B, S, latent_channels)``: ``proj(norm3(x)) +
    attn(norm1(x))``, then plus ``mlp(norm2(·))``."""

    def __init__(self, config: MiniMaxH3AudioConfig, *, dtype=jnp.float32):
        width, out = config.latent_dim, config.latent_channels
        self.norm1 = LayerNorm(width, LAYER_NORM_EPS, dtype=dtype)
        self.attn = H3AudioCausalAttention(config, dtype=dtype)
        self.proj = Dense(width, out, dtype=dtype)
        self.norm3 = LayerNorm(width, LAYER_NORM_EPS, dtype=dtype)
        self.norm2 = LayerNorm(out, LAYER_NORM_EPS, dtype=dtype)
        self.mlp = GeGluMlp(out, dtype=dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = self.proj(self.norm3(x)) + self.attn(self.norm1(x))
        return h + self.mlp(self.norm2(h))


class H3AudioEncoder(nnx.Module):
    """``AutoencoderKLMiniMaxH3Audio.encode(...).latent_dist.mode()``: a mono waveform ``(B, 1, S)``
    → the posterior's mean ``(B, latent_channels, ceil(S/hop_length))``, float32, the waveform
    right-padded with zeros to whole hops first. ``logs_proj`` (the log standard deviation) is left
    out: MiniMax-H3 takes the mean. Parameters under diffusers' names (``encoder.*``,
    ``pre_block.*``, ``mean_proj.*``)."""

    def __init__(self, config: MiniMaxH3AudioConfig, *, dtype=jnp.float32):
        self.config = config
        self.encoder = DacEncoder(config, dtype=dtype)
        self.pre_block = AttentionProjection(config, dtype=dtype)
        self.mean_proj = Conv1d(config.latent_channels, config.latent_channels, 1, dtype=dtype)

    def __call__(self, waveform: jax.Array) -> jax.Array:
        samples = waveform.shape[-1]
        padded = self.config.latent_frames(samples) * self.config.hop_length
        x = jnp.pad(waveform, ((0, 0), (0, 0), (0, padded - samples))).transpose(0, 2, 1)
        x = self.pre_block(self.encoder(x.astype(self.mean_proj.weight.dtype)))
        return self.mean_proj(x).astype(jnp.float32).transpose(0, 2, 1)
