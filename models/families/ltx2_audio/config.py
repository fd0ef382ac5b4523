"""LTX-2's sound: the audio VAE (``AutoencoderKLLTX2Audio``) and its vocoder (``LTX2Vocoder``), read
from (and written to) the diffusers ``config.json`` of a pipeline's ``audio_vae/`` and ``vocoder/``
folders. No JAX here.

The audio VAE works on a log-mel spectrogram ``(B, channels, time, mel_bins)`` as a 2-D image whose
height is time: its convs are causal along time (``causality_axis="height"``), each latent frame
is ``LATENT_DOWNSAMPLE_FACTOR`` mel frames and each latent mel bin as many mel bins. The vocoder
turns the spectrogram into a waveform at ``output_sampling_rate`` (``mel_hop_length`` samples at
``sample_rate`` per mel frame in, ``prod(upsample_factors)`` samples per mel frame out).

The audio VAE keeps ``latents_mean`` / ``latents_std`` as buffers beside its weights (diffusers'
``register_buffer``), not in its ``config.json``. Pipelines normalise the *packed* latents
``(B, L, C·M)`` with them (``models.families.ltx2_audio.pipeline``), so they have ``C·M`` values,
which diffusers sizes as ``base_channels`` (128 = 8 channels x 16 latent mel bins in the release).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

from vaeserve.models.config import ConfigError, config_fields_from_dict, config_to_dict

# diffusers' ``LATENT_DOWNSAMPLE_FACTOR``: mel frames (and mel bins) per latent frame (and bin).
LATENT_DOWNSAMPLE_FACTOR = 4
# The per-pixel RMS norm's epsilon (``LTX2AudioPixelNorm(dim=1, eps=1e-6)`` in every block).
PIXEL_NORM_EPS = 1e-6
CAUSALITY_AXES = ("none", "width", "height", "width-compatibility")
VOCODER_ACTIVATIONS = ("snakebeta", "snake", "leaky_relu")


def _tuples(config: Any, names: tuple[str, ...]) -> None:
    """Lists from a ``config.json`` as tuples (a frozen dataclass stays hashable), nested ones too."""
    for name in names:
        value = getattr(config, name)
        if isinstance(value, list | tuple):
            object.__setattr__(config, name, tuple(tuple(v) if isinstance(v, list | tuple) else v for v in value))


@dataclasses.dataclass(frozen=True)
class LTX2AudioVAEConfig:
    """Every ``AutoencoderKLLTX2Audio`` config key, with diffusers' defaults (the LTX-2 release's
    architecture: widths 128·(1, 2, 4), 8 latent channels, 64 mel bins, stereo, pixel norms, causal
    along time). ``resolution`` and ``dropout`` change nothing at inference; ``attn_resolutions`` puts
    an attention block after each resnet of a level whose nominal size (``resolution`` halved per
    level) is listed."""

    family: ClassVar[str] = "ltx2-audio"
    class_name: ClassVar[str] = "AutoencoderKLLTX2Audio"

    base_channels: int = 128
    output_channels: int = 2
    ch_mult: tuple[int, ...] = (1, 2, 4)
    num_res_blocks: int = 2
    attn_resolutions: tuple[int, ...] | None = None
    in_channels: int = 2
    resolution: int = 256
    latent_channels: int = 8
    norm_type: str = "pixel"
    causality_axis: str = "height"
    dropout: float = 0.0
    mid_block_add_attention: bool = False
    sample_rate: int = 16000
    mel_hop_length: int = 160
    is_causal: bool = True
    mel_bins: int | None = 64
    double_z: bool = True

    def __post_init__(self) -> None:
        _tuples(self, ("ch_mult", "attn_resolutions"))
        problems = self.problems()
        if problems:
            raise ConfigError(f"{self.class_name}: " + "; ".join(problems))

    def problems(self) -> list[str]:
        """What a config must hold for these layers (diffusers raises on the first two too)."""
        problems = []
        if self.causality_axis not in CAUSALITY_AXES:
            problems.append(f"causality_axis={self.causality_axis!r}; expected one of {list(CAUSALITY_AXES)}")
        if self.norm_type != "pixel":
            # GroupNorm with a causal axis is refused by diffusers; a non-causal GroupNorm VAE is no release.
            problems.append(f"norm_type={self.norm_type!r}; expected 'pixel'")
        if not self.ch_mult or min(self.ch_mult) < 1:
            problems.append(f"ch_mult={list(self.ch_mult)}; expected positive multipliers")
        return problems

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> LTX2AudioVAEConfig:
        return config_fields_from_dict(cls, raw)

    def to_dict(self) -> dict[str, Any]:
        out = config_to_dict(self)
        out["ch_mult"] = list(self.ch_mult)
        return out

    # -- derived -------------------------------------------------------------------------------
    @property
    def levels(self) -> int:
        return len(self.ch_mult)

    @property
    def decoder_width(self) -> int:
        """The widest (innermost) width: the decoder's ``conv_in`` and mid block."""
        return self.base_channels * self.ch_mult[-1]

    def level_width(self, level: int) -> int:
        return self.base_channels * self.ch_mult[level]

    def level_attends(self, level: int) -> bool:
        """Whether a level's resnets are each followed by an attention block."""
        return bool(self.attn_resolutions) and self.resolution // 2 ** level in (self.attn_resolutions or ())

    def mel_frames(self, latent_frames: int) -> int:
        """The mel frames a decode gives for ``latent_frames``: ``4·L − 3`` (diffusers crops so for
        every ``causality_axis``, ``"none"`` too: its test is ``is not None``)."""
        return max(latent_frames * LATENT_DOWNSAMPLE_FACTOR - (LATENT_DOWNSAMPLE_FACTOR - 1), 1)

    def latent_mel_bins(self) -> int:
        return (self.mel_bins or 0) // LATENT_DOWNSAMPLE_FACTOR


