"""Where a GPU decode's time goes, read from its compiled program on a host without a GPU.

Compiles the decode's stream steps (the programs the server runs: latent frame 0, then one latent
frame per step) for an absent H100 with XLA's CUDA compiler (``sharding.chips.topology_devices``;
the CUDA plugin, ``pip install "vaeserve[cuda]"``, no GPU or driver), and reads the optimized HLO
(``compiled.as_text()``): per kernel what it is (a cuDNN convolution, a layout change, the causal
caches' concatenation, a norm's reduction, ...) and the bytes it reads and writes, each counted as
often as its loop runs; per convolution its shapes, ``dim_labels`` (layout), cuDNN target and the
kernels between it and the convolution before. Nothing runs: the figures are FLOPs, bytes and
kernel counts, with the time each would take at the chip's peak (``ChipFacts``) as a floor.

    python -m bench.gpu_study                                   # Wan 2.1, 1280x720, both dtypes, all variants
    python -m bench.gpu_study --model hunyuan1.5 --dtypes bfloat16 --variants current chunk-4
    python -m bench.gpu_study --video 832x480 --dtypes bfloat16 --variants current nhwc
    python -m bench.gpu_study --check                           # the variants' convs against the current, CPU

Variants (``VARIANTS``; ``current`` is the product's): ``current``, the program as served; ``nhwc``, XLA
told to run every cuDNN convolution channels-last (``--xla_gpu_force_conv_nhwc``);
``time-taps-2d``, each causal 3x3x3 conv of a later step as three 2-D convs (one per time tap,
time folded into the batch, summed); ``time-in-channels``, the three frames side by side in
channels and one 2-D conv over ``3·C``; ``inner-4``, ``chunk-4`` and their ``nhwc-`` twins, the
programs with another step geometry (whole steps, or four latent frames a step); ``edge-select``,
HunyuanVideo's replicate padding in ops XLA fuses.
Each (variant, dtype) compiles in a process of its own
(XLA reads its flags once per process). Writes JSON (``--out``) and a markdown table (``--markdown``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NHWC = "--xla_gpu_force_conv_nhwc=true"  # every cuDNN convolution channels-last


@dataclass(frozen=True)
class Variant:
    """A way to compile the decode: its step geometry (``chunk``, latent frames per later step, and
    ``inner_frames``, frames per inner step after each temporal upsampler; None: the product's
    automatic choice, ``models.frame_groups.stream_group``), XLA flags (read once per process) and,
    by its name, a rewrite of its convs or padding (``variant_rewrites``). The card's run
    (``bench.device_check --variants``) times the same ones."""

    name: str
    chunk: int | None = None
    inner_frames: int | None = None
    xla_flags: str = ""

    @property
    def latent_frames_per_step(self) -> int:
        return self.chunk or 1  # the product's default chunk (``models.decode.DEFAULT_CHUNK``)

    def geometry(self) -> dict[str, int | None]:
        return {"chunk": self.latent_frames_per_step, "inner_frames": self.inner_frames}


# The product's programs (``current``) run one latent frame per step and, at 720p, the stages
# after each temporal upsampler one frame at a time: each causal conv then reads two cached frames
# for every new one. The geometry variants decode more frames per conv call (the same values).
VARIANTS = {v.name: v for v in (
    Variant("current"), Variant("nhwc", xla_flags=NHWC), Variant("time-taps-2d"), Variant("time-in-channels"),
    Variant("inner-4", chunk=1, inner_frames=4), Variant("nhwc-inner-4", chunk=1, inner_frames=4, xla_flags=NHWC),
    Variant("chunk-4", chunk=4, inner_frames=16), Variant("nhwc-chunk-4", chunk=4, inner_frames=16, xla_flags=NHWC),
    Variant("edge-select"))}
TOPOLOGY = "h100-1"

# -- the HLO text -----------------------------------------------------------------------------------
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4,
          "s64": 8, "u64": 8, "f64": 8}
_ARRAY = re.compile(r"\b(?P<dtype>[a-z]+\d*)\[(?P<dims>[\d,]*)\](?:\{(?P<layout>[\d,]*)[^}]*\})?")
_HEADER = re.compile(r"^(?:ENTRY )?%(?P<name>[\w.\-]+) \(")
# Ops that launch nothing: views, tuples, control flow (their bodies are counted instead), constants.
_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "conditional", "call",
         "after-all", "opt-barrier", "partition-id", "replica-id", "iota"}


@dataclass(frozen=True)
class Array:
    dtype: str
    dims: tuple[int, ...]
    layout: tuple[int, ...]  # minor to major, as HLO writes it

    @property
    def bytes(self) -> int:
        return math.prod(self.dims) * _BYTES.get(self.dtype, 4)

    def text(self) -> str:
        """``bf16[1,192,3,362,642]`` with its dims major to minor in memory, e.g. ``{N,C,T,H,W}``."""
        order = ",".join(str(self.dims[i]) for i in reversed(self.layout)) if self.layout else ""
        return f"{self.dtype}[{','.join(map(str, self.dims))}]" + (f" (memory order {order})" if order else "")


def arrays(type_text: str) -> list[Array]:
    """The arrays of an HLO type (one array or a tuple), zero-sized ones left out."""
    found = []
    for m in _ARRAY.finditer(type_text):
        dims = tuple(int(d) for d in m["dims"].split(",") if d)
        layout = tuple(int(d) for d in (m["layout"] or "").split(",") if d)
        if m["dtype"] in _BYTES and math.prod(dims) > 0:
            found.append(Array(m["dtype"], dims, layout))
    return found


@dataclass
class Instr:
    name: str
    type_text: str
    op: str
    operands: list[str]
    attrs: str
    args: str = ""
    root: bool = False

    def attr(self, key: str) -> str | None:
        m = re.search(rf"\b{key}=(\"[^\"]*\"|\{{[^}}]*\}}|[^,\s{{}}\"]+)", self.attrs)
        return m[1].strip('"') if m else None

    @property
    def scope(self) -> str:
        """The model's scope of the op (its ``op_name``), loops' plumbing left out."""
        m = re.search(r'op_name="([^"]*)"', self.attrs)
        text = m[1] if m else ""
        text = re.sub(r"^jit\(\w+\)/(decode_step/)?", "", text)
        return re.sub(r"(/while/body|/eval_jaxpr|/jit\(\w+\))", "", text)


def _closing(text: str, start: int) -> int:
    """Index of the bracket closing the one at ``text[start]``."""
    depth = 0
    for i in range(start, len(text)):
        depth += text[i] == "("
        depth -= text[i] == ")"
        if depth == 0:
            return i
    raise ValueError(f"unbalanced HLO line: {text[:200]}")


def parse_instruction(line: str) -> Instr | None:
    """One HLO instruction line, ``[ROOT] %name = TYPE op(operands), attrs``; None for other lines."""
    m = re.match(r"^\s*(ROOT\s+)?%(?P<name>[\w.\-]+) = ", line)
    if not m:
        return None
    rest = line[m.end():]
    if rest.startswith("("):
        end = _closing(rest, 0) + 1
    else:
        end = rest.index(" ")
    type_text, rest = rest[:end], rest[end:].lstrip()
    op_end = rest.index("(")
    args_end = _closing(rest, op_end)
    operands = re.findall(r"%([\w.\-]+)", rest[op_end:args_end])
    return Instr(m["name"], type_text, rest[:op_end], operands, rest[args_end + 1:], args=rest[op_end + 1:args_end],
                 root=bool(m.group(1)))


def parse_module(text: str) -> tuple[dict[str, list[Instr]], str]:
    """``({computation: [instructions in schedule order]}, entry name)`` of an HLO module's text."""
    computations: dict[str, list[Instr]] = {}
    entry, current = "", None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header:
            current = computations.setdefault(header["name"], [])
            entry = header["name"] if line.startswith("ENTRY") else entry
            continue
        instr = parse_instruction(line) if current is not None else None
        if instr is not None and current is not None:
            current.append(instr)
    return computations, entry


