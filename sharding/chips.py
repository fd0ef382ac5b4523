"""TPU chips by generation and NVIDIA GPUs, and abstract devices to compile for without them.

``topology_devices("v5e:2x4")`` returns the compile-only devices of that slice from libtpu's
compiler (``pip install "vaeserve[aot]"``): a ``Mesh`` over them compiles the very programs the
chips would run, and ``memory_analysis()`` answers per device. Nothing runs.
``topology_devices("h100-8")`` does the same for one host of 8 H100s with XLA's CUDA compiler
(``pip install "vaeserve[cuda]"``; no GPU or driver needed), given a description of the GPU
that we write from its public figures (``gpu_target_config``).

The chip facts are the public figures of Google's Cloud TPU documentation, one page per
generation, and of NVIDIA's data sheets (sources beside each row). Memory is given as the
documents write it (GB, 10^9 bytes): slightly less than the chips hold, so a plan that fits here
fits there.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
import pkgutil
from collections import Counter
from collections.abc import Sequence

import jax


class TopologyError(ValueError):
    """A topology that libtpu cannot describe, or a compiler that is not installed."""


@dataclasses.dataclass(frozen=True)
class ChipFacts:
    """Public per-chip figures of one TPU generation or GPU model.

    Attributes:
      name: the generation as Cloud TPU names it (``"v5e"``), or the GPU (``"h100"``).
      device_kinds: ``jax.Device.device_kind`` of its devices (``"TPU v5 lite"``).
      hbm_bytes: HBM per chip.
      peak_bf16_flops: peak dense bfloat16 FLOP/s per chip.
      hbm_bytes_per_s: HBM bandwidth per chip.
      chips_per_host: chips on one host (one TPU VM of the largest single-host slice; an HGX board).
      slices: single-host slice names and their topology names (``"v5e-8": "v5e:2x4"``; for a GPU
        host ``"h100-8": "1x1x8"``: slices x hosts x GPUs per host, as XLA's CUDA topology reads it).
      platform: ``"tpu"`` or ``"cuda"``: which compiler describes its devices.
      headroom: the share of HBM a plan keeps free by default. 10% on a TPU (the runtime, transfers,
        fragmentation); 25% on a GPU, because JAX's GPU allocator takes 75% of the memory unless
        ``XLA_PYTHON_CLIENT_MEM_FRACTION`` says otherwise.
    """

    name: str
    device_kinds: tuple[str, ...]
    hbm_bytes: int
    peak_bf16_flops: float
    hbm_bytes_per_s: float
    chips_per_host: int
    slices: dict[str, str]
    platform: str = "tpu"
    headroom: float = 0.10


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
    # https://www.nvidia.com/en-us/data-center/h100/ — H100 SXM: 80 GB HBM3, 3.35 TB/s, 1,979 TFLOPS
    # bf16 with sparsity (989 dense), 8 GPUs per HGX H100 host.
    ChipFacts("h100", ("NVIDIA H100 80GB HBM3",), 80 * 10**9, 989e12, 3.35e12, 8,
              {f"h100-{n}": f"1x1x{n}" for n in (1, 2, 4, 8)}, platform="cuda", headroom=0.25),
    # https://www.nvidia.com/en-us/data-center/h200/ — H200 SXM: 141 GB HBM3e, 4.8 TB/s, 1,979 TFLOPS
    # bf16 with sparsity (989 dense; the same Hopper die as H100), 8 GPUs per HGX H200 host.
    ChipFacts("h200", ("NVIDIA H200 141GB HBM3e",), 141 * 10**9, 989e12, 4.8e12, 8,
              {f"h200-{n}": f"1x1x{n}" for n in (1, 2, 4, 8)}, platform="cuda", headroom=0.25),
)

# What XLA's CUDA compiler needs to know of a Hopper SM (compute capability 9.0), from NVIDIA's
# CUDA C++ Programming Guide (Technical Specifications per Compute Capability) and the H100 white
# paper: 132 SMs at 1.98 GHz boost, 128 FP32 lanes per SM, 50 MB L2, 228 KB shared memory per SM
# (227 KB opt-in per block), 64 K registers per SM and per block.
_HOPPER = {
    "threads_per_block_limit": 1024, "threads_per_warp": 32, "shared_memory_per_block": 48 * 1024,
    "shared_memory_per_core": 228 * 1024, "threads_per_core_limit": 2048, "core_count": 132,
    "fpus_per_core": 128, "block_dim_limit_x": 2**31 - 1, "block_dim_limit_y": 65535, "block_dim_limit_z": 65535,
    "l2_cache_size": 50 * 2**20, "clock_rate_ghz": 1.98, "shared_memory_per_block_optin": 227 * 1024,
    "registers_per_core_limit": 65536, "registers_per_block_limit": 65536,
}


def chip_facts(device_kind: str) -> ChipFacts:
    """The facts of the chip whose devices report ``device_kind``."""
    for chip in CHIPS:
        if device_kind in chip.device_kinds:
            return chip
    known = sorted(kind for chip in CHIPS for kind in chip.device_kinds)
    raise TopologyError(f"no chip facts for device kind {device_kind!r}; known: {known}")


def _slice_chip(name: str) -> ChipFacts | None:
    """The chip of a single-host slice name (``"v5e-8"``, ``"h100-8"``); None for other names."""
    return next((chip for chip in CHIPS if name in chip.slices), None)


def slice_facts(topology: str) -> tuple[ChipFacts, str, int] | None:
    """The chip, the single-host slice name and the chips of a slice the chip table names, by either
    name (``"v5e:2x4"`` or ``"v5e-8"`` → v5e, ``"v5e-8"``, 8; ``"h100-8"`` → h100, ``"h100-8"``, 8);
    None for any other topology."""
    for chip in CHIPS:
        for name, shape in chip.slices.items():
            if topology == name or (chip.platform == "tpu" and topology == shape):
                return chip, name, math.prod(int(size) for size in shape.split(":")[-1].split("x"))
    return None


def topology_name(text: str) -> str:
    """``"v5e-8"`` (a single-host slice) → ``"v5e:2x4"``; topology names pass through."""
    chip = _slice_chip(text)
    return chip.slices[text] if chip else text


def _cudnn_version() -> tuple[int, int, int]:
    """The cuDNN that the CUDA plugin would load (XLA's choice of convolution depends on it);
    9.0.0 where none is installed."""
    from importlib import metadata

    for package in ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12"):  # the cuda extra's (CUDA 13), then CUDA 12's
        try:
            major, minor, patch, *_ = (int(part) for part in metadata.version(package).split("."))
        except (metadata.PackageNotFoundError, ValueError):
            continue
        return major, minor, patch
    return 9, 0, 0


def gpu_target_config(chip: ChipFacts) -> str:
    """The ``GpuTargetConfigProto`` (text form) that lets XLA compile for ``chip`` without the GPU:
    a Hopper SM with the chip's memory, bandwidth and name (its ``device_kind``)."""
    fields = {**_HOPPER, "memory_bandwidth": int(chip.hbm_bytes_per_s), "device_memory_size": chip.hbm_bytes}
    lines = [f"  {key}: {value}" for key, value in fields.items()]
    return "\n".join([
        "gpu_device_info {", *lines, "  cuda_compute_capability { major: 9 minor: 0 }", "}",
        'platform_name: "CUDA"', "dnn_version_info {{ major: {} minor: {} patch: {} }}".format(*_cudnn_version()),
        f'device_description_str: "{chip.device_kinds[0]}"', "",
    ])


def compile_target(chip: ChipFacts) -> str:
    """What the compiler is told of ``chip`` besides the program, as far as we write it: for a GPU
    our description (``gpu_target_config``) less the cuDNN version, which the compiler's installed
    packages tell; for a TPU nothing (libtpu describes its own chips)."""
    if chip.platform != "cuda":
        return ""
    return "\n".join(line for line in gpu_target_config(chip).splitlines() if not line.startswith("dnn_version_info"))


def _gpu_devices(chip: ChipFacts, topology: str) -> list[jax.Device]:
    """The compile-only devices of one GPU host, e.g. ``"h100-8"``."""
    # The CUDA plugin checks the driver's and libraries' versions when it loads; compiling for a
    # described GPU needs neither a GPU nor a driver.
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    from jax.experimental import topologies

    try:
        description = topologies.get_topology_desc(platform="cuda", topology_name=chip.name,
                                                   target_config=gpu_target_config(chip),
                                                   topology=chip.slices[topology])
    except (RuntimeError, ValueError, NotImplementedError) as e:  # no CUDA plugin: "Unknown backend cuda"
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise TopologyError(f"cannot describe GPU host {topology!r}: {message}. XLA's CUDA compiler comes "
                            "with `pip install \"vaeserve[cuda]\"` (no GPU or driver needed to plan)") from e
    return list(description.devices)


# What libtpu reads, as it loads, of the TPU workers around it. Left unset on a host without a TPU,
# libtpu (0.0.50) logs that it could not find them (`Failed to find host bounds for accelerator
# type`, `E0000 … INVALID_ARGUMENT: … unexpected worker hostname`) although it describes and
# compiles for any topology all the same: this host is the one worker, with no TPU chips.
LIBTPU_WITHOUT_TPU = {"TPU_WORKER_HOSTNAMES": "localhost", "TPU_HOST_BOUNDS": "1,1,1"}


def tpu_chips_here() -> int:
    """The TPU chips on this host's PCI bus (JAX's own check; 0 on a host without a TPU)."""
    from jax._src import hardware_utils

    return hardware_utils.num_available_tpu_chips_and_device_id()[0]


def topology_devices(topology: str) -> list[jax.Device]:
    """The compile-only devices of a TPU slice, e.g. ``"v5e:2x4"`` (8 devices) or ``"v5p-8"``, or of
    a GPU host (``"h100-8"``, ``"h200-4"``; see ``_gpu_devices``).

    Needs libtpu (the ``aot`` extra) but no TPU. libtpu takes a machine-wide lock when it loads and
    asks the cloud metadata server what it runs on; neither is needed to compile, so both are
    turned off here (a serving process that already holds the lock does not block planning), and
    on a host without a TPU libtpu is told that it is a single worker (``LIBTPU_WITHOUT_TPU``).
    """
    chip = _slice_chip(topology)
    if chip is not None and chip.platform == "cuda":
        return _gpu_devices(chip, topology)
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    if not tpu_chips_here():
        for name, value in LIBTPU_WITHOUT_TPU.items():
            os.environ.setdefault(name, value)
    from jax.experimental import topologies

    name = topology_name(topology)
    try:
        return list(topologies.get_topology_desc(platform="tpu", topology_name=name).devices)
    except (RuntimeError, ValueError) as e:  # JaxRuntimeError is a RuntimeError
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        slices = sorted(s for chip in CHIPS for s in chip.slices if chip.platform == "tpu")
        gpus = sorted(s for chip in CHIPS for s in chip.slices if chip.platform == "cuda")
        raise TopologyError(
            f"cannot describe TPU topology {topology!r}: {message}. Expected a name such as "
            f"'v5e:2x4', 'v6e:2x4', 'v5p:2x2x1', a single-host slice {slices} or a GPU host {gpus}; "
            "the TPU compiler comes with `pip install \"vaeserve[aot]\"`"
        ) from e


def platforms_without_absent_tpu() -> str | None:
    """The JAX platforms for this host when libtpu is installed but no TPU chip is on it; None
    where JAX's own choice is right (a TPU host, no libtpu, or ``JAX_PLATFORMS`` set).

    JAX tries every backend it has a plugin for: with libtpu installed (the ``aot`` extra, for
    ``vaeserve plan``) and no TPU, that try fails, and says so in alarming words (libtpu's
    ``unexpected worker hostname``, JAX's ``Unable to initialize backend 'tpu'``). Whether a TPU
    chip is there is JAX's own check (the PCI bus); without one the TPU is left out: GPU plugins
    that are installed, then the CPU (JAX passes over ``cuda`` where no NVIDIA GPU is visible).
    Call before JAX starts its backends."""
    if os.environ.get("JAX_PLATFORMS") or jax.config.values.get("jax_platforms"):
        return None
    from jax._src import cloud_tpu_init

    if cloud_tpu_init.get_tpu_library_path() is None or tpu_chips_here():
        return None
    try:
        namespace = importlib.import_module("jax_plugins")  # where JAX's GPU plugins install themselves
    except ImportError:
        plugins: list[str] = []
    else:
        plugins = [module.name for module in pkgutil.iter_modules(namespace.__path__)]
    gpus = [platform for platform in ("cuda", "rocm") if any(name.startswith(f"xla_{platform}") for name in plugins)]
    return ",".join([*gpus, "cpu"])


def devices_per_chip(devices: Sequence[jax.Device]) -> int:
    """Devices that share one chip: 1 on v5e/v6e/v5p (one device per chip), 2 where libtpu lists
    each TensorCore of a v4 chip as its own device (they share its HBM)."""
    coords = Counter(tuple(getattr(d, "coords", (d.id,))) for d in devices)
    return max(coords.values()) if coords else 1
