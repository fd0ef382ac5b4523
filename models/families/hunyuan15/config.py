"""HunyuanVideo 1.5's VAE configuration (``AutoencoderKLHunyuanVideo15``), read from and written to
a diffusers ``config.json``. No JAX here."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from vaeserve.models.config import ConfigError, config_fields_from_dict, config_to_dict, exact_log2
from vaeserve.models.families.hunyuan.config import HunyuanVideoConfig


@dataclasses.dataclass(frozen=True)
class HunyuanVideo15Config:
    """Every ``AutoencoderKLHunyuanVideo15`` config key; the defaults are the real HunyuanVideo 1.5 VAE.

    Per-pixel RMS norms and causal convs, up/down-sampling by channel ↔ (time, row, column)
    rearrangement (DC-AE style), and a frame-causal mid-block attention: causal in time, so it
    streams, keeping the mid-block's keys and values of earlier latent frames.
    """

    family: ClassVar[str] = "hunyuan1.5"
    class_name: ClassVar[str] = "AutoencoderKLHunyuanVideo15"
    causal: ClassVar[bool] = True
    is_image: ClassVar[bool] = False
    takes_one_frame_clips: ClassVar[bool] = False
    lookahead: ClassVar[int | None] = None
    min_latent_size: ClassVar[int] = 1
    decode_conditions: ClassVar[bool] = False

    in_channels: int = 3
    out_channels: int = 3
    latent_channels: int = 32
    block_out_channels: tuple[int, ...] = (128, 256, 512, 1024, 1024)
    layers_per_block: int = 2
    spatial_compression_ratio: int = 16
    temporal_compression_ratio: int = 4
    downsample_match_channel: bool = True
    upsample_match_channel: bool = True
    scaling_factor: float = 1.03682

    def __post_init__(self) -> None:
        object.__setattr__(self, "block_out_channels", tuple(self.block_out_channels))
        self.validate()

    # -- derived -------------------------------------------------------------------------------
    z_dim = HunyuanVideoConfig.z_dim
    frame_channels = HunyuanVideoConfig.frame_channels
    latents_mean = HunyuanVideoConfig.latents_mean
    latents_std = HunyuanVideoConfig.latents_std
    num_output_frames = HunyuanVideoConfig.num_output_frames

    @property
    def decoder_channels(self) -> tuple[int, ...]:
        """The decoder's widths, block by block: ``block_out_channels`` reversed."""
        return tuple(reversed(self.block_out_channels))

    def up_blocks(self) -> tuple[tuple[int, int, int | None, bool], ...]:
        """``(in, out, upsampler out or None, doubles time)`` per up block (diffusers' rule:
        space in the first log2(spatial) blocks, time in the first log2(temporal))."""
        spatial, temporal = exact_log2(self.spatial_compression_ratio) or 0, exact_log2(self.temporal_compression_ratio) or 0
        dims, cin = self.decoder_channels, self.decoder_channels[0]
        blocks: list[tuple[int, int, int | None, bool]] = []
        for i, cout in enumerate(dims):
            if i < spatial or i < temporal:
                up = dims[i + 1] if self.upsample_match_channel and i + 1 < len(dims) else cout
                blocks.append((cin, cout, up, i < temporal))
                cin = up
            else:
                blocks.append((cin, cout, None, False))
                cin = cout
        return tuple(blocks)

    def down_blocks(self) -> tuple[tuple[int, int, int | None, bool], ...]:
        """``(in, out, downsampler out or None, halves time)`` per down block (diffusers' rule:
        space in the first log2(spatial) blocks, time from block log2(spatial / temporal) on)."""
        spatial = exact_log2(self.spatial_compression_ratio) or 0
        first_temporal = exact_log2(self.spatial_compression_ratio // max(1, self.temporal_compression_ratio)) or 0
        dims, cin = self.block_out_channels, self.block_out_channels[0]
        blocks: list[tuple[int, int, int | None, bool]] = []
        for i, cout in enumerate(dims):
            if i < spatial:
                down = dims[i + 1] if self.downsample_match_channel and i + 1 < len(dims) else cout
                blocks.append((cin, cout, down, i >= first_temporal))
                cin = down
            else:
                blocks.append((cin, cout, None, False))
                cin = cout
        return tuple(blocks)

    @property
    def spatial_scale(self) -> int:
        return self.spatial_compression_ratio

    @property
    def temporal_scale(self) -> int:
        return self.temporal_compression_ratio

    # -- checks --------------------------------------------------------------------------------
    def validate(self) -> None:
        problems = []
        dims = self.block_out_channels
        spatial, temporal = exact_log2(self.spatial_compression_ratio), exact_log2(self.temporal_compression_ratio)
        if spatial is None or temporal is None or not 1 <= temporal <= spatial < len(dims):
            problems.append(f"spatial/temporal_compression_ratio={self.spatial_compression_ratio}/"
                            f"{self.temporal_compression_ratio}; expected powers of 2 with "
                            f"temporal ≤ spatial < 2^{len(dims)}")
        if self.layers_per_block < 1:
            problems.append(f"layers_per_block={self.layers_per_block}; expected ≥ 1")
        if self.in_channels != 3 or self.out_channels != 3:
            problems.append(f"in/out_channels={self.in_channels}/{self.out_channels}; expected 3 (RGB)")
        if dims[-1] % self.latent_channels:
            problems.append(f"block_out_channels[-1]={dims[-1]} must be a multiple of latent_channels "
                            f"({self.latent_channels}): the decoder's input shortcut repeats each channel")
        if not problems:
            for i, (_, cout, up, temporal) in enumerate(self.up_blocks()):
                problems += upsample_problem(i, cout, up, temporal)
        if not self.scaling_factor > 0:
            problems.append(f"scaling_factor={self.scaling_factor}; expected > 0")
        if problems:
            raise ConfigError(f"unsupported {self.class_name} config: " + "; ".join(problems))

    def encoder_problems(self) -> list[str]:
        """Why this config's encoder cannot run (empty when it can): its shortcuts average whole
        groups of channels, which must divide (diffusers fails otherwise). The decoder may still run."""
        problems = []
        if self.block_out_channels[-1] % (2 * self.latent_channels):
            problems.append(f"block_out_channels[-1]={self.block_out_channels[-1]} must be a multiple of "
                            f"2 x latent_channels ({2 * self.latent_channels}): the encoder's output shortcut "
                            "averages channel groups")
        for i, (_, cout, down, temporal) in enumerate(self.down_blocks()):
            problems += downsample_problem(i, cout, down, temporal)
        return problems

    # -- (de)serialisation ---------------------------------------------------------------------
    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> HunyuanVideo15Config:
        return config_fields_from_dict(cls, raw)

    def to_dict(self) -> dict[str, Any]:
        return config_to_dict(self)



def upsample_problem(block: int, cin: int, cout: int | None, temporal: bool) -> list[str]:
    """HunyuanVideo 1.5's upsampler packs ``f`` = 8 (time and space) or 4 (space) sub-positions in
    channels: its conv makes ``f·cout`` of them, its shortcut repeats each of the ``cin`` input
    channels ``f·cout / cin`` times (half as often on the first frame, which gets 4 sub-positions)."""
    if cout is None:
        return []
    factor = 8 if temporal else 4
    repeats, remainder = divmod(factor * cout, cin)
    if remainder or (temporal and (cin % 4 or repeats % 2)):
        return [f"up block {block}: {cin} channels do not repeat into {cout} x {factor} sub-positions"]
    return []


def downsample_problem(block: int, cin: int, cout: int | None, temporal: bool) -> list[str]:
    """The encoder's inverse: its conv makes ``cout / f`` channels, its shortcut averages groups of
    ``f·cin / cout`` of the ``f·cin`` packed input channels (half the group on the first frame)."""
    if cout is None:
        return []
    factor = 8 if temporal else 4
    group, remainder = divmod(factor * cin, cout)
    if remainder or cout % factor or (temporal and group % 2):
        return [f"down block {block}: {cin} channels do not average into {cout} / {factor} sub-positions"]
    return []