def executions(computations: dict[str, list[Instr]], entry: str) -> dict[str, int]:
    """How often each computation that launches kernels runs per call of the program: the entry
    once, a while loop's body (and condition) its ``known_trip_count`` times as often as the
    computation around it, a conditional's branches and a call's target as often as it."""
    counts: dict[str, int] = defaultdict(int)

    def visit(name: str, times: int) -> None:
        counts[name] += times
        for instr in computations.get(name, []):
            if instr.op == "while":
                trips = re.search(r'known_trip_count":\{"n":"(\d+)"', instr.attrs)
                n = int(trips[1]) if trips else 1
                visit((instr.attr("body") or "").lstrip("%"), times * n)
                visit((instr.attr("condition") or "").lstrip("%"), times * (n + 1))
            elif instr.op == "conditional":
                for branch in re.findall(r"%([\w.\-]+)", instr.attr("branch_computations") or ""):
                    visit(branch, times)
            elif instr.op == "call":
                visit((instr.attr("to_apply") or "").lstrip("%"), times)
    visit(entry, 1)
    return dict(counts)


# -- what each kernel is, and the bytes it moves ----------------------------------------------------
CATEGORIES = ("conv", "gemm", "layout", "concatenate", "reduction", "slice", "update", "elementwise", "other")


