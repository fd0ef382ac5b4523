"""HunyuanVideo's VAE configuration (``AutoencoderKLHunyuanVideo``), read from and written to a
diffusers ``config.json``. No JAX here."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from vaeserve.models.config import ConfigError, config_fields_from_dict, config_to_dict, exact_log2
from vaeserve.models.shapes import output_frames

HUNYUAN_BLOCKS = ("HunyuanVideoDownBlock3D", "HunyuanVideoUpBlock3D")

@dataclasses.dataclass(frozen=True)
class HunyuanVideoConfig:
    """Every ``AutoencoderKLHunyuanVideo`` config key; the defaults are the real HunyuanVideo VAE.

    GroupNorm(``norm_num_groups``) everywhere, over (C/G, T, H, W): its statistics span the whole
    clip, so the model decodes a clip at once (``causal`` is False).
    """

    family: ClassVar[str] = "hunyuan1.0"
    class_name: ClassVar[str] = "AutoencoderKLHunyuanVideo"
    causal: ClassVar[bool] = False
    is_image: ClassVar[bool] = False
    takes_one_frame_clips: ClassVar[bool] = False
    lookahead: ClassVar[int | None] = None
    min_latent_size: ClassVar[int] = 1
    decode_conditions: ClassVar[bool] = False

    in_channels: int = 3
    out_channels: int = 3
    latent_channels: int = 16
    down_block_types: tuple[str, ...] = (HUNYUAN_BLOCKS[0],) * 4
    up_block_types: tuple[str, ...] = (HUNYUAN_BLOCKS[1],) * 4
    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    layers_per_block: int = 2
    act_fn: str = "silu"
    norm_num_groups: int = 32
    scaling_factor: float = 0.476986
    spatial_compression_ratio: int = 8
    temporal_compression_ratio: int = 4
    mid_block_add_attention: bool = True

    def __post_init__(self) -> None:
        for name in ("down_block_types", "up_block_types", "block_out_channels"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        self.validate()

    # -- derived -------------------------------------------------------------------------------
    @property
    def z_dim(self) -> int:
        return self.latent_channels

    @property
    def frame_channels(self) -> int:
        return self.in_channels

    @property
    def latents_mean(self) -> tuple[float, ...]:
        return (0.0,) * self.latent_channels

    @property
    def latents_std(self) -> tuple[float, ...]:
        return (1.0 / self.scaling_factor,) * self.latent_channels

    def up_factors(self) -> tuple[tuple[bool, bool], ...]:
        """``(doubles time, doubles space)`` of each up block's upsampler (diffusers' rule for a
        temporal ratio of 4: space in the first log2(spatial) blocks, time in the two before the last)."""
        blocks = len(self.block_out_channels)
        spatial, temporal = exact_log2(self.spatial_compression_ratio) or 0, exact_log2(self.temporal_compression_ratio) or 0
        return tuple((blocks - 1 - temporal <= i < blocks - 1, i < spatial) for i in range(blocks))

    def down_factors(self) -> tuple[tuple[bool, bool], ...]:
        """``(halves time, halves space)`` of each down block's downsampler (the same rule)."""
        return self.up_factors()

    @property
    def spatial_scale(self) -> int:
        return 2 ** sum(s for _, s in self.up_factors())

    @property
    def temporal_scale(self) -> int:
        return 2 ** sum(t for t, _ in self.up_factors())

    def num_output_frames(self, latent_frames: int) -> int:
        return output_frames(latent_frames, self.temporal_scale)

    # -- checks --------------------------------------------------------------------------------
    def validate(self) -> None:
        problems = []
        blocks = len(self.block_out_channels)
        if blocks < 2:
            problems.append(f"block_out_channels={list(self.block_out_channels)}; expected at least 2 blocks")
        for name, kind in (("down_block_types", HUNYUAN_BLOCKS[0]), ("up_block_types", HUNYUAN_BLOCKS[1])):
            types = getattr(self, name)
            if len(types) != blocks or set(types) != {kind}:
                problems.append(f"{name}={list(types)}; expected {blocks} x {kind!r}")
        if self.act_fn not in ("silu", "swish"):
            problems.append(f"act_fn={self.act_fn!r}; expected 'silu'")
        if self.temporal_compression_ratio != 4:
            problems.append(f"temporal_compression_ratio={self.temporal_compression_ratio}; the decoder supports 4")
        spatial = exact_log2(self.spatial_compression_ratio)
        if spatial is None or spatial > blocks:
            problems.append(f"spatial_compression_ratio={self.spatial_compression_ratio}; expected 2^k, k ≤ {blocks}")
        if self.norm_num_groups < 1 or any(c % self.norm_num_groups for c in self.block_out_channels):
            problems.append(f"norm_num_groups={self.norm_num_groups} must divide every block_out_channels "
                            f"{list(self.block_out_channels)}")
        if self.layers_per_block < 1:
            problems.append(f"layers_per_block={self.layers_per_block}; expected ≥ 1")
        if self.in_channels != 3 or self.out_channels != 3:
            problems.append(f"in/out_channels={self.in_channels}/{self.out_channels}; expected 3 (RGB)")
        if not self.scaling_factor > 0:
            problems.append(f"scaling_factor={self.scaling_factor}; expected > 0")
        if problems:
            raise ConfigError(f"unsupported {self.class_name} config: " + "; ".join(problems))

    # -- (de)serialisation ---------------------------------------------------------------------
    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> HunyuanVideoConfig:
        return config_fields_from_dict(cls, raw)

    def to_dict(self) -> dict[str, Any]:
        return config_to_dict(self)

