"""The sound of a MiniMax-H3 pipeline, as diffusers' modular ``minimax_h3`` blocks decode and encode
it. The VAE is mono, so the soundtrack's channels (two: stereo) are the batch of its latents:
  * decode (``MiniMaxH3AudioDecodeStep``): normalised latents ``(channels, latent_channels, L)`` →
    ``z · std + mean`` per latent channel → the decoder → ``(channels, 1, S)`` → the waveform
    ``(1, channels, S)``, ``S = L · hop_length`` samples at ``sampling_rate``;
  * encode (a reference soundtrack, ``encoders.py``): a waveform ``(channels, S)`` → each channel's
    posterior mean → ``(mean − latents_mean) / latents_std``: ``(channels, latent_channels, L)``,
    ``L = ceil(S / hop_length)``, the layout decode takes (the pipeline then packs it into rows
    ``(channels·L, latent_channels)`` for its transformer).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .config import MiniMaxH3AudioConfig
from .modules import H3AudioDecoder, H3AudioEncoder
from .weights import load_h3_audio_decoder, load_h3_audio_encoder


class H3AudioStatistics(NamedTuple):
    """The config's ``latents_mean`` / ``latents_std``, float32, one per latent channel (a config
    without them: mean 0, std 1)."""

    mean: np.ndarray
    std: np.ndarray


def h3_audio_statistics(config: MiniMaxH3AudioConfig) -> H3AudioStatistics:
    mean = config.latents_mean if config.latents_mean is not None else (0.0,) * config.latent_channels
    std = config.latents_std if config.latents_std is not None else (1.0,) * config.latent_channels
    return H3AudioStatistics(np.asarray(mean, np.float32), np.asarray(std, np.float32))


class H3AudioDecodePath(NamedTuple):
    decoder: H3AudioDecoder
    statistics: H3AudioStatistics


class H3AudioEncodePath(NamedTuple):
    encoder: H3AudioEncoder
    statistics: H3AudioStatistics


def denormalize_h3_audio_latents(latents: jax.Array, statistics: H3AudioStatistics) -> jax.Array:
    """``z · std + mean`` per latent channel of ``(B, latent_channels, L)``, in float32."""
    mean, std = (jnp.asarray(s).reshape(1, -1, 1) for s in statistics)
    return latents.astype(jnp.float32) * std + mean


def normalize_h3_audio_latents(latents: jax.Array, statistics: H3AudioStatistics) -> jax.Array:
    """``(z − mean) / std`` per latent channel of ``(B, latent_channels, L)``: the inverse."""
    mean, std = (jnp.asarray(s).reshape(1, -1, 1) for s in statistics)
    return (latents.astype(jnp.float32) - mean) / std


def decode_audio(path: H3AudioDecodePath, latents: jax.Array) -> jax.Array:
    """A pipeline's normalised audio latents ``(channels, latent_channels, L)`` → its waveform
    ``(1, channels, L·hop_length)`` in [-1, 1], float32, at the config's ``sampling_rate``. Pure:
    jit it with ``path`` as an argument."""
    if latents.ndim != 3:
        raise ValueError(f"audio latents of shape {tuple(latents.shape)}; expected (channels, latent_channels, L)")
    waveform = path.decoder(denormalize_h3_audio_latents(latents, path.statistics))
    return waveform.transpose(1, 0, 2)


def encode_audio(path: H3AudioEncodePath, waveform: jax.Array) -> jax.Array:
    """A soundtrack ``(channels, S)`` at the config's ``sampling_rate`` → its normalised latents
    ``(channels, latent_channels, ceil(S/hop_length))``, the layout ``decode_audio`` takes. Pure."""
    if waveform.ndim != 2:
        raise ValueError(f"waveform of shape {tuple(waveform.shape)}; expected (channels, samples)")
    return normalize_h3_audio_latents(path.encoder(waveform[:, None]), path.statistics)


def load_h3_audio_decode_path(folder: str | Path, *, dtype: str = "float32") -> H3AudioDecodePath:
    """The decode path of an audio VAE folder or a pipeline folder (its ``audio_vae/``)."""
    decoder = load_h3_audio_decoder(folder, dtype=dtype)
    return H3AudioDecodePath(decoder, h3_audio_statistics(decoder.config))


def load_h3_audio_encode_path(folder: str | Path, *, dtype: str = "float32") -> H3AudioEncodePath:
    """The encode path of an audio VAE folder or a pipeline folder (its ``audio_vae/``)."""
    encoder = load_h3_audio_encoder(folder, dtype=dtype)
    return H3AudioEncodePath(encoder, h3_audio_statistics(encoder.config))
