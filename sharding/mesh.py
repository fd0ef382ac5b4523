"""The decode mesh: axis names live here and nowhere else.

``dp`` splits the batch (independent requests), ``tp`` splits every frame into bands (height or
width) that exchange one-row halos. The mesh is built once by the caller and passed in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh

DP_AXIS = "dp"
TP_AXIS = "tp"
MESH_AXES = (DP_AXIS, TP_AXIS)


class MeshError(ValueError):
    """A mesh that the devices at hand cannot provide."""


def host_major(devices: Sequence[jax.Device]) -> list[jax.Device]:
    """``devices`` grouped by the process (host) that owns them, each host's in their given order."""
    return sorted(devices, key=lambda device: device.process_index)


def device_grid(tp: int, dp: int, devices: Sequence[jax.Device]) -> np.ndarray:
    """``dp x tp`` of ``devices`` (the first ``dp · tp``, host by host), laid out by JAX's
    ``mesh_utils``, which knows the TPU torus and the hosts.

    The devices of one TPU slice share one chip-to-chip network, hosts or not: the mesh follows the
    torus, so neighbouring ``tp`` ranks are neighbouring chips where the slice allows it. Where a
    network joins *granules* — TPU slices, or the processes of a CPU/GPU job — ``tp`` fills a
    granule before it spans two (``create_hybrid_device_mesh``). Meshes that ``mesh_utils`` cannot
    lay on the hardware (a tp of 3 on a 2x4 slice, say) keep the devices' own order."""
    chosen = host_major(devices)[: tp * dp]
    tpu = chosen[0].platform == "tpu"
    granules = len({getattr(d, "slice_index", 0) if tpu else d.process_index for d in chosen})
    try:
        if granules == 1:
            return mesh_utils.create_device_mesh((dp, tp), devices=chosen)
        per_granule = len(chosen) // granules
        tp_inside = math.gcd(tp, per_granule)
        inside = (per_granule // tp_inside, tp_inside)
        return mesh_utils.create_hybrid_device_mesh(inside, (dp // inside[0], tp // tp_inside), devices=chosen,
                                                    process_is_granule=not tpu)
    except (ValueError, NotImplementedError, AssertionError):
        return np.asarray(chosen, dtype=object).reshape(dp, tp)


def make_mesh(tp: int, dp: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ``(dp, tp)`` mesh over ``dp · tp`` devices (the first ones of ``devices``, or of every
    process's devices, host by host), laid out by :func:`device_grid`."""
    if not (isinstance(tp, int) and isinstance(dp, int)) or tp < 1 or dp < 1:
        raise MeshError(f"tp and dp must be integers ≥ 1; received tp={tp!r}, dp={dp!r}")
    devices = list(jax.devices() if devices is None else devices)
    needed = tp * dp
    if needed > len(devices):
        raise MeshError(
            f"a mesh of dp={dp} x tp={tp} needs {needed} devices; only {len(devices)} available "
            f"({devices[0].platform if devices else 'none'}). On CPU, force more with "
            "XLA_FLAGS=--xla_force_host_platform_device_count=N before JAX starts."
        )
    return Mesh(device_grid(tp, dp, devices), MESH_AXES)


def single_device_mesh(device: jax.Device | None = None) -> Mesh:
    """A 1x1 mesh of ``device`` (default: the first of this process's): where a single device's
    decode and encode run, the same programs as any mesh's."""
    return Mesh(np.array([[device or jax.local_devices()[0]]]), MESH_AXES)


def device_key(device: jax.Device) -> tuple:
    """What makes a device a distinct compile target: ids alone collide across platforms (CPU
    device 0 and the first chip of an abstract TPU topology), and across TPU generations."""
    return (device.platform, device.device_kind, device.id, tuple(getattr(device, "coords", ()) or ()))


def mesh_key(mesh: Mesh) -> tuple:
    """A hashable identity for caching programs per mesh (axis names, sizes and devices)."""
    return (tuple(mesh.axis_names), tuple(mesh.devices.shape), tuple(device_key(d) for d in mesh.devices.flat))
