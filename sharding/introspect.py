"""Look inside the sharded programs: per-device memory, HLO text, collectives, halo traffic.

Used by the tests (memory is shown structurally, not measured) and by ``bench/scaling.py``.
"""

from __future__ import annotations

import re
from typing import cast

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from vaeserve.models.decode import decode_step, resolve_chunk
from vaeserve.models.family_modules import DecoderModule
from vaeserve.models.shapes import clip_shape
from vaeserve.models.vae import DTYPES, VAE

from .bands import Split, band_layout
from .decode import compile_decode
from .halo import HaloRecorder


def program_memory(compiled: jax.stages.Compiled) -> dict[str, int]:
    """``memory_analysis()`` of a compiled per-device program, in bytes: temp, argument, output,
    alias, code. Answers for programs compiled for abstract devices too (nothing runs)."""
    stats = compiled.memory_analysis()
    if stats is None:
        raise RuntimeError("this backend's compiler gives no memory_analysis() for the program")
    return {
        "temp_bytes": int(stats.temp_size_in_bytes),
        "argument_bytes": int(stats.argument_size_in_bytes),
        "output_bytes": int(stats.output_size_in_bytes),
        "alias_bytes": int(stats.alias_size_in_bytes),
        "code_bytes": int(stats.generated_code_size_in_bytes),
    }


def memory_stats(vae: VAE, shape: tuple[int, ...], mesh: Mesh, **options) -> dict[str, int]:
    """``program_memory`` of the per-device program of ``compile_decode(vae, shape, mesh, **options)``."""
    return program_memory(compile_decode(vae, shape, mesh, **options))


def hlo_text(vae: VAE, shape: tuple[int, ...], mesh: Mesh, **options) -> str:
    """The optimized, SPMD-partitioned HLO of the per-device program of ``compile_decode``."""
    return compile_decode(vae, shape, mesh, **options).as_text() or ""


COLLECTIVE_OPS = ("collective-permute", "all-gather", "all-reduce", "all-to-all", "reduce-scatter")
# One HLO instruction: ``%name = TYPE op(`` or, asynchronous, ``%name = (TUPLE) op-start(``.
_COLLECTIVE = re.compile(
    r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<type>[^=]*?)\s(?P<op>" + "|".join(COLLECTIVE_OPS) + r")(?P<start>-start)?\(",
    re.MULTILINE,
)
_ARRAY = re.compile(r"(?P<dtype>[a-z]+\d*)\[(?P<dims>[\d,]*)\]")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4, "f64": 8, "s64": 8}


