"""What every VAE configuration is (``VAEConfig``), and the helpers each family's config classes
read and write a diffusers ``config.json`` with (``models.registry.config_from_dict`` finds the class
by its ``_class_name``). No JAX here: the HTTP layer reads configs too.

Every family answers the same questions (``VAEConfig``): latent channels, spatial and temporal
scale, the output frame count, the latents' normalisation, whether decoding is causal in time and
whether it makes images (no time axis at the API; a one-frame clip inside).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Protocol

from .shapes import ShapeRules

# Keys diffusers writes that carry no model information.
_BOOKKEEPING_KEYS = {"_class_name", "_diffusers_version", "_name_or_path", "_use_default_values"}


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
      decode_conditions: whether a decode takes a timestep and noise (``models.conditions.DecodeConditions``).
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



def config_fields_from_dict(cls, raw: dict[str, Any], *, dropped: frozenset[str] | set[str] = frozenset()):
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


def _as_lists(value: Any) -> Any:
    return [_as_lists(v) for v in value] if isinstance(value, tuple) else value


def config_to_dict(config) -> dict[str, Any]:
    """A diffusers ``config.json`` body: ``_class_name`` and every field (tuples, nested ones too, as
    lists)."""
    return {"_class_name": config.class_name, **{f.name: _as_lists(getattr(config, f.name))
                                                 for f in dataclasses.fields(config)}}



def exact_log2(value: int) -> int | None:
    """``log2(value)`` for a power of two ≥ 1, else None."""
    return value.bit_length() - 1 if value >= 1 and value & (value - 1) == 0 else None
