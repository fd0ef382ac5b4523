"""The compiled plans shipped with the package: ``vaeserve plan`` answers the rows it holds at once.

``sharding/plans/tpu.jsonl`` (libtpu) and ``gpu.jsonl`` (XLA's CUDA compiler) hold one JSON line
per compiled decode (``bench/plan_table.py`` writes them): a model, video, slice, dtype and tp —
batch 1, dp 1, uint8 frames out, automatic inner frames, as a server runs — and what the compiler
said (``memory_analysis()`` bytes, fits, FLOPs, compile time; or, for a program it refused for
memory, its message and the bytes it named). Each row also names what made it:

* ``compiler``: the versions of the compiler's packages (``jax``, ``jaxlib``, and ``libtpu`` or the
  CUDA plugin);
* ``code``: the fingerprint of the code that becomes the decode program (``code_fingerprint``).

A row whose fingerprint or compiler differs from this checkout's is *stale*: it is still shown,
saying so, and ``vaeserve plan --compile`` compiles it again.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import math
from collections.abc import Callable, Iterator
from functools import cache
from importlib import metadata
from importlib.resources import files
from pathlib import Path
from typing import Any

from .chips import CHIPS

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # where models/ and sharding/ sit
TABLES = {"tpu": "plans/tpu.jsonl", "gpu": "plans/gpu.jsonl"}
DEFAULT_MODEL = "wan2.1"  # rows of Wan 2.1 name no model
# What a table row is: a decode at batch 1, dp 1, uint8 frames out, automatic inner frames.
ROW_SETTINGS = {"batch": 1, "dp": 1, "output": "uint8", "inner_frames": None}
# The package whose version is the compiler's, besides jax and jaxlib: libtpu, and the CUDA plugin
# of the `cuda` extra (rows compiled before it moved to CUDA 13 name jax-cuda12-plugin).
COMPILER_PACKAGES = {"tpu": "libtpu", "gpu": "jax-cuda13-plugin"}
# Where the decode program's code starts: the module that builds the program.
PROGRAM_BUILDER = "sharding/decode.py"
PACKAGE = "vaeserve"
FIRST_PARTY = ("models", "sharding")  # the subpackages whose code becomes programs


# -- the code fingerprint -------------------------------------------------------------------------
def _within_package(module: str) -> str:
    """``vaeserve.models.x`` -> ``models.x``: a module's name relative to the package root (paths
    and fingerprints name modules so, as they sit in a checkout)."""
    return module.removeprefix(f"{PACKAGE}.")


def imported_modules(path: str, source: str) -> Iterator[str]:
    """The first-party module files that ``source`` (the file at ``path``, relative to the package
    root) imports: ``from vaeserve.models.x import …``, ``from .x import …``, ``import
    vaeserve.sharding.y``."""
    package = path.rsplit("/", 1)[0]
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom):
            base = package.replace("/", ".") if node.level else ""
            module = ".".join(part for part in (base, _within_package(node.module or "")) if part)
            names = [module] + [f"{module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [_within_package(alias.name) for alias in node.names]
        for name in names:
            if name.split(".")[0] in FIRST_PARTY:
                yield name.replace(".", "/") + ".py"


@cache
def _normalized(source: str) -> str:
    """The code without what does not change a program: comments, formatting, docstrings and the
    ``vaeserve.`` prefix of imports."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:  # where the package is installed changes no program
            node.module = _within_package(node.module)
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
    return ast.dump(tree, include_attributes=False)


def family_module_files(family: str) -> list[str]:
    """The module files of the decoders of configs whose ``family`` is ``family`` (the registry names
    them by dotted path, so the imports do not lead there)."""
    from vaeserve.models.registry import FAMILIES

    files = []
    for descriptor in FAMILIES:
        for cls in descriptor.configs:
            if cls.family == family:
                decoder = descriptor.load(descriptor.modules[cls.class_name].decoder)
                files.append(Path(inspect.getfile(decoder)).resolve().relative_to(PACKAGE_ROOT).as_posix())
    return files


def code_fingerprint(family: str, read: Callable[[str], str | None] | None = None) -> str:
    """A fingerprint of the code that becomes ``family``'s decode program: 12 hex digits of the
    SHA-256 of every module ``sharding/decode.py`` and the family's decoder module import,
    transitively, within ``models`` and ``sharding``, each without its comments, formatting and
    docstrings. Coarse on purpose: a change it sees may leave the program as it was, but a change to
    the program's code is never missed. ``read(path)`` gives a file's text (None: no such file); by
    default this checkout's (a git revision's, to stamp rows compiled before)."""
    read = read or _read_checkout
    seen: dict[str, str] = {}
    todo = [PROGRAM_BUILDER, *family_module_files(family)]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        source = read(path)
        if source is None:  # a name imported from a module, or a package (its __init__)
            init = path.removesuffix(".py") + "/__init__.py"
            if init != path and init not in seen and read(init) is not None:
                todo.append(init)
            continue
        seen[path] = _normalized(source)
        todo.extend(imported_modules(path, source))
    digest = hashlib.sha256()
    for path in sorted(seen):
        digest.update(f"{path}\n{seen[path]}\n".encode())
    return digest.hexdigest()[:12]


def _read_checkout(path: str) -> str | None:
    file = PACKAGE_ROOT / path
    return file.read_text(encoding="utf-8") if file.is_file() else None


@cache
def current_fingerprint(family: str) -> str:
    return code_fingerprint(family)


def compiler_versions(platform: str) -> dict[str, str]:
    """The installed versions of the packages that make up ``platform``'s compiler (``"tpu"`` or
    ``"gpu"``); a package that is not installed is left out."""
    versions = {}
    for package in ("jax", "jaxlib", COMPILER_PACKAGES[platform]):
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


def staleness(row: dict[str, Any], family: str, platform: str) -> str | None:
    """Why a row may no longer be what this checkout would compile, or None: the code that makes
    the program changed (another fingerprint), or the compiler installed here is another version.
    A row that names neither is stale too (nothing says what made it)."""
    reasons = []
    code = current_fingerprint(family)
    if row.get("code") != code:
        reasons.append(f"compiled from decode code {row.get('code', 'unknown')}; this checkout's is {code}")
    installed = compiler_versions(platform)
    changed = [f"{name} {version} (here {installed[name]})" for name, version in (row.get("compiler") or {}).items()
               if name in installed and installed[name] != version]
    if "compiler" not in row:
        reasons.append("the compiler that made it is not recorded")
    elif changed:
        reasons.append(f"compiled by {', '.join(changed)}")
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
