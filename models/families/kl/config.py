"""The AutoencoderKL image VAEs' configurations, read from (and written to) a diffusers
``config.json``: ``AutoencoderKL`` (Stable Diffusion 1.x/2.x, SDXL, Flux.1) and ``AutoencoderKLFlux2``.
They answer ``models.config.VAEConfig``'s questions; ``is_image`` is true: latents ``(B, C, H, W)``
in, images ``(B, 3, H, W)`` out. No JAX here.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from vaeserve.models.config import ConfigError, config_fields_from_dict, config_to_dict

# -- image VAEs ------------------------------------------------------------------------------------
KL_BLOCKS = ("DownEncoderBlock2D", "UpDecoderBlock2D")
# ``AutoencoderKL``'s ``latents_mean``/``latents_std`` keys (set by SDXL-derived checkpoints such as
# Playground v2.5) are held under these names: ``VAEConfig.latents_mean``/``latents_std`` are the
# per-channel statistics every family answers with, derived from them and the scaling factor.
_KL_RENAMES = {"latents_mean": "pipeline_latents_mean", "latents_std": "pipeline_latents_std"}


def _kl_problems(config: Any) -> list[str]:
    """What ``AutoencoderKL`` and ``AutoencoderKLFlux2`` configs must hold for our layers."""
    problems = []
    blocks = len(config.block_out_channels)
    for name, kind, count in (("down_block_types", KL_BLOCKS[0], blocks),
                              ("up_block_types", KL_BLOCKS[1], len(config.decoder_channels))):
        types = getattr(config, name)
        if len(types) != count or set(types) != {kind}:
            problems.append(f"{name}={list(types)}; expected {count} x {kind!r}")
    if len(config.decoder_channels) != blocks:
        problems.append(f"decoder_block_out_channels={list(config.decoder_channels)}; expected {blocks} blocks, as "
                        "block_out_channels (the encoder and decoder scale alike)")
    if config.act_fn not in ("silu", "swish"):
        problems.append(f"act_fn={config.act_fn!r}; expected 'silu'")
    widths = (*config.block_out_channels, *config.decoder_channels)
    if config.norm_num_groups < 1 or any(c % config.norm_num_groups for c in widths):
        problems.append(f"norm_num_groups={config.norm_num_groups} must divide every block width {sorted(set(widths))}")
    if config.layers_per_block < 1:
        problems.append(f"layers_per_block={config.layers_per_block}; expected ≥ 1")
    if config.in_channels != 3 or config.out_channels != 3:
        problems.append(f"in/out_channels={config.in_channels}/{config.out_channels}; expected 3 (RGB)")
    if config.latent_channels < 1:
        problems.append(f"latent_channels={config.latent_channels}; expected ≥ 1")
    return problems


@dataclasses.dataclass(frozen=True)
class AutoencoderKLConfig:
    """Every ``AutoencoderKL`` config key, with diffusers' defaults; ``sd()``, ``sdxl()`` and
    ``flux1()`` are the real VAEs of Stable Diffusion 1.x/2.x, SDXL and Flux.1.

    2-D convs, GroupNorm(``norm_num_groups``) whose statistics span the whole image, and one
    single-head attention over every token in the mid block; ``use_quant_conv``/``use_post_quant_conv``
    the 1x1 convs around the latents (Flux.1 has neither). A pipeline's latents ``z`` decode as
    ``z / scaling_factor + shift_factor`` (``shift_factor`` None: 0), or, when the config sets the
    per-channel ``latents_mean``/``latents_std`` (held as ``pipeline_latents_*``), as
    ``z · latents_std / scaling_factor + latents_mean``: that is ``latents_mean``/``latents_std`` here.
    ``sample_size`` and ``force_upcast`` (diffusers' tile size and float32 hint) change nothing here.
    """

    family: ClassVar[str] = "autoencoder-kl"
    class_name: ClassVar[str] = "AutoencoderKL"
    causal: ClassVar[bool] = False  # its GroupNorm statistics span the image: decoded at once
    is_image: ClassVar[bool] = True
    takes_one_frame_clips: ClassVar[bool] = False
    lookahead: ClassVar[int | None] = None
    min_latent_size: ClassVar[int] = 1
    decode_conditions: ClassVar[bool] = False

    in_channels: int = 3
    out_channels: int = 3
    down_block_types: tuple[str, ...] = (KL_BLOCKS[0],)
    up_block_types: tuple[str, ...] = (KL_BLOCKS[1],)
    block_out_channels: tuple[int, ...] = (64,)
    layers_per_block: int = 1
    act_fn: str = "silu"
    latent_channels: int = 4
    norm_num_groups: int = 32
    sample_size: int | tuple[int, ...] = 32
    scaling_factor: float = 0.18215
    shift_factor: float | None = None
    pipeline_latents_mean: tuple[float, ...] | None = None
    pipeline_latents_std: tuple[float, ...] | None = None
    force_upcast: bool = True
    use_quant_conv: bool = True
    use_post_quant_conv: bool = True
    mid_block_add_attention: bool = True

    def __post_init__(self) -> None:
        for name in ("down_block_types", "up_block_types", "block_out_channels", "pipeline_latents_mean",
                     "pipeline_latents_std", "sample_size"):
            value = getattr(self, name)
            if isinstance(value, list | tuple):
                object.__setattr__(self, name, tuple(value))
        self.validate()

    @classmethod
    def sd(cls, **overrides: Any) -> AutoencoderKLConfig:
        """The VAE of Stable Diffusion 1.x/2.x: 4 latent channels, 8x, widths (128, 256, 512, 512)."""
        real = dict(down_block_types=(KL_BLOCKS[0],) * 4, up_block_types=(KL_BLOCKS[1],) * 4,
                    block_out_channels=(128, 256, 512, 512), layers_per_block=2, sample_size=512)
        return cls(**{**real, **overrides})

    @classmethod
    def sdxl(cls, **overrides: Any) -> AutoencoderKLConfig:
        """SDXL's VAE: SD's architecture, scaling factor 0.13025."""
        return cls.sd(**{"sample_size": 1024, "scaling_factor": 0.13025, **overrides})

    @classmethod
    def flux1(cls, **overrides: Any) -> AutoencoderKLConfig:
        """Flux.1's VAE: 16 latent channels, no quant convs, ``z / 0.3611 + 0.1159``."""
        return cls.sd(**{"latent_channels": 16, "sample_size": 1024, "scaling_factor": 0.3611, "shift_factor": 0.1159,
                         "use_quant_conv": False, "use_post_quant_conv": False, **overrides})

    # -- derived -------------------------------------------------------------------------------
    @property
    def z_dim(self) -> int:
        return self.latent_channels

    @property
    def frame_channels(self) -> int:
        return self.in_channels

    @property
    def decoder_channels(self) -> tuple[int, ...]:
        """The decoder's block widths in diffusers' order (it runs them reversed)."""
        return self.block_out_channels

    @property
    def spatial_scale(self) -> int:
        return 2 ** (len(self.block_out_channels) - 1)

    @property
    def temporal_scale(self) -> int:
        return 1

    def num_output_frames(self, latent_frames: int) -> int:
        return latent_frames

    @property
    def latents_mean(self) -> tuple[float, ...]:
        if self.pipeline_latents_mean is not None:
            return self.pipeline_latents_mean
        return (float(self.shift_factor or 0.0),) * self.latent_channels

    @property
    def latents_std(self) -> tuple[float, ...]:
        if self.pipeline_latents_std is not None:
            return tuple(s / self.scaling_factor for s in self.pipeline_latents_std)
        return (1.0 / self.scaling_factor,) * self.latent_channels

    # -- checks --------------------------------------------------------------------------------
    def validate(self) -> None:
        problems = _kl_problems(self)
        if not self.scaling_factor > 0:
            problems.append(f"scaling_factor={self.scaling_factor}; expected > 0")
        stats = (self.pipeline_latents_mean, self.pipeline_latents_std)
        if (stats[0] is None) != (stats[1] is None):
            problems.append("latents_mean and latents_std: expected both or neither")
        elif stats[0] is not None and stats[1] is not None and {len(stats[0]), len(stats[1])} != {self.latent_channels}:
            problems.append(f"latents_mean/latents_std have {len(stats[0])}/{len(stats[1])} values; expected "
                            f"latent_channels = {self.latent_channels}")
        if problems:
            raise ConfigError(f"unsupported {self.class_name} config: " + "; ".join(problems))

    # -- (de)serialisation ---------------------------------------------------------------------
    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> AutoencoderKLConfig:
        return config_fields_from_dict(cls, {_KL_RENAMES.get(k, k): v for k, v in raw.items()})

    def to_dict(self) -> dict[str, Any]:
        back = {v: k for k, v in _KL_RENAMES.items()}
        return {back.get(k, k): v for k, v in config_to_dict(self).items()}


@dataclasses.dataclass(frozen=True)
class AutoencoderKLFlux2Config:
    """Every ``AutoencoderKLFlux2`` config key; the defaults (diffusers') are Flux.2's VAE: the
    ``AutoencoderKL`` layers with 32 latent channels, an optional decoder of its own widths
    (``decoder_block_out_channels``) and no scaling factor.

    Flux.2's pipelines normalize latents in their 2x2-patchified layout (``patch_size``:
    ``(B, 32·4, H/2, W/2)``) with BatchNorm running statistics that live in the checkpoint
    (``bn.running_mean``/``bn.running_var``, ``32·4`` values; kept with the weights), then
    unpatchify them: the VAE takes ``(B, 32, H, W)`` after that, so ``latents_mean``/``latents_std``
    here are 0 and 1 (``denormalize`` changes nothing).
    """

    family: ClassVar[str] = "flux2"
    class_name: ClassVar[str] = "AutoencoderKLFlux2"
    causal: ClassVar[bool] = False
    is_image: ClassVar[bool] = True
    takes_one_frame_clips: ClassVar[bool] = False
    lookahead: ClassVar[int | None] = None
    min_latent_size: ClassVar[int] = 1
    decode_conditions: ClassVar[bool] = False

    in_channels: int = 3
    out_channels: int = 3
    down_block_types: tuple[str, ...] = (KL_BLOCKS[0],) * 4
    up_block_types: tuple[str, ...] = (KL_BLOCKS[1],) * 4
    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    decoder_block_out_channels: tuple[int, ...] | None = None
    layers_per_block: int = 2
    act_fn: str = "silu"
    latent_channels: int = 32
    norm_num_groups: int = 32
    sample_size: int | tuple[int, ...] = 1024
    use_quant_conv: bool = True
    use_post_quant_conv: bool = True
    mid_block_add_attention: bool = True
    batch_norm_eps: float = 1e-4
    batch_norm_momentum: float = 0.1
    patch_size: tuple[int, ...] = (2, 2)

    def __post_init__(self) -> None:
        for name in ("down_block_types", "up_block_types", "block_out_channels", "decoder_block_out_channels",
                     "patch_size", "sample_size"):
            value = getattr(self, name)
            if isinstance(value, list | tuple):
                object.__setattr__(self, name, tuple(value))
        problems = _kl_problems(self)
        if len(self.patch_size) != 2 or min(self.patch_size) < 1:
            problems.append(f"patch_size={list(self.patch_size)}; expected two sizes ≥ 1")
        if problems:
            raise ConfigError(f"unsupported {self.class_name} config: " + "; ".join(problems))

    z_dim = AutoencoderKLConfig.z_dim
    frame_channels = AutoencoderKLConfig.frame_channels
    spatial_scale = AutoencoderKLConfig.spatial_scale
    temporal_scale = AutoencoderKLConfig.temporal_scale
    num_output_frames = AutoencoderKLConfig.num_output_frames

    @property
    def decoder_channels(self) -> tuple[int, ...]:
        return self.decoder_block_out_channels or self.block_out_channels

    @property
    def batch_norm_channels(self) -> int:
        """Channels of the pipeline's patchified latents, which the BatchNorm statistics describe."""
        return self.patch_size[0] * self.patch_size[1] * self.latent_channels

    @property
    def latents_mean(self) -> tuple[float, ...]:
        return (0.0,) * self.latent_channels

    @property
    def latents_std(self) -> tuple[float, ...]:
        return (1.0,) * self.latent_channels

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> AutoencoderKLFlux2Config:
        return config_fields_from_dict(cls, raw)

    def to_dict(self) -> dict[str, Any]:
        return config_to_dict(self)
