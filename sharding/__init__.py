"""Exact spatially sharded decoding and encoding: bands of every frame over the ``tp`` mesh axis,
one-row halos.

Public surface: ``make_mesh``, ``sharded_decode``, ``sharded_decode_stream``, ``sharded_encode``,
their ahead-of-time compiled programs (``compile_decode``, ``compile_decode_stream``,
``compile_encode``), the axis-name constants, inspection helpers for memory and HLO
(``introspect``), and planning for TPU slices without a TPU (``topology_devices``, ``plan_decode``,
``check_fits``).
"""

if __name__ != "vaeserve.sharding":  # the checkout's folder imported by its own name would load every module twice
    raise ImportError(f"this is the package vaeserve.sharding: import it as `vaeserve.sharding`, not `{__name__}`")

from .bands import BandLayout, SplitError, band_layout, choose_split
from .chips import TopologyError, topology_devices
from .decode import (
    Decoded,
    compile_decode,
    compile_decode_stream,
    put_latents,
    replicated_state,
    sharded_decode,
    sharded_decode_stream,
    to_host,
    to_host_cropped,
)
from .encode import compile_encode, put_frames, replicated_encoder_state, sharded_encode
from .fits import WontFitError, check_fits
from .halo import BandContext
from .introspect import collectives, halo_bytes, hlo_text, memory_stats
from .mesh import DP_AXIS, MESH_AXES, TP_AXIS, MeshError, make_mesh
from .planner import PlanError, plan_decode

__all__ = [
    "DP_AXIS",
    "MESH_AXES",
    "TP_AXIS",
    "BandContext",
    "BandLayout",
    "Decoded",
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
    "compile_encode",
    "halo_bytes",
    "hlo_text",
    "make_mesh",
    "memory_stats",
    "band_layout",
    "plan_decode",
    "put_frames",
    "put_latents",
    "replicated_encoder_state",
    "replicated_state",
    "sharded_decode",
    "sharded_decode_stream",
    "sharded_encode",
    "to_host",
    "to_host_cropped",
    "topology_devices",
]
