"""MiniMax-H3's served programs: its released decode and encode (``decode.py``) in the generic
programs' layouts and pixel space, so the single-device path (``VAE``) and the mesh path
(``sharding``) call them as they call the frame-stepped families' (``models.family_modules.family_programs``).

Latents ``(B, z, T, h, w)`` NCTHW in; frames out as every family gives them (``models.decode.finish_frames``):
float32 ``(B, 3, F, H, W)`` in [-1, 1] or uint8 ``(B, F, H, W, 3)``. The decoder's pixels are
ImageNet-normalised: they are taken to [0, 1] and clamped (``to_unit_range``, what H3's pipeline
does) and from there to [-1, 1], the service's float range; the encoder takes frames in [-1, 1]
back to its space (``from_unit_range``). On a mesh, every tile of every chunk is one batch spread
over the given axes (``parallel.spread_over``), ``config.tiles_per_step`` tiles at a time on each
device. The tile geometry and the tiles per step are the config's (a server sets them from its
settings): a VAE's programs are cached per VAE, so each geometry has programs of its own.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from vaeserve.models.decode import denormalize_latents, finish_frames, nonfinite_count
from vaeserve.models.encode import PosteriorOptions, latents_from_moments
from vaeserve.models.shapes import Output

from .config import AutoencoderKLMiniMaxH3Config
from .decode import RunTiles, chunk_pieces, decode, decode_clips, encode, from_unit_range, in_steps, to_unit_range
from .geometry import frame_tiles
from .parallel import spread_over


def tile_runner(module: nnx.Module, config: AutoencoderKLMiniMaxH3Config, mesh: Mesh,
                axes: tuple[str, ...]) -> RunTiles:
    """``module`` over a batch of tiles, ``config.tiles_per_step`` at a time, spread over ``mesh``'s
    ``axes`` (one device: a 1x1 mesh)."""
    return spread_over(in_steps(module, config.tiles_per_step), mesh, axes)


def _served_frames(frames: jax.Array, output: Output) -> jax.Array:
    """ImageNet-normalised frames ``(B, F, H, W, 3)`` → the service's: clamped to [0, 1], then
    float32 NCTHW in [-1, 1] or uint8 NTHWC (``models.decode.finish_frames``)."""
    finished = finish_frames(2.0 * to_unit_range(frames) - 1.0, output)
    return jnp.moveaxis(finished, -1, 1) if output == "float" else finished


def decode_program(graphdef, config: AutoencoderKLMiniMaxH3Config, dtype, *, denormalize: bool, output: Output,
                   mesh: Mesh, axes: tuple[str, ...]):
    """``(state, latents NCTHW) → (frames, (B,) non-finite count)``: the released decode (tiled,
    chunked), the count read on the decoder's own pixels before they are clamped."""

    def run(state, latents: jax.Array) -> tuple[jax.Array, jax.Array]:
        decoder = tile_runner(nnx.merge(graphdef, state), config, mesh, axes)
        frames = decode(decoder, _channels_last(latents, config, dtype, denormalize=denormalize), config)
        return _served_frames(frames, output), nonfinite_count(frames)

    return run


def _channels_last(latents: jax.Array, config: AutoencoderKLMiniMaxH3Config, dtype, *,
                   denormalize: bool) -> jax.Array:
    z = jnp.moveaxis(jnp.asarray(latents, jnp.float32), 1, -1)
    return (denormalize_latents(z, config) if denormalize else z).astype(dtype)


def chunk_program(graphdef, config: AutoencoderKLMiniMaxH3Config, dtype, *, first: bool, denormalize: bool,
                  output: Output, mesh: Mesh, axes: tuple[str, ...]):
    """One chunk of a streamed decode: ``(state, chunk NCTHW (B, z, chunk_latent_frames, h, w)[,
    ahead]) → (piece, ahead, ahead's frames, (B,) non-finite count)``. ``ahead``: the previous
    chunk's read-ahead frames (float32, ImageNet-normalised, ``(B, f, H, W, 3)``), absent for the
    ``first``; the piece and the ahead's frames come as ``output``. The pieces in order, then the
    last chunk's ahead frames, are the whole decode's frames before the padding frames are cut
    (``config.padding_frames``)."""

    def run(state, latents: jax.Array, ahead: jax.Array | None = None):
        decoder = tile_runner(nnx.merge(graphdef, state), config, mesh, axes)
        frames = decode_clips(decoder, _channels_last(latents, config, dtype, denormalize=denormalize), config)
        piece, ahead = chunk_pieces(frames, ahead, config)
        return _served_frames(piece, output), ahead, _served_frames(ahead, output), nonfinite_count(frames)

    if first:
        return lambda state, latents: run(state, latents)
    return run


def chunk_latents(latents: np.ndarray, config: AutoencoderKLMiniMaxH3Config) -> list[np.ndarray]:
    """Host latents NCTHW ``(B, z, T, h, w)`` → each chunk a streamed decode runs, ``(B, z,
    chunk_latent_frames, h, w)``, cut as ``decode.cut_chunks`` cuts them (the last latent frame
    repeated to make whole chunks)."""
    t = latents.shape[2]
    padded = np.concatenate([latents, np.repeat(latents[:, :, -1:], config.padding_latent_frames(t), axis=2)], axis=2)
    size = config.tokens_chunk_size
    return [padded[:, :, i * size: i * size + config.chunk_latent_frames] for i in range(config.decode_chunks(t))]


def chunk_shapes(shape: tuple[int, ...], config: AutoencoderKLMiniMaxH3Config) -> list[tuple[int, ...]]:
    """The shape of each chunk ``chunk_latents`` cuts from latents ``shape`` ``(B, z, T, h, w)``."""
    return [(*shape[:2], config.chunk_latent_frames, *shape[3:])] * config.decode_chunks(shape[2])


def ahead_shape(shape: tuple[int, ...], config: AutoencoderKLMiniMaxH3Config) -> tuple[int, ...]:
    """The read-ahead frames ``(B, frame_overlap, sH, sW, 3)`` a chunk of latents ``shape`` hands the next."""
    s = config.spatial_scale
    return (shape[0], config.frame_overlap, s * shape[3], s * shape[4], 3)


def work_pieces(shape: tuple[int, ...], config: AutoencoderKLMiniMaxH3Config) -> int:
    """The tiles of every chunk of every video the decode of latents ``shape`` ``(B, z, T, h, w)``
    runs: the batch ``spread_over`` shares among a mesh's devices."""
    s = config.spatial_scale
    rows, columns = frame_tiles(s * shape[3], s * shape[4], config)
    return shape[0] * config.decode_chunks(shape[2]) * len(rows.starts) * len(columns.starts)


def encode_program(graphdef, config: AutoencoderKLMiniMaxH3Config, dtype, *, mesh: Mesh, axes: tuple[str, ...]):
    """``(state, frames NCTHW in [-1, 1], options) → latents (B, z, T, H/s, W/s)``: the released
    encode (one frame alone, or ``clip_length``-frame clips less ``token_drop`` latent frames), then
    the posterior ``options`` ask for (``models.encode.latents_from_moments``)."""

    def run(state, frames: jax.Array, options: PosteriorOptions) -> jax.Array:
        x = from_unit_range((jnp.moveaxis(jnp.asarray(frames, jnp.float32), 1, -1) + 1.0) / 2.0)
        encoder = tile_runner(nnx.merge(graphdef, state), config, mesh, axes)
        return latents_from_moments(encode(encoder, x.astype(dtype), config), options, config)

    return run
