"""MiniMax-H3's released decode and encode (diffusers' ``AutoencoderKLMiniMaxH3._decode``/``_encode``,
tiling on as it ships), as pure functions around the modules.

Decode: the latents are cut into temporal chunks of ``chunk_latent_frames`` (``tokens_chunk_size``
of its own plus ``token_overlap`` read ahead; the last latent frame repeated to make whole
chunks), each chunk into spatial tiles whose geometry is fixed in Python at trace time
(``geometry.split_tiles``: equal tiles, overlaps widened so they cover the frame exactly). Every
tile of every chunk of every video is an independent ViT call on the same shape: they run as ONE
batch through ``run`` (which ``in_steps`` bounds in memory and ``parallel.spread_over`` spreads
over devices), then the tiles are blended linearly (``stitch_tiles``) and consecutive chunks
cross-faded (``join_chunks``). Because the ViT places tokens by coordinates normalised over its
tile, the tiled decode is the released picture; the untiled decode (``tiled=False``: one
attention over each chunk's whole frame) is a different one.

Layouts: latents ``(B, T, h, w, z)`` and frames ``(B, F, H, W, 3)`` (channels-last, ImageNet-
normalised pixels); diffusers' ``(B, C, T, H, W)`` is the caller's to transpose.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from .config import IMAGENET_MEAN, IMAGENET_STD, AutoencoderKLMiniMaxH3Config
from .geometry import Tiles, frame_tiles

H3Config = AutoencoderKLMiniMaxH3Config
# A batch of equal-shaped ViT (or encoder) calls: (N, ...) → (N, ...).
RunTiles = Callable[[jax.Array], jax.Array]


# -- pixels ----------------------------------------------------------------------------------------
def to_unit_range(frames: jax.Array) -> jax.Array:
    """Decoded frames ``(..., 3)`` from ImageNet-normalised space to [0, 1], clamped (what H3's
    pipeline does before post-processing)."""
    mean, std = jnp.asarray(IMAGENET_MEAN, jnp.float32), jnp.asarray(IMAGENET_STD, jnp.float32)
    return jnp.clip(frames.astype(jnp.float32) * std + mean, 0.0, 1.0)


def from_unit_range(frames: jax.Array) -> jax.Array:
    """Frames ``(..., 3)`` in [0, 1] to the ImageNet-normalised space the encoder takes."""
    mean, std = jnp.asarray(IMAGENET_MEAN, jnp.float32), jnp.asarray(IMAGENET_STD, jnp.float32)
    return (frames.astype(jnp.float32) - mean) / std


# -- spatial tiles ---------------------------------------------------------------------------------
def cut_tiles(x: jax.Array, rows: Tiles, columns: Tiles, scale: int) -> jax.Array:
    """``(N, T, H, W, C)`` → ``(N, rows, columns, T, size_h, size_w, C)``: the tiles of pixel
    geometry ``rows``/``columns`` on a grid ``scale`` times coarser (1: the pixels themselves)."""
    hs, ws = rows.size // scale, columns.size // scale
    return jnp.stack([jnp.stack([x[:, :, i // scale: i // scale + hs, j // scale: j // scale + ws]
                                 for j in columns.starts], axis=1) for i in rows.starts], axis=1)


def blend(a: jax.Array, b: jax.Array, extent: int, axis: int) -> jax.Array:
    """diffusers' ``_blend``: ``b`` whose first ``extent`` entries along ``axis`` fade in linearly
    from ``a``'s last ones (weight ``k / extent`` on ``b``)."""
    extent = min(a.shape[axis], b.shape[axis], extent)
    shape = [1] * a.ndim
    shape[axis] = extent
    weight = (jnp.arange(extent, dtype=b.dtype) / extent).reshape(shape)
    tail = jax.lax.slice_in_dim(a, a.shape[axis] - extent, a.shape[axis], axis=axis)
    head = jax.lax.slice_in_dim(b, 0, extent, axis=axis)
    rest = jax.lax.slice_in_dim(b, extent, b.shape[axis], axis=axis)
    return jnp.concatenate([tail * (1 - weight) + head * weight, rest], axis=axis)


