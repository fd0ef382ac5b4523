"""MiniMax-H3's sound: the audio VAE (``AutoencoderKLMiniMaxH3Audio``), read from (and written to)
the diffusers ``config.json`` of a pipeline's ``audio_vae/`` folder. No JAX here.

The VAE is mono and works on the waveform itself (no mel spectrogram, no vocoder): the encoder
strides by ``prod(encoder_rates)`` samples per latent frame (800 = 40 latents a second at 32 kHz in
the release) and the decoder upsamples by ``prod(decoder_rates)``, the same number. MiniMax-H3's
soundtrack is stereo: its two channels are two batch items of the VAE.

Unlike the video VAEs, the latents' per-channel ``latents_mean`` / ``latents_std`` are keys of the
``config.json`` (diffusers' pipeline reads ``audio_vae.config.latents_mean``), not tensors.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

from vaeserve.models.config import ConfigError, config_fields_from_dict, config_to_dict

# The anti-aliased SnakeBeta's resampling (diffusers' ``MiniMaxH3AudioActivation1d`` defaults, fixed
# in the checkpoint's filter buffers): upsample 2x, act, low-pass and decimate with 12-tap filters.
ANTIALIAS_RATIO = 2
ANTIALIAS_KERNEL = 12
# ``pre_block``'s GeGLU MLP is this many times the latent width (diffusers' ``mlp_ratio``).
MLP_RATIO = 2


def _tuples(config: Any, names: tuple[str, ...]) -> None:
    """Lists from a ``config.json`` as tuples (a frozen dataclass stays hashable), nested ones too."""
    for name in names:
        value = getattr(config, name)
        if isinstance(value, list | tuple):
            object.__setattr__(config, name, tuple(tuple(v) if isinstance(v, list | tuple) else v for v in value))


@dataclasses.dataclass(frozen=True)
class MiniMaxH3AudioConfig:
    """Every ``AutoencoderKLMiniMaxH3Audio`` config key, with diffusers' defaults (the release's
    architecture: a DAC encoder 64 → 2048 wide striding 2·4·4·5·5, an attention projection to 32
    latent channels, a BigVGAN decoder 1024 wide upsampling 5·5·2·2·2·2·2, mono at 32 kHz)."""

    family: ClassVar[str] = "minimax-h3-audio"
    class_name: ClassVar[str] = "AutoencoderKLMiniMaxH3Audio"

    encoder_dim: int = 64
    encoder_rates: tuple[int, ...] = (2, 4, 4, 5, 5)
    latent_dim: int = 2048
    latent_channels: int = 32
    num_attention_heads: int = 8
    decoder_dim: int = 1024
    decoder_rates: tuple[int, ...] = (5, 5, 2, 2, 2, 2, 2)
    decoder_kernel_sizes: tuple[int, ...] = (9, 9, 4, 4, 4, 4, 4)
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    sampling_rate: int = 32000
    latents_mean: tuple[float, ...] | None = None
    latents_std: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        _tuples(self, ("encoder_rates", "decoder_rates", "decoder_kernel_sizes", "resblock_kernel_sizes",
                       "resblock_dilation_sizes", "latents_mean", "latents_std"))
        problems = self.problems()
        if problems:
            raise ConfigError(f"{self.class_name}: " + "; ".join(problems))

    def problems(self) -> list[str]:
        """What a config must hold for these layers (diffusers raises on the first two too)."""
        problems = []
        if math.prod(self.decoder_rates) != self.hop_length:
            problems.append(f"decoder_rates={list(self.decoder_rates)} upsample by {math.prod(self.decoder_rates)}; "
                            f"expected the encoder's hop length {self.hop_length}")
        if self.latent_dim % self.latent_channels:
            problems.append(f"latent_dim={self.latent_dim}; expected a multiple of latent_channels={self.latent_channels}")
        if self.latent_dim % self.num_attention_heads:
            problems.append(f"latent_dim={self.latent_dim}; expected a multiple of "
                            f"num_attention_heads={self.num_attention_heads}")
        if len(self.decoder_kernel_sizes) != len(self.decoder_rates):
            problems.append(f"decoder_kernel_sizes={list(self.decoder_kernel_sizes)}; expected one per decoder rate")
        if len(self.resblock_kernel_sizes) != len(self.resblock_dilation_sizes):
            problems.append(f"resblock_kernel_sizes={list(self.resblock_kernel_sizes)}; expected one per "
                            f"resblock_dilation_sizes entry ({len(self.resblock_dilation_sizes)})")
        if self.decoder_dim % 2 ** len(self.decoder_rates):
            problems.append(f"decoder_dim={self.decoder_dim}; expected a multiple of {2 ** len(self.decoder_rates)} "
                            "(each upsampler halves it)")
        for name in ("latents_mean", "latents_std"):
            values = getattr(self, name)
            if values is not None and len(values) != self.latent_channels:
                problems.append(f"{name} has {len(values)} values; expected latent_channels={self.latent_channels}")
        return problems

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> MiniMaxH3AudioConfig:
        return config_fields_from_dict(cls, raw)

    def to_dict(self) -> dict[str, Any]:
        return config_to_dict(self)

    # -- derived -------------------------------------------------------------------------------
    @property
    def hop_length(self) -> int:
        """Waveform samples per latent frame (the encoder's strides multiplied)."""
        return math.prod(self.encoder_rates)

    @property
    def head_dim(self) -> int:
        return self.latent_dim // self.num_attention_heads

    def encoder_widths(self) -> list[int]:
        """The width of the encoder's first conv, then each block's (doubled per stride)."""
        return [self.encoder_dim * 2 ** i for i in range(len(self.encoder_rates) + 1)]

    def decoder_widths(self) -> list[int]:
        """Each upsampler's output width: ``decoder_dim`` halved per upsampler."""
        return [self.decoder_dim // 2 ** (i + 1) for i in range(len(self.decoder_rates))]

    def latent_frames(self, samples: int) -> int:
        """Latent frames of a waveform of ``samples`` (right-padded to whole hops, as diffusers does)."""
        return -(-samples // self.hop_length)
