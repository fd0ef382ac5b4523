"""LTX-Video (``AutoencoderKLLTXVideo``, 0.9.0 … 0.9.8) and LTX-2 (``AutoencoderKLLTX2Video``, 2.0,
2.3, 2.5) VAE configurations. No JAX here: the HTTP layer reads configs too.

The two classes spell the same architecture differently, so each reduces to one plan that the
shared layers (``models.families.ltx.layers``) build from: ``decoder_plan()`` (the mid block, then each up block's
widths, depth, upsampler strides, residual and noise) and ``encoder_plan()``. The plan also gives
the stream arithmetic of a decoder that is not causal in time (``lookahead``, ``step_frames``):
every conv there sees one frame ahead, so a stream holds each layer's last frames back until the
next step brings the frame after them.

Both classes keep ``latents_mean`` / ``latents_std`` as *tensors* beside the weights (diffusers
registers them as buffers), not in ``config.json``: loading copies them into the config
(``with_statistics``), and ``to_dict`` leaves them out.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

from vaeserve.models.config import ConfigError, config_fields_from_dict, config_to_dict
from vaeserve.models.shapes import output_frames

# Per-pixel RMS norms (``RMSNorm(eps=1e-8)``, ``PerChannelRMSNorm``) and the up blocks' time embedding
# (``PixArtAlphaCombinedTimestepSizeEmbeddings``: 256 sinusoidal channels).
PIXEL_NORM_EPS = 1e-8
TIME_PROJECTION_CHANNELS = 256
# Upsampler strides (time, space) by diffusers' ``upsample_type`` / ``downsample_type``.
STRIDES = {"spatial": (1, 2), "temporal": (2, 1), "spatiotemporal": (2, 2), "conv": (2, 2)}


class UpBlockPlan(NamedTuple):
    """One decoder up block: an optional ``conv_in`` resnet (``cin`` → ``cout``, when the nominal
    widths differ), an optional upsampler (``stride`` (time, space), its conv from ``cout·factor``
    channels, ``residual``: the depth-to-space shortcut), then ``layers`` resnets at ``cout``."""

    cin: int
    cout: int
    layers: int
    stride: tuple[int, int] | None
    residual: bool
    factor: int
    inject_noise: bool


class DecoderPlan(NamedTuple):
    """The decoder: conv_in to ``mid_channels``, a mid block of ``mid_layers`` resnets, the up blocks,
    then the head at ``out_channels`` (``3·patch²`` channels, unpatchified)."""

    latent_channels: int
    mid_channels: int
    mid_layers: int
    mid_noise: bool
    up_blocks: tuple[UpBlockPlan, ...]
    patch: int
    causal: bool
    edge: str  # "zero" or "reflect": the spatial padding of every conv
    timestep_conditioning: bool
    conv_shortcut_wrapped: bool  # LTX-Video's resnet shortcut is a causal conv held under ``.conv``

    @property
    def head_channels(self) -> int:
        return self.up_blocks[-1].cout if self.up_blocks else self.mid_channels


class DownBlockPlan(NamedTuple):
    """One encoder down block: ``layers`` resnets at ``cin``, then a downsampler of ``kind``
    (``"conv"``: a stride-2 conv at ``cin``, followed by a ``conv_out`` resnet ``cin`` → ``cout`` when
    they differ; else a space-to-depth downsampler of ``stride`` to ``cout``) or none."""

    cin: int
    cout: int
    layers: int
    kind: str | None
    stride: tuple[int, int] | None


class EncoderPlan(NamedTuple):
    conv_in_channels: int
    down_blocks: tuple[DownBlockPlan, ...]
    mid_channels: int
    mid_layers: int
    latent_channels: int
    patch: int
    edge: str


def _tuple(value, length: int) -> tuple:
    """diffusers' LTX-2 accepts one bool for every block: expand it."""
    return (value,) * length if isinstance(value, bool) else tuple(value)


def _edge(mode: str) -> str | None:
    return {"zeros": "zero", "reflect": "reflect"}.get(mode)