def _fused_ops(instr: Instr, computations: dict[str, list[Instr]]) -> list[Instr]:
    called = instr.attr("calls")
    return computations.get(called.lstrip("%"), []) if called else []


def _changes_layout(instr: Instr, types: dict[str, str]) -> bool:
    """A copy whose result's layout is not its operand's (a transpose in memory)."""
    if instr.op != "copy" or not instr.operands:
        return False
    source, result = arrays(types.get(instr.operands[0], "")), arrays(instr.type_text)
    return bool(source and result and source[0].layout != result[0].layout)


def category(instr: Instr, computations: dict[str, list[Instr]], types: dict[str, str]) -> str:
    """What a kernel does (``CATEGORIES``): a cuDNN conv, a matmul (cuBLAS, Triton, dot), a layout
    change (a transpose, or a copy into another layout), the causal caches' concatenation, a
    reduction (norm statistics), a slice (a copy of part of an array: the next caches), an update
    (frames written into a larger array), elementwise arithmetic, or other."""
    target = instr.attr("custom_call_target") or ""
    if "cudnn$conv" in target:
        return "conv"
    if "cublas" in target or "gemm" in target or "fmha" in target:
        return "gemm"
    ops = [instr, *_fused_ops(instr, computations)]
    kinds = {op.op for op in ops}
    if "dot" in kinds or "gemm" in instr.name:
        return "gemm"
    if "transpose" in kinds or any(_changes_layout(op, types) for op in ops):
        return "layout"
    for kind, name in (("concatenate", "concatenate"), ("reduce", "reduction"), ("dynamic-update-slice", "update")):
        if kind in kinds:
            return name
    if kinds & {"slice", "dynamic-slice"} and kinds <= {"fusion", "slice", "dynamic-slice", "parameter", "bitcast", "copy"}:
        return "slice"
    if instr.op in ("fusion", "copy", "convert", "add", "multiply", "select", "pad", "broadcast"):
        return "elementwise"
    return "other"


def _users(fused: list[Instr]) -> dict[str, list[Instr]]:
    users: dict[str, list[Instr]] = defaultdict(list)
    for op in fused:
        for operand in op.operands:
            users[operand].append(op)
    return users


def _size(type_text: str) -> int:
    return sum(a.bytes for a in arrays(type_text))


def _written(op: Instr, by_name: dict[str, Instr], types: dict[str, str]) -> int:
    """Bytes a kernel's root writes: a dynamic-update-slice writes its update (in place), a tuple
    its elements."""
    if op.op == "tuple":
        return sum(_written(by_name[o], by_name, types) if o in by_name else _size(types.get(o, "")) for o in op.operands)
    if op.op == "dynamic-update-slice":
        return _size(types.get(op.operands[1], ""))
    return _size(op.type_text)


