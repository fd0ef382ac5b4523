"""MiniMax-H3's video VAE configuration (diffusers' ``AutoencoderKLMiniMaxH3``), read from (and
written to) a diffusers ``config.json``, with the geometry of its released decode: the temporal
chunks its encoder's clips leave behind and the spatial tiles it ships with. No JAX here.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

from vaeserve.models.config import ConfigError, config_fields_from_dict, config_to_dict

# diffusers keeps the tile geometry on the model, not in config.json (``enable_tiling``'s arguments,
# in its order), and knows nothing of how many tiles run at once (``STEP_FIELDS``): these fields are
# read from a config dict when present and never written back, so a saved folder loads in diffusers
# unchanged.
TILING_FIELDS = ("tile_sample_min_height", "tile_sample_min_width", "tile_sample_min_overlap_height",
                 "tile_sample_min_overlap_width")
STEP_FIELDS = ("tiles_per_step",)
# The decoder's pixels are ImageNet-normalised over [0, 1] (diffusers' class docstring).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _problems(config: AutoencoderKLMiniMaxH3Config) -> list[str]:
    problems = []
    levels = len(config.block_out_channels)
    for name in ("spatial_downsample_factors", "temporal_downsample_factors"):
        factors = getattr(config, name)
        if len(factors) != levels or any(f not in (1, 2) for f in factors):
            problems.append(f"{name}={list(factors)}; expected {levels} factors of 1 or 2")
    if any(t > 1 and s == 1 for s, t in zip(config.spatial_downsample_factors, config.temporal_downsample_factors,
                                             strict=False)):
        problems.append("a temporal-only downsample (spatial factor 1, temporal 2) is not implemented")
    if any(c % config.norm_num_groups for c in config.block_out_channels):
        problems.append(f"norm_num_groups={config.norm_num_groups} must divide every width {list(config.block_out_channels)}")
    if config.spatial_padding_mode not in ("reflect", "replicate", "constant"):
        problems.append(f"spatial_padding_mode={config.spatial_padding_mode!r}; expected 'reflect'")
    if config.rope_dim % 6 or config.rope_dim > config.decoder_attention_head_dim:
        problems.append(f"decoder_attention_head_dim · decoder_rope_dim_ratio = {config.rope_dim}; expected a "
                        "multiple of 6 (two per axis) within the head")
    if len(config.latents_mean) != config.latent_channels or len(config.latents_std) != config.latent_channels:
        problems.append(f"latents_mean/latents_std have {len(config.latents_mean)}/{len(config.latents_std)} values; "
                        f"expected latent_channels = {config.latent_channels}")
    if not 0 <= config.token_drop < config.tokens_chunk_size:
        problems.append(f"token_drop={config.token_drop}; expected 0 ≤ token_drop < {config.tokens_chunk_size}")
    s = config.spatial_scale
    for size, overlap in ((config.tile_sample_min_height, config.tile_sample_min_overlap_height),
                          (config.tile_sample_min_width, config.tile_sample_min_overlap_width)):
        if size % s or overlap % s or not 0 < overlap < size:
            problems.append(f"tile {size} with overlap {overlap}; expected multiples of {s}, 0 < overlap < tile")
    if config.tiles_per_step < 1:
        problems.append(f"tiles_per_step={config.tiles_per_step}; expected ≥ 1")
    return problems


@dataclasses.dataclass(frozen=True)
class AutoencoderKLMiniMaxH3Config:
    """Every ``AutoencoderKLMiniMaxH3`` config key, with diffusers' defaults (the released
    architecture; the release's ``latents_mean``/``latents_std`` are its pipeline's statistics), and
    the tile geometry of its released decode (``tile_sample_min_*``: 256-pixel tiles, at least
    64 pixels of overlap; diffusers' ``enable_tiling`` arguments) and the tiles each device runs at
    once (``tiles_per_step``: a bound on the attention's memory, a released tile being 1,797 tokens
    of 2,048 channels; the frames are the same whatever it is). A server sets these three from its
    settings (``with_tiling``).

    Encoder: a causal 3-D CNN (``block_out_channels`` levels, ``layers_per_block`` resnets each,
    per-level downsample factors: 16x spatial, 4x temporal), GroupNorm per frame. Decoder: a ViT over
    every latent voxel (``decoder_*``: 36 blocks of 32 heads of 64), each token expanded to a
    ``temporal_scale x spatial_scale²`` pixel block. The encoder takes ``clip_length``-frame clips and
    drops the last ``token_drop`` latent frames; the decode mirrors that in chunks (``tokens_chunk_size``,
    ``token_overlap``, ``frame_pre_padding``, ``frame_overlap``).
    """

    family: ClassVar[str] = "minimax-h3"
    class_name: ClassVar[str] = "AutoencoderKLMiniMaxH3"
    causal: ClassVar[bool] = False  # the ViT attends over a whole chunk
    is_image: ClassVar[bool] = False
    takes_one_frame_clips: ClassVar[bool] = False
    lookahead: ClassVar[int | None] = None
    min_latent_size: ClassVar[int] = 1
    decode_conditions: ClassVar[bool] = False
    # The shape rules' (``models.shapes.encode_frame_step``): the released encode takes any number
    # of frames (it pads the last clip with copies of its last frame).
    encode_frame_step: ClassVar[int] = 1

    in_channels: int = 3
    out_channels: int = 3
    latent_channels: int = 24
    block_out_channels: tuple[int, ...] = (128, 256, 256, 512, 512, 1024)
    layers_per_block: int = 2
    spatial_downsample_factors: tuple[int, ...] = (2, 2, 2, 2, 1, 1)
    temporal_downsample_factors: tuple[int, ...] = (1, 2, 2, 1, 1, 1)
    norm_num_groups: int = 32
    norm_eps: float = 1e-6
    spatial_padding_mode: str = "reflect"
    decoder_num_layers: int = 36
    decoder_num_attention_heads: int = 32
    decoder_attention_head_dim: int = 64
    decoder_num_register_tokens: int = 4
    decoder_ffn_mult: int = 4
    decoder_rope_theta: float = 100.0
    decoder_rope_dim_ratio: float = 0.75
    decoder_norm_eps: float = 1e-5
    clip_length: int = 17
    token_drop: int = 3
    latents_mean: tuple[float, ...] = (0.0,) * 24
    latents_std: tuple[float, ...] = (1.0,) * 24
    tile_sample_min_height: int = 256
    tile_sample_min_width: int = 256
    tile_sample_min_overlap_height: int = 64
    tile_sample_min_overlap_width: int = 64
    tiles_per_step: int = 4

    def __post_init__(self) -> None:
        for name in ("block_out_channels", "spatial_downsample_factors", "temporal_downsample_factors",
                     "latents_mean", "latents_std"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if problems := _problems(self):
            raise ConfigError(f"unsupported {self.class_name} config: " + "; ".join(problems))

    @classmethod
    def tiny(cls, **overrides: Any) -> AutoencoderKLMiniMaxH3Config:
        """A few-channel model of the same layers (4x spatial, 4x temporal; 16-pixel tiles with
        4 pixels of overlap), for tests."""
        small = dict(latent_channels=4, block_out_channels=(4, 8), layers_per_block=1,
                     spatial_downsample_factors=(2, 2), temporal_downsample_factors=(2, 2), norm_num_groups=2,
                     decoder_num_layers=2, decoder_num_attention_heads=2, decoder_attention_head_dim=8,
                     decoder_num_register_tokens=2, decoder_ffn_mult=2, latents_mean=(0.0,) * 4,
                     latents_std=(1.0,) * 4, tile_sample_min_height=16, tile_sample_min_width=16,
                     tile_sample_min_overlap_height=4, tile_sample_min_overlap_width=4)
        return cls(**{**small, **overrides})

    def with_tiling(self, *, size: int | None = None, overlap: int | None = None,
                    per_step: int | None = None) -> AutoencoderKLMiniMaxH3Config:
        """This config with square ``size``-pixel tiles overlapping by at least ``overlap`` pixels,
        ``per_step`` of them at once on each device (None: as it is); ``ConfigError`` for a
        geometry the decode cannot run (sizes not multiples of the spatial scale, overlap ≥ tile)."""
        changes: dict[str, Any] = {**({"tile_sample_min_height": size, "tile_sample_min_width": size} if size else {}),
                   **({"tile_sample_min_overlap_height": overlap, "tile_sample_min_overlap_width": overlap}
                      if overlap else {}),
                   **({"tiles_per_step": per_step} if per_step else {})}
        return dataclasses.replace(self, **changes)

    # -- what every config answers (models.config.VAEConfig) -----------------------------------
    @property
    def z_dim(self) -> int:
        return self.latent_channels

    @property
    def frame_channels(self) -> int:
        return self.in_channels

    @property
    def spatial_scale(self) -> int:
        return math.prod(self.spatial_downsample_factors)

    @property
    def temporal_scale(self) -> int:
        return math.prod(self.temporal_downsample_factors)

    def num_output_frames(self, latent_frames: int) -> int:
        """Frames of the released decode of ``latent_frames`` (``17n + 5`` for ``5n + 2``)."""
        chunks = self.decode_chunks(latent_frames)
        return self.chunk_frames * chunks + (self.frame_overlap if self.token_drop else 0) \
            - self.padding_frames(latent_frames)

    # -- the decoder ---------------------------------------------------------------------------
    @property
    def decoder_dim(self) -> int:
        return self.decoder_num_attention_heads * self.decoder_attention_head_dim

    @property
    def rope_dim(self) -> int:
        """Channels of each head that the 3-axis RoPE rotates."""
        return int(self.decoder_attention_head_dim * self.decoder_rope_dim_ratio)

    # -- the temporal chunks of the released decode (diffusers' derived geometry) ---------------
    @property
    def frame_pre_padding(self) -> int:
        """Leading frames of a decoded chunk that no clip frame stands for (``clip_length`` is no
        multiple of the temporal scale)."""
        return (-self.clip_length) % self.temporal_scale

    @property
    def tokens_chunk_size(self) -> int:
        """Latent frames per encoded clip, before ``token_drop``."""
        return math.ceil(self.clip_length / self.temporal_scale)

    @property
    def token_overlap(self) -> int:
        """Latent frames a decoded chunk reads beyond its own (0 without ``token_drop``)."""
        return (-self.token_drop) % self.tokens_chunk_size

    @property
    def frame_overlap(self) -> int:
        """Frames two consecutive chunks share, cross-faded."""
        return max(self.token_overlap * self.temporal_scale - self.frame_pre_padding, 0)

    @property
    def chunk_latent_frames(self) -> int:
        """Latent frames of every chunk the ViT decodes."""
        return self.tokens_chunk_size + self.token_overlap

    @property
    def chunk_frames(self) -> int:
        """Frames each chunk contributes before the next one's cross-fade."""
        return self.tokens_chunk_size * self.temporal_scale - self.frame_pre_padding

    @property
    def min_latent_frames(self) -> int:
        """The fewest latent frames the released decode takes: one whole chunk (3 as released;
        ``models.shapes.min_latent_frames``)."""
        return next(t for t in range(1, self.tokens_chunk_size + 1) if self.decode_chunks(t) >= 1)

    def padding_latent_frames(self, latent_frames: int) -> int:
        """Copies of the last latent frame appended to make whole chunks."""
        return (-(latent_frames + self.token_drop)) % self.tokens_chunk_size

    def decode_chunks(self, latent_frames: int) -> int:
        """Chunks the released decode of ``latent_frames`` runs (at least 3 latent frames give one)."""
        tokens = latent_frames + self.token_drop + self.padding_latent_frames(latent_frames)
        return tokens // self.tokens_chunk_size - int(self.token_drop > 0)

    def padding_frames(self, latent_frames: int) -> int:
        """Trailing decoded frames that the appended latent frames stand for, cut off again: a
        chunk's last latent frame covers ``clip_length mod temporal_scale`` frames, the others
        ``temporal_scale``."""
        tail = self.clip_length % self.temporal_scale
        return sum(tail if tail and (latent_frames + k) % self.tokens_chunk_size == 0 else self.temporal_scale
                   for k in range(self.padding_latent_frames(latent_frames)))

    def encoded_latent_frames(self, frames: int) -> int:
        """Latent frames of the encode of ``frames`` (one frame: one; else whole clips, the last
        padded with copies of the last frame, less ``token_drop``)."""
        if frames == 1:
            return 1
        return math.ceil(frames / self.clip_length) * self.tokens_chunk_size - self.token_drop

    # -- (de)serialisation ---------------------------------------------------------------------
    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> AutoencoderKLMiniMaxH3Config:
        return config_fields_from_dict(cls, raw)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in config_to_dict(self).items() if k not in TILING_FIELDS + STEP_FIELDS}