# -- the stream arithmetic of a decoder --------------------------------------------------------------
def _frame_ops(plan: DecoderPlan) -> list[tuple[str, int]]:
    """The decoder's layers in order as ``("conv", 1)`` (a 3x3x3 conv) and ``("up", st)`` (an
    upsampler that multiplies time by ``st`` after its conv): what the stream arithmetic walks."""
    ops = [("conv", 1)] + [("conv", 1)] * (2 * plan.mid_layers)
    for block in plan.up_blocks:
        ops += [("conv", 1)] * (2 if block.cin != block.cout else 0)
        if block.stride is not None:
            ops += [("up", block.stride[0])]
        ops += [("conv", 1)] * (2 * block.layers)
    return ops + [("conv", 1)]


def first_step_frames(plan: DecoderPlan, frames: int) -> int:
    """Frames the decoder emits on a stream's first step of ``frames`` latent frames. A conv that sees
    one frame ahead holds its last frame back until the next step brings the frame after it (its
    past on the first step is a copy of the clip's first frame): one frame fewer than it takes.
    An upsampler multiplies by its time stride and drops the ``stride − 1`` frames before the clip's
    first. A causal decoder emits ``1 + temporal_scale·(frames − 1)``. −1 when some layer would
    emit nothing (too few frames: see ``lookahead``). Every later step emits ``temporal_scale`` frames
    per latent frame it takes."""
    count = frames
    for kind, stride in _frame_ops(plan):
        count -= 0 if plan.causal else 1
        if kind == "up":
            count = stride * count - (stride - 1)
        if count < 1:
            return -1
    return count


def lookahead(plan: DecoderPlan) -> int:
    """Latent frames beyond frame 0 that a stream's first step takes so that every layer emits a frame
    (0 for a causal decoder): the sum over its convs of one frame each, at each conv's time scale."""
    extra = 0
    while first_step_frames(plan, 1 + extra) < 1:
        extra += 1
    return extra


