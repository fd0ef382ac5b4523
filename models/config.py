"""VAE configurations, read from (and written to) a diffusers ``config.json``: Wan 2.1 / 2.2
(``AutoencoderKLWan``), HunyuanVideo (``AutoencoderKLHunyuanVideo``), HunyuanVideo 1.5
(``AutoencoderKLHunyuanVideo15``), LTX-Video / LTX-2 (``AutoencoderKLLTXVideo``,
``AutoencoderKLLTX2Video``: ``models.ltx_config``) and the image VAEs: ``AutoencoderKL`` (SD, SDXL,
Flux.1), ``AutoencoderKLFlux2`` and ``AutoencoderKLQwenImage``. No JAX here: the HTTP layer reads
configs too.

Every family answers the same questions (``VAEConfig``): latent channels, spatial and temporal
scale, the output frame count, the latents' normalisation, whether decoding is causal in time and
whether it makes images (no time axis at the API; a one-frame clip inside).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, ClassVar, Protocol

from .shapes import ShapeRules, output_frames

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

# Keys diffusers writes that carry no model information.
_BOOKKEEPING_KEYS = {"_class_name", "_diffusers_version", "_name_or_path", "_use_default_values"}
# Keys in published configs that ``AutoencoderKLWan.__init__`` does not take: diffusers drops them.
# ``clip_output`` (false in Wan2.2-TI2V-5B-Diffusers' vae/config.json) changes nothing there:
# diffusers' ``_decode`` clamps to [-1, 1] unconditionally, as the original Wan 2.2 decode does.
_DROPPED_KEYS = {"clip_output"}


class ConfigError(ValueError):
    """A config.json that this implementation cannot (or will not) decode faithfully."""


class VAEConfig(ShapeRules, Protocol):
    """What the rest of vaeserve reads from a model's config, the same for every family.

    Attributes:
      family: ``"wan"``, ``"hunyuan1.0"``, ``"hunyuan1.5"``, ``"ltx-video"``, ``"ltx2"``,
        ``"autoencoder-kl"``, ``"flux2"`` or ``"qwen-image"`` (which modules implement it).
      z_dim: latent channels.
      spatial_scale: output pixels per latent row/column.
      temporal_scale: output frames per latent frame after the first.
      frame_channels: channels of the frames the encoder takes (3: RGB).
      latents_mean, latents_std: per-channel normalisation: a pipeline's latents ``z`` decode as
        ``z · latents_std + latents_mean`` (Wan: its published statistics; HunyuanVideo: mean 0,
        std ``1 / scaling_factor``), and encode back with the inverse.
      causal: decoding latent frames ``0..t`` gives exactly the first frames of the whole decode,
        so a decode can stream step by step (Wan, HunyuanVideo 1.5); HunyuanVideo 1.0's GroupNorm
        statistics span the whole clip, so it cannot. Released LTX decoders are not causal either
        (each conv sees one frame ahead) but stream ``lookahead`` latent frames behind their input.
      lookahead: None for a decoder that streams frame 0 alone, then chunks (or not at all); for
        an LTX decoder, the latent frames beyond frame 0 a stream's first step takes.
      decode_conditions: whether a decode takes a timestep and noise (``models.ltx.DecodeConditions``).
      is_image: an image model: latents ``(B, C, H, W)`` in, images ``(B, 3, H, W)`` out (inside, a
        one-frame clip ``(B, 1, H, W, C)`` runs through the same programs as a video).
      takes_one_frame_clips: an image model that also takes diffusers' video layout with one frame,
        ``(B, C, 1, H, W)`` (Qwen-Image, whose diffusers class is a video VAE).
    """

    family: ClassVar[str]
    class_name: ClassVar[str]
    is_image: ClassVar[bool]
    takes_one_frame_clips: ClassVar[bool]

    @property
    def lookahead(self) -> int | None: ...

    @property
    def decode_conditions(self) -> bool: ...

    @property
    def latents_mean(self) -> tuple[float, ...]: ...

    @property
    def latents_std(self) -> tuple[float, ...]: ...

    @property
    def causal(self) -> bool: ...

    def num_output_frames(self, latent_frames: int) -> int: ...

    def to_dict(self) -> dict[str, Any]: ...


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
        return _from_dict(cls, raw, dropped=_DROPPED_KEYS)

    @classmethod
    def from_json(cls, path: str | Path) -> WanVAEConfig:
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))

    def to_dict(self) -> dict[str, Any]:
        return _to_dict(self)


def _from_dict(cls, raw: dict[str, Any], *, dropped: frozenset[str] | set[str] = frozenset()):
    """``cls(**raw)`` for a diffusers config of ``cls.class_name`` (the default when the key is
    absent); an unknown key or another class is a ``ConfigError`` that names the known ones."""
    class_name = raw.get("_class_name", cls.class_name)
    if class_name != cls.class_name:
        raise ConfigError(f"config _class_name is {class_name!r}; expected {cls.class_name!r}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - known - _BOOKKEEPING_KEYS - set(dropped))
    if unknown:
        raise ConfigError(f"unknown {cls.class_name} config keys: {unknown}; known keys: {sorted(known)}")
    return cls(**{k: v for k, v in raw.items() if k in known})


def _to_dict(config) -> dict[str, Any]:
    """A diffusers ``config.json`` body: ``_class_name`` and every field (tuples as lists)."""
    out: dict[str, Any] = {"_class_name": config.class_name}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


# -- HunyuanVideo ---------------------------------------------------------------------------------
HUNYUAN_BLOCKS = ("HunyuanVideoDownBlock3D", "HunyuanVideoUpBlock3D")


def _log2(value: int) -> int | None:
    """``log2(value)`` for a power of two ≥ 1, else None."""
    return value.bit_length() - 1 if value >= 1 and value & (value - 1) == 0 else None


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
        spatial, temporal = _log2(self.spatial_compression_ratio) or 0, _log2(self.temporal_compression_ratio) or 0
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
        spatial = _log2(self.spatial_compression_ratio)
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
        return _from_dict(cls, raw)

    def to_dict(self) -> dict[str, Any]:
        return _to_dict(self)


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
        spatial, temporal = _log2(self.spatial_compression_ratio) or 0, _log2(self.temporal_compression_ratio) or 0
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
        spatial = _log2(self.spatial_compression_ratio) or 0
        first_temporal = _log2(self.spatial_compression_ratio // max(1, self.temporal_compression_ratio)) or 0
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
        spatial, temporal = _log2(self.spatial_compression_ratio), _log2(self.temporal_compression_ratio)
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
                problems += _upsample_problem(i, cout, up, temporal)
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
            problems += _downsample_problem(i, cout, down, temporal)
        return problems

    # -- (de)serialisation ---------------------------------------------------------------------
    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> HunyuanVideo15Config:
        return _from_dict(cls, raw)

    def to_dict(self) -> dict[str, Any]:
        return _to_dict(self)


def _upsample_problem(block: int, cin: int, cout: int | None, temporal: bool) -> list[str]:
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


def _downsample_problem(block: int, cin: int, cout: int | None, temporal: bool) -> list[str]:
    """The encoder's inverse: its conv makes ``cout / f`` channels, its shortcut averages groups of
    ``f·cin / cout`` of the ``f·cin`` packed input channels (half the group on the first frame)."""
    if cout is None:
        return []
    factor = 8 if temporal else 4
    group, remainder = divmod(factor * cin, cout)
    if remainder or cout % factor or (temporal and group % 2):
        return [f"down block {block}: {cin} channels do not average into {cout} / {factor} sub-positions"]
    return []


# -- every family -----------------------------------------------------------------------------------
# The image and LTX configs build on the helpers above: imported here, after them, so that
# ``models.image_config`` and ``models.ltx_config`` (which import this module) find them whichever
# module is imported first.
from .image_config import AutoencoderKLConfig, AutoencoderKLFlux2Config, QwenImageConfig  # noqa: E402
from .ltx_config import LTX2VideoConfig, LTXVideoConfig  # noqa: E402

CONFIG_CLASSES: dict[str, Any] = {cls.class_name: cls for cls in (
    WanVAEConfig, HunyuanVideoConfig, HunyuanVideo15Config, LTXVideoConfig, LTX2VideoConfig, AutoencoderKLConfig,
    AutoencoderKLFlux2Config, QwenImageConfig)}


def config_from_dict(raw: dict[str, Any]) -> VAEConfig:
    """The config of a diffusers ``config.json`` body, by its ``_class_name`` (Wan when absent)."""
    class_name = raw.get("_class_name", WanVAEConfig.class_name)
    if class_name not in CONFIG_CLASSES:
        raise ConfigError(f"config _class_name is {class_name!r}; expected one of {sorted(CONFIG_CLASSES)}")
    return CONFIG_CLASSES[class_name].from_dict(raw)


def read_config(path: str | Path) -> VAEConfig:
    """``config_from_dict`` of a ``config.json`` file."""
    with open(path, encoding="utf-8") as f:
        return config_from_dict(json.load(f))
