"""Qwen-Image's VAE configuration (``AutoencoderKLQwenImage``): the Wan 2.1 architecture with
weights of its own, for images. No JAX here."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from vaeserve.models.config import ConfigError, config_fields_from_dict, config_to_dict
from vaeserve.models.families.wan.config import WAN21_LATENTS_MEAN, WAN21_LATENTS_STD, WanVAEConfig


@dataclasses.dataclass(frozen=True)
class QwenImageConfig:
    """Every ``AutoencoderKLQwenImage`` config key; the defaults (diffusers') are Qwen-Image's VAE.

    Qwen-Image's VAE is the Wan 2.1 architecture with weights of its own (its latent statistics
    are Wan 2.1's), used for images: ``wan()`` is the same model as a ``WanVAEConfig``, which the
    Wan layers are built from. ``input_channels`` is both ``in_channels`` and ``out_channels`` there.
    """

    family: ClassVar[str] = "qwen-image"
    class_name: ClassVar[str] = "AutoencoderKLQwenImage"
    causal: ClassVar[bool] = True
    is_image: ClassVar[bool] = True
    takes_one_frame_clips: ClassVar[bool] = True
    lookahead: ClassVar[int | None] = None
    min_latent_size: ClassVar[int] = 1
    decode_conditions: ClassVar[bool] = False

    base_dim: int = 96
    z_dim: int = 16
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    attn_scales: tuple[float, ...] = ()
    temperal_downsample: tuple[bool, ...] = (False, True, True)
    dropout: float = 0.0
    input_channels: int = 3
    latents_mean: tuple[float, ...] = WAN21_LATENTS_MEAN
    latents_std: tuple[float, ...] = WAN21_LATENTS_STD

    def __post_init__(self) -> None:
        for name in ("dim_mult", "attn_scales", "temperal_downsample", "latents_mean", "latents_std"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        try:
            self.wan()
        except ConfigError as e:
            raise ConfigError(f"unsupported {self.class_name} config: {e}") from e

    def wan(self) -> WanVAEConfig:
        """The same model as a Wan 2.1 config (what the Wan layers are built from)."""
        return WanVAEConfig(base_dim=self.base_dim, z_dim=self.z_dim, dim_mult=self.dim_mult,
                            num_res_blocks=self.num_res_blocks, attn_scales=self.attn_scales,
                            temperal_downsample=self.temperal_downsample, dropout=self.dropout,
                            latents_mean=self.latents_mean, latents_std=self.latents_std,
                            in_channels=self.input_channels, out_channels=self.input_channels,
                            scale_factor_spatial=None, scale_factor_temporal=None)

    @property
    def spatial_scale(self) -> int:
        return self.wan().spatial_scale

    @property
    def temporal_scale(self) -> int:
        return self.wan().temporal_scale

    @property
    def frame_channels(self) -> int:
        return self.input_channels

    def num_output_frames(self, latent_frames: int) -> int:
        return self.wan().num_output_frames(latent_frames)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> QwenImageConfig:
        return config_fields_from_dict(cls, raw)

    def to_dict(self) -> dict[str, Any]:
        return config_to_dict(self)