# -- the two configs ---------------------------------------------------------------------------------
class _LTXConfig:
    """What both LTX configs derive from their plans (the ``VAEConfig`` answers and the checks)."""

    family: ClassVar[str]
    class_name: ClassVar[str]
    latent_channels: int
    in_channels: int
    out_channels: int
    patch_size: int
    patch_size_t: int
    scaling_factor: float
    timestep_conditioning: bool
    spatial_compression_ratio: int | None
    temporal_compression_ratio: int | None
    statistics: tuple[tuple[float, ...], tuple[float, ...]] | None
    # diffusers keeps the latents' statistics as buffers of these names (moved into the config on loading).
    statistics_tensors: ClassVar[tuple[str, ...]] = ("latents_mean", "latents_std")

    def decoder_plan(self) -> DecoderPlan:
        raise NotImplementedError

    def encoder_plan(self) -> EncoderPlan:
        raise NotImplementedError

    # -- VAEConfig ------------------------------------------------------------------------------
    @property
    def z_dim(self) -> int:
        return self.latent_channels

    @property
    def frame_channels(self) -> int:
        return self.in_channels

    @property
    def spatial_scale(self) -> int:
        """Output pixels per latent row: the patch times every upsampler's spatial stride (32)."""
        scale = self.patch_size
        for block in self.decoder_plan().up_blocks:
            scale *= block.stride[1] if block.stride else 1
        return scale

    @property
    def temporal_scale(self) -> int:
        """Output frames per latent frame after the first: every upsampler's time stride (8)."""
        scale = 1
        for block in self.decoder_plan().up_blocks:
            scale *= block.stride[0] if block.stride else 1
        return scale

    @property
    def causal(self) -> bool:
        """Whether frame ``t`` depends on latent frames ``0..t`` only (``decoder_causal``). Released
        decoders are not: each conv sees one frame ahead, and a stream runs ``lookahead`` frames
        ahead of its output instead."""
        return self.decoder_plan().causal

    @property
    def lookahead(self) -> int:
        """Latent frames beyond frame 0 that a stream's first step takes (``lookahead``)."""
        return lookahead(self.decoder_plan())

    @property
    def injects_noise(self) -> bool:
        """Whether the decoder's resnets add seeded noise (some LTX-Video 0.9.1+ and LTX-2 decoders)."""
        plan = self.decoder_plan()
        return plan.mid_noise or any(b.inject_noise for b in plan.up_blocks)

    @property
    def decode_conditions(self) -> bool:
        """Whether a decode takes a timestep and noise (``models.conditions.DecodeConditions``): a
        timestep-conditioned decoder or one that injects noise."""
        return self.timestep_conditioning or self.injects_noise

    @property
    def latents_mean(self) -> tuple[float, ...]:
        mean = self.statistics[0] if self.statistics else (0.0,) * self.latent_channels
        return tuple(float(m) for m in mean)

    @property
    def latents_std(self) -> tuple[float, ...]:
        """The pipelines' ``latents · latents_std / scaling_factor + latents_mean``: std over the factor."""
        std = self.statistics[1] if self.statistics else (1.0,) * self.latent_channels
        return tuple(float(s) / self.scaling_factor for s in std)

    @property
    def min_latent_size(self) -> int:
        """Reflect padding needs two rows to reflect: a decoder that pads so takes latents ≥ 2 x 2."""
        return 2 if self.decoder_plan().edge == "reflect" else 1

    def num_output_frames(self, latent_frames: int) -> int:
        return output_frames(latent_frames, self.temporal_scale)

    def first_step_frames(self, frames: int) -> int:
        """Frames a stream's first step of ``frames`` latent frames gives (``first_step_frames``)."""
        return first_step_frames(self.decoder_plan(), frames)

    def with_statistics(self, mean, std):
        """This config with the checkpoint's ``latents_mean`` / ``latents_std`` tensors."""
        values = (tuple(float(m) for m in mean), tuple(float(s) for s in std))
        if any(len(v) != self.latent_channels for v in values):
            raise ConfigError(f"latents_mean/latents_std have {len(values[0])}/{len(values[1])} values; "
                              f"expected latent_channels = {self.latent_channels}")
        return dataclasses.replace(self, statistics=values)  # type: ignore[type-var]

    # -- checks --------------------------------------------------------------------------------
    def _plan_problems(self) -> list[str]:
        problems = []
        if self.in_channels != 3 or self.out_channels != 3:
            problems.append(f"in/out_channels={self.in_channels}/{self.out_channels}; expected 3 (RGB)")
        if self.patch_size < 1 or self.patch_size_t != 1:
            problems.append(f"patch_size/patch_size_t={self.patch_size}/{self.patch_size_t}; expected ≥ 1 and 1")
        if not self.scaling_factor > 0:
            problems.append(f"scaling_factor={self.scaling_factor}; expected > 0")
        if problems:
            return problems
        plan = self.decoder_plan()
        channels = plan.mid_channels  # what reaches each block
        for i, block in enumerate(plan.up_blocks):
            if block.cin != block.cout:
                if channels != block.cin or block.factor != 1:
                    problems.append(f"up block {i}: {channels} channels reach a conv_in of {block.cin} → {block.cout} "
                                    f"with upsample_factor {block.factor} (diffusers' decoder cannot run it)")
                if plan.timestep_conditioning or block.inject_noise:
                    problems.append(f"up block {i}: a conv_in ({block.cin} → {block.cout}) in a decoder that is "
                                    "timestep-conditioned or injects noise (diffusers cannot run it)")
                channels = block.cout
            if block.stride:
                packed = block.stride[0] * block.stride[1] ** 2
                if channels != block.cout * block.factor or channels % packed or (channels * packed) % block.factor:
                    problems.append(f"up block {i}: {channels} channels do not rearrange by {block.stride} into "
                                    f"{block.cout} (upsample_factor {block.factor})")
                channels = block.cout
            elif channels != block.cout:
                problems.append(f"up block {i}: {channels} channels reach resnets of {block.cout}")
        given = (self.spatial_compression_ratio, self.temporal_compression_ratio)
        if given[0] not in (None, self.spatial_scale) or given[1] not in (None, self.temporal_scale):
            problems.append(f"spatial/temporal_compression_ratio={given[0]}/{given[1]}; the decoder's upsamplers "
                            f"give {self.spatial_scale}/{self.temporal_scale}")
        if plan.edge not in ("zero", "reflect"):
            problems.append("the decoder's spatial padding must be 'zeros' or 'reflect'")
        if self.statistics and any(len(v) != self.latent_channels for v in self.statistics):
            problems.append("latents_mean/latents_std must have latent_channels values")
        return problems

    def validate(self) -> None:
        problems = self._own_problems() + self._plan_problems()
        if problems:
            raise ConfigError(f"unsupported {self.class_name} config: " + "; ".join(problems))

    def _own_problems(self) -> list[str]:
        return []

    def encoder_problems(self) -> list[str]:
        """Why this config's encoder cannot run (empty when it can); the decoder may still run."""
        plan, problems = self.encoder_plan(), []
        if not getattr(self, "encoder_causal", True):
            problems.append("encoder_causal=False: the encoder runs causal configs only")
        scale, frames = plan.patch, 1
        for i, block in enumerate(plan.down_blocks):
            if block.kind not in (None, *STRIDES):
                problems.append(f"down block {i}: downsample_type {block.kind!r}; expected one of {sorted(STRIDES)}")
                continue
            if block.stride is not None:
                st, ss = block.stride
                scale, frames = scale * ss, frames * st
                if block.kind != "conv" and (block.cin * st * ss * ss) % block.cout or block.cout % (st * ss * ss):
                    problems.append(f"down block {i}: {block.cin} channels do not pack into {block.cout}")
        if (scale, frames) != (self.spatial_scale, self.temporal_scale):
            problems.append(f"the encoder scales by {scale}x{frames} (space x time), the decoder by "
                            f"{self.spatial_scale}x{self.temporal_scale}")
        return problems

    # -- (de)serialisation ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A diffusers ``config.json`` body (the statistics are tensors, not config keys)."""
        return {key: value for key, value in config_to_dict(self).items() if key != "statistics"}


