"""A family's decoder and encoder module types, as the decode and encode loops call them.

Every family's decoder and encoder are called the same way by the decode and encode loops
(``models.decode``, ``models.encode``): ``module(x, caches, ctx, *, clip_frames=…)`` → ``(y,
caches)``, with four static facts on the module: ``steps_with_caches`` (latent frame 0 first,
then chunks with the caches it returns; else the whole clip at once), ``lookahead`` (None, or for a
decoder that sees ahead the latent frames beyond frame 0 its first step takes: its frames then come
that far behind its input, and the stream runs on past the clip's end), ``needs_clip_frames`` (the
first step sizes a cache by the clip's latent frames) and ``temporal_scale`` (frames per latent
frame). A decoder whose first step needs the clip's length may take it at run time
(``runtime_clip_frames``: its first step's caches are a ``models.decode.StreamStart``, and
``clip_frames`` the longest clip its program serves), so one first-step program serves many clip
lengths. A decoder whose config takes ``decode_conditions`` also takes ``conditions=`` (timestep,
noise: ``models.conditions``). Which modules a config's family builds is its descriptor's
(``models.registry``), loaded here by their dotted paths.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any, Protocol, cast

import jax

from .config import VAEConfig
from .registry import family_of, module_types
from .spatial import SpatialContext

# A pytree of a decoder's or encoder's causal caches, as a step hands them to the next.
Caches = Any


class DecoderModule(Protocol):
    """What the decode loop needs of a family's decoder (see the module docstring)."""

    steps_with_caches: bool
    lookahead: int | None
    needs_clip_frames: bool
    runtime_clip_frames: bool
    temporal_scale: int

    def __call__(self, z: jax.Array, caches: Any, ctx: SpatialContext, *, inner_frames: int | None = None,
                 clip_frames: int | None = None, conditions: Any = None) -> tuple[jax.Array, Any]: ...


class EncoderModule(Protocol):
    """What the encode loop needs of a family's encoder."""

    steps_with_caches: bool
    needs_clip_frames: bool
    temporal_scale: int

    def __call__(self, x: jax.Array, caches: Any, ctx: SpatialContext, *,
                 clip_frames: int | None = None) -> tuple[jax.Array, Any]: ...


def _every_encoder_runs(config: Any) -> None:
    del config


@dataclasses.dataclass(frozen=True)
class FamilyModules:
    """A config's decoder and encoder module types, and the check of its encoder's config (raises
    ``ConfigError`` for a config whose decoder runs but whose encoder does not)."""

    decoder: Any  # a DecoderModule type
    encoder: Any  # an EncoderModule type
    check_encoder: Callable[[Any], None]


def family_modules(config: VAEConfig) -> FamilyModules:
    """The module types of ``config``'s family, imported now (they import JAX)."""
    family, types = family_of(config), module_types(config)
    check = family.load(types.check_encoder) if types.check_encoder else _every_encoder_runs
    return FamilyModules(family.load(types.decoder), family.load(types.encoder), check)


class FamilyPrograms(Protocol):
    """The whole programs of a family whose modules are not frame-stepped (its descriptor's
    ``ModuleTypes.programs``: MiniMax-H3's tiled ViT), built for a ``mesh`` (one device: a 1x1
    mesh): each spreads its independent pieces of work over the mesh's ``axes``.

    ``decode_program(...)(state, latents NCTHW) → (frames, (B,) non-finite count)``, frames as
    ``models.decode.full_program``'s (float32 NCTHW in [-1, 1] or uint8 NTHWC);
    ``encode_program(...)(state, frames NCTHW in [-1, 1], options) → latents NCTHW``, as
    ``sharding.compile_encode``'s."""

    def decode_program(self, graphdef: Any, config: Any, dtype: Any, *, denormalize: bool, output: Any,
                       mesh: Any, axes: tuple[str, ...]) -> Callable[..., Any]: ...

    def encode_program(self, graphdef: Any, config: Any, dtype: Any, *, mesh: Any = None,
                       axes: tuple[str, ...] = ()) -> Callable[..., Any]: ...

    # A streamed decode, a chunk at a time: ``chunk_latents(latents, config)`` cuts host latents into
    # the chunks (``chunk_shapes``: their shapes), ``chunk_program(...)(state, chunk[, ahead]) → (piece,
    # ahead, ahead's frames, (B,) count)`` decodes one (``first``: without the previous chunk's
    # ``ahead``, float32 ``ahead_shape``).
    def chunk_latents(self, latents: Any, config: Any) -> list[Any]: ...

    def chunk_shapes(self, shape: tuple[int, ...], config: Any) -> list[tuple[int, ...]]: ...

    def ahead_shape(self, shape: tuple[int, ...], config: Any) -> tuple[int, ...]: ...

    def chunk_program(self, graphdef: Any, config: Any, dtype: Any, *, first: bool, denormalize: bool, output: Any,
                      mesh: Any, axes: tuple[str, ...]) -> Callable[..., Any]: ...

    # The independent pieces of work (MiniMax-H3: the tiles of every chunk of every video) the
    # decode of latents ``shape`` spreads over a mesh's devices: what each device's share is made of.
    def work_pieces(self, shape: tuple[int, ...], config: Any) -> int: ...


def family_programs(config: VAEConfig) -> FamilyPrograms | None:
    """The family's own whole programs (imported now), or None for a family whose modules the
    generic decode and encode loops call."""
    types = module_types(config)
    if types.programs is None:
        return None
    return cast(FamilyPrograms, importlib.import_module(f"{family_of(config).package}.{types.programs}"))