def kernel_bytes(instr: Instr, computations: dict[str, list[Instr]], types: dict[str, str]) -> int:
    """Bytes a kernel reads and writes, as the HLO says: each operand and result once; of an operand
    a fusion only slices, the slices; nothing of the array a dynamic-update-slice writes into."""
    fused = _fused_ops(instr, computations)
    if not fused:
        if instr.op == "dynamic-update-slice":
            return 2 * _size(types.get(instr.operands[1], ""))
        return sum(_size(types.get(o, "")) for o in instr.operands) + _size(instr.type_text)
    by_name = {op.name: op for op in fused}
    params = {int(op.args): op for op in fused if op.op == "parameter"}
    users = _users(fused)
    read = 0
    for index, operand in enumerate(instr.operands):
        param = params.get(index)
        its = users.get(param.name, []) if param else []
        if its and all(u.op in ("slice", "dynamic-slice") for u in its):
            read += sum(_size(u.type_text) for u in its)
        elif its and all(u.op == "dynamic-update-slice" and u.operands[0] == param.name for u in its):  # type: ignore[union-attr]
            continue
        else:
            read += _size(types.get(operand, ""))
    root = next((op for op in fused if op.root), fused[-1])
    return read + _written(root, by_name, types)


def conv_flops(instr: Instr, types: dict[str, str]) -> int:
    """2 x multiply-adds of a cuDNN convolution: output elements x kernel elements per output feature."""
    out = arrays(instr.type_text)[0]
    kernel = arrays(types.get(instr.operands[1], ""))[0]
    labels = (instr.attr("dim_labels") or "_o").split("_")[1].split("->")[0]
    return 2 * math.prod(out.dims) * math.prod(kernel.dims) // kernel.dims[labels.index("o")]


# -- one program ------------------------------------------------------------------------------------
@dataclass
class Kernel:
    name: str
    category: str
    bytes: int
    runs: int
    scope: str


@dataclass
class ProgramStudy:
    kernels: list[Kernel] = field(default_factory=list)
    convs: list[dict[str, Any]] = field(default_factory=list)

    def totals(self, peak_flops: float, bandwidth: float) -> dict[str, Any]:
        """Kernels and bytes per category (each counted as often as it runs), conv FLOPs, and the
        time each would take at the chip's peak: the floor a faster program can approach."""
        count: Counter[str] = Counter()
        moved: Counter[str] = Counter()
        for k in self.kernels:
            count[k.category] += k.runs
            moved[k.category] += k.bytes * k.runs
        flops = sum(c["flops"] * c["runs"] for c in self.convs)
        return {
            "kernels": sum(count.values()), "kernels_by_category": dict(count),
            "bytes": sum(moved.values()), "bytes_by_category": dict(moved),
            "conv_flops": flops, "conv_floor_s": flops / peak_flops,
            "memory_floor_s": sum(moved.values()) / bandwidth,
            "layout_floor_s": moved["layout"] / bandwidth,
            "non_conv_floor_s": (sum(moved.values()) - moved["conv"] - moved["gemm"]) / bandwidth,
        }


def _bytes_by_category(kernels: list[Kernel]) -> Counter[str]:
    moved: Counter[str] = Counter()
    for k in kernels:
        moved[k.category] += k.bytes
    return moved


def _producer(name: str, where: dict[str, Instr]) -> str:
    """What made an operand: the category-bearing kernel behind views, or "loop state"."""
    seen = where.get(name)
    while seen is not None and seen.op in ("bitcast", "get-tuple-element", "copy") and seen.operands:
        if seen.op == "get-tuple-element" and seen.operands[0] in where and where[seen.operands[0]].op == "parameter":
            return "loop state (caches, activations carried by the loop)"
        if seen.op == "copy":
            return seen.name
        seen = where.get(seen.operands[0])
    return seen.name if seen is not None else name


def study_program(hlo: str) -> ProgramStudy:
    """Every kernel of a compiled GPU program (``compiled.as_text()``) with its category, bytes and
    runs per call; every cuDNN convolution with its shapes, layout and the kernels before it."""
    computations, entry = parse_module(hlo)
    types = {i.name: i.type_text for instrs in computations.values() for i in instrs}
    runs = executions(computations, entry)
    study = ProgramStudy()
    for comp, times in runs.items():
        where = {i.name: i for i in computations.get(comp, [])}
        categories: dict[str, str] = {}
        since: list[Kernel] = []
        for instr in computations.get(comp, []):
            if instr.op in _FREE:
                continue
            kind = category(instr, computations, types)
            categories[instr.name] = kind
            kernel = Kernel(instr.name, kind, kernel_bytes(instr, computations, types), times, instr.scope)
            study.kernels.append(kernel)
            if kind != "conv":
                since.append(kernel)
                continue
            source = _producer(instr.operands[0], where)
            operands = [arrays(types.get(o, "")) for o in instr.operands[:2]]
            study.convs.append({
                "scope": instr.scope, "runs": times, "target": (instr.attr("custom_call_target") or "").split("$")[-1],
                "window": instr.attr("window"), "dim_labels": instr.attr("dim_labels"),
                "input": operands[0][0].text() if operands[0] else "", "kernel": operands[1][0].text() if operands[1] else "",
                "output": arrays(instr.type_text)[0].text(), "flops": conv_flops(instr, types), "bytes": kernel.bytes,
                "input_from": f"{source} ({categories.get(source, 'outside')})",
                "kernels_before": len(since), "bytes_before": dict(_bytes_by_category(since)),
            })
            since = []
    return study


