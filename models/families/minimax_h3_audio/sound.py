"""MiniMax-H3's sound as the service serves it (``models.sound``): a pipeline folder's audio VAE
(``audio_vae/``), or the release's architecture with seeded random weights, behind the generic
interface — ``info`` (sizes and rates), ``state`` (the decoder's weights) and the pure
``apply(state, latents)``: normalised latents ``(B, channels, latent_channels, L)`` (each row what
the pipeline's decode step takes: the stereo pair of mono latents) → a waveform
``(B, channels, L·hop_length)`` float32; and the encoder's ``encoder_state`` and pure
``encode(encoder_state, waveform)``: ``(B, channels, S)`` at ``sample_rate`` → the latents
``(B, channels, latent_channels, ceil(S/hop_length))``, normalised as the pipeline's reference
soundtracks are (``pipeline.encode_audio``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from vaeserve.models.families.ltx2_audio.weights import load_module
from vaeserve.models.sound import SoundInfo
from vaeserve.models.vae import resolve_dtype

from .config import MiniMaxH3AudioConfig
from .modules import H3AudioDecoder, H3AudioEncoder
from .pipeline import H3AudioStatistics, denormalize_h3_audio_latents, h3_audio_statistics, normalize_h3_audio_latents
from .weights import DECODER_PREFIXES, ENCODER_PREFIXES, read_audio_vae, seeded_h3_audio, tensors_under

# MiniMax-H3's soundtrack is stereo (diffusers' ``MINIMAX_H3_AUDIO_CHANNELS``): two mono latent rows.
H3_AUDIO_CHANNELS = 2


def sound_info(config: MiniMaxH3AudioConfig) -> SoundInfo:
    """``hop_length`` samples per latent frame, none lost: the decoder upsamples by exactly it."""
    return SoundInfo(title="MiniMax-H3 audio VAE", sample_rate=config.sampling_rate, channels=H3_AUDIO_CHANNELS,
                     layout=(H3_AUDIO_CHANNELS, config.latent_channels, None),
                     samples_per_latent_frame=config.hop_length, channel_axis=1, encodes=True)


class H3Sound:
    """The audio VAE's decoder and encoder behind ``models.sound``'s interface."""

    def __init__(self, decoder: H3AudioDecoder, encoder: H3AudioEncoder, statistics: H3AudioStatistics, *,
                 source: str):
        self.info = sound_info(decoder.config)
        self.source = source
        self._statistics = statistics
        self._decoder_graph, self.state = nnx.split(decoder)
        self._encoder_graph, self.encoder_state = nnx.split(encoder)

    def apply(self, state: Any, latents: jax.Array) -> jax.Array:
        """Latents ``(B, channels, C, L)`` → waveform ``(B, channels, L·hop)`` float32. Pure: jit it."""
        batch, channels, width, frames = latents.shape
        decoder = nnx.merge(self._decoder_graph, state)
        rows = denormalize_h3_audio_latents(latents.reshape(batch * channels, width, frames), self._statistics)
        return decoder(rows).reshape(batch, channels, -1).astype(jnp.float32)

    def encode(self, encoder_state: Any, waveform: jax.Array) -> jax.Array:
        """Waveform ``(B, channels, S)`` → normalised latents ``(B, channels, C, ceil(S/hop))``. Pure."""
        batch, channels, samples = waveform.shape
        encoder = nnx.merge(self._encoder_graph, encoder_state)
        means = encoder(waveform.reshape(batch * channels, 1, samples).astype(jnp.float32))
        latents = normalize_h3_audio_latents(means, self._statistics)
        return latents.reshape(batch, channels, *latents.shape[1:])


def load_sound(folder: str | Path, *, dtype: str = "float32") -> H3Sound:
    """The sound of a pipeline folder's ``audio_vae/`` (or of the audio VAE folder alone), read once."""
    config, tensors, source = read_audio_vae(folder)
    target = resolve_dtype(dtype)
    decoder = load_module(lambda: H3AudioDecoder(config, dtype=target), tensors_under(tensors, DECODER_PREFIXES),
                          source=str(source))
    encoder = load_module(lambda: H3AudioEncoder(config, dtype=target), tensors_under(tensors, ENCODER_PREFIXES),
                          source=str(source))
    return H3Sound(decoder, encoder, h3_audio_statistics(config), source=str(folder))


def random_sound(*, seed: int, dtype: str = "float32", config: MiniMaxH3AudioConfig | None = None) -> H3Sound:
    """The release's architecture (or ``config``) with seeded random weights and the config's latent
    statistics (the release's default: mean 0, std 1): it decodes noise-like sound."""
    config = config or MiniMaxH3AudioConfig()
    decoder, encoder = seeded_h3_audio(config, seed=seed, dtype=dtype)
    return H3Sound(decoder, encoder, h3_audio_statistics(config), source=f"random weights (seed {seed})")
