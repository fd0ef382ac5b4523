"""The sound of an LTX-2 pipeline, as ``LTX2Pipeline`` decodes it (``pipeline_ltx2.py``): audio
latents → denormalised, unpacked latents → the audio VAE's decoder → a log-mel spectrogram → the
vocoder → a waveform.

Two latent layouts come out of a pipeline, and ``decode_audio`` takes both, by their rank (as the
pipeline's own ``audio_latents`` argument does):
  * packed ``(B, L, C·M)``, normalised: the denoising loop's latents; they are denormalised with
    the audio VAE's ``latents_mean`` / ``latents_std`` (over the ``C·M`` features), then unpacked;
  * unpacked ``(B, C, L, M)``, already denormalised: what ``output_type="latent"`` returns.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp

from .modules import AudioDecoder
from .vocoder import Vocoder, VocoderWithBWE
from .weights import AudioStatistics, load_audio_decoder, load_vocoder


class AudioDecodePath(NamedTuple):
    """What decoding a pipeline's sound takes: the audio VAE's decoder, its latents' statistics,
    the vocoder (LTX-2.0's, or LTX-2.3's with its band-width extension)."""

    decoder: AudioDecoder
    statistics: AudioStatistics
    vocoder: Vocoder | VocoderWithBWE


def denormalize_audio_latents(packed: jax.Array, statistics: AudioStatistics) -> jax.Array:
    """``z · std + mean`` over the last axis of packed latents ``(B, L, C·M)``, in their dtype."""
    mean, std = (jnp.asarray(s, packed.dtype) for s in statistics)
    return packed * std + mean


def unpack_audio_latents(packed: jax.Array, latent_mel_bins: int) -> jax.Array:
    """``(B, L, C·M)`` → ``(B, C, L, M)`` (feature ``c·M + m`` is bin ``m`` of channel ``c``)."""
    batch, frames, features = packed.shape
    return packed.reshape(batch, frames, features // latent_mel_bins, latent_mel_bins).transpose(0, 2, 1, 3)


def spectrogram_latents(latents: jax.Array, statistics: AudioStatistics, latent_mel_bins: int) -> jax.Array:
    """The audio VAE's input ``(B, C, L, M)`` from either layout a pipeline gives (see the module)."""
    if latents.ndim == 4:
        return latents
    if latents.ndim != 3:
        raise ValueError(f"audio latents of shape {tuple(latents.shape)}; expected (B, L, C·M) packed or (B, C, L, M)")
    return unpack_audio_latents(denormalize_audio_latents(latents, statistics), latent_mel_bins)


def decode_audio(path: AudioDecodePath, latents: jax.Array) -> jax.Array:
    """A pipeline's audio latents (either layout) → its waveform ``(B, out_channels, samples)`` at
    the vocoder's ``output_sampling_rate``. Pure: jit it with ``path`` as an argument."""
    unpacked = spectrogram_latents(latents, path.statistics, path.decoder.config.latent_mel_bins())
    return path.vocoder(path.decoder(unpacked))


def load_audio_decode_path(folder: str | Path, *, dtype: str = "float32") -> AudioDecodePath:
    """The decode path of a pipeline folder (``audio_vae/`` and ``vocoder/``)."""
    decoder, statistics = load_audio_decoder(folder, dtype=dtype)
    return AudioDecodePath(decoder, statistics, load_vocoder(folder, dtype=dtype))
