"""LTX-2's audio VAE in Flax nnx (diffusers' ``autoencoder_kl_ltx2_audio.py``): the decoder, latents
``(B, C, L, M)`` → a log-mel spectrogram ``(B, channels, T, mel_bins)``, and the encoder, back.

The spectrogram is a 2-D image whose height is time, held channels-last inside, ``(B, T, F, C)``.
Every conv is ``LTX2AudioCausalConv2d``: zeros padded before it along the causal axis (time in the
release: a mel frame never sees a later one), centred along the other. Norms are per pixel (an RMS
over channels, no weight), the optional attention is one head over every (time, bin) position.

Weights keep PyTorch's layouts and names (``OIHW`` kernels, ``decoder.up.1.block.0.conv1.conv.weight``),
so loading a checkpoint is reading it (``models.families.ltx2_audio.weights``); the convs take
``OIHW`` kernels as they are.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from vaeserve.models.conv import upsample_nearest_2x
from vaeserve.models.families.ltx.layers import pixel_norm as ltx_pixel_norm

from .config import PIXEL_NORM_EPS, LTX2AudioVAEConfig

# Exact float32 on accelerators too (no TF32 / bf16 passes): the parity promise is float32.
PRECISION = lax.Precision.HIGHEST
_DIMENSIONS = ("NHWC", "OIHW", "NHWC")


# -- pure functions ----------------------------------------------------------------------------------
def causal_padding(kernel: int, causality_axis: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """``((before, after) along time, (before, after) along bins)`` of a causal conv's zeros:
    all ``kernel − 1`` before the causal axis, centred (the odd one after) on the other; centred
    on both for ``"none"``."""
    total = kernel - 1
    centred = (total // 2, total - total // 2)
    if causality_axis == "height":
        return (total, 0), centred
    if causality_axis in ("width", "width-compatibility"):
        return centred, (total, 0)
    return centred, centred


def conv2d(x: jax.Array, weight: jax.Array, bias: jax.Array,
           padding: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (0, 0)), *, stride: int = 1) -> jax.Array:
    """``nn.Conv2d`` after zero ``padding``: ``(B, T, F, C)`` with an ``(O, C, kh, kw)`` kernel →
    ``(B, T', F', O)``."""
    y = lax.conv_general_dilated(x, weight.astype(x.dtype), (stride, stride), padding,
                                 dimension_numbers=_DIMENSIONS, precision=PRECISION)
    return y + bias.astype(x.dtype)


def downsample_padding(causality_axis: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """``LTX2AudioDownsample``'s zeros before its stride-2 3x3 conv, ``((time), (bins))``: two
    before the causal axis, one after the other (one after both for ``"none"``)."""
    return {"none": ((0, 1), (0, 1)), "width": ((0, 1), (2, 0)), "height": ((2, 0), (0, 1)),
            "width-compatibility": ((0, 1), (1, 0))}[causality_axis]


def drop_first_causal_row(x: jax.Array, causality_axis: str) -> jax.Array:
    """An upsampler's output less its first position along the causal axis (the row that saw only
    the zeros before the clip), so ``T`` time positions become ``2T − 1``, not ``2T``."""
    if causality_axis == "height":
        return x[:, 1:]
    if causality_axis == "width":
        return x[:, :, 1:]
    return x


def fit_spectrogram(x: jax.Array, frames: int, bins: int, channels: int) -> jax.Array:
    """The decoder's output cropped, then zero-padded, to ``(B, frames, bins, channels)``."""
    x = x[:, :frames, :bins, :channels]
    return jnp.pad(x, ((0, 0), (0, frames - x.shape[1]), (0, bins - x.shape[2]), (0, 0)))


def pixel_norm(x: jax.Array) -> jax.Array:
    """LTX's per-pixel RMS norm (over channels, in float32) at this VAE's epsilon."""
    return ltx_pixel_norm(x, PIXEL_NORM_EPS)


def zeros_param(shape: tuple[int, ...], dtype) -> nnx.Param:
    # Values come from a checkpoint (``weights.load_module``); models are built with ``nnx.eval_shape``.
    return nnx.Param(jnp.zeros(shape, dtype))


# -- layers ------------------------------------------------------------------------------------------
class AudioCausalConv2d(nnx.Module):
    """``LTX2AudioCausalConv2d``: a conv (kernel under ``.conv``) after its causal zero padding.
    ``(B, T, F, cin)`` → ``(B, T, F, cout)``."""

    def __init__(self, cin: int, cout: int, kernel: int, causality_axis: str, *, dtype=jnp.float32):
        self.conv = AudioConv2d(cin, cout, kernel, dtype=dtype)
        self.padding = causal_padding(kernel, causality_axis)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.conv(x, self.padding)