def stitch_tiles(tiles: jax.Array, row_overlaps: tuple[int, ...], column_overlaps: tuple[int, ...]) -> jax.Array:
    """diffusers' ``_stitch_tiles``: ``(N, rows, columns, T, h, w, C)`` → ``(N, T, H, W, C)``. Each
    tile is blended with the unblended tile above it, then with the unblended tile to its left, and
    cut where the next one begins."""
    rows, columns = tiles.shape[1], tiles.shape[2]
    out_rows = []
    for i in range(rows):
        out_row = []
        for j in range(columns):
            tile = tiles[:, i, j]
            if i > 0:
                tile = blend(tiles[:, i - 1, j], tile, row_overlaps[i - 1], axis=2)
            if j > 0:
                tile = blend(tiles[:, i, j - 1], tile, column_overlaps[j - 1], axis=3)
            if i < rows - 1:
                tile = tile[:, :, : tile.shape[2] - row_overlaps[i]]
            if j < columns - 1:
                tile = tile[:, :, :, : tile.shape[3] - column_overlaps[j]]
            out_row.append(tile)
        out_rows.append(jnp.concatenate(out_row, axis=3))
    return jnp.concatenate(out_rows, axis=2)


# -- temporal chunks -------------------------------------------------------------------------------
def cut_chunks(z: jax.Array, config: H3Config) -> jax.Array:
    """``(B, T, h, w, z)`` → ``(B, chunks, chunk_latent_frames, h, w, z)``: the last latent frame
    repeated to make whole chunks, each chunk reading ``token_overlap`` frames of the next."""
    t = z.shape[1]
    pad = config.padding_latent_frames(t)
    z = jnp.concatenate([z, jnp.repeat(z[:, -1:], pad, axis=1)], axis=1)
    size = config.tokens_chunk_size
    return jnp.stack([z[:, i * size: i * size + config.chunk_latent_frames] for i in range(config.decode_chunks(t))],
                     axis=1)


def join_chunks(chunks: jax.Array, latent_frames: int, config: H3Config) -> jax.Array:
    """The decoded chunks ``(B, chunks, t·chunk_latent_frames, H, W, C)`` → the video ``(B, F, H, W, C)``:
    each chunk's own frames (less ``frame_pre_padding``) cross-faded over ``frame_overlap`` frames
    with the previous chunk's read-ahead frames; the last read-ahead appended; the frames the
    repeated latent frames stand for cut off."""
    own = config.tokens_chunk_size * config.temporal_scale
    pre = config.frame_pre_padding
    pieces, ahead = [], None
    for i in range(chunks.shape[1]):
        piece = chunks[:, i, pre:own]
        if ahead is not None:
            piece = blend(ahead, piece, config.frame_overlap, axis=1)
        pieces.append(piece)
        if config.token_drop > 0:
            ahead = chunks[:, i, own + pre: 2 * own]
    if ahead is not None:
        pieces.append(ahead)
    video = jnp.concatenate(pieces, axis=1)
    return video[:, : video.shape[1] - config.padding_frames(latent_frames)]


# -- the whole decode and encode ---------------------------------------------------------------------
def in_steps(run: RunTiles, per_step: int) -> RunTiles:
    """``run`` over a batch's leading axis ``per_step`` at a time (a bound on the memory of the
    attention: a real tile is 1,797 tokens), the same numbers as all at once."""

    def stepped(batch: jax.Array) -> jax.Array:
        if per_step >= batch.shape[0]:
            return run(batch)
        return jax.lax.map(lambda item: run(item[None])[0], batch, batch_size=per_step)

    return stepped


