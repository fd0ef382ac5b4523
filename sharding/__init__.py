"""Exact spatially sharded decoding: bands of every frame over the ``tp`` mesh axis, one-row halos.

Public surface: ``make_mesh``, ``sharded_decode``, ``sharded_decode_stream``, their ahead-of-time
compiled programs (``compile_decode``, ``compile_decode_stream``), the axis-name constants,
inspection helpers for memory and HLO (``inspect``), and planning for TPU slices without a TPU
(``topology_devices``, ``plan_decode``, ``check_fits``).
"""

from .chips import TopologyError, topology_devices
from .decode import (
    compile_decode,
    compile_decode_stream,
    put_latents,
    replicated_state,
    sharded_decode,
    sharded_decode_stream,
    to_host,
)
from .halo import BandContext
from .inspect import collectives, halo_bytes, hlo_text, memory_stats
from .mesh import DP_AXIS, MESH_AXES, TP_AXIS, MeshError, make_mesh
from .plan import BandPlan, SplitError, choose_split, plan_bands
from .planner import PlanError, WontFitError, check_fits, plan_decode

__all__ = [
    "DP_AXIS",
    "MESH_AXES",
    "TP_AXIS",
    "BandContext",
    "BandPlan",
    "MeshError",
    "PlanError",
    "SplitError",
    "TopologyError",
    "WontFitError",
    "check_fits",
    "choose_split",
    "collectives",
    "compile_decode",
    "compile_decode_stream",
    "halo_bytes",
    "hlo_text",
    "make_mesh",
    "memory_stats",
    "plan_bands",
    "plan_decode",
    "put_latents",
    "replicated_state",
    "sharded_decode",
    "sharded_decode_stream",
    "to_host",
    "topology_devices",
]
