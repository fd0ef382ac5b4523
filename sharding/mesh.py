"""The decode mesh: axis names live here and nowhere else.

``dp`` splits the batch (independent requests), ``tp`` splits every frame into bands (height or
width) that exchange one-row halos. The mesh is built once by the caller and passed in.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

DP_AXIS = "dp"
TP_AXIS = "tp"
MESH_AXES = (DP_AXIS, TP_AXIS)


class MeshError(ValueError):
    """A mesh that the devices at hand cannot provide."""


def host_major(devices: Sequence[jax.Device]) -> list[jax.Device]:
    """``devices`` grouped by the process (host) that owns them, each host's in their given order.

    Cut into rows of ``tp``, this keeps a frame's bands on one host wherever ``tp`` allows: the halo
    exchange then crosses hosts only where a band group must span them.
    """
    return sorted(devices, key=lambda device: device.process_index)


def make_mesh(tp: int, dp: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ``(dp, tp)`` mesh over ``dp · tp`` devices (the first ones of ``devices``, or of every
    process's devices, host by host).

    Neighbouring ``tp`` ranks are adjacent devices, so on hardware with a ring/torus the halo
    exchange runs between neighbours; on a multi-host slice ``tp`` fills a host before it spans two.
    """
    if not (isinstance(tp, int) and isinstance(dp, int)) or tp < 1 or dp < 1:
        raise MeshError(f"tp and dp must be integers ≥ 1; received tp={tp!r}, dp={dp!r}")
    devices = host_major(jax.devices()) if devices is None else list(devices)
    needed = tp * dp
    if needed > len(devices):
        raise MeshError(
            f"a mesh of dp={dp} x tp={tp} needs {needed} devices; only {len(devices)} available "
            f"({devices[0].platform if devices else 'none'}). On CPU, force more with "
            "XLA_FLAGS=--xla_force_host_platform_device_count=N before JAX starts."
        )
    grid = np.asarray(devices[:needed], dtype=object).reshape(dp, tp)
    return Mesh(grid, MESH_AXES)


def device_key(device: jax.Device) -> tuple:
    """What makes a device a distinct compile target: ids alone collide across platforms (CPU
    device 0 and the first chip of an abstract TPU topology), and across TPU generations."""
    return (device.platform, device.device_kind, device.id, tuple(getattr(device, "coords", ()) or ()))


def mesh_key(mesh: Mesh) -> tuple:
    """A hashable identity for caching programs per mesh (axis names, sizes and devices)."""
    return (tuple(mesh.axis_names), tuple(mesh.devices.shape), tuple(device_key(d) for d in mesh.devices.flat))