def decode(run: RunTiles, z: jax.Array, config: H3Config, *, tiled: bool = True) -> jax.Array:
    """The released decode: latents ``(B, T, h, w, z)`` (``T ≥ 3``: at least one chunk) → frames
    ``(B, config.num_output_frames(T), s·h, s·w, 3)``. ``run`` is the decoder (``H3Decoder``) on a
    batch of clips; every tile of every chunk goes through it as one batch. ``tiled=False`` decodes
    each chunk's whole frame in one attention: NOT the released picture."""
    b, t, h, w, c = z.shape
    if config.decode_chunks(t) < 1:
        raise ValueError(f"{t} latent frames make no chunk of the released decode; expected at least 3")
    chunks = cut_chunks(z, config)  # (B, K, L, h, w, z)
    k = chunks.shape[1]
    frames = decode_clips(run, chunks.reshape(b * k, *chunks.shape[2:]), config, tiled=tiled)
    return join_chunks(frames.reshape(b, k, *frames.shape[1:]), t, config)


def decode_clips(run: RunTiles, clips: jax.Array, config: H3Config, *, tiled: bool = True) -> jax.Array:
    """Chunks of latents ``(N, L, h, w, z)`` → their decoded frames ``(N, t·L, s·h, s·w, 3)``: every
    tile of every chunk one batch through ``run``, each chunk's tiles blended."""
    n, _, h, w, _ = clips.shape
    s = config.spatial_scale
    rows, columns = frame_tiles(h * s, w * s, config, tiled=tiled)
    tiles = cut_tiles(clips, rows, columns, s)  # (N, rows, columns, L, th, tw, z)
    grid = tiles.shape[1:3]
    decoded = run(tiles.reshape(-1, *tiles.shape[3:]))
    return stitch_tiles(decoded.reshape(n, *grid, *decoded.shape[1:]), rows.overlaps, columns.overlaps)


def chunk_pieces(frames: jax.Array, ahead: jax.Array | None, config: H3Config) -> tuple[jax.Array, jax.Array]:
    """One decoded chunk ``(B, t·L, H, W, C)`` → ``(piece, ahead)``: its own frames (less
    ``frame_pre_padding``) cross-faded with the previous chunk's read-ahead frames ``ahead`` (None
    for the first chunk), and its own read-ahead frames for the next (``join_chunks``, a chunk at a
    time: the pieces in order, then the last ``ahead``, are the video before its padding is cut)."""
    own, pre = config.tokens_chunk_size * config.temporal_scale, config.frame_pre_padding
    piece = frames[:, pre:own]
    if ahead is not None:
        piece = blend(ahead, piece, config.frame_overlap, axis=1)
    return piece, frames[:, own + pre: 2 * own] if config.token_drop > 0 else frames[:, :0]


def encode(run: RunTiles, x: jax.Array, config: H3Config, *, tiled: bool = True) -> jax.Array:
    """The released encode: frames ``(B, F, H, W, 3)`` → posterior moments
    ``(B, config.encoded_latent_frames(F), H/s, W/s, 2z)``. One frame goes through alone; more are
    cut into ``clip_length``-frame clips (the last padded with copies of the last frame), every
    spatial tile of every clip one batch through ``run`` (``H3Encoder``), the tiles blended in
    latent space, and the last ``token_drop`` latent frames dropped."""
    b, f, height, width, c = x.shape
    s = config.spatial_scale
    if height % s or width % s:
        raise ValueError(f"frames of {height}x{width}; expected multiples of {s}")
    if f > 1:
        pad = (-f) % config.clip_length
        x = jnp.concatenate([x, jnp.repeat(x[:, -1:], pad, axis=1)], axis=1)
        x = x.reshape(b * (x.shape[1] // config.clip_length), config.clip_length, height, width, c)
    rows, columns = frame_tiles(height, width, config, tiled=tiled)
    tiles = cut_tiles(x, rows, columns, 1)
    grid = tiles.shape[1:3]
    moments = run(tiles.reshape(-1, *tiles.shape[3:]))
    moments = stitch_tiles(moments.reshape(x.shape[0], *grid, *moments.shape[1:]),
                           tuple(o // s for o in rows.overlaps), tuple(o // s for o in columns.overlaps))
    if f == 1:
        return moments
    moments = moments.reshape(b, -1, *moments.shape[2:])
    return moments[:, : moments.shape[1] - config.token_drop]
