"""LTX-2's sound as the service serves it (``models.sound``): a pipeline folder's audio VAE decoder
and vocoder, or the release's architecture with seeded random weights, behind the generic decoder
interface — ``info`` (sizes and rates), ``state`` (the weights, a pytree) and the pure
``apply(state, latents)``: unpacked, denormalised latents ``(B, C, L, M)`` (what ``LTX2Pipeline``
returns with ``output_type="latent"``) → a waveform ``(B, channels, samples)`` float32.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vaeserve.models.sound import SoundInfo
from vaeserve.models.vae import resolve_dtype

from .config import LATENT_DOWNSAMPLE_FACTOR, LTX2AudioVAEConfig, LTX2VocoderConfig, LTX2VocoderWithBWEConfig
from .modules import AudioDecoder
from .pipeline import AudioDecodePath, load_audio_decode_path
from .vocoder import Vocoder
from .weights import AudioStatistics, Built

# A random model's bias scale, as the video VAEs' (``models.vae.seeded_module``).
RANDOM_BIAS_SCALE = 0.02


def sound_info(path: AudioDecodePath) -> SoundInfo:
    """The sizes and rates of a decode path: each latent frame is 4 mel frames (the first only 1),
    each mel frame ``prod(upsample_factors)`` samples (times the band-width extension's ratio)."""
    vae, vocoder = path.decoder.config, path.vocoder.config
    if isinstance(vocoder, LTX2VocoderWithBWEConfig):
        per_mel_frame = vocoder.stage_config().samples_per_frame * vocoder.rate_ratio
        title = "LTX-2.3 audio VAE + vocoder with band-width extension"
    else:
        per_mel_frame = vocoder.samples_per_frame
        title = "LTX-2 audio VAE + vocoder"
    return SoundInfo(title=title, sample_rate=vocoder.output_sampling_rate, channels=vocoder.out_channels,
                     layout=(vae.latent_channels, None, vae.latent_mel_bins()),
                     samples_per_latent_frame=LATENT_DOWNSAMPLE_FACTOR * per_mel_frame,
                     lost_samples=(LATENT_DOWNSAMPLE_FACTOR - 1) * per_mel_frame)


class LTX2Sound:
    """A decode path behind ``models.sound``'s decoder interface."""

    def __init__(self, path: AudioDecodePath, *, source: str):
        self.info = sound_info(path)
        self.source = source
        self._graphdef, self.state = nnx.split((path.decoder, path.vocoder))

    def apply(self, state: Any, latents: jax.Array) -> jax.Array:
        """Latents ``(B, C, L, M)`` → waveform ``(B, channels, samples)`` float32. Pure: jit it."""
        decoder, vocoder = nnx.merge(self._graphdef, state)
        waveform = vocoder(decoder(latents))
        return waveform.astype(jnp.float32)


def load_sound(folder: str | Path, *, dtype: str = "float32") -> LTX2Sound:
    """The sound of a pipeline folder (``audio_vae/`` and ``vocoder/``)."""
    return LTX2Sound(load_audio_decode_path(folder, dtype=dtype), source=str(folder))


def seeded_weights(build: Callable[[], Built], rng: np.random.Generator) -> Built:
    """``build()`` with random weights drawn on the host: kernels N(0, 1/fan-in) (fan-in: every
    axis but the first), biases N(0, 0.02²), Snake amplitudes 1 (their log 0), resampling
    filters a moving average. Drawn with NumPy (one ``jax.random`` program per shape would compile
    for seconds)."""
    graphdef, state = nnx.split(nnx.eval_shape(build))
    leaves = []
    for path, var in nnx.to_flat_state(state):
        name, shape = str(path[-1]), var.shape
        if name in ("alpha", "beta"):
            value = np.zeros(shape, np.float32)
        elif name == "filter":
            value = np.full(shape, 1 / shape[-1], np.float32)
        elif name.endswith("bias"):
            value = RANDOM_BIAS_SCALE * rng.standard_normal(shape, np.float32)
        else:
            value = rng.standard_normal(shape, np.float32) / np.float32(np.sqrt(np.prod(shape[1:])))
        leaves.append((path, var.replace(jnp.asarray(value, var.dtype))))
    return nnx.merge(graphdef, nnx.from_flat_state(leaves))


def random_sound(*, seed: int, dtype: str = "float32", vae: LTX2AudioVAEConfig | None = None,
                 vocoder: LTX2VocoderConfig | None = None) -> LTX2Sound:
    """LTX-2's release architecture (or the configs given) with seeded random weights and unit
    latent statistics: it decodes noise-like sound, for tests and demos."""
    vae, vocoder = vae or LTX2AudioVAEConfig(), vocoder or LTX2VocoderConfig()
    target, rng = resolve_dtype(dtype), np.random.default_rng(seed)
    decoder = seeded_weights(lambda: AudioDecoder(vae, dtype=target), rng)
    voice = seeded_weights(lambda: Vocoder(vocoder, dtype=target), rng)
    features = vae.latent_channels * vae.latent_mel_bins()
    statistics = AudioStatistics(np.zeros(features, np.float32), np.ones(features, np.float32))
    return LTX2Sound(AudioDecodePath(decoder, statistics, voice), source=f"random weights (seed {seed})")

