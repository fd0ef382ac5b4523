"""Spreading a batch of independent tiles over devices: the tiles of a released H3 decode (or
encode) need nothing of each other until they are blended, so each device runs a share of them.
The mesh and its axis come from the caller (``sharding.mesh``); nothing here names an axis.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P

from .decode import RunTiles


def padded_count(count: int, devices: int) -> int:
    """``count`` rounded up to a multiple of ``devices``: every device runs as many tiles."""
    return devices * math.ceil(count / devices)


def spread_over(run: RunTiles, mesh: Mesh, axes: str | tuple[str, ...]) -> RunTiles:
    """``run`` with its batch split over the devices of ``mesh``'s ``axes``: the batch padded with
    zero tiles to a multiple of their count (uneven counts), each device running its share, the
    padding dropped. The other axes of the mesh run the same tiles (replicated). The weights
    ``run`` closes over are replicated on every device."""
    axes = (axes,) if isinstance(axes, str) else axes
    devices = math.prod(mesh.shape[axis] for axis in axes)
    spread = jax.shard_map(run, mesh=mesh, in_specs=P(axes), out_specs=P(axes))

    def spread_run(batch: jax.Array) -> jax.Array:
        count = batch.shape[0]
        padding = jnp.zeros((padded_count(count, devices) - count, *batch.shape[1:]), batch.dtype)
        return spread(jnp.concatenate([batch, padding]))[:count]

    return spread_run
