"""The spatial tiles of MiniMax-H3's released decode and encode, in pixels (diffusers'
``_split_tiles``): pure Python, fixed at trace time. No JAX here."""

from __future__ import annotations

import dataclasses
import math

from .config import AutoencoderKLMiniMaxH3Config


@dataclasses.dataclass(frozen=True)
class Tiles:
    """Tiles along one axis, in pixels: ``starts``, the common ``size`` and the ``overlaps``
    between neighbours (one fewer than the tiles)."""

    starts: tuple[int, ...]
    size: int
    overlaps: tuple[int, ...]

    @classmethod
    def whole(cls, length: int) -> Tiles:
        """One tile over the whole axis (an untiled decode or encode)."""
        return cls((0,), length, ())


def split_tiles(length: int, tile: int, min_overlap: int, step: int) -> Tiles:
    """diffusers' ``_split_tiles``: the fewest ``tile``-sized tiles that cover ``length`` with
    overlaps of at least ``min_overlap``, the slack spread round-robin over the overlaps in whole
    ``step``s (the spatial scale, so tiles stay latent-aligned); one tile of ``length`` if it fits."""
    if tile >= length:
        return Tiles.whole(length)
    count = math.ceil(length / tile)
    while tile * count - min_overlap * (count - 1) < length:
        count += 1
    overlaps = [min_overlap] * (count - 1)
    for i in range((tile * count - sum(overlaps) - length) // step):
        overlaps[i % (count - 1)] += step
    starts = [0]
    for overlap in overlaps:
        starts.append(starts[-1] + tile - overlap)
    return Tiles(tuple(starts), tile, tuple(overlaps))


def frame_tiles(height: int, width: int, config: AutoencoderKLMiniMaxH3Config, *,
                tiled: bool = True) -> tuple[Tiles, Tiles]:
    """The released tiles of a ``height x width``-pixel frame, rows then columns (``tiled=False``:
    the whole frame)."""
    if not tiled:
        return Tiles.whole(height), Tiles.whole(width)
    s = config.spatial_scale
    return (split_tiles(height, config.tile_sample_min_height, config.tile_sample_min_overlap_height, s),
            split_tiles(width, config.tile_sample_min_width, config.tile_sample_min_overlap_width, s))