@dataclasses.dataclass(frozen=True)
class LTX2VocoderConfig:
    """Every ``LTX2Vocoder`` config key, with diffusers' defaults (LTX-2's release: mel frames of
    128 = 2 channels x 64 bins in, stereo at 24 kHz out, 240 samples per mel frame).

    ``conv_in`` (kernel 7) to ``hidden_channels``, then per upsampler a transposed conv (halving the
    width) followed by the mean of ``len(resnet_kernel_sizes)`` residual blocks, then ``conv_out``
    (kernel 7). Activations: leaky ReLU before each upsampler, or SnakeBeta (anti-aliased when
    ``antialias``) inside the blocks and before ``conv_out``; ``final_act_fn`` ``"tanh"``,
    ``"clamp"`` or None."""

    family: ClassVar[str] = "ltx2-audio"
    class_name: ClassVar[str] = "LTX2Vocoder"

    in_channels: int = 128
    hidden_channels: int = 1024
    out_channels: int = 2
    upsample_kernel_sizes: tuple[int, ...] = (16, 15, 8, 4, 4)
    upsample_factors: tuple[int, ...] = (6, 5, 2, 2, 2)
    resnet_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resnet_dilations: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    act_fn: str = "leaky_relu"
    leaky_relu_negative_slope: float = 0.1
    antialias: bool = False
    antialias_ratio: int = 2
    antialias_kernel_size: int = 12
    final_act_fn: str | None = "tanh"
    final_bias: bool = True
    output_sampling_rate: int = 24000

    def __post_init__(self) -> None:
        _tuples(self, ("upsample_kernel_sizes", "upsample_factors", "resnet_kernel_sizes", "resnet_dilations"))
        problems = self.problems()
        if problems:
            raise ConfigError(f"{self.class_name}: " + "; ".join(problems))

    def problems(self) -> list[str]:
        problems = []
        if len(self.upsample_kernel_sizes) != len(self.upsample_factors):
            problems.append(f"upsample_kernel_sizes={list(self.upsample_kernel_sizes)} and upsample_factors="
                            f"{list(self.upsample_factors)}; expected lists of one length")
        if len(self.resnet_kernel_sizes) != len(self.resnet_dilations):
            problems.append(f"resnet_kernel_sizes={list(self.resnet_kernel_sizes)} and resnet_dilations="
                            f"{[list(d) for d in self.resnet_dilations]}; expected lists of one length")
        if self.act_fn not in VOCODER_ACTIVATIONS:
            problems.append(f"act_fn={self.act_fn!r}; expected one of {list(VOCODER_ACTIVATIONS)}")
        if self.antialias and not self.snake:
            # diffusers nests the anti-aliasing of a leaky ReLU ever deeper per block (its ResBlock
            # reassigns ``act_fn``, not ``act``): no release does this.
            problems.append("antialias=True with act_fn='leaky_relu'; expected a Snake activation")
        if self.final_act_fn not in ("tanh", "clamp", None):
            problems.append(f"final_act_fn={self.final_act_fn!r}; expected 'tanh', 'clamp' or None")
        if self.hidden_channels % 2 ** len(self.upsample_factors):
            problems.append(f"hidden_channels={self.hidden_channels}; expected a multiple of "
                            f"{2 ** len(self.upsample_factors)} (each upsampler halves it)")
        return problems

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> LTX2VocoderConfig:
        return config_fields_from_dict(cls, raw)

    def to_dict(self) -> dict[str, Any]:
        return config_to_dict(self)

    # -- derived -------------------------------------------------------------------------------
    @property
    def samples_per_frame(self) -> int:
        """Waveform samples per mel frame (the product of the upsampling factors)."""
        return math.prod(self.upsample_factors)

    def widths(self) -> list[int]:
        """Each upsampler's output width: ``hidden_channels`` halved per upsampler."""
        return [self.hidden_channels // 2 ** (i + 1) for i in range(len(self.upsample_factors))]

    @property
    def snake(self) -> bool:
        return self.act_fn in ("snakebeta", "snake")


@dataclasses.dataclass(frozen=True)
class LTX2VocoderWithBWEConfig:
    """Every ``LTX2VocoderWithBWE`` config key, with diffusers' defaults (LTX-2.3's release: a
    SnakeBeta vocoder to 16 kHz, then a band-width extension to 48 kHz). The ``bwe_*`` keys are a
    second ``LTX2VocoderConfig``'s; ``filter_length``, ``hop_length``, ``window_length`` and
    ``num_mel_channels`` the causal log-mel spectrogram between the two (its bases are buffers of
    the checkpoint)."""

    family: ClassVar[str] = "ltx2-audio"
    class_name: ClassVar[str] = "LTX2VocoderWithBWE"

    in_channels: int = 128
    hidden_channels: int = 1536
    out_channels: int = 2
    upsample_kernel_sizes: tuple[int, ...] = (11, 4, 4, 4, 4, 4)
    upsample_factors: tuple[int, ...] = (5, 2, 2, 2, 2, 2)
    resnet_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resnet_dilations: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    act_fn: str = "snakebeta"
    leaky_relu_negative_slope: float = 0.1
    antialias: bool = True
    antialias_ratio: int = 2
    antialias_kernel_size: int = 12
    final_act_fn: str | None = None
    final_bias: bool = False
    bwe_in_channels: int = 128
    bwe_hidden_channels: int = 512
    bwe_out_channels: int = 2
    bwe_upsample_kernel_sizes: tuple[int, ...] = (12, 11, 4, 4, 4)
    bwe_upsample_factors: tuple[int, ...] = (6, 5, 2, 2, 2)
    bwe_resnet_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    bwe_resnet_dilations: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    bwe_act_fn: str = "snakebeta"
    bwe_leaky_relu_negative_slope: float = 0.1
    bwe_antialias: bool = True
    bwe_antialias_ratio: int = 2
    bwe_antialias_kernel_size: int = 12
    bwe_final_act_fn: str | None = None
    bwe_final_bias: bool = False
    filter_length: int = 512
    hop_length: int = 80
    window_length: int = 512
    num_mel_channels: int = 64
    input_sampling_rate: int = 16000
    output_sampling_rate: int = 48000

    def __post_init__(self) -> None:
        _tuples(self, ("upsample_kernel_sizes", "upsample_factors", "resnet_kernel_sizes", "resnet_dilations",
                       "bwe_upsample_kernel_sizes", "bwe_upsample_factors", "bwe_resnet_kernel_sizes",
                       "bwe_resnet_dilations"))
        problems = self.problems()
        if problems:
            raise ConfigError(f"{self.class_name}: " + "; ".join(problems))

    def problems(self) -> list[str]:
        """Each stage's problems (``LTX2VocoderConfig.problems``), and the rates' and mels' fit."""
        problems = []
        for stage in (self._stage_fields(), self._bwe_fields()):
            try:
                LTX2VocoderConfig(**stage)
            except ConfigError as e:
                problems.append(str(e))
        if self.output_sampling_rate % self.input_sampling_rate:
            problems.append(f"output_sampling_rate={self.output_sampling_rate}; expected a multiple of "
                            f"input_sampling_rate={self.input_sampling_rate} (the resampler's ratio)")
        if self.bwe_in_channels != self.out_channels * self.num_mel_channels:
            problems.append(f"bwe_in_channels={self.bwe_in_channels}; expected out_channels x num_mel_channels = "
                            f"{self.out_channels * self.num_mel_channels}")
        return problems

    def _stage_fields(self) -> dict[str, Any]:
        names = [f.name for f in dataclasses.fields(LTX2VocoderConfig) if f.name != "output_sampling_rate"]
        return {**{name: getattr(self, name) for name in names}, "output_sampling_rate": self.input_sampling_rate}

    def _bwe_fields(self) -> dict[str, Any]:
        names = [f.name for f in dataclasses.fields(LTX2VocoderConfig) if f.name != "output_sampling_rate"]
        return {**{name: getattr(self, "bwe_" + name) for name in names}, "output_sampling_rate": self.output_sampling_rate}

    def stage_config(self) -> LTX2VocoderConfig:
        """The first vocoder's config (diffusers' ``self.vocoder``)."""
        return LTX2VocoderConfig(**self._stage_fields())

    def bwe_config(self) -> LTX2VocoderConfig:
        """The band-width extension's vocoder config (diffusers' ``self.bwe_generator``)."""
        return LTX2VocoderConfig(**self._bwe_fields())

    @property
    def rate_ratio(self) -> int:
        return self.output_sampling_rate // self.input_sampling_rate

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> LTX2VocoderWithBWEConfig:
        return config_fields_from_dict(cls, raw)

    def to_dict(self) -> dict[str, Any]:
        return config_to_dict(self)
