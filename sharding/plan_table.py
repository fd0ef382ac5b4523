"""The compiled plans shipped with the package: ``vaeserve plan`` answers the rows it holds at once.

``sharding/plans/tpu.jsonl`` (libtpu) and ``gpu.jsonl`` (XLA's CUDA compiler) hold one JSON line
per compiled decode (``bench/plan_table.py`` writes them): a model, video, slice, dtype and tp —
batch 1, dp 1, uint8 frames out, automatic inner frames, as a server runs — and what the compiler
said (``memory_analysis()`` bytes, fits, FLOPs, compile time; or, for a program it refused for
memory, its message and the bytes it named). Each row also names what made it:

* ``compiler``: the versions of the compiler's packages (``jax``, ``jaxlib``, and ``libtpu`` or the
  CUDA plugin);
* ``program``: the fingerprint of the lowered program that was compiled (``program_fingerprint``).

A row stays fresh while this checkout lowers the same program for it and the same compiler is
installed: a change to the Python that leaves the program as it was (a comment, a rename, a
refactor) leaves every row fresh. A row whose program or compiler differs is *stale*: it is still
shown, saying so, and ``vaeserve plan --compile`` compiles it again.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from functools import cache
from importlib import metadata
from importlib.resources import files
from typing import Any

from vaeserve.models.registry import DEFAULT_MODEL  # rows of the default model name no model

from .chips import CHIPS

TABLES = {"tpu": "plans/tpu.jsonl", "gpu": "plans/gpu.jsonl"}
# The packages whose versions are the compiler's, besides jax and jaxlib: libtpu; the CUDA plugin of
# the `cuda` extra and the cuDNN it loads, whose version XLA's choice of convolutions follows (rows
# compiled before it moved to CUDA 13 name jax-cuda12-plugin; rows older than these notes, no cuDNN).
COMPILER_PACKAGES = {"tpu": ("libtpu",), "gpu": ("jax-cuda13-plugin", "nvidia-cudnn-cu13")}


# -- the program fingerprint ----------------------------------------------------------------------
_PRIVATE_FUNCTION = re.compile(r"func\.func private @([A-Za-z_][\w.$-]*)")
_SYMBOL = re.compile(r"@([A-Za-z_][\w.$-]*)")


def normalized_module(text: str) -> str:
    """A lowered module's text (``Lowered.as_text()``, without debug information: no source
    locations) with its private functions named by the order they are defined in (``@silu_3`` →
    ``@f7``): JAX names them after the Python functions that made them, which changes no program."""
    names = {name: f"f{index}" for index, name in enumerate(_PRIVATE_FUNCTION.findall(text))}
    return _SYMBOL.sub(lambda match: "@" + names.get(match[1], match[1]), text)


def program_fingerprint(module_text: str, compiler_options: Mapping[str, Any], target: str = "") -> str:
    """12 hex digits of the SHA-256 of a lowered program (``normalized_module``), the compiler
    options it is compiled with and the description of the devices we give the compiler
    (``chips.compile_target``): what the compiler is given, so an equal fingerprint under the same
    compiler is the same compiled program."""
    digest = hashlib.sha256(normalized_module(module_text).encode())
    digest.update(json.dumps(dict(compiler_options), sort_keys=True).encode())
    digest.update(target.encode())
    return digest.hexdigest()[:12]


def compiler_versions(platform: str) -> dict[str, str]:
    """The installed versions of the packages that make up ``platform``'s compiler (``"tpu"`` or
    ``"gpu"``); a package that is not installed is left out."""
    versions = {}
    for package in ("jax", "jaxlib", *COMPILER_PACKAGES[platform]):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    return versions


# -- the rows -------------------------------------------------------------------------------------
def platform_of(slice_name: str) -> str:
    chip = next(chip for chip in CHIPS if slice_name in chip.slices)
    return "gpu" if chip.platform == "cuda" else "tpu"


@cache
def rows(platform: str) -> tuple[dict[str, Any], ...]:
    """Every row of a platform's table, as shipped."""
    text = files("vaeserve.sharding").joinpath(TABLES[platform]).read_text(encoding="utf-8")
    return tuple(json.loads(line) for line in text.splitlines() if line.strip())


def lookup(model: str, video: str, slice_name: str, dtype: str, tp: int) -> dict[str, Any] | None:
    """The table's row of one decode (``video`` as ``WxHxF``), or None."""
    for row in rows(platform_of(slice_name)):
        if (row.get("model", DEFAULT_MODEL), row["video"], row["slice"], row["dtype"], row["tp"]) == (
                model, video, slice_name, dtype, tp):
            return row
    return None


def staleness(row: dict[str, Any], platform: str, program: str | None) -> str | None:
    """Why a row may no longer be what this checkout would compile, or None: another compiler is
    installed here, or this checkout lowers another program for it (``program``: its fingerprint;
    None where it cannot be lowered here, which leaves the program unchecked). A row that does not
    name its compiler or program is stale too (nothing says what made it)."""
    reasons = []
    installed = compiler_versions(platform)
    changed = [f"{name} {version} (here {installed[name]})" for name, version in (row.get("compiler") or {}).items()
               if name in installed and installed[name] != version]
    if "compiler" not in row:
        reasons.append("the compiler that made it is not recorded")
    elif changed:
        reasons.append(f"compiled by {', '.join(changed)}")
    if "program" not in row:
        reasons.append("the program it was compiled from is not recorded")
    elif program is not None and row["program"] != program:
        reasons.append(f"compiled from program {row['program']}; this checkout lowers {program}")
    return "; ".join(reasons) or None


def compiler_text(row: dict[str, Any]) -> str:
    """``"libtpu 0.0.42.1, jax 0.10.2"``: the row's compiler, its own package first."""
    versions = row.get("compiler") or {}
    return ", ".join(f"{name} {version}" for name, version in sorted(versions.items(), key=lambda kv: kv[0] == "jax"
                                                                     or kv[0] == "jaxlib")) or "unrecorded"


def estimate_compile_s(model: str, video: str, slice_name: str, dtype: str, tp: int) -> tuple[float, str] | None:
    """The CPU seconds a compile of this decode is likely to take, and the row it is read from: the
    row itself, else the same model, dtype and tp on the same platform nearest in frame size; None
    when the table has no row of the model. A 2-core host's CPU time, not a promise."""
    candidates = [row for row in rows(platform_of(slice_name)) if row.get("model", DEFAULT_MODEL) == model
                  and row["dtype"] == dtype and row["tp"] == tp and "compile_cpu_s" in row]
    if not candidates:
        return None
    pixels = math.prod(int(v) for v in video.split("x"))

    def distance(row: dict[str, Any]) -> tuple[bool, bool, float]:
        size = math.prod(int(v) for v in row["video"].split("x"))
        return row["video"] != video, row["slice"] != slice_name, abs(math.log(size / pixels))

    nearest = min(candidates, key=distance)
    return float(nearest["compile_cpu_s"]), f"{nearest['video']} on {nearest['slice']} at tp={tp}"
