"""Wan 2.1 and Wan 2.2's VAE configuration (``AutoencoderKLWan``), read from and written to a
diffusers ``config.json``. No JAX here."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, ClassVar

from vaeserve.models.config import ConfigError, config_fields_from_dict, config_to_dict
from vaeserve.models.shapes import output_frames

# Wan 2.1's published per-channel latent statistics (diffusers' AutoencoderKLWan defaults).
WAN21_LATENTS_MEAN: tuple[float, ...] = (
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
    0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
)
WAN21_LATENTS_STD: tuple[float, ...] = (
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
)

# Wan 2.2 (TI2V-5B) latent statistics, 48 channels (Wan2.2 ``wan/modules/vae2_2.py``, and the
# ``vae/config.json`` of ``Wan-AI/Wan2.2-TI2V-5B-Diffusers``).
WAN22_LATENTS_MEAN = (
    -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557,
    -0.1382, 0.0542, 0.2813, 0.0891, 0.1570, -0.0098, 0.0375, -0.1825,
    -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
    -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230,
    -0.0313, -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.0520, 0.3748,
    0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667,
)
WAN22_LATENTS_STD = (
    0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013,
    0.8158, 1.0344, 0.5894, 1.0901, 0.6885, 0.6165, 0.8454, 0.4978,
    0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
    0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093,
    0.5709, 0.6065, 0.6415, 0.4944, 0.5726, 1.2042, 0.5458, 1.6887,
    0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
)

# Keys in published configs that ``AutoencoderKLWan.__init__`` does not take: diffusers drops them.
# ``clip_output`` (false in Wan2.2-TI2V-5B-Diffusers' vae/config.json) changes nothing there:
# diffusers' ``_decode`` clamps to [-1, 1] unconditionally, as the original Wan 2.2 decode does.
DROPPED_KEYS = {"clip_output"}


@dataclasses.dataclass(frozen=True)
class WanVAEConfig:
    """Every ``AutoencoderKLWan`` config key. Defaults are the real Wan 2.1 VAE; ``WanVAEConfig.wan22()``
    is the real Wan 2.2 (TI2V-5B) VAE.

    ``is_residual`` selects the decoder: False → Wan 2.1 (plain up blocks, each upsampler halving
    the width); True → Wan 2.2 (residual up blocks with a parameter-free DupUp3D shortcut). With
    ``patch_size`` p the decoder ends in ``3·p²`` channels, unpatchified to RGB at p x the size.
    """

    family: ClassVar[str] = "wan"
    class_name: ClassVar[str] = "AutoencoderKLWan"
    causal: ClassVar[bool] = True  # causal convs and per-pixel norms: it streams exactly
    is_image: ClassVar[bool] = False
    takes_one_frame_clips: ClassVar[bool] = False
    lookahead: ClassVar[int | None] = None
    min_latent_size: ClassVar[int] = 1
    decode_conditions: ClassVar[bool] = False

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

    @classmethod
    def wan22(cls, **overrides: Any) -> WanVAEConfig:
        """The real Wan 2.2 (TI2V-5B) VAE: 48 latent channels, 16x spatial, decoder width 256."""
        real = dict(base_dim=160, decoder_base_dim=256, z_dim=48, is_residual=True, patch_size=2,
                    in_channels=12, out_channels=12, scale_factor_spatial=16,
                    latents_mean=WAN22_LATENTS_MEAN, latents_std=WAN22_LATENTS_STD)
        return cls(**{**real, **overrides})

    # -- derived -------------------------------------------------------------------------------
    @property
    def decoder_dim(self) -> int:
        return self.decoder_base_dim if self.decoder_base_dim is not None else self.base_dim

    @property
    def temperal_upsample(self) -> tuple[bool, ...]:
        return tuple(reversed(self.temperal_downsample))

    @property
    def decoder_dims(self) -> tuple[int, ...]:
        """Channel widths of the decoder stages: ``[384, 384, 384, 192, 96]`` for Wan 2.1,
        ``[1024, 1024, 1024, 512, 256]`` for Wan 2.2."""
        mult = (self.dim_mult[-1],) + tuple(reversed(self.dim_mult))
        return tuple(self.decoder_dim * m for m in mult)

    @property
    def patch(self) -> int:
        """Pixels per side of one output patch: ``patch_size``, or 1 without patchify."""
        return self.patch_size or 1

    @property
    def spatial_scale(self) -> int:
        """Output pixels per latent row/column: 8 for Wan 2.1, 16 for Wan 2.2 (8 x the 2x2 patch)."""
        return 2 ** (len(self.dim_mult) - 1) * self.patch

    @property
    def temporal_scale(self) -> int:
        return 2 ** sum(self.temperal_upsample[: len(self.dim_mult) - 1])

    @property
    def frame_channels(self) -> int:
        """RGB: Wan 2.2's encoder patchifies the 3 channels into ``in_channels = 12`` itself."""
        return self.in_channels // self.patch**2

    def num_output_frames(self, latent_frames: int) -> int:
        return output_frames(latent_frames, self.temporal_scale)

    # -- checks --------------------------------------------------------------------------------
    def validate(self) -> None:
        problems = []
        if self.patch_size is not None and self.patch_size < 1:
            problems.append(f"patch_size={self.patch_size}; expected null or ≥ 1")
        if self.attn_scales:
            problems.append(f"attn_scales={list(self.attn_scales)}: the decoder has no attention at scales; expected []")
        rgb = 3 * self.patch**2
        if self.out_channels != rgb:
            problems.append(f"out_channels={self.out_channels}; expected {rgb} (RGB x patch_size²)")
        if self.in_channels != rgb:
            problems.append(f"in_channels={self.in_channels}; expected {rgb} (RGB x patch_size²)")
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
        halves = not self.is_residual  # each Wan 2.1 upsampler halves the width
        if self.decoder_dim <= 0 or (halves and self.decoder_dim % 2) or self.num_res_blocks < 0:
            problems.append(f"decoder width {self.decoder_dim} must be a positive{' even' if halves else ''} number")
        problems += self._dup_up_problems()
        if self.scale_factor_spatial not in (None, self.spatial_scale):
            problems.append(f"scale_factor_spatial={self.scale_factor_spatial}; the dims imply {self.spatial_scale}")
        if self.scale_factor_temporal not in (None, self.temporal_scale):
            problems.append(f"scale_factor_temporal={self.scale_factor_temporal}; the dims imply {self.temporal_scale}")
        if problems:
            raise ConfigError("unsupported Wan VAE config: " + "; ".join(problems))

    def _dup_up_problems(self) -> list[str]:
        """Wan 2.2's shortcuts: DupUp3D repeats each input channel ``cout·factor / cin`` times,
        the encoder's AvgDown3D averages groups of ``cin·factor / cout`` (diffusers refuses both
        when they do not divide)."""
        if not self.is_residual or len(self.temperal_downsample) != len(self.dim_mult) - 1:
            return []
        problems = []
        dims = self.decoder_dims
        for stage, temporal in enumerate(self.temperal_upsample):
            cin, cout, factor = dims[stage], dims[stage + 1], 4 * (2 if temporal else 1)
            if (cout * factor) % cin:
                problems.append(f"up block {stage}: DupUp3D needs {cin} | {cout}·{factor}")
        dims = tuple(self.base_dim * m for m in (1, *self.dim_mult))
        for stage, temporal in enumerate((*self.temperal_downsample, False)):
            last = stage == len(self.dim_mult) - 1
            cin, cout, factor = dims[stage], dims[stage + 1], 1 if last else 4 * (2 if temporal else 1)
            if (cin * factor) % cout:
                problems.append(f"down block {stage}: AvgDown3D needs {cout} | {cin}·{factor}")
        return problems

    # -- (de)serialisation ---------------------------------------------------------------------
    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> WanVAEConfig:
        return config_fields_from_dict(cls, raw, dropped=DROPPED_KEYS)

    @classmethod
    def from_json(cls, path: str | Path) -> WanVAEConfig:
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))

    def to_dict(self) -> dict[str, Any]:
        return config_to_dict(self)