_TUPLE_FIELDS = ("block_out_channels", "down_block_types", "decoder_block_out_channels", "layers_per_block",
                 "decoder_layers_per_block", "spatio_temporal_scaling", "decoder_spatio_temporal_scaling",
                 "decoder_inject_noise", "downsample_type", "upsample_type", "upsample_residual", "upsample_factor")


def _freeze(config) -> None:
    for name in _TUPLE_FIELDS:
        if hasattr(config, name) and isinstance(getattr(config, name), list):
            object.__setattr__(config, name, tuple(getattr(config, name)))


@dataclasses.dataclass(frozen=True)
class LTXVideoConfig(_LTXConfig):
    """Every ``AutoencoderKLLTXVideo`` config key; the defaults are diffusers' (LTX-Video 0.9.0).
    ``LTXVideoConfig.v095()`` is the real 0.9.5 – 0.9.8 VAE (timestep-conditioned decoder)."""

    family: ClassVar[str] = "ltx-video"
    class_name: ClassVar[str] = "AutoencoderKLLTXVideo"
    is_image: ClassVar[bool] = False
    takes_one_frame_clips: ClassVar[bool] = False

    in_channels: int = 3
    out_channels: int = 3
    latent_channels: int = 128
    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    down_block_types: tuple[str, ...] = ("LTXVideoDownBlock3D",) * 4
    decoder_block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    layers_per_block: tuple[int, ...] = (4, 3, 3, 3, 4)
    decoder_layers_per_block: tuple[int, ...] = (4, 3, 3, 3, 4)
    spatio_temporal_scaling: tuple[bool, ...] = (True, True, True, False)
    decoder_spatio_temporal_scaling: tuple[bool, ...] = (True, True, True, False)
    decoder_inject_noise: tuple[bool, ...] = (False, False, False, False, False)
    downsample_type: tuple[str, ...] = ("conv", "conv", "conv", "conv")
    upsample_residual: tuple[bool, ...] = (False, False, False, False)
    upsample_factor: tuple[int, ...] = (1, 1, 1, 1)
    timestep_conditioning: bool = False
    patch_size: int = 4
    patch_size_t: int = 1
    resnet_norm_eps: float = 1e-6
    scaling_factor: float = 1.0
    encoder_causal: bool = True
    decoder_causal: bool = False
    spatial_compression_ratio: int | None = None
    temporal_compression_ratio: int | None = None
    statistics: tuple[tuple[float, ...], tuple[float, ...]] | None = None

    def __post_init__(self) -> None:
        _freeze(self)
        self.validate()

    @classmethod
    def v091(cls, **overrides: Any) -> LTXVideoConfig:
        """The real LTX-Video 0.9.1 VAE: timestep-conditioned decoder that injects noise."""
        real = dict(decoder_block_out_channels=(256, 512, 1024), decoder_layers_per_block=(5, 6, 7, 8),
                    decoder_spatio_temporal_scaling=(True, True, True), decoder_inject_noise=(True, True, True, False),
                    upsample_residual=(True, True, True), upsample_factor=(2, 2, 2), timestep_conditioning=True)
        return cls(**{**real, **overrides})

    @classmethod
    def v095(cls, **overrides: Any) -> LTXVideoConfig:
        """The real LTX-Video 0.9.5 / 0.9.7 / 0.9.8 VAE."""
        real = dict(block_out_channels=(128, 256, 512, 1024, 2048), down_block_types=("LTXVideo095DownBlock3D",) * 4,
                    decoder_block_out_channels=(256, 512, 1024), layers_per_block=(4, 6, 6, 2, 2),
                    decoder_layers_per_block=(5, 5, 5, 5), spatio_temporal_scaling=(True, True, True, True),
                    decoder_spatio_temporal_scaling=(True, True, True), decoder_inject_noise=(False,) * 4,
                    downsample_type=("spatial", "temporal", "spatiotemporal", "spatiotemporal"),
                    upsample_residual=(True, True, True), upsample_factor=(2, 2, 2), timestep_conditioning=True,
                    spatial_compression_ratio=32, temporal_compression_ratio=8)
        return cls(**{**real, **overrides})

    def decoder_plan(self) -> DecoderPlan:
        widths = tuple(reversed(self.decoder_block_out_channels))
        return _decoder_plan(
            self.latent_channels, widths, tuple(reversed(self.decoder_layers_per_block)),
            tuple(reversed(self.decoder_spatio_temporal_scaling)), ("spatiotemporal",) * len(widths),
            tuple(reversed(self.decoder_inject_noise)), tuple(reversed(self.upsample_residual)),
            tuple(reversed(self.upsample_factor)), patch=self.patch_size, causal=self.decoder_causal, edge="zero",
            timestep_conditioning=self.timestep_conditioning, conv_shortcut_wrapped=True)

    def encoder_plan(self) -> EncoderPlan:
        dims, blocks = self.block_out_channels, []
        ltx095 = self.down_block_types[-1] == "LTXVideo095DownBlock3D"
        count = len(dims) - (1 if ltx095 else 0)
        cout = dims[0]
        for i in range(count):
            cin = cout
            cout = dims[i + 1] if ltx095 or i + 1 < count else dims[i]
            kind = (self.downsample_type[i] if ltx095 else "conv") if self.spatio_temporal_scaling[i] else None
            blocks.append(DownBlockPlan(cin, cout, self.layers_per_block[i], kind, STRIDES.get(kind or "")))
        return EncoderPlan(dims[0], tuple(blocks), cout, self.layers_per_block[-1], self.latent_channels,
                           self.patch_size, "zero")

    def _own_problems(self) -> list[str]:
        problems = []
        blocks = len(self.decoder_block_out_channels)
        for name, want in (("decoder_layers_per_block", blocks + 1), ("decoder_spatio_temporal_scaling", blocks),
                           ("decoder_inject_noise", blocks + 1), ("upsample_residual", blocks),
                           ("upsample_factor", blocks)):
            if len(getattr(self, name)) < want:
                problems.append(f"{name} has {len(getattr(self, name))} entries; expected {want}")
        kinds = set(self.down_block_types)
        if not kinds <= {"LTXVideoDownBlock3D", "LTXVideo095DownBlock3D"}:
            problems.append(f"down_block_types={list(self.down_block_types)}")
        return problems

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> LTXVideoConfig:
        return config_fields_from_dict(cls, raw)


