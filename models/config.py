"""Wan 2.1 VAE configuration, read from (and written to) a diffusers ``config.json``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

# Wan 2.1's published per-channel latent statistics (diffusers' AutoencoderKLWan defaults).
WAN21_LATENTS_MEAN = (
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
    0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
)
WAN21_LATENTS_STD = (
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
)

# Keys diffusers writes that carry no model information.
_BOOKKEEPING_KEYS = {"_class_name", "_diffusers_version", "_name_or_path", "_use_default_values"}


class ConfigError(ValueError):
    """A config.json that this implementation cannot (or will not) decode faithfully."""


@dataclasses.dataclass(frozen=True)
class WanVAEConfig:
    """Every ``AutoencoderKLWan`` config key. Defaults are the real Wan 2.1 VAE."""

    base_dim: int = 96
    decoder_base_dim: int | None = None
    z_dim: int = 16
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    attn_scales: tuple[float, ...] = ()
    temperal_downsample: tuple[bool, ...] = (False, True, True)
    dropout: float = 0.0
    latents_mean: tuple[float, ...] = WAN21_LATENTS_MEAN
    latents_std: tuple[float, ...] = WAN21_LATENTS_STD
    is_residual: bool = False
    in_channels: int = 3
    out_channels: int = 3
    patch_size: int | None = None
    scale_factor_temporal: int | None = 4
    scale_factor_spatial: int | None = 8

    def __post_init__(self) -> None:
        for name in ("dim_mult", "attn_scales", "temperal_downsample", "latents_mean", "latents_std"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        self.validate()

    # -- derived -------------------------------------------------------------------------------
    @property
    def decoder_dim(self) -> int:
        return self.decoder_base_dim if self.decoder_base_dim is not None else self.base_dim

    @property
    def temperal_upsample(self) -> tuple[bool, ...]:
        return tuple(reversed(self.temperal_downsample))

    @property
    def decoder_dims(self) -> tuple[int, ...]:
        """Channel widths entering each decoder stage: ``[384, 384, 384, 192, 96]`` for Wan 2.1."""
        mult = (self.dim_mult[-1],) + tuple(reversed(self.dim_mult))
        return tuple(self.decoder_dim * m for m in mult)

    @property
    def spatial_scale(self) -> int:
        return 2 ** (len(self.dim_mult) - 1)

    @property
    def temporal_scale(self) -> int:
        return 2 ** sum(self.temperal_upsample[: len(self.dim_mult) - 1])

    def num_output_frames(self, latent_frames: int) -> int:
        return 1 + self.temporal_scale * (latent_frames - 1)

    # -- checks --------------------------------------------------------------------------------
    def validate(self) -> None:
        problems = []
        if self.is_residual:
            problems.append("is_residual=True (Wan 2.2 residual up-blocks) is not supported; expected false")
        if self.patch_size is not None:
            problems.append(f"patch_size={self.patch_size} (Wan 2.2 patchified output) is not supported; expected null")
        if self.attn_scales:
            problems.append(f"attn_scales={list(self.attn_scales)}: the decoder has no attention at scales; expected []")
        if self.out_channels != 3:
            problems.append(f"out_channels={self.out_channels}; expected 3 (RGB)")
        if len(self.dim_mult) < 2:
            problems.append(f"dim_mult={list(self.dim_mult)}; expected at least 2 stages")
        if len(self.temperal_downsample) != len(self.dim_mult) - 1:
            problems.append(
                f"temperal_downsample has {len(self.temperal_downsample)} entries; "
                f"expected len(dim_mult) - 1 = {len(self.dim_mult) - 1}"
            )
        if len(self.latents_mean) != self.z_dim or len(self.latents_std) != self.z_dim:
            problems.append(
                f"latents_mean/latents_std have {len(self.latents_mean)}/{len(self.latents_std)} values; "
                f"expected z_dim = {self.z_dim}"
            )
        if self.decoder_dim <= 0 or self.decoder_dim % 2 or self.num_res_blocks < 0:
            problems.append(f"decoder width {self.decoder_dim} must be a positive even number")
        if self.scale_factor_spatial not in (None, self.spatial_scale):
            problems.append(f"scale_factor_spatial={self.scale_factor_spatial}; the dims imply {self.spatial_scale}")
        if self.scale_factor_temporal not in (None, self.temporal_scale):
            problems.append(f"scale_factor_temporal={self.scale_factor_temporal}; the dims imply {self.temporal_scale}")
        if problems:
            raise ConfigError("unsupported Wan VAE config: " + "; ".join(problems))

    # -- (de)serialisation ---------------------------------------------------------------------
    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "WanVAEConfig":
        class_name = raw.get("_class_name", "AutoencoderKLWan")
        if class_name != "AutoencoderKLWan":
            raise ConfigError(f"config _class_name is {class_name!r}; expected 'AutoencoderKLWan'")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - known - _BOOKKEEPING_KEYS)
        if unknown:
            raise ConfigError(f"unknown AutoencoderKLWan config keys: {unknown}; known keys: {sorted(known)}")
        return cls(**{k: v for k, v in raw.items() if k in known})

    @classmethod
    def from_json(cls, path: str | Path) -> "WanVAEConfig":
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"_class_name": "AutoencoderKLWan"}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out