def _result_arrays(type_text: str, asynchronous: bool) -> list[tuple[str, tuple[int, ...]]]:
    """The result arrays of a collective from its HLO type.

    Synchronous ops return one array (or a tuple of results); an asynchronous ``*-start`` returns
    ``(operands..., results..., scalar contexts...)``, as the TPU and GPU compilers write
    collective-permutes and all-gathers: the results are the second half of its non-scalar arrays.
    """
    arrays = [(m["dtype"], tuple(int(d) for d in m["dims"].split(",") if d)) for m in _ARRAY.finditer(type_text)]
    arrays = [a for a in arrays if a[1]]
    if not type_text.lstrip().startswith("("):
        return arrays[:1]
    return arrays[len(arrays) // 2 :] if asynchronous else arrays


def collectives(hlo: str) -> list[dict]:
    """Every collective in HLO text (CPU, TPU or GPU): ``{"op", "dtype", "shape", "bytes"}`` per
    result array, its shape per device. A loop body is listed once, however often it runs."""
    found = []
    for match in _COLLECTIVE.finditer(hlo):
        for dtype, dims in _result_arrays(match["type"], bool(match["start"])):
            found.append({"op": match["op"], "dtype": dtype, "shape": dims,
                          "bytes": int(np.prod(dims)) * _BYTES.get(dtype, 4)})
    return found


def collective_summary(found: list[dict]) -> dict[str, dict[str, int]]:
    """``{op: {"count", "bytes"}}`` over the output of ``collectives``."""
    summary: dict[str, dict[str, int]] = {}
    for c in found:
        entry = summary.setdefault(c["op"], {"count": 0, "bytes": 0})
        entry["count"] += 1
        entry["bytes"] += c["bytes"]
    return summary


_CONV_SCOPES = ("CausalConv3d/", "Resample/resample/")  # the 3x3(x3) convolutions' named scopes


def conv_ops(hlo: str) -> dict[str, int]:
    """How the 3x3(x3) convolutions were compiled: ``{"convolution", "tap_matmul"}`` instruction counts.

    ``convolution``: native convolution instructions (on a GPU, cuDNN convolution calls).
    ``tap_matmul``: matmuls (dots; cuBLAS calls on a GPU) traced inside a convolution layer's
    scope — the CPU path's nine-tap matmul, which an accelerator program must not contain (it is
    what compiling for a TPU from a CPU host ran before the conv path followed the target devices).
    """
    native = tap = 0
    for line in hlo.splitlines():
        if " convolution(" in line or '"__cudnn$conv' in line:
            native += 1
        elif (" dot(" in line or '"__cublas' in line) and any(scope in line for scope in _CONV_SCOPES):
            tap += 1
    return {"convolution": native, "tap_matmul": tap}


def halo_bytes(vae: VAE, shape: tuple[int, ...], tp: int, *, dp: int = 1, split: Split | None = None,
               chunk: int | None = None) -> dict[str, int]:
    """Halo traffic of one decode step, from tracing the band program (no mesh, no compile).

    Returns bytes for step 0 (``"first"``, latent frame 0) and a later step (``"next"``, ``chunk``
    latent frames; an LTX decoder's first step takes ``1 + lookahead``): ``"*_per_device"`` is the most one device sends (a one-row slab to each of its
    at most two neighbours per 3x3 conv), ``"*_total"`` what the whole mesh sends (``2 (tp-1)``
    slabs per conv, times ``dp``). ``tp = 1`` exchanges nothing. A model that is not causal in time
    decodes the whole clip in its one step: ``"first"`` is the whole decode, ``"next"`` 0.
    """
    batch, _, frames_in_clip, height, width = clip_shape(shape)
    layout = band_layout(height, width, tp, split)
    chunk = resolve_chunk(chunk)
    dtype = DTYPES[vae.dtype]
    band_hw = (layout.band, width) if layout.split == "height" else (height, layout.band)
    z_dim = vae.config.z_dim

    # Traced as whole steps (no inner frame loop, whose body a trace would see once): the rows
    # exchanged are the same however a step's frames are grouped.
    whole_step = vae.config.temporal_scale * chunk

    def step(state, caches, z, *conditions):
        model = cast(DecoderModule, nnx.merge(vae.graphdef, state))
        return decode_step(model, caches, z, recorder, output="uint8", inner_frames=whole_step,
                           clip_frames=frames_in_clip if caches is None else None,
                           conditions=conditions[0] if conditions else None)

    lookahead = vae.config.lookahead
    first = (1 + lookahead if lookahead is not None else 1) if vae.steps else frames_in_clip
    conditions = vae.conditions_avals(batch // dp)
    slabs = {}
    caches = None
    for name, frames in (("first", first), ("next", chunk if vae.steps else 0)):
        recorder = HaloRecorder(layout)
        if frames:
            z = jax.ShapeDtypeStruct((batch // dp, frames, *band_hw, z_dim), dtype)
            _, caches, _ = jax.eval_shape(step, vae.state, caches, z, *conditions)
        slabs[name] = recorder.slab_bytes()
    result = {}
    for name, slab in slabs.items():
        result[f"{name}_per_device"] = slab * min(2, tp - 1)
        result[f"{name}_total"] = slab * 2 * (tp - 1) * dp
    return result