class AudioConv2d(nnx.Module):
    """``nn.Conv2d(cin, cout, kernel)`` without padding of its own; ``weight`` ``(cout, cin, k, k)``."""

    def __init__(self, cin: int, cout: int, kernel: int, *, dtype=jnp.float32):
        self.weight = zeros_param((cout, cin, kernel, kernel), dtype)
        self.bias = zeros_param((cout,), dtype)

    def __call__(self, x: jax.Array, padding=((0, 0), (0, 0)), *, stride: int = 1) -> jax.Array:
        return conv2d(x, self.weight[...], self.bias[...], padding, stride=stride)


class AudioResnetBlock(nnx.Module):
    """``LTX2AudioResnetBlock`` with pixel norms: norm, SiLU, causal 3x3, twice, plus the input
    (through a 1x1 ``nin_shortcut`` when the width changes)."""

    def __init__(self, cin: int, cout: int, causality_axis: str, *, dtype=jnp.float32):
        self.conv1 = AudioCausalConv2d(cin, cout, 3, causality_axis, dtype=dtype)
        self.conv2 = AudioCausalConv2d(cout, cout, 3, causality_axis, dtype=dtype)
        self.nin_shortcut = AudioCausalConv2d(cin, cout, 1, causality_axis, dtype=dtype) if cin != cout else None

    def __call__(self, x: jax.Array) -> jax.Array:
        h = self.conv1(jax.nn.silu(pixel_norm(x)))
        h = self.conv2(jax.nn.silu(pixel_norm(h)))
        return (x if self.nin_shortcut is None else self.nin_shortcut(x)) + h


class AudioAttnBlock(nnx.Module):
    """``LTX2AudioAttnBlock``: one head over every (time, bin) position of a clip, 1x1 convs for
    q, k, v and the projection, plus the input. Not causal: it sees the whole clip."""

    def __init__(self, width: int, *, dtype=jnp.float32):
        self.q, self.k, self.v, self.proj_out = (AudioConv2d(width, width, 1, dtype=dtype) for _ in range(4))

    def __call__(self, x: jax.Array) -> jax.Array:
        batch, frames, bins, width = x.shape
        h = pixel_norm(x)
        q, k, v = (layer(h).reshape(batch, frames * bins, width) for layer in (self.q, self.k, self.v))
        scores = jnp.einsum("bqc,bkc->bqk", q, k, precision=PRECISION) * width ** -0.5
        weights = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(x.dtype)
        h = jnp.einsum("bqk,bkc->bqc", weights, v, precision=PRECISION).reshape(x.shape)
        return x + self.proj_out(h)


class AudioUpsample(nnx.Module):
    """``LTX2AudioUpsample`` with its conv: nearest 2x, a causal 3x3, less the first causal row."""

    def __init__(self, width: int, causality_axis: str, *, dtype=jnp.float32):
        self.conv = AudioCausalConv2d(width, width, 3, causality_axis, dtype=dtype)
        self.causality_axis = causality_axis

    def __call__(self, x: jax.Array) -> jax.Array:
        return drop_first_causal_row(self.conv(upsample_nearest_2x(x)), self.causality_axis)


class AudioDownsample(nnx.Module):
    """``LTX2AudioDownsample`` with its conv: a stride-2 3x3 after ``downsample_padding``."""

    def __init__(self, width: int, causality_axis: str, *, dtype=jnp.float32):
        self.conv = AudioConv2d(width, width, 3, dtype=dtype)
        self.padding = downsample_padding(causality_axis)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.conv(x, self.padding, stride=2)