@dataclasses.dataclass(frozen=True)
class LTX2VideoConfig(_LTXConfig):
    """Every ``AutoencoderKLLTX2Video`` config key; the defaults are diffusers' (LTX-2 with a causal
    decoder). ``LTX2VideoConfig.ltx2()`` is the real LTX-2 (2.0) VAE (reflect padding, a decoder
    that sees one frame ahead), ``.ltx23()`` the real LTX-2.3 / 2.5 one (zero padding, five levels)."""

    family: ClassVar[str] = "ltx2"
    class_name: ClassVar[str] = "AutoencoderKLLTX2Video"
    is_image: ClassVar[bool] = False
    takes_one_frame_clips: ClassVar[bool] = False
    noise_before_denormalize: ClassVar[bool] = True  # LTX-2 pipelines mix decode noise into normalized latents

    in_channels: int = 3
    out_channels: int = 3
    latent_channels: int = 128
    block_out_channels: tuple[int, ...] = (256, 512, 1024, 2048)
    down_block_types: tuple[str, ...] = ("LTX2VideoDownBlock3D",) * 4
    decoder_block_out_channels: tuple[int, ...] = (256, 512, 1024)
    layers_per_block: tuple[int, ...] = (4, 6, 6, 2, 2)
    decoder_layers_per_block: tuple[int, ...] = (5, 5, 5, 5)
    spatio_temporal_scaling: tuple[bool, ...] | bool = (True, True, True, True)
    decoder_spatio_temporal_scaling: tuple[bool, ...] | bool = (True, True, True)
    decoder_inject_noise: tuple[bool, ...] | bool = (False, False, False, False)
    downsample_type: tuple[str, ...] = ("spatial", "temporal", "spatiotemporal", "spatiotemporal")
    upsample_type: tuple[str, ...] = ("spatiotemporal", "spatiotemporal", "spatiotemporal")
    upsample_residual: tuple[bool, ...] | bool = (True, True, True)
    upsample_factor: tuple[int, ...] = (2, 2, 2)
    timestep_conditioning: bool = False
    patch_size: int = 4
    patch_size_t: int = 1
    resnet_norm_eps: float = 1e-6
    scaling_factor: float = 1.0
    encoder_causal: bool = True
    decoder_causal: bool = True
    encoder_spatial_padding_mode: str = "zeros"
    decoder_spatial_padding_mode: str = "reflect"
    spatial_compression_ratio: int | None = None
    temporal_compression_ratio: int | None = None
    statistics: tuple[tuple[float, ...], tuple[float, ...]] | None = None

    def __post_init__(self) -> None:
        _freeze(self)
        self.validate()

    @classmethod
    def ltx2(cls, **overrides: Any) -> LTX2VideoConfig:
        """The real LTX-2 (2.0) VAE (``Lightricks/LTX-2``)."""
        return cls(**{**dict(decoder_causal=False, spatial_compression_ratio=32, temporal_compression_ratio=8),
                      **overrides})

    @classmethod
    def ltx23(cls, **overrides: Any) -> LTX2VideoConfig:
        """The real LTX-2.3 / 2.5 VAE (``Lightricks/LTX-2.3``)."""
        real = dict(block_out_channels=(256, 512, 1024, 1024), decoder_block_out_channels=(256, 512, 512, 1024),
                    layers_per_block=(4, 6, 4, 2, 2), decoder_layers_per_block=(4, 6, 4, 2, 2),
                    decoder_spatio_temporal_scaling=(True, True, True, True), decoder_inject_noise=(False,) * 5,
                    upsample_type=("spatiotemporal", "spatiotemporal", "temporal", "spatial"),
                    upsample_residual=(False,) * 4, upsample_factor=(2, 2, 1, 2), decoder_causal=False,
                    decoder_spatial_padding_mode="zeros", spatial_compression_ratio=32, temporal_compression_ratio=8)
        return cls(**{**real, **overrides})

    def decoder_plan(self) -> DecoderPlan:
        widths = tuple(reversed(self.decoder_block_out_channels))
        levels = len(self.decoder_layers_per_block)
        return _decoder_plan(
            self.latent_channels, widths, tuple(reversed(self.decoder_layers_per_block)),
            tuple(reversed(_tuple(self.decoder_spatio_temporal_scaling, levels - 1))), self.upsample_type,
            tuple(reversed(_tuple(self.decoder_inject_noise, levels))),
            tuple(reversed(_tuple(self.upsample_residual, levels - 1))), tuple(reversed(self.upsample_factor)),
            patch=self.patch_size, causal=self.decoder_causal, edge=_edge(self.decoder_spatial_padding_mode) or "?",
            timestep_conditioning=self.timestep_conditioning, conv_shortcut_wrapped=False)

    def encoder_plan(self) -> EncoderPlan:
        scaling = _tuple(self.spatio_temporal_scaling, len(self.layers_per_block) - 1)
        blocks, cout = [], self.latent_channels
        for i, width in enumerate(self.block_out_channels):
            cin, cout = cout, width
            kind = self.downsample_type[i] if scaling[i] else None
            blocks.append(DownBlockPlan(cin, cout, self.layers_per_block[i], kind, STRIDES.get(kind or "")))
        return EncoderPlan(self.latent_channels, tuple(blocks), cout, self.layers_per_block[-1], self.latent_channels,
                           self.patch_size, _edge(self.encoder_spatial_padding_mode) or "?")

    def _own_problems(self) -> list[str]:
        problems = []
        levels = len(self.decoder_layers_per_block)
        if len(self.decoder_block_out_channels) != levels - 1:
            problems.append(f"decoder_block_out_channels has {len(self.decoder_block_out_channels)} entries; "
                            f"expected len(decoder_layers_per_block) − 1 = {levels - 1}")
        for name in ("upsample_type", "upsample_factor"):
            if len(getattr(self, name)) < levels - 1:
                problems.append(f"{name} has {len(getattr(self, name))} entries; expected {levels - 1}")
        if any(kind not in STRIDES or kind == "conv" for kind in self.upsample_type):
            problems.append(f"upsample_type={list(self.upsample_type)}; expected spatial, temporal or spatiotemporal")
        if set(self.down_block_types) != {"LTX2VideoDownBlock3D"}:
            problems.append(f"down_block_types={list(self.down_block_types)}")
        for name in ("encoder_spatial_padding_mode", "decoder_spatial_padding_mode"):
            if _edge(getattr(self, name)) is None:
                problems.append(f"{name}={getattr(self, name)!r}; expected 'zeros' or 'reflect'")
        return problems

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> LTX2VideoConfig:
        return config_fields_from_dict(cls, raw)


def _decoder_plan(latent_channels: int, widths: tuple[int, ...], layers: tuple[int, ...], scaling: tuple[bool, ...],
                  kinds: tuple[str, ...], noise: tuple[bool, ...], residual: tuple[bool, ...],
                  factors: tuple[int, ...], **head: Any) -> DecoderPlan:
    """diffusers' decoder loop: block ``i`` runs from ``width[i−1] / factor[i]`` to ``width[i] / factor[i]``
    (the running width is the divided one) on the reversed per-block lists."""
    blocks, width = [], widths[0]
    for i, target in enumerate(widths):
        cin, width = width // factors[i], target // factors[i]
        stride = STRIDES[kinds[i]] if scaling[i] else None
        blocks.append(UpBlockPlan(cin, width, layers[i + 1], stride, bool(residual[i]), factors[i], bool(noise[i + 1])))
    return DecoderPlan(latent_channels, widths[0], layers[0], bool(noise[0]), tuple(blocks), **head)
