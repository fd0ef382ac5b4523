"""TPU chips by generation, and abstract TPU devices to compile for without a TPU.

``topology_devices("v5e:2x4")`` returns the compile-only devices of that slice from libtpu's
compiler (``pip install "vaeserve[aot]"``): a ``Mesh`` over them compiles the very programs the
chips would run, and ``memory_analysis()`` answers per device. Nothing runs.

The chip facts are the public figures of Google's Cloud TPU documentation, one page per
generation (sources beside each row). HBM is given as the documents write it (GB, 10^9 bytes):
slightly less than the chips hold, so a plan that fits here fits there.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from collections.abc import Sequence

import jax


class TopologyError(ValueError):
    """A topology that libtpu cannot describe, or a compiler that is not installed."""


@dataclasses.dataclass(frozen=True)
class ChipFacts:
    """Public per-chip figures of one TPU generation.

    Attributes:
      name: the generation as Cloud TPU names it (``"v5e"``).
      device_kinds: ``jax.Device.device_kind`` of its devices (``"TPU v5 lite"``).
      hbm_bytes: HBM per chip.
      peak_bf16_flops: peak dense bfloat16 FLOP/s per chip.
      hbm_bytes_per_s: HBM bandwidth per chip.
      chips_per_host: chips on one host (one TPU VM of the largest single-host slice).
      slices: single-host slice names and their topology names (``"v5e-8": "v5e:2x4"``).
    """

    name: str
    device_kinds: tuple[str, ...]
    hbm_bytes: int
    peak_bf16_flops: float
    hbm_bytes_per_s: float
    chips_per_host: int
    slices: dict[str, str]


CHIPS: tuple[ChipFacts, ...] = (
    # https://cloud.google.com/tpu/docs/v4 — 32 GiB HBM2, 1200 GBps, 275 TFLOPS bf16, 4 chips per host.
    ChipFacts("v4", ("TPU v4",), 32 * 2**30, 275e12, 1200e9, 4, {"v4-8": "v4:2x2x1"}),
    # https://cloud.google.com/tpu/docs/v5e — 16 GB HBM2, 819 GBps, 197 TFLOPS bf16, 8 chips per host.
    ChipFacts("v5e", ("TPU v5 lite", "TPU v5e"), 16 * 10**9, 197e12, 819e9, 8,
              {"v5e-4": "v5e:2x2", "v5e-8": "v5e:2x4"}),
    # https://cloud.google.com/tpu/docs/v5p — 95 GB HBM2e, 2765 GBps, 459 TFLOPS bf16, 4 chips per host.
    ChipFacts("v5p", ("TPU v5", "TPU v5p"), 95 * 10**9, 459e12, 2765e9, 4, {"v5p-8": "v5p:2x2x1"}),
    # https://cloud.google.com/tpu/docs/v6e — 32 GB HBM, 1640 GBps, 918 TFLOPS bf16, 8 chips per host.
    ChipFacts("v6e", ("TPU v6 lite", "TPU v6e"), 32 * 10**9, 918e12, 1640e9, 8,
              {"v6e-4": "v6e:2x2", "v6e-8": "v6e:2x4"}),
)


def chip_facts(device_kind: str) -> ChipFacts:
    """The facts of the chip whose devices report ``device_kind``."""
    for chip in CHIPS:
        if device_kind in chip.device_kinds:
            return chip
    known = sorted(kind for chip in CHIPS for kind in chip.device_kinds)
    raise TopologyError(f"no chip facts for device kind {device_kind!r}; known: {known}")


def topology_name(text: str) -> str:
    """``"v5e-8"`` (a single-host slice) → ``"v5e:2x4"``; topology names pass through."""
    for chip in CHIPS:
        if text in chip.slices:
            return chip.slices[text]
    return text


def topology_devices(topology: str) -> list[jax.Device]:
    """The compile-only devices of a TPU slice, e.g. ``"v5e:2x4"`` (8 devices) or ``"v5p-8"``.

    Needs libtpu (the ``aot`` extra) but no TPU. libtpu takes a machine-wide lock when it loads and
    asks the cloud metadata server what it runs on; neither is needed to compile, so both are
    turned off here (a serving process that already holds the lock does not block planning).
    """
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    from jax.experimental import topologies

    name = topology_name(topology)
    try:
        return list(topologies.get_topology_desc(platform="tpu", topology_name=name).devices)
    except (RuntimeError, ValueError) as e:  # JaxRuntimeError is a RuntimeError
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        slices = sorted(s for chip in CHIPS for s in chip.slices)
        raise TopologyError(
            f"cannot describe TPU topology {topology!r}: {message}. Expected a name such as "
            f"'v5e:2x4', 'v6e:2x4', 'v5p:2x2x1' or a single-host slice {slices}; the TPU compiler "
            "comes with `pip install \"vaeserve[aot]\"`"
        ) from e


def devices_per_chip(devices: Sequence[jax.Device]) -> int:
    """Devices that share one chip: 1 on v5e/v6e/v5p (one device per chip), 2 where libtpu lists
    each TensorCore of a v4 chip as its own device (they share its HBM)."""
    coords = Counter(tuple(getattr(d, "coords", (d.id,))) for d in devices)
    return max(coords.values()) if coords else 1
