"""Will a compiled program fit the memory it will run in? The serve-time guard.

``check_fits`` reads a compiled program's ``memory_analysis()`` (per device: arguments, output,
temp, code) and compares it with the memory available, before the program ever runs; a program
that cannot fit raises ``WontFitError`` naming the shape, the bytes needed vs available and what
would fit (a larger tp, a smaller batch). ``sharding.planner`` asks the same question of programs
compiled for a TPU slice or GPU host that is not here.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax

from .introspect import program_memory
from .mesh import DP_AXIS, TP_AXIS


class WontFitError(RuntimeError):
    """A compiled program that needs more memory per device than the device has: ``needed`` and
    ``limit`` bytes per device, ``hint`` what would fit."""

    def __init__(self, message: str, *, needed: int, limit: int, hint: str):
        super().__init__(message)
        self.needed, self.limit, self.hint = needed, limit, hint


def program_total_bytes(memory: dict[str, int]) -> int:
    """Bytes one device holds while the program runs: arguments + output − aliased + temp + code."""
    return (memory["argument_bytes"] + memory["output_bytes"] - memory["alias_bytes"] + memory["temp_bytes"]
            + memory["code_bytes"])


def _memory_stats(device: jax.Device) -> dict | None:
    try:
        return device.memory_stats()
    except Exception:  # noqa: BLE001 - unimplemented on some platforms
        return None


def device_bytes_limit(devices: Sequence[jax.Device]) -> int | None:
    """The least ``memory_stats()["bytes_limit"]`` over ``devices``; None where the runtime reports
    none (CPU devices, abstract TPU devices)."""
    limits = [int(stats["bytes_limit"]) for stats in map(_memory_stats, devices) if stats and "bytes_limit" in stats]
    return min(limits) if limits else None


def free_device_bytes(device: jax.Device) -> int | None:
    """``bytes_limit − bytes_in_use`` of ``device`` now; None where the runtime reports no limit (CPU)."""
    stats = _memory_stats(device)
    if not stats or "bytes_limit" not in stats:
        return None
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))


def _size(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def what_would_fit(memory: dict[str, int], *, batch: int, tp: int, dp: int, devices: int, limit: int) -> str:
    """An estimate of the tp (or the batch) that would fit ``limit``, from one compiled program.

    Weights and code stay the same per device; temp and output bytes scale as ``batch / tp``
    (``memory_analysis`` over tp = 1, 2, 4, 8 follows that closely). An estimate to confirm with
    ``vaeserve plan``, not a promise.
    """
    fixed = memory["argument_bytes"] + memory["code_bytes"] - memory["alias_bytes"]
    scaling = memory["temp_bytes"] + memory["output_bytes"]
    per_replica = max(1, batch // dp)
    for candidate in (2**k for k in range(1, 12)):
        if tp < candidate <= devices // dp and fixed + scaling * tp / candidate <= limit:
            return (f"tp={candidate} would fit (estimated {_size(fixed + scaling * tp / candidate)} per device; "
                    f"{devices} devices here): serve with --tp {candidate} --dp {max(1, devices // candidate)}")
    most = int((limit - fixed) // (scaling / per_replica)) if limit > fixed and scaling else 0
    if 1 <= most < per_replica:
        return f"a batch of {most} per replica would fit (estimated): serve with --max-batch {most * dp}"
    return ("no tp or batch on these devices fits (estimated): serve a smaller shape, bfloat16, or more devices "
            "per frame (check with `vaeserve plan`)")


def check_fits(compiled: jax.stages.Compiled, *, shape: tuple[int, ...], mesh: jax.sharding.Mesh,
               limit: int, devices: int | None = None, what: str = "the decode of latents") -> int:
    """The bytes per device of ``compiled`` (the decode of NCTHW latents ``shape`` on ``mesh``) if they
    fit ``limit``; else ``WontFitError`` with the shape, the bytes needed vs available and what would fit.
    ``devices``: how many the host has (default: the mesh's); ``what``: the program, for the message
    (``"the encode of frames"`` for an encode)."""
    memory = program_memory(compiled)
    needed = program_total_bytes(memory)
    if needed <= limit:
        return needed
    tp, dp = mesh.shape[TP_AXIS], mesh.shape[DP_AXIS]
    hint = what_would_fit(memory, batch=shape[0], tp=tp, dp=dp, devices=devices or mesh.devices.size, limit=limit)
    raise WontFitError(
        f"{what} {tuple(shape)} at tp={tp}, dp={dp} needs {_size(needed)} per device "
        f"(weights and inputs {_size(memory['argument_bytes'])}, output {_size(memory['output_bytes'])}, "
        f"temp {_size(memory['temp_bytes'])}, code {_size(memory['code_bytes'])}) but {_size(limit)} "
        f"are available ({needed} > {limit} bytes); {hint}", needed=needed, limit=limit, hint=hint,
    )
