"""LTX-2's vocoders in Flax nnx (diffusers' ``pipelines/ltx2/vocoder.py``): ``LTX2Vocoder``, a
log-mel spectrogram ``(B, C, T, M)`` → a waveform ``(B, out_channels, T·prod(upsample_factors))``,
and ``LTX2VocoderWithBWE`` (LTX-2.3), which extends its band to a higher sampling rate.

A HiFi-GAN / BigVGAN generator over time, channels-last inside ``(B, S, C)``: the ``C·M`` mel
features of each frame are the channels of a 1-D signal, widened by ``conv_in``, then each
upsampler (a transposed conv) lengthens it and halves its width and the mean of a few residual
blocks (dilated convs, 'same' padding) refines it. The SnakeBeta activations are anti-aliased
where configured: upsampled 2x by a Kaiser-windowed sinc, activated, low-passed and decimated back;
the two sinc filters are buffers of the checkpoint, read with it.

The band-width extension runs a second generator of the same kind on the first waveform's own
causal log-mel spectrogram (an STFT whose windowed DFT basis and mel filterbank are buffers of the
checkpoint) and adds the result to the first waveform resampled by a Hann-windowed sinc.

Weights keep PyTorch's names and layouts (``Conv1d`` ``(O, I, K)``, ``ConvTranspose1d`` ``(I, O, K)``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from .config import LTX2VocoderConfig, LTX2VocoderWithBWEConfig
from .modules import PRECISION, zeros_param

_DIMENSIONS = ("NWC", "OIW", "NWC")
# SnakeBeta's guard against a zero amplitude (diffusers' ``eps``).
SNAKE_EPS = 1e-9
# ``nn.LeakyReLU()``'s default slope: the vocoder's last activation ignores the configured one (as
# the original code does).
DEFAULT_LEAKY_SLOPE = 0.01
# The BWE resampler's Hann-windowed sinc (``UpSample1d(window_type="hann")``): its rolloff (of the
# Nyquist rate), its zero crossings each side, and its half-width in input samples.
HANN_ROLLOFF = 0.99
HANN_ZERO_CROSSINGS = 6
HANN_WIDTH = math.ceil(HANN_ZERO_CROSSINGS / HANN_ROLLOFF)
# The log-mel spectrogram's floor (``MelSTFT``: ``log(clamp(mel, min=1e-5))``).
MEL_FLOOR = 1e-5


# -- pure functions ----------------------------------------------------------------------------------
def conv1d(x: jax.Array, weight: jax.Array, bias: jax.Array | None, padding: tuple[int, int], *,
           dilation: int = 1, stride: int = 1, groups: int = 1) -> jax.Array:
    """``nn.Conv1d`` after zero ``padding``: ``(B, S, C)`` with an ``(O, C/groups, K)`` kernel → ``(B, S', O)``."""
    y = lax.conv_general_dilated(x, weight.astype(x.dtype), (stride,), (padding,), rhs_dilation=(dilation,),
                                 dimension_numbers=_DIMENSIONS, feature_group_count=groups, precision=PRECISION)
    return y if bias is None else y + bias.astype(x.dtype)


def conv_transpose1d(x: jax.Array, weight: jax.Array, bias: jax.Array | None, *, stride: int, padding: int,
                     groups: int = 1) -> jax.Array:
    """``nn.ConvTranspose1d``: ``(B, S, C)`` with a ``(C, O/groups, K)`` kernel → ``(B, (S−1)·stride
    − 2·padding + K, O)``: the input dilated by ``stride``, a conv with the flipped kernel."""
    cin, per_group, kernel = weight.shape
    flipped = weight[:, :, ::-1].reshape(groups, cin // groups, per_group, kernel)
    flipped = flipped.transpose(0, 2, 1, 3).reshape(groups * per_group, cin // groups, kernel)
    edge = kernel - 1 - padding
    y = lax.conv_general_dilated(x, flipped.astype(x.dtype), (1,), ((edge, edge),), lhs_dilation=(stride,),
                                 dimension_numbers=_DIMENSIONS, feature_group_count=groups, precision=PRECISION)
    return y if bias is None else y + bias.astype(x.dtype)


def same_padding(kernel: int, dilation: int) -> tuple[int, int]:
    """PyTorch's ``padding="same"``: ``dilation·(kernel − 1)`` zeros, the odd one after."""
    total = dilation * (kernel - 1)
    return total // 2, total - total // 2


def leaky_relu(x: jax.Array, slope: float) -> jax.Array:
    return jnp.where(x >= 0, x, slope * x)


def snake(x: jax.Array, log_alpha: jax.Array, log_beta: jax.Array | None) -> jax.Array:
    """SnakeBeta (log-scale parameters): ``x + sin²(α·x) / (β + eps)``; Snake when ``β`` is ``α``."""
    alpha = jnp.exp(log_alpha.astype(x.dtype))
    amplitude = alpha if log_beta is None else jnp.exp(log_beta.astype(x.dtype))
    return x + (1.0 / (amplitude + SNAKE_EPS)) * jnp.sin(x * alpha) ** 2


def replicate_pad(x: jax.Array, before: int, after: int) -> jax.Array:
    return jnp.pad(x, ((0, 0), (before, after), (0, 0)), mode="edge")


def depthwise_filter(taps: jax.Array, channels: int) -> jax.Array:
    """One ``(1, 1, K)`` filter for each of ``channels``: ``(channels, 1, K)``."""
    return jnp.broadcast_to(taps.reshape(1, 1, -1), (channels, 1, taps.shape[-1]))


class SincCrop(NamedTuple):
    """``UpSample1d``'s edges: the samples replicated on each side before, and cropped from the
    left and right after, its transposed conv."""

    pad: int
    left: int
    right: int


def kaiser_crop(kernel: int, ratio: int) -> SincCrop:
    """The edges of ``UpSample1d(window_type="kaiser")`` (the anti-aliased activations)."""
    pad = kernel // ratio - 1
    return SincCrop(pad, pad * ratio + (kernel - ratio) // 2, pad * ratio + (kernel - ratio + 1) // 2)


def hann_crop(ratio: int) -> SincCrop:
    """The edges of ``UpSample1d(window_type="hann")`` (the BWE resampler)."""
    kernel = 2 * HANN_WIDTH * ratio + 1
    return SincCrop(HANN_WIDTH, 2 * HANN_WIDTH * ratio, kernel - ratio)


def hann_sinc_taps(ratio: int) -> np.ndarray:
    """``UpSample1d(window_type="hann")``'s filter (not in the checkpoint: diffusers makes it), in
    float32 as torch does: a sinc at ``rolloff`` of the rate under a squared-cosine window."""
    kernel = 2 * HANN_WIDTH * ratio + 1
    time = (np.arange(kernel, dtype=np.float32) / np.float32(ratio) - np.float32(HANN_WIDTH)) * np.float32(HANN_ROLLOFF)
    clamped = np.clip(time, -HANN_ZERO_CROSSINGS, HANN_ZERO_CROSSINGS)
    window = np.cos(clamped * np.float32(math.pi / HANN_ZERO_CROSSINGS / 2), dtype=np.float32) ** 2
    return (np.sinc(time).astype(np.float32) * window * np.float32(HANN_ROLLOFF / ratio)).astype(np.float32)


def upsample_sinc(x: jax.Array, taps: jax.Array, ratio: int, crop: SincCrop) -> jax.Array:
    """``UpSample1d``: ``(B, S, C)`` → ``(B, ratio·S, C)``: edge-replicated by ``crop.pad``, a
    depthwise transposed conv with the filter, times ``ratio``, cropped."""
    channels = x.shape[-1]
    y = ratio * conv_transpose1d(replicate_pad(x, crop.pad, crop.pad), depthwise_filter(taps, channels), None,
                                 stride=ratio, padding=0, groups=channels)
    return y[:, crop.left:y.shape[1] - crop.right]


def downsample_sinc(x: jax.Array, taps: jax.Array, ratio: int) -> jax.Array:
    """``DownSample1d``: ``(B, S, C)`` → ``(B, S/ratio, C)``: edge-replicated, low-passed, decimated."""
    kernel, channels = taps.shape[-1], x.shape[-1]
    left, right = kernel // 2 + kernel % 2 - 1, kernel // 2
    return conv1d(replicate_pad(x, left, right), depthwise_filter(taps, channels), None, (0, 0),
                  stride=ratio, groups=channels)


# -- layers ------------------------------------------------------------------------------------------
class Conv1d(nnx.Module):
    """``nn.Conv1d(cin, cout, kernel, dilation)``, 'same' padding; ``weight`` ``(cout, cin, kernel)``."""

    def __init__(self, cin: int, cout: int, kernel: int, *, dilation: int = 1, bias: bool = True, dtype=jnp.float32):
        self.weight = zeros_param((cout, cin, kernel), dtype)
        self.bias = zeros_param((cout,), dtype) if bias else None
        self.dilation = dilation

    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.weight.shape[-1]
        bias = None if self.bias is None else self.bias[...]
        return conv1d(x, self.weight[...], bias, same_padding(kernel, self.dilation), dilation=self.dilation)


class ConvTranspose1d(nnx.Module):
    """The vocoder's upsampler: ``nn.ConvTranspose1d(cin, cout, kernel, stride, (kernel − stride)/2)``."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, *, dtype=jnp.float32):
        self.weight = zeros_param((cin, cout, kernel), dtype)
        self.bias = zeros_param((cout,), dtype)
        self.stride = stride

    def __call__(self, x: jax.Array) -> jax.Array:
        padding = (self.weight.shape[-1] - self.stride) // 2
        return conv_transpose1d(x, self.weight[...], self.bias[...], stride=self.stride, padding=padding)


class SnakeBeta(nnx.Module):
    def __init__(self, channels: int, *, use_beta: bool, dtype=jnp.float32):
        self.alpha = zeros_param((channels,), dtype)
        self.beta = zeros_param((channels,), dtype) if use_beta else None

    def __call__(self, x: jax.Array) -> jax.Array:
        return snake(x, self.alpha[...], None if self.beta is None else self.beta[...])


class SincFilter(nnx.Module):
    """A resampling filter of the checkpoint (``UpSample1d``/``DownSample1d``'s ``filter`` buffer, ``(1, 1, K)``)."""

    def __init__(self, kernel: int, *, dtype=jnp.float32):
        self.filter = zeros_param((1, 1, kernel), dtype)


class AntiAliasSnake(nnx.Module):
    """``AntiAliasAct1d`` of a SnakeBeta: upsample ``ratio``x, activate, downsample back."""

    def __init__(self, channels: int, *, use_beta: bool, ratio: int, kernel: int, dtype=jnp.float32):
        self.upsample = SincFilter(kernel, dtype=dtype)
        self.act = SnakeBeta(channels, use_beta=use_beta, dtype=dtype)
        self.downsample = SincFilter(kernel, dtype=dtype)
        self.ratio = ratio

    def __call__(self, x: jax.Array) -> jax.Array:
        taps = self.upsample.filter[...].astype(x.dtype)
        x = upsample_sinc(x, taps, self.ratio, kaiser_crop(taps.shape[-1], self.ratio))
        return downsample_sinc(self.act(x), self.downsample.filter[...].astype(x.dtype), self.ratio)


class LeakyReLU(nnx.Module):
    def __init__(self, slope: float):
        self.slope = slope

    def __call__(self, x: jax.Array) -> jax.Array:
        return leaky_relu(x, self.slope)


def activation(config: LTX2VocoderConfig, channels: int, *, dtype) -> nnx.Module:
    """A residual block's activation: SnakeBeta (``"snakebeta"``) or Snake (``"snake"``: no β),
    anti-aliased when ``antialias``; else a leaky ReLU of the configured slope."""
    if not config.snake:
        return LeakyReLU(config.leaky_relu_negative_slope)
    use_beta = config.act_fn == "snakebeta"
    if config.antialias:
        return AntiAliasSnake(channels, use_beta=use_beta, ratio=config.antialias_ratio,
                              kernel=config.antialias_kernel_size, dtype=dtype)
    return SnakeBeta(channels, use_beta=use_beta, dtype=dtype)


class ResBlock(nnx.Module):
    """diffusers' vocoder ``ResBlock``: per dilation, ``x + conv2(act2(conv1(act1(x))))``, ``conv1``
    dilated, ``conv2`` not."""

    def __init__(self, config: LTX2VocoderConfig, channels: int, kernel: int, dilations: tuple[int, ...], *, dtype):
        self.convs1 = nnx.List([Conv1d(channels, channels, kernel, dilation=d, dtype=dtype) for d in dilations])
        self.acts1 = nnx.List([activation(config, channels, dtype=dtype) for _ in dilations])
        self.convs2 = nnx.List([Conv1d(channels, channels, kernel, dtype=dtype) for _ in dilations])
        self.acts2 = nnx.List([activation(config, channels, dtype=dtype) for _ in dilations])

    def __call__(self, x: jax.Array) -> jax.Array:
        for act1, conv1, act2, conv2 in zip(self.acts1, self.convs1, self.acts2, self.convs2, strict=True):
            x = x + conv2(act2(conv1(act1(x))))
        return x


class Vocoder(nnx.Module):
    """``LTX2Vocoder``: a log-mel spectrogram ``(B, C, T, M)`` (``C·M = in_channels``) → a waveform
    ``(B, out_channels, T·samples_per_frame)``, diffusers' layouts."""

    def __init__(self, config: LTX2VocoderConfig, *, dtype=jnp.float32):
        self.config = config
        widths = config.widths()
        self.conv_in = Conv1d(config.in_channels, config.hidden_channels, 7, dtype=dtype)
        self.upsamplers = nnx.List([
            ConvTranspose1d(cin, cout, kernel, stride, dtype=dtype) for cin, cout, kernel, stride in
            zip([config.hidden_channels, *widths[:-1]], widths, config.upsample_kernel_sizes, config.upsample_factors,
                strict=True)])
        self.resnets = nnx.List([
            ResBlock(config, width, kernel, dilations, dtype=dtype) for width in widths
            for kernel, dilations in zip(config.resnet_kernel_sizes, config.resnet_dilations, strict=True)])
        self.act_out: nnx.Module = (
            AntiAliasSnake(widths[-1], use_beta=True, ratio=config.antialias_ratio,
                           kernel=config.antialias_kernel_size, dtype=dtype)
            if config.snake else LeakyReLU(DEFAULT_LEAKY_SLOPE))
        self.conv_out = Conv1d(widths[-1], config.out_channels, 7, bias=config.final_bias, dtype=dtype)

    def __call__(self, mel: jax.Array) -> jax.Array:
        batch, channels, frames, bins = mel.shape
        dtype = self.conv_in.weight.dtype
        # Channel ``c·M + m`` of the 1-D signal is bin ``m`` of mel channel ``c`` (diffusers' flatten).
        x = self.conv_in(mel.transpose(0, 2, 1, 3).reshape(batch, frames, channels * bins).astype(dtype))
        per_upsampler = len(self.config.resnet_kernel_sizes)
        for i, upsampler in enumerate(self.upsamplers):
            if not self.config.snake:
                x = leaky_relu(x, self.config.leaky_relu_negative_slope)
            x = upsampler(x)
            blocks = [self.resnets[j] for j in range(i * per_upsampler, (i + 1) * per_upsampler)]
            x = jnp.mean(jnp.stack([block(x) for block in blocks]), axis=0)
        x = self.conv_out(self.act_out(x))
        if self.config.final_act_fn == "tanh":
            x = jnp.tanh(x)
        elif self.config.final_act_fn == "clamp":
            x = jnp.clip(x, -1, 1)
        return x.transpose(0, 2, 1)


# -- the band-width extension ------------------------------------------------------------------------
def causal_log_mel(waveform: jax.Array, forward_basis: jax.Array, mel_basis: jax.Array, *, hop: int,
                   window: int) -> jax.Array:
    """``MelSTFT``: a waveform ``(N, S)`` → its causal log-mel spectrogram ``(N, frames, mels)``:
    ``window − hop`` zeros before it, a strided conv with the checkpoint's windowed DFT basis
    ``(2F, 1, K)`` (real parts, then imaginary), magnitudes, the mel filterbank ``(mels, F)``, a log."""
    x = jnp.pad(waveform, ((0, 0), (max(0, window - hop), 0)))[..., None]
    spectrum = conv1d(x, forward_basis.astype(x.dtype), None, (0, 0), stride=hop)
    real, imag = jnp.split(spectrum, 2, axis=-1)
    magnitude = jnp.sqrt(real * real + imag * imag)
    mel = jnp.einsum("nfk,mk->nfm", magnitude, mel_basis.astype(x.dtype), precision=PRECISION)
    return jnp.log(jnp.maximum(mel, MEL_FLOOR))


class STFTBases(nnx.Module):
    """``CausalSTFT``'s buffers (``(2F, 1, K)`` each; the inverse one is read, not used)."""

    def __init__(self, frequencies: int, filter_length: int, *, dtype=jnp.float32):
        self.forward_basis = zeros_param((2 * frequencies, 1, filter_length), dtype)
        self.inverse_basis = zeros_param((2 * frequencies, 1, filter_length), dtype)


class MelSTFT(nnx.Module):
    def __init__(self, config: LTX2VocoderWithBWEConfig, *, dtype=jnp.float32):
        frequencies = config.filter_length // 2 + 1
        self.stft_fn = STFTBases(frequencies, config.filter_length, dtype=dtype)
        self.mel_basis = zeros_param((config.num_mel_channels, frequencies), dtype)


class VocoderWithBWE(nnx.Module):
    """``LTX2VocoderWithBWE``: the vocoder at ``input_sampling_rate``, then a band-width extension
    to ``output_sampling_rate``: the first waveform's own log-mel spectrogram (zero-padded to whole
    hops) through a second vocoder gives a residual added to the first waveform resampled (a
    Hann-windowed sinc), clipped to [-1, 1]. ``(B, C, T, M)`` → ``(B, out_channels, S·rate ratio)``,
    ``S = T·samples_per_frame`` of the first vocoder."""

    def __init__(self, config: LTX2VocoderWithBWEConfig, *, dtype=jnp.float32):
        self.config = config
        self.vocoder = Vocoder(config.stage_config(), dtype=dtype)
        self.bwe_generator = Vocoder(config.bwe_config(), dtype=dtype)
        self.mel_stft = MelSTFT(config, dtype=dtype)

    def __call__(self, mel: jax.Array) -> jax.Array:
        config = self.config
        x = self.vocoder(mel)
        batch, channels, samples = x.shape
        x = jnp.pad(x, ((0, 0), (0, 0), (0, -samples % config.hop_length)))
        log_mel = causal_log_mel(x.reshape(batch * channels, -1), self.mel_stft.stft_fn.forward_basis[...],
                                 self.mel_stft.mel_basis[...], hop=config.hop_length, window=config.window_length)
        residual = self.bwe_generator(log_mel.reshape(batch, channels, *log_mel.shape[1:]))
        ratio = config.rate_ratio
        taps = jnp.asarray(hann_sinc_taps(ratio), x.dtype)
        skip = upsample_sinc(x.transpose(0, 2, 1), taps, ratio, hann_crop(ratio)).transpose(0, 2, 1)
        return jnp.clip(residual + skip, -1, 1)[..., :samples * ratio]