class AudioMidBlock(nnx.Module):
    def __init__(self, width: int, causality_axis: str, *, attention: bool, dtype=jnp.float32):
        self.block_1 = AudioResnetBlock(width, width, causality_axis, dtype=dtype)
        self.attn_1 = AudioAttnBlock(width, dtype=dtype) if attention else None
        self.block_2 = AudioResnetBlock(width, width, causality_axis, dtype=dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.block_1(x)
        return self.block_2(x if self.attn_1 is None else self.attn_1(x))


def resnets_and_attention(blocks: nnx.List, attention: nnx.List, x: jax.Array) -> jax.Array:
    """A level's resnets, each followed by its attention block where the level has them."""
    for i, block in enumerate(blocks):
        x = block(x)
        x = attention[i](x) if len(attention) else x
    return x


class AudioUpStage(nnx.Module):
    """One decoder level: resnets (each followed by attention where the level attends), then the
    upsampler (every level but the outermost, level 0)."""

    def __init__(self, config: LTX2AudioVAEConfig, level: int, cin: int, *, dtype=jnp.float32):
        width, axis = config.level_width(level), config.causality_axis
        widths = [cin] + [width] * config.num_res_blocks
        self.block = nnx.List([AudioResnetBlock(w, width, axis, dtype=dtype) for w in widths])
        self.attn = nnx.List([AudioAttnBlock(width, dtype=dtype) for _ in widths] if config.level_attends(level) else [])
        self.upsample = AudioUpsample(width, axis, dtype=dtype) if level else None

    def __call__(self, x: jax.Array) -> jax.Array:
        x = resnets_and_attention(self.block, self.attn, x)
        return x if self.upsample is None else self.upsample(x)


class AudioDecoder(nnx.Module):
    """``LTX2AudioDecoder``: latents ``(B, latent_channels, L, M)`` → a log-mel spectrogram
    ``(B, output_channels, config.mel_frames(L), mel_bins)`` (diffusers' layouts; ``mel_bins``
    None: cropped to ``M`` bins, as diffusers does). Parameters under diffusers' names below
    ``decoder.``."""

    def __init__(self, config: LTX2AudioVAEConfig, *, dtype=jnp.float32):
        self.config = config
        axis, widest = config.causality_axis, config.decoder_width
        self.conv_in = AudioCausalConv2d(config.latent_channels, widest, 3, axis, dtype=dtype)
        self.mid = AudioMidBlock(widest, axis, attention=config.mid_block_add_attention, dtype=dtype)
        stages: dict[int, AudioUpStage] = {}
        cin = widest
        for level in reversed(range(config.levels)):
            stages[level] = AudioUpStage(config, level, cin, dtype=dtype)
            cin = config.level_width(level)
        self.up = nnx.List([stages[level] for level in range(config.levels)])
        self.conv_out = AudioCausalConv2d(cin, config.output_channels, 3, axis, dtype=dtype)

    def __call__(self, latents: jax.Array) -> jax.Array:
        _, _, frames, bins = latents.shape
        dtype = self.conv_in.conv.weight.dtype
        x = self.mid(self.conv_in(latents.transpose(0, 2, 3, 1).astype(dtype)))
        for level in reversed(range(self.config.levels)):
            x = self.up[level](x)
        x = self.conv_out(jax.nn.silu(pixel_norm(x)))
        target_bins = self.config.mel_bins if self.config.mel_bins is not None else bins
        x = fit_spectrogram(x, self.config.mel_frames(frames), target_bins, self.config.output_channels)
        return x.transpose(0, 3, 1, 2)


class AudioDownStage(nnx.Module):
    """One encoder level: resnets (each followed by attention where the level attends), then the
    downsampler (every level but the innermost)."""

    def __init__(self, config: LTX2AudioVAEConfig, level: int, cin: int, *, dtype=jnp.float32):
        width, axis = config.level_width(level), config.causality_axis
        widths = [cin] + [width] * (config.num_res_blocks - 1)
        self.block = nnx.List([AudioResnetBlock(w, width, axis, dtype=dtype) for w in widths])
        self.attn = nnx.List([AudioAttnBlock(width, dtype=dtype) for _ in widths] if config.level_attends(level) else [])
        self.downsample = AudioDownsample(width, axis, dtype=dtype) if level != config.levels - 1 else None

    def __call__(self, x: jax.Array) -> jax.Array:
        x = resnets_and_attention(self.block, self.attn, x)
        return x if self.downsample is None else self.downsample(x)


class AudioEncoder(nnx.Module):
    """``LTX2AudioEncoder`` and ``latent_dist.mode()``: a log-mel spectrogram ``(B, in_channels,
    T, mel_bins)`` → the posterior's mean ``(B, latent_channels, L, M)`` (the first half of
    ``conv_out``'s channels; the other is the log-variance), in the layout and scale a pipeline's
    ``audio_latents`` argument takes. Each level but the innermost halves time and bins (rounding
    up), so the release's three levels take ``T = 4L − 3`` mel frames to ``L`` latent frames: the
    decoder's count, inverted. Parameters under diffusers' names below ``encoder.``."""

    def __init__(self, config: LTX2AudioVAEConfig, *, dtype=jnp.float32):
        self.config = config
        axis = config.causality_axis
        self.conv_in = AudioCausalConv2d(config.in_channels, config.base_channels, 3, axis, dtype=dtype)
        stages, cin = [], config.base_channels
        for level in range(config.levels):
            stages.append(AudioDownStage(config, level, cin, dtype=dtype))
            cin = config.level_width(level)
        self.down = nnx.List(stages)
        self.mid = AudioMidBlock(cin, axis, attention=config.mid_block_add_attention, dtype=dtype)
        out = 2 * config.latent_channels if config.double_z else config.latent_channels
        self.conv_out = AudioCausalConv2d(cin, out, 3, axis, dtype=dtype)

    def __call__(self, mel: jax.Array) -> jax.Array:
        x = self.conv_in(mel.transpose(0, 2, 3, 1).astype(self.conv_in.conv.weight.dtype))
        for stage in self.down:
            x = stage(x)
        x = self.conv_out(jax.nn.silu(pixel_norm(self.mid(x))))
        # diffusers halves the channels (``DiagonalGaussianDistribution``): the mean comes first.
        return x[..., :x.shape[-1] // 2].transpose(0, 3, 1, 2)
