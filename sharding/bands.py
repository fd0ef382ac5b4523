"""Band arithmetic: which spatial axis to split, how far to pad it, who sends halos to whom.

Pure functions of static sizes, testable without a mesh. Sizes are in *latent* rows (or columns);
after each 2x upsampler a band is 2x taller, so the scale of an activation is inferred from its
local size relative to the latent band (``BandLayout.scale``).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np

Split = Literal["height", "width"]
SPLITS = ("height", "width")


class SplitError(ValueError):
    """A split that cannot be made (unknown axis, a mesh that does not fit the batch)."""


def band_size(size: int, tp: int) -> int:
    """Latent rows per device: ``ceil(size / tp)``."""
    return -(-size // tp)


def padding(size: int, tp: int) -> int:
    """Rows added at the far edge so that ``size`` splits evenly over ``tp`` devices."""
    return band_size(size, tp) * tp - size


def choose_split(height: int, width: int, tp: int, split: Split | None = None) -> Split:
    """The axis to split: ``split`` when given, else the one that needs less padding.

    Ties go to height: bands of whole rows are contiguous in a row-major frame. 720p latents
    (90 x 160) over 8 devices split by width (160 = 8 x 20; 90 would need 6 padded rows).
    """
    if split is not None:
        if split not in SPLITS:
            raise SplitError(f"split must be one of {SPLITS} or None; received {split!r}")
        return split
    return "height" if padding(height, tp) <= padding(width, tp) else "width"


@dataclasses.dataclass(frozen=True)
class BandLayout:
    """How one spatial axis of every frame is cut into ``tp`` bands.

    Attributes:
      split: ``"height"`` or ``"width"``.
      tp: number of bands (devices along the ``tp`` mesh axis).
      size: latent rows (columns) that exist.
      band: latent rows (columns) per device, ``ceil(size / tp)``; the last bands may hold
        padded rows, which the sharded context keeps at zero at every conv input.
    """

    split: Split
    tp: int
    size: int
    band: int

    @property
    def padded(self) -> int:
        return self.band * self.tp

    @property
    def pad(self) -> int:
        return self.padded - self.size

    @property
    def axis(self) -> int:
        """The split axis of a channels-last array ``(..., H, W, C)``, counted from the end."""
        return -3 if self.split == "height" else -2

    def scale(self, local_size: int) -> int:
        """Upsampling factor of an activation whose band is ``local_size`` rows (1, 2, 4 or 8)."""
        scale, remainder = divmod(local_size, self.band)
        if remainder or scale < 1:
            raise ValueError(f"a band of {local_size} rows is no multiple of the latent band {self.band}")
        return scale

    def valid(self, scale: int = 1) -> np.ndarray:
        """``(padded · scale,)`` bool over the global split axis at ``scale``: rows that exist."""
        return np.arange(self.padded * scale) < self.size * scale


def band_layout(height: int, width: int, tp: int, split: Split | None = None) -> BandLayout:
    """The band layout for latent frames of ``height x width`` over ``tp`` devices."""
    if tp < 1:
        raise SplitError(f"tp must be ≥ 1; received {tp}")
    split = choose_split(height, width, tp, split)
    size = height if split == "height" else width
    return BandLayout(split=split, tp=tp, size=size, band=band_size(size, tp))


def halo_permutations(tp: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """``(downward, upward)`` source→target pairs for ``lax.ppermute`` along ``tp``.

    Downward: rank ``i`` sends its last row to ``i+1`` (its top halo). Upward: rank ``i+1`` sends
    its first row to ``i`` (its bottom halo). Non-cyclic: rank 0 receives no top halo and rank
    ``tp-1`` no bottom halo, and ``ppermute`` fills what nobody sends with zeros — exactly zero
    padding at the image edge. (A cyclic ``(i + 1) % tp`` would wrap the bottom edge onto the top.)
    """
    down = [(i, i + 1) for i in range(tp - 1)]
    up = [(dst, src) for src, dst in down]
    return down, up
