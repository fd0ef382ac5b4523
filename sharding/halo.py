"""The sharded spatial context: what the decoder sees inside ``shard_map``.

Each device holds one band of every frame (``BandLayout``). Before every 3x3 conv, ``pad_hw``
fetches one row from each neighbour with a non-cyclic ``lax.ppermute`` (the image edges receive
zeros, exactly like zero padding) and pads the other spatial axis. The mid-block attention keeps
its queries local and all-gathers K and V along ``tp`` (they are latent-resolution).

HunyuanVideo adds two things that cross bands. Its convs pad with the edge row (``edge=
"replicate"``): interior band edges still take their neighbours' rows, and the outermost real
rows of the image are repeated — with an uneven split the last real row may sit inside a band or
at the end of the one before the padded bands, and it is that row, never a padded one, that the
bottom edge repeats. Its GroupNorm statistics span the whole frame: each band sums its own rows
and ``band_sum`` adds the sums over ``tp`` (mean first, then centred squares: two sums).

LTX-2.0's decoder pads with ``edge="reflect"``: the image's first row takes row 1 above it and
its last real row ``R − 1`` takes row ``R − 2`` below it — a band at the top reflects its own rows,
interior bands take halos, and with an uneven split the row reflected is a real one (in the band,
or in its halo from above), never a padded one. LTX decoders also inject noise: ``frame_noise``
draws the whole frame's noise on every band and keeps the band's rows, so a seeded decode does
not depend on the split.

Uneven splits: rows that exist only because the split axis was padded up to a multiple of ``tp``
are set to zero (or, with replicate edges, to the last real row) at every conv input (before their
edge rows are sent anywhere), left out of the statistics and masked out of the attention keys, so
the decode stays exact; their outputs are cropped away by the caller.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from vaeserve.models.estimate import QUERY_CHUNK
from vaeserve.models.spatial import (
    Edge,
    attend_frames_local,
    check_edge,
    dot_product_attention,
    frame_normal,
    group_moments,
    pad_edges,
    replicate_pad_hw,
    zero_pad_hw,
    zero_pad_hw_after,
)

from .bands import BandLayout, halo_permutations
from .mesh import TP_AXIS


def _positive(axis: int, ndim: int) -> int:
    return axis % ndim


def _pad_other_axis(x: jax.Array, split_axis: int, width: tuple[int, int] = (1, 1), edge: Edge = "zero") -> jax.Array:
    """Pad the spatial axis that is *not* split by ``width`` (before, after): zeros, edge values or
    reflected ones."""
    other = x.ndim - 2 if split_axis == x.ndim - 3 else x.ndim - 3
    widths = [(0, 0)] * x.ndim
    widths[other] = width
    mode = {"zero": "constant", "replicate": "edge", "reflect": "reflect"}[edge]
    return jnp.pad(x, widths, mode=mode)


def band_sum(partial_sums: jax.Array, axis_name: str) -> jax.Array:
    """The sum over every band of each band's partial sums: the one reduction across bands (the
    GroupNorm statistics of the whole frame)."""
    return lax.psum(partial_sums, axis_name)


class BandContext:
    """``SpatialContext`` for one band inside ``shard_map`` over the ``tp`` mesh axis.

    Args:
      layout: the band layout (split axis, band size, padding).
      axis_name: the mesh axis the bands lie along.
      query_chunk: queries per attention score block (passed to ``dot_product_attention``).
      native_conv: native XLA convolutions (the mesh is on an accelerator; see ``SpatialContext``).
      rounded_conv_sums: native convolutions round their sums to the operands' type (GPUs).
      onednn_conv: oneDNN's convolutions on CPU (see ``SpatialContext``).
    """

    def __init__(self, layout: BandLayout, *, axis_name: str = TP_AXIS, query_chunk: int = QUERY_CHUNK,
                 native_conv: bool = False, rounded_conv_sums: bool = False, onednn_conv: bool = False):
        self.layout, self.axis_name, self.query_chunk = layout, axis_name, query_chunk
        self.native_conv, self.rounded_conv_sums, self.onednn_conv = native_conv, rounded_conv_sums, onednn_conv
        self.exchanges_halos = layout.tp > 1

    def permutations(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """``(downward, upward)`` ppermute pairs of the halo exchange (``bands.halo_permutations``)."""
        return halo_permutations(self.layout.tp)

    def _valid_local(self, local_size: int) -> jax.Array:
        """``(local_size,)`` bool: which of this device's rows exist (at the array's scale)."""
        scale = self.layout.scale(local_size)
        rows = lax.axis_index(self.axis_name) * local_size + jnp.arange(local_size)
        return rows < self.layout.size * scale

    def mask_padding(self, x: jax.Array) -> jax.Array:
        """Zero the rows of ``(..., H, W, C)`` that exist only because of padding (no-op when even)."""
        if self.layout.pad == 0:
            return x
        axis = _positive(self.layout.axis, x.ndim)
        shape = [1] * x.ndim
        shape[axis] = x.shape[axis]
        valid = self._valid_local(x.shape[axis]).reshape(shape)
        return jnp.where(valid, x, jnp.zeros((), x.dtype))

    def pad_hw(self, x: jax.Array, *, edge: Edge = "zero") -> jax.Array:
        """``(..., h, w, C)`` band → ``(..., h+2, w+2, C)`` with the neighbours' edge rows as halo;
        at the image's edges zeros, or the image's own edge rows (``edge="replicate"``)."""
        if check_edge(edge) == "replicate":
            return self._replicate_pad(x)
        if edge == "reflect":
            return self._reflect_pad(x)
        x = self.mask_padding(x)
        if self.layout.tp == 1:
            return zero_pad_hw(x)
        axis = _positive(self.layout.axis, x.ndim)
        return _pad_other_axis(self._with_halos(x, axis), axis)

    def _with_halos(self, x: jax.Array, axis: int) -> jax.Array:
        """The band with its neighbours' edge rows above and below (zeros where no neighbour is)."""
        n = x.shape[axis]
        down, up = self.permutations()
        top = lax.ppermute(lax.slice_in_dim(x, n - 1, n, axis=axis), self.axis_name, down)
        bottom = lax.ppermute(lax.slice_in_dim(x, 0, 1, axis=axis), self.axis_name, up)
        return jnp.concatenate([top, x, bottom], axis=axis)

    def _replicate_pad(self, x: jax.Array) -> jax.Array:
        """``pad_hw`` with replicate edges: halos between bands, the image's first and last *real*
        rows repeated at its edges (``clamp_to_image``), edge columns on the other axis."""
        if self.layout.tp == 1:
            return replicate_pad_hw(x)
        axis = _positive(self.layout.axis, x.ndim)
        return _pad_other_axis(self.clamp_to_image(self._with_halos(x, axis), axis), axis, edge="replicate")

    def clamp_to_image(self, banded: jax.Array, axis: int) -> jax.Array:
        """``banded``: this band with one halo row on each side along ``axis``. Every row outside the
        image's real rows ``[0, R)`` becomes the nearest real row: row −1 (above the first band)
        row 0, rows ≥ R (the halo below the last band, padded rows) row R − 1 — which is in
        ``banded`` whenever this band has real rows or starts right after them (the only bands whose
        rows reach the image)."""
        n = banded.shape[axis] - 2
        real = self.layout.size * self.layout.scale(n)
        start = lax.axis_index(self.axis_name) * n - 1  # the global row of banded's row 0
        rows = start + jnp.arange(n + 2)
        shape = [1] * banded.ndim
        shape[axis] = n + 2
        rows = rows.reshape(shape)
        first = lax.slice_in_dim(banded, 1, 2, axis=axis)
        last = lax.dynamic_slice_in_dim(banded, jnp.clip(real - 1 - start, 0, n + 1), 1, axis=axis)
        return jnp.where(rows < 0, first, jnp.where(rows >= real, last, banded))

    def _reflect_pad(self, x: jax.Array) -> jax.Array:
        """``pad_hw`` with reflect edges: halos between bands, the image's rows 1 and ``R − 2``
        reflected at its edges (``reflect_to_image``), reflected columns on the other axis."""
        if self.layout.tp == 1:  # one band holds the whole frame (no padded rows)
            return pad_edges(x, "reflect")
        axis = _positive(self.layout.axis, x.ndim)
        return _pad_other_axis(self.reflect_to_image(self._with_halos(x, axis), axis), axis, edge="reflect")

    def reflect_to_image(self, banded: jax.Array, axis: int) -> jax.Array:
        """``banded``: this band with one halo row on each side along ``axis``. The row above the
        image (−1) becomes row 1, the row below its real rows (``R``) row ``R − 2``, and padded rows
        further down row ``R − 1`` (their outputs are cropped; they only need to be finite). Rows
        1 and ``R − 2`` are in ``banded`` whenever this band holds real rows: the top band holds row
        1 (or takes it as its halo from below when one row high), and ``R − 2`` lies at most one row
        above the band's first row that is past the image."""
        n = banded.shape[axis] - 2
        real = self.layout.size * self.layout.scale(n)
        start = lax.axis_index(self.axis_name) * n - 1  # the global row of banded's row 0
        shape = [1] * banded.ndim
        shape[axis] = n + 2
        rows = (start + jnp.arange(n + 2)).reshape(shape)

        def row(global_row):
            return lax.dynamic_slice_in_dim(banded, jnp.clip(global_row - start, 0, n + 1), 1, axis=axis)

        below = jnp.where(rows == real, row(real - 2), row(real - 1))
        return jnp.where(rows < 0, row(1), jnp.where(rows >= real, below, banded))

    def frame_noise(self, keys: jax.Array, shape: tuple[int, int, int]) -> jax.Array:
        """The whole frame's noise drawn on every band (real rows only, so it does not depend on the
        padding), the band's rows kept: ``keys (B, 2)``, local ``(h, w, C)`` → ``(B, h, w, C)``."""
        axis = 1 if self.layout.split == "height" else 2  # of the (B, H, W, C) noise
        local = shape[axis - 1]
        real = self.layout.size * self.layout.scale(local)
        whole = list(shape)
        whole[axis - 1] = real
        noise = frame_normal(keys, tuple(whole))
        widths = [(0, 0)] * 4
        widths[axis] = (0, self.layout.tp * local - real)
        noise = jnp.pad(noise, widths)
        return lax.dynamic_slice_in_dim(noise, lax.axis_index(self.axis_name) * local, local, axis=axis)

    def pad_hw_after(self, x: jax.Array) -> jax.Array:
        """``(..., h, w, C)`` band → ``(..., h+1, w+1, C)``: the next band's first row below it.

        The encoder's stride-2 convs pad only at the bottom/right, so only the upward permutation
        runs; the last rank receives zeros, the reference's bottom padding. Bands start on even
        rows at every scale (the latent band times 8, 4, 2), so the strided rows line up with the
        whole frame's.
        """
        x = self.mask_padding(x)
        if self.layout.tp == 1:
            return zero_pad_hw_after(x)
        axis = _positive(self.layout.axis, x.ndim)
        _, up = self.permutations()
        below = lax.ppermute(lax.slice_in_dim(x, 0, 1, axis=axis), self.axis_name, up)
        return _pad_other_axis(jnp.concatenate([x, below], axis=axis), axis, (0, 1))

    def group_moments(self, x: jax.Array, groups: int) -> tuple[jax.Array, jax.Array]:
        """The GroupNorm statistics of the whole frame from a band ``(B, T, h, w, C)``: each band's
        sums over its real rows, added over the bands (``band_sum``)."""
        axis = _positive(self.layout.axis, x.ndim)
        n = x.shape[axis]
        real_rows = self.layout.size * self.layout.scale(n)
        other = x.shape[5 - axis]  # the axis that is not split: W (axis 2 split) or H (axis 3)
        count = x.shape[1] * real_rows * other * (x.shape[-1] // groups)
        valid = None
        if self.layout.pad:
            shape = [1] * x.ndim
            shape[axis] = n
            valid = self._valid_local(n).reshape(shape)
        total = functools.partial(band_sum, axis_name=self.axis_name) if self.layout.tp > 1 else None
        return group_moments(x, groups, count=count, valid=valid, total=total)

    def attend_frames(self, q: jax.Array, k: jax.Array, v: jax.Array, *, first_query_frame) -> jax.Array:
        """Local queries ``(B, Tq, h, w, C)`` against the keys/values of every band's frames."""
        k, v = self._gather_frames(k), self._gather_frames(v)
        return attend_frames_local(q, k, v, first_query_frame=first_query_frame, query_chunk=self.query_chunk,
                                   key_valid=self.frame_key_valid(k.shape))

    def _gather_frames(self, x: jax.Array) -> jax.Array:
        """``(B, T, h, w, C)`` bands → the whole frames ``(B, T, H, W, C)`` on every band."""
        if self.layout.tp == 1:
            return x
        return lax.all_gather(x, self.axis_name, axis=2 if self.layout.split == "height" else 3, tiled=True)

    def frame_key_valid(self, shape: tuple[int, ...]) -> jax.Array | None:
        """``(T·H·W,)`` bool over gathered frames ``shape`` ``(B, T, H, W, C)``: the tokens that exist
        (None when no row is padded)."""
        if not self.layout.pad:
            return None
        axis = 2 if self.layout.split == "height" else 3
        rows = self.layout.valid(self.layout.scale(shape[axis] // self.layout.tp))
        grid = rows[:, None] if axis == 2 else rows[None, :]
        return jnp.asarray(np.tile(np.broadcast_to(grid, shape[2:4]).reshape(-1), shape[1]))

    def attend(self, q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        """Local queries ``(N, h, w, C)`` against the keys/values of the whole frame → ``(N, h, w, C)``."""
        n, h, w, c = q.shape
        axis = 1 if self.layout.split == "height" else 2
        key_valid = None
        if self.layout.tp > 1:
            k = lax.all_gather(k, self.axis_name, axis=axis, tiled=True)
            v = lax.all_gather(v, self.axis_name, axis=axis, tiled=True)
        if self.layout.pad:
            rows = self.layout.valid(self.layout.scale(q.shape[axis]))
            grid = rows[:, None] if axis == 1 else rows[None, :]
            key_valid = jnp.asarray(np.broadcast_to(grid, k.shape[1:3]).reshape(-1))
        out = dot_product_attention(
            q.reshape(n, h * w, c), k.reshape(n, -1, c), v.reshape(n, -1, c),
            key_valid=key_valid, query_chunk=self.query_chunk,
        )
        return out.reshape(n, h, w, c)


class HaloRecorder:
    """A single-band stand-in context that records what ``BandContext`` would exchange.

    Trace a decode step on one band's shapes with it (``jax.eval_shape``): every ``pad_hw`` call
    appends the shape and dtype of the one-row slab each device sends in each direction. (Its
    ``pad_hw_after`` raises: it records decode steps, whose convs all pad on every side.)
    """

    native_conv = rounded_conv_sums = onednn_conv = False  # the conv path does not change what crosses devices

    def __init__(self, layout: BandLayout):
        self.layout = layout
        self.exchanges_halos = layout.tp > 1
        self.slabs: list[tuple[tuple[int, ...], np.dtype]] = []

    def pad_hw(self, x: jax.Array, *, edge: Edge = "zero") -> jax.Array:
        shape = list(x.shape)
        shape[_positive(self.layout.axis, x.ndim)] = 1
        self.slabs.append((tuple(shape), np.dtype(x.dtype)))
        return zero_pad_hw(x)

    def pad_hw_after(self, x: jax.Array) -> jax.Array:
        raise NotImplementedError("HaloRecorder records decode steps; their convs pad on every side")

    def attend(self, q, k, v):
        return q  # shapes only

    def attend_frames(self, q, k, v, *, first_query_frame):
        return q  # shapes only

    def group_moments(self, x: jax.Array, groups: int) -> tuple[jax.Array, jax.Array]:
        zeros = jnp.zeros((x.shape[0], groups), jnp.float32)  # shapes only: statistics are no halo
        return zeros, zeros

    def frame_noise(self, keys: jax.Array, shape: tuple[int, int, int]) -> jax.Array:
        return jnp.zeros((keys.shape[0], *shape), jnp.float32)  # shapes only: noise is drawn, not sent

    def slab_bytes(self) -> int:
        """Bytes of the slabs one device sends in one direction over the traced step."""
        return int(sum(np.prod(shape) * dtype.itemsize for shape, dtype in self.slabs))