# -- variants (compile-only studies, not the product) -----------------------------------------------
def time_taps_2d(past, x_padded, kernel, *, rounded_sums: bool):
    """A causal 3x3x3 conv of ``x_padded (B, T, H+2, W+2, C)`` after ``past (B, 2, H+2, W+2, C)`` as
    three 2-D convs, one per time tap, each over the ``T`` frames it reads with time folded into
    the batch, summed: ``(B, T, H, W, O)`` sums (no bias)."""
    import jax.numpy as jnp
    from jax import lax

    from vaeserve.models.conv import sums_type
    from vaeserve.models.spatial import matmul_precision

    b, t, hp, wp, c = x_padded.shape
    frames = [past[:, i] for i in range(past.shape[1])] + [x_padded[:, i] for i in range(t)]
    taps = [lax.conv_general_dilated(jnp.stack(frames[tap : tap + t], axis=1).reshape(b * t, hp, wp, c), kernel[tap],
                                     (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                     precision=matmul_precision(x_padded.dtype),
                                     preferred_element_type=sums_type(x_padded.dtype, rounded=rounded_sums))
            for tap in range(kernel.shape[0])]
    total = taps[0]
    for y in taps[1:]:
        total = total + y
    return total.reshape(b, t, hp - 2, wp - 2, kernel.shape[-1])


def time_in_channels(past, x_padded, kernel, *, rounded_sums: bool):
    """The same conv as ``time_taps_2d`` as one 2-D conv: the three frames each output frame reads
    side by side in channels (``3·C``), the kernel's time taps folded likewise."""
    import jax.numpy as jnp
    from jax import lax

    from vaeserve.models.conv import sums_type
    from vaeserve.models.spatial import matmul_precision

    b, t, hp, wp, c = x_padded.shape
    kt, o = kernel.shape[0], kernel.shape[-1]
    seq = jnp.concatenate([past, x_padded], axis=1)
    stacked = jnp.concatenate([seq[:, i : i + t] for i in range(kt)], axis=-1).reshape(b * t, hp, wp, kt * c)
    folded = kernel.transpose(1, 2, 0, 3, 4).reshape(3, 3, kt * c, o)
    y = lax.conv_general_dilated(stacked, folded, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                 precision=matmul_precision(x_padded.dtype),
                                 preferred_element_type=sums_type(x_padded.dtype, rounded=rounded_sums))
    return y.reshape(b, t, hp - 2, wp - 2, o)


_REWRITES = {"time-taps-2d": time_taps_2d, "time-in-channels": time_in_channels}


def edge_select_pad(x):
    """``replicate_pad_hw`` (``jnp.pad(mode="edge")``, which JAX writes as concatenations of slices)
    as a zero pad whose border rows and columns are then set from the rows and columns inside them:
    the same values, in ops XLA can fuse into the conv input's fusion."""
    import jax.numpy as jnp

    h, w = x.shape[-3], x.shape[-2]
    padded = jnp.pad(x, [(0, 0)] * (x.ndim - 3) + [(1, 1), (1, 1), (0, 0)])
    padded = padded.at[..., 0, :, :].set(padded[..., 1, :, :]).at[..., h + 1, :, :].set(padded[..., h, :, :])
    return padded.at[..., :, 0, :].set(padded[..., :, 1, :]).at[..., :, w + 1, :].set(padded[..., :, w, :])


# Variants that change how a frame is padded (HunyuanVideo's replicate edges), not the convs.
_PAD_REWRITES = {"edge-select": edge_select_pad}


@contextlib.contextmanager
def variant_rewrites(variant: str) -> Iterator[None]:
    """While tracing, a frame's replicate padding, or a later step's causal 3x3x3 convs (stride 1, a
    past to read), run as ``variant`` says; the clip's first step and strided convs as they are. A
    variant without a rewrite traces the product's code."""
    from vaeserve.models import conv, spatial
    from vaeserve.sharding import halo

    if variant in _PAD_REWRITES:  # the one-device context's and the model's own replicate padding
        saved = spatial.replicate_pad_hw, halo.replicate_pad_hw
        spatial.replicate_pad_hw = halo.replicate_pad_hw = _PAD_REWRITES[variant]
        try:
            yield
        finally:
            spatial.replicate_pad_hw, halo.replicate_pad_hw = saved
        return
    rewrite = _REWRITES.get(variant)
    if rewrite is None:
        yield
        return
    original = conv._native_causal

    def native_causal(past, x_padded, kernel, *, start, strides=(1, 1, 1), rounded_sums):
        if past is None or tuple(strides) != (1, 1, 1) or kernel.shape[0] != past.shape[1] + 1:
            return original(past, x_padded, kernel, start=start, strides=strides, rounded_sums=rounded_sums)
        return rewrite(past, x_padded, kernel, rounded_sums=rounded_sums)

    conv._native_causal = native_causal
    try:
        yield
    finally:
        conv._native_causal = original


def check_variants(seed: int = 0) -> dict[str, float]:
    """Max abs difference, float32 on CPU, of each rewrite against the current native 3-D conv on a
    small random case (and of a time-reversed kernel: the control, which must differ)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from vaeserve.models.conv import _native_causal

    rng = np.random.default_rng(seed)
    past, x = (jnp.asarray(rng.standard_normal((1, n, 10, 12, 8), np.float32)) for n in (2, 3))
    kernel = jnp.asarray(rng.standard_normal((3, 3, 3, 8, 5), np.float32))
    with jax.default_matmul_precision("highest"):
        expected = np.asarray(_native_causal(past, x, kernel, start="zero", rounded_sums=False))
        found = {name: float(np.abs(np.asarray(fn(past, x, kernel, rounded_sums=False)) - expected).max())
                 for name, fn in _REWRITES.items()}
        reversed_taps = np.asarray(time_taps_2d(past, x, kernel[::-1], rounded_sums=False))
    from vaeserve.models.spatial import replicate_pad_hw, zero_pad_hw

    edge = replicate_pad_hw(x)
    found.update({name: float(np.abs(np.asarray(fn(x)) - np.asarray(edge)).max()) for name, fn in _PAD_REWRITES.items()})
    return {**found, "control: time taps reversed": float(np.abs(reversed_taps - expected).max()),
            "control: zero padding": float(np.abs(np.asarray(zero_pad_hw(x)) - np.asarray(edge)).max())}


# -- jobs -------------------------------------------------------------------------------------------
def latents_shape(video: str, chunk: int = 1, config=None) -> tuple[int, ...]:
    """``"1280x720"`` → the latents (of ``config``, the default model's by default) of a first step
    and one later step of ``chunk`` latent frames."""
    from vaeserve.models.registry import default_config

    config = config or default_config()
    width, height = (int(n) for n in video.split("x"))
    scale = config.spatial_scale
    return (1, config.z_dim, 1 + chunk, height // scale, width // scale)


def run_job(variant: str, dtype: str, video: str, model: str = "wan2.1") -> dict[str, Any]:
    """Compile the stream steps of ``model``'s decode for an H100 and study each program."""
    from importlib import metadata

    from vaeserve import models, sharding
    from vaeserve.models.registry import embedded_model
    from vaeserve.sharding.chips import chip_facts, topology_devices
    from vaeserve.sharding.introspect import program_memory

    devices = topology_devices(TOPOLOGY)
    chip = chip_facts(devices[0].device_kind)
    mesh = sharding.make_mesh(1, devices=devices)
    config = embedded_model(model).config()
    vae = models.abstract_vae(config, dtype=dtype)
    chosen = VARIANTS[variant]
    start = time.perf_counter()
    with variant_rewrites(variant):
        programs = sharding.compile_decode_stream(vae, latents_shape(video, chosen.latent_frames_per_step, config), mesh,
                                                  chunk=chosen.chunk, inner_frames=chosen.inner_frames)
    seconds = time.perf_counter() - start
    if len(programs) != 2:
        raise ValueError(f"{model} decodes in {len(programs)} program(s), not a first and a later step: "
                         "the study reads stepped decodes")
    peak = chip.peak_bf16_flops if dtype == "bfloat16" else FLOAT32_PEAK
    studied = {}
    frames = {"first step": 1, "later step": vae.config.temporal_scale * chosen.latent_frames_per_step}
    for step, compiled in zip(("first step", "later step"), programs, strict=True):
        study = study_program(compiled.as_text() or "")
        studied[step] = {"frames": frames[step], "memory": program_memory(compiled),
                         "totals": study.totals(peak, chip.hbm_bytes_per_s), "convs": study.convs}
    versions = {name: metadata.version(name) for name in ("jax", "jax-cuda13-plugin", "nvidia-cudnn-cu13")}
    return {"model": model, "variant": variant, "dtype": dtype, "video": video, "geometry": chosen.geometry(),
            "device_kind": devices[0].device_kind, "versions": versions,
            "compile_s": round(seconds, 1), "peak_flops": peak, "hbm_bytes_per_s": chip.hbm_bytes_per_s,
            "programs": studied}


# H100 SXM's dense float32 (non-tensor) peak, 67 TFLOP/s: the floor of an exact float32 conv.
FLOAT32_PEAK = 67e12


def run_jobs(variants: list[str], dtypes: list[str], video: str, model: str = "wan2.1") -> list[dict[str, Any]]:
    """Each (variant, dtype) in a process of its own, with its XLA flags; a failed job is recorded."""
    import tempfile

    from tqdm import tqdm

    results = []
    jobs = [(v, d) for v in variants for d in dtypes]
    for variant, dtype in tqdm(jobs, desc="compile for H100", unit="program pair"):
        with tempfile.TemporaryDirectory() as folder:
            out = Path(folder) / "job.json"
            env = {**os.environ, "XLA_FLAGS": " ".join(filter(None, [os.environ.get("XLA_FLAGS"),
                                                                     VARIANTS[variant].xla_flags]))}
            done = subprocess.run([sys.executable, "-m", "bench.gpu_study", "--job", variant, dtype, "--video", video,
                                   "--model", model, "--job-out", str(out)], env=env, capture_output=True, text=True)
            if done.returncode:
                results.append({"variant": variant, "dtype": dtype, "error": done.stderr[-2000:]})
                continue
            results.append(json.loads(out.read_text()))
    return results


# -- output -----------------------------------------------------------------------------------------
def _gb(n: float) -> str:
    return f"{n / 1e9:.1f}"


def markdown(results: list[dict[str, Any]], command: str, host: str) -> str:
    """The study as markdown: totals per variant, dtype and step; the later step's convs (the first
    result's)."""
    done = next((r for r in results if "device_kind" in r), {})
    versions = ", ".join(f"{name} {version}" for name, version in done.get("versions", {}).items())
    lines = [f"The {done.get('model', 'wan2.1')} decode at {done.get('video', '1280x720')}, compiled on {host}, "
             f"for one {done.get('device_kind', 'NVIDIA H100 80GB HBM3')} (sm_90)"
             + (f" ({versions})" if versions else "") + f"; reproduce with `{command}`.", "",
             "| variant | dtype | step | kernels | convs | conv TFLOP | GB moved | of which layout | concatenate "
             "| slice | reduction | conv floor ms | memory floor ms | temp GB |", "|" + "---|" * 14]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['variant']} | {r['dtype']} | failed: {r['error'].splitlines()[-1][:80]} |" + " |" * 11)
            continue
        for step, p in r["programs"].items():
            t, moved = p["totals"], p["totals"]["bytes_by_category"]
            lines.append(f"| {r['variant']} | {r['dtype']} | {step} | {t['kernels']} | "
                         f"{t['kernels_by_category'].get('conv', 0)} | {t['conv_flops'] / 1e12:.1f} | {_gb(t['bytes'])} | "
                         f"{_gb(moved.get('layout', 0))} | {_gb(moved.get('concatenate', 0))} | {_gb(moved.get('slice', 0))} | "
                         f"{_gb(moved.get('reduction', 0))} | {1e3 * t['conv_floor_s']:.1f} | {1e3 * t['memory_floor_s']:.1f} | "
                         f"{_gb(p['memory']['temp_bytes'])} |")
    lines += ["", "Per output frame of the later step (an 81-frame clip runs the first step once, then "
              "80 frames of later steps):", "",
              "| variant | dtype | latent frames per step | inner frames | frames per step | kernels per frame "
              "| GB moved per frame | conv floor ms per frame | memory floor ms per frame | temp GB |", "|" + "---|" * 10]
    for r in results:
        if "error" in r or "later step" not in r["programs"]:
            continue
        p = r["programs"]["later step"]
        t, frames = p["totals"], p.get("frames", 4)
        geometry = r.get("geometry", {"chunk": 1, "inner_frames": None})
        inner = geometry["inner_frames"] or "automatic"
        lines.append(f"| {r['variant']} | {r['dtype']} | {geometry['chunk']} | {inner} | {frames} | "
                     f"{t['kernels'] / frames:.0f} | {t['bytes'] / frames / 1e9:.1f} | "
                     f"{1e3 * t['conv_floor_s'] / frames:.1f} | {1e3 * t['memory_floor_s'] / frames:.1f} | "
                     f"{_gb(p['memory']['temp_bytes'])} |")
    first = next((r for r in results if "error" not in r), None)
    if first is not None:
        lines += ["", f"Convolutions of the later step ({first['variant']}, {first['dtype']}), once per listed run:", "",
                  "| scope | runs | target | dim_labels | input | GFLOP | GB in+out | input from | since the conv before (category: GB) |",
                  "|" + "---|" * 9]
        for c in first["programs"]["later step"]["convs"]:
            scope = re.sub(r"^WanDecoder/decoder/Decoder3d/|frame_groups_after_up_blocks\.\d/", "", c["scope"])
            scope = scope.replace("/conv_general_dilated", "")
            lines.append(f"| {scope} | {c['runs']} | {c['target']} | `{c['dim_labels']}` | {c['input'].split(' (')[0]} | "
                         f"{c['flops'] / 1e9:.0f} | {_gb(c['bytes'])} | {c['input_from'].split(' (')[-1].rstrip(')')} | "
                         + ", ".join(f"{k}: {_gb(v)}" for k, v in c["bytes_before"].items()) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    from vaeserve.models.registry import EMBEDDED

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    videos = [name for name, model in EMBEDDED.items() if not model.config().is_image]
    parser.add_argument("--model", default="wan2.1", choices=videos,
                        help="the embedded video model whose real config is studied (default wan2.1; its decode "
                             "must step: a first and a later step)")
    parser.add_argument("--video", default="1280x720", help="WIDTHxHEIGHT of the decoded frames (default 1280x720)")
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"], choices=["bfloat16", "float32"])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--out", type=Path, help="write the study as JSON here")
    parser.add_argument("--markdown", type=Path, help="write the tables as markdown here")
    parser.add_argument("--render", type=Path, help="print (and with --markdown write) the tables of a saved --out")
    parser.add_argument("--check", action="store_true", help="check the variants' convs against the current, on CPU")
    parser.add_argument("--job", nargs=2, metavar=("VARIANT", "DTYPE"), help=argparse.SUPPRESS)
    parser.add_argument("--job-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.check:
        print(json.dumps(check_variants(), indent=1))
        return
    if args.job:
        variant, dtype = args.job
        args.job_out.write_text(json.dumps(run_job(variant, dtype, args.video, args.model)))
        return
    if args.render:
        saved = json.loads(args.render.read_text())
    else:
        saved = {"command": "python -m bench.gpu_study " + " ".join(sys.argv[1:]),
                 "host": f"an {platform.machine()} host with {os.cpu_count()} cores and no GPU",
                 "results": run_jobs(args.variants, args.dtypes, args.video, args.model)}
    if args.out:
        args.out.write_text(json.dumps(saved, indent=1) + "\n")
    text = markdown(saved["results"], saved["command"], saved["host"])
    if args.markdown:
        args.markdown.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
