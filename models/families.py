"""Which modules implement a config: one entry per family (``VAEConfig.family``).

Every family's decoder and encoder are called the same way by the decode and encode loops
(``models.decode``, ``models.encode``): ``module(x, caches, ctx, *, clip_frames=…)`` → ``(y,
caches)``, with four static facts on the module: ``causal`` (steps: latent frame 0 first, then
chunks with the caches it returns; else the whole clip at once), ``lookahead`` (None, or for an
LTX decoder the latent frames beyond frame 0 its first step takes: its frames then come that far
behind its input, and the stream runs on past the clip's end), ``needs_clip_frames`` (the first
step sizes a cache by the clip's latent frames) and ``temporal_scale`` (frames per latent frame).
A decoder whose config takes ``decode_conditions`` also takes ``conditions=`` (timestep, noise).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import jax

from .config import (
    ConfigError,
    HunyuanVideo15Config,
    HunyuanVideoConfig,
    LTX2VideoConfig,
    LTXVideoConfig,
    VAEConfig,
    WanVAEConfig,
)
from .decoder import WanDecoder
from .encoder import WanEncoder, check_encoder_config as check_wan_encoder
from .hunyuan import HunyuanVideoDecoder, HunyuanVideoEncoder
from .hunyuan15 import HunyuanVideo15Decoder, HunyuanVideo15Encoder
from .image_config import AutoencoderKLConfig, AutoencoderKLFlux2Config, QwenImageConfig
from .kl import Flux2Decoder, KLDecoder, KLEncoder
from .ltx_vae import LTXDecoder, LTXEncoder
from .qwen_image import QwenImageDecoder, QwenImageEncoder
from .spatial import SpatialContext


class DecoderModule(Protocol):
    """What the decode loop needs of a family's decoder (see the module docstring)."""

    causal: bool
    lookahead: int | None
    needs_clip_frames: bool
    temporal_scale: int

    def __call__(self, z: jax.Array, caches: Any, ctx: SpatialContext, *, inner_frames: int | None = None,
                 clip_frames: int | None = None, conditions: Any = None) -> tuple[jax.Array, Any]: ...


class EncoderModule(Protocol):
    """What the encode loop needs of a family's encoder."""

    causal: bool
    needs_clip_frames: bool
    temporal_scale: int

    def __call__(self, x: jax.Array, caches: Any, ctx: SpatialContext, *,
                 clip_frames: int | None = None) -> tuple[jax.Array, Any]: ...


def _check_hunyuan15_encoder(config: Any) -> None:
    problems = config.encoder_problems()
    if problems:
        raise ConfigError("this HunyuanVideo 1.5 config's encoder cannot run: " + "; ".join(problems))


def _no_encoder_problems(config: Any) -> None:
    del config  # HunyuanVideo 1.0's and AutoencoderKL's encoders run every config their decoders run


def _check_qwen_image_encoder(config: Any) -> None:
    check_wan_encoder(config.wan())


def _check_ltx_encoder(config: Any) -> None:
    problems = config.encoder_problems()
    if problems:
        raise ConfigError(f"this {config.class_name} config's encoder cannot run: " + "; ".join(problems))


@dataclasses.dataclass(frozen=True)
class Family:
    """A family's decoder and encoder module types, and the check of its encoder's config
    (raises ``ConfigError`` for a config whose decoder runs but whose encoder does not)."""

    decoder: Any  # a DecoderModule type
    encoder: Any  # an EncoderModule type
    check_encoder: Callable[[Any], None]


FAMILIES: dict[str, Family] = {
    WanVAEConfig.family: Family(WanDecoder, WanEncoder, check_wan_encoder),
    HunyuanVideoConfig.family: Family(HunyuanVideoDecoder, HunyuanVideoEncoder, _no_encoder_problems),
    HunyuanVideo15Config.family: Family(HunyuanVideo15Decoder, HunyuanVideo15Encoder, _check_hunyuan15_encoder),
    LTXVideoConfig.family: Family(LTXDecoder, LTXEncoder, _check_ltx_encoder),
    LTX2VideoConfig.family: Family(LTXDecoder, LTXEncoder, _check_ltx_encoder),
    AutoencoderKLConfig.family: Family(KLDecoder, KLEncoder, _no_encoder_problems),
    AutoencoderKLFlux2Config.family: Family(Flux2Decoder, KLEncoder, _no_encoder_problems),
    QwenImageConfig.family: Family(QwenImageDecoder, QwenImageEncoder, _check_qwen_image_encoder),
}


def family_of(config: VAEConfig) -> Family:
    return FAMILIES[config.family]
