"""Will a decode fit a TPU slice (or a GPU host)? Compile it for the slice's abstract devices and read
each chip's bytes.

``plan_decode`` compiles the sharded decode (``compile_decode``, the very program a server runs)
ahead of time for every candidate ``(dp, tp)`` mesh over the devices of a topology
(``chips.topology_devices``), on any host: no TPU, no weights (``models.abstract_vae``). For each
mesh it reports the per-device ``memory_analysis()``, whether it fits the chip's HBM with a stated
headroom, FLOPs, HBM traffic, halo bytes, the collectives in the compiled HLO, the compile time and
a roofline *lower bound* on the decode time; then the smallest tp that fits.

A family that builds its own programs (MiniMax-H3's tiled ViT: ``models.family_modules.family_programs``)
is planned from those: its decode spreads independent pieces of work (tiles) over every device of
the mesh, so a candidate's "tp" is the devices the pieces are spread over, its ``split`` is
``"tiles"`` and it exchanges no halos.

FLOPs are the model's count (``models.flops``) of the whole decode, per device: XLA's
``cost_analysis()`` sees a ``lax.scan`` body once (latent frame 0 plus one later step, not T − 1
of them), so its figure is reported beside it (``cost_analysis_flops``), and so is its byte count
(``bytes_accessed``), an undercount of the whole decode's traffic that keeps the bound a bound.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from vaeserve.models.config import VAEConfig
from vaeserve.models.conv import compiler_options_for
from vaeserve.models.flops import decode_flops
from vaeserve.models.shapes import (
    FramesError,
    Output,
    check_output,
    clip_shape,
    latents_for_frames,
    min_latent_frames,
    misfits,
    output_frames,
)
from vaeserve.models.vae import VAE

from .bands import Split, band_layout
from .chips import (
    ChipFacts,
    TopologyError,
    chip_facts,
    compile_target,
    devices_per_chip,
    slice_facts,
    topology_devices,
)
from .decode import lower_decode, lower_own_decode, mesh_platform
from .fits import program_total_bytes
from .introspect import collective_summary, collectives, halo_bytes, program_memory
from .mesh import DP_AXIS, TP_AXIS, make_mesh
from .plan_table import compiler_versions, lookup, platform_of, program_fingerprint, staleness


class PlanError(ValueError):
    """A video or latent shape the model cannot decode; the message names the nearest valid values."""


# -- shapes -------------------------------------------------------------------------------------
def latent_shape_for_video(config: VAEConfig, width: int, height: int, frames: int) -> tuple[int, ...]:
    """Latents ``(C, T, H, W)`` that decode to ``frames`` frames of ``width x height``; an image
    model's ``(C, H, W)`` for one frame (an image).

    The decoder yields ``1 + temporal_scale·(T − 1)`` frames (or what its config's
    ``num_output_frames`` says: MiniMax-H3's ``17n + 5`` for ``5n + 2``) of ``spatial_scale`` times
    the latent size; other sizes are refused (``PlanError``) with the nearest ones that exist.
    """
    spatial, temporal = config.spatial_scale, config.temporal_scale
    if config.is_image and frames != 1:
        raise PlanError(f"the {config.class_name} VAE decodes images: one frame, received {frames}")
    if config.is_image or follows_frame_rule(config):
        problems = misfits(width, height, frames, spatial=spatial, temporal=temporal)
        t = latents_for_frames(frames, temporal)
    else:
        problems, t = own_frame_misfits(config, frames), latent_frames_decoding_to(config, frames)
        problems += misfits(width, height, 1, spatial=spatial, temporal=temporal)
    if problems:
        raise PlanError("; ".join(map(str, problems)))
    time_axis = () if config.is_image else (t,)
    return config.z_dim, *time_axis, height // spatial, width // spatial


def follows_frame_rule(config: VAEConfig) -> bool:
    """Whether ``config`` decodes ``1 + temporal_scale·(T − 1)`` frames from ``T`` latent frames
    (every family but one whose decode chunks time its own way: MiniMax-H3)."""
    fewest = min_latent_frames(config)
    return all(config.num_output_frames(t) == output_frames(t, config.temporal_scale)
               for t in range(fewest, fewest + 8))


def latent_frames_decoding_to(config: VAEConfig, frames: int) -> int:
    """The latent frames whose decode has exactly ``frames`` frames (0: none has)."""
    return next((t for t in range(min_latent_frames(config), frames + 1) if config.num_output_frames(t) == frames), 0)


def own_frame_misfits(config: VAEConfig, frames: int) -> list[FramesError]:
    """``frames`` as a config with its own frame rule refuses it: the frame counts its decodes
    have just below and above (one error), or none."""
    if latent_frames_decoding_to(config, frames):
        return []
    counts = [config.num_output_frames(t) for t in range(min_latent_frames(config), frames + 2)]
    nearest = [max((c for c in counts if c < frames), default=None), min((c for c in counts if c > frames), default=None)]
    return [FramesError(f"the {config.class_name} decoder makes no video of that many frames",
                        expected=[c for c in nearest if c is not None], received=frames, what="frames")]


def video_for_latents(config: VAEConfig, shape: Sequence[int]) -> tuple[int, int, int]:
    """``(width, height, frames)`` decoded from latents ``(C, T, H, W)`` (an image's ``(C, H, W)``: one frame)."""
    _, t, h, w = clip_shape((1, *shape))[1:]
    return w * config.spatial_scale, h * config.spatial_scale, config.num_output_frames(t)


# -- one mesh -----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class MeshPlan:
    """One candidate mesh, per device (a chip, or one TensorCore where libtpu lists those).

    Bytes: ``total_bytes = argument + output − alias + temp + code`` of ``memory_analysis()``;
    ``fits`` when ``total_bytes ≤ usable_bytes = hbm_bytes · (1 − headroom)``. ``flops`` is the
    model's count for the whole decode on this device; ``cost_analysis_flops`` and
    ``bytes_accessed`` are XLA's, counting a scan body once. ``halo_bytes`` are sent by the busiest
    device over the whole decode (None for a family's own tiled program: ``split`` ``"tiles"``, no
    halos). ``bound_s`` is a lower bound, not a measurement.

    ``refused``: the compiler's own message when it refused the program for memory (libtpu checks a
    program against the chip's HBM while compiling). Such a row does not fit; its ``temp_bytes`` and
    ``total_bytes`` are the bytes the compiler names (at least what the program needs), its other
    byte and cost fields are 0.

    ``compiler`` and ``program`` say what made it: the compiler's package versions and the
    fingerprint of the lowered program (``plan_table.program_fingerprint``). ``source``:
    ``"compiled"`` here, or ``"table"``: read from the compiled plans shipped with the package
    (``sharding.plan_table``), where ``stale`` says why it may differ from what this checkout
    compiles (None: it does not), ``unchecked`` why its program could not be lowered here to check
    (None: it was), and what the table does not keep is None (``cost_analysis_flops``,
    ``halo_bytes``) or empty (``collectives``).
    """

    tp: int
    dp: int
    split: str
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    code_bytes: int
    total_bytes: int
    hbm_bytes: int
    usable_bytes: int
    fits: bool
    flops: float
    cost_analysis_flops: float | None
    bytes_accessed: float
    halo_bytes: int | None
    collectives: dict[str, dict[str, int]]
    compile_s: float
    bound_s: float
    refused: str | None = None
    source: str = "compiled"
    compiler: dict[str, str] | None = None
    program: str | None = None
    stale: str | None = None
    unchecked: str | None = None


def _cost(compiled: jax.stages.Compiled) -> dict[str, float]:
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # older JAX: one dict per program
        cost = cost[0] if cost else {}
    return dict(cost or {})


def device_flops(config: VAEConfig, shape: tuple[int, ...], tp: int, dp: int, split: str, band: int) -> float:
    """Model FLOPs of one device's share: its ``B/dp`` latents and a band of ``band`` rows (columns)
    of the frame padded to ``tp·band`` (padded rows are computed too; attention splits by queries)."""
    b, c, t, h, w = clip_shape(shape)
    padded = (b // dp, c, t, band * tp, w) if split == "height" else (b // dp, c, t, h, band * tp)
    return decode_flops(config, padded) / tp


# The ``split`` of a family's own programs: its pieces of work (tiles) spread over the devices.
TILES_SPLIT = "tiles"


def own_device_flops(vae: VAE, shape: tuple[int, ...], devices: int) -> float:
    """Model FLOPs of one device's share of a family's own decode: the whole decode's FLOPs times
    the share of its pieces of work (``FamilyPrograms.work_pieces``) the busiest device runs (an
    uneven count is padded with pieces every device computes)."""
    assert vae.own_programs is not None
    pieces = vae.own_programs.work_pieces(shape, vae.config)
    return decode_flops(vae.config, shape) * -(-pieces // devices) / pieces


def program_of(vae: VAE, mesh: jax.sharding.Mesh, lowered: jax.stages.Lowered) -> str:
    """The fingerprint of a lowered decode (``plan_table.program_fingerprint``) with the compiler
    options its platform compiles it with and, for a GPU, the description we give of it."""
    device = mesh.devices.flat[0]
    options = compiler_options_for(mesh_platform(mesh), vae.cpu_convs)
    target = compile_target(chip_facts(device.device_kind)) if mesh_platform(mesh) == "gpu" else ""
    return program_fingerprint(lowered.as_text(debug_info=False), options, target)


def decode_program(vae: VAE, shape: tuple[int, ...], mesh: jax.sharding.Mesh, *, output: Output = "uint8",
                   inner_frames: int | None = None) -> tuple[jax.stages.Lowered, str]:
    """The decode a plan compiles (``compile_decode``'s, lowered) and its fingerprint; a family's
    own program where it builds one (``inner_frames`` does not apply to it)."""
    if vae.own_programs is not None:
        lowered = lower_own_decode(vae, shape, mesh, output=output)
    else:
        lowered = lower_decode(vae, shape, mesh, output=output, inner_frames=inner_frames)
    return lowered, program_of(vae, mesh, lowered)


def plan_mesh(vae: VAE, shape: tuple[int, ...], mesh: jax.sharding.Mesh, chip: ChipFacts, *,
              hbm_bytes: int, output: Output = "uint8", headroom: float | None = None,
              inner_frames: int | None = None) -> MeshPlan:
    """Compile the decode of NCTHW latents ``shape`` (an image model's NCHW) on ``mesh`` and report
    one device's needs (``inner_frames``: as in ``compile_decode``; None is what a server runs)."""
    tp, dp = mesh.shape[TP_AXIS], mesh.shape[DP_AXIS]
    usable = int(hbm_bytes * (1 - (chip.headroom if headroom is None else headroom)))
    bands = None if vae.own_programs is not None else band_layout(shape[-2], shape[-1], tp)
    if bands is None:
        split, flops = TILES_SPLIT, own_device_flops(vae, shape, tp * dp)
    else:
        split, flops = bands.split, device_flops(vae.config, shape, tp, dp, bands.split, bands.band)
    compiler = compiler_versions(platform_of_mesh(mesh))
    start = time.perf_counter()
    lowered, program = decode_program(vae, shape, mesh, output=output, inner_frames=inner_frames)
    try:
        compiled = lowered.compile()
    except jax.errors.JaxRuntimeError as error:
        required = compiler_refusal_bytes(str(error))
        if required is None:
            raise
        return MeshPlan(
            tp=tp, dp=dp, split=split, argument_bytes=0, output_bytes=0, alias_bytes=0, temp_bytes=required,
            code_bytes=0, total_bytes=required, hbm_bytes=hbm_bytes, usable_bytes=usable, fits=False, flops=flops,
            cost_analysis_flops=0.0, bytes_accessed=0.0, halo_bytes=0, collectives={},
            compile_s=round(time.perf_counter() - start, 3), bound_s=0.0, refused=str(error).splitlines()[0],
            compiler=compiler, program=program)
    compile_s = time.perf_counter() - start
    memory = program_memory(compiled)
    total = program_total_bytes(memory)
    cost = _cost(compiled)
    bytes_accessed = float(cost.get("bytes accessed", 0.0))
    return MeshPlan(
        tp=tp, dp=dp, split=split, argument_bytes=memory["argument_bytes"], output_bytes=memory["output_bytes"],
        alias_bytes=memory["alias_bytes"], temp_bytes=memory["temp_bytes"], code_bytes=memory["code_bytes"],
        total_bytes=total, hbm_bytes=hbm_bytes, usable_bytes=usable,
        fits=total <= usable, flops=flops, cost_analysis_flops=float(cost.get("flops", 0.0)),
        bytes_accessed=bytes_accessed,
        halo_bytes=None if bands is None else decode_halo_bytes(vae, shape, tp, dp, bands.split),
        collectives=collective_summary(collectives(compiled.as_text() or "")), compile_s=round(compile_s, 3),
        bound_s=max(flops / chip.peak_bf16_flops, bytes_accessed / chip.hbm_bytes_per_s),
        compiler=compiler, program=program,
    )


def decode_halo_bytes(vae: VAE, shape: tuple[int, ...], tp: int, dp: int, split: Split) -> int:
    """The halo bytes the busiest band sends over a whole decode of latents ``shape``."""
    halo = halo_bytes(vae, shape, tp, dp=dp, split=split)
    return halo["first_per_device"] + (clip_shape(shape)[2] - 1) * halo["next_per_device"]


def platform_of_mesh(mesh: jax.sharding.Mesh) -> str:
    """``"tpu"`` or ``"gpu"``: whose compiler compiles for the mesh's devices (``plan_table``'s names)."""
    return "tpu" if mesh_platform(mesh) == "tpu" else "gpu"


_REFUSAL = re.compile(r"RESOURCE_EXHAUSTED.*?required for [^(]*\((?P<size>[0-9.]+)(?P<unit>[KMGT]?)\)")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def compiler_refusal_bytes(message: str) -> int | None:
    """The bytes a compiler's out-of-memory refusal names, or None for any other error.

    libtpu: ``RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO
    temporaries (28.79G) exceeds available HBM (15.75G)`` (binary units: its 15.75G on a 16 GB v5e
    chip are GiB).
    """
    match = _REFUSAL.search(message)
    if match is None:
        return None
    return int(float(match["size"]) * _UNITS[match["unit"]])


# -- the table of compiled plans --------------------------------------------------------------------
def table_model(config: VAEConfig) -> str | None:
    """The name the table gives ``config``'s model (``"wan2.1"``, …): its rows answer for it when
    ``config`` is that model's config (a checkpoint folder of Wan 2.1 is ``"wan2.1"``); else None."""
    from vaeserve.models.loading import MODEL_NAMES

    return next((name for name, make in MODEL_NAMES.items() if make() == config), None)


def mesh_from_row(row: dict[str, Any], latents: Sequence[int], *, chip: ChipFacts, per_chip: int,
                  headroom: float | None) -> MeshPlan | None:
    """A table row as the candidate mesh it describes (``headroom`` may differ from the row's:
    ``fits`` is read again from its bytes), or None for a row that holds no answer (a compile
    that failed for another reason than memory)."""
    hbm = chip.hbm_bytes // per_chip
    usable = int(hbm * (1 - (chip.headroom if headroom is None else headroom)))
    refused = row.get("error") if "required_bytes" in row else None
    if "error" in row and refused is None:
        return None
    split = row.get("split") or band_layout(latents[2], latents[3], row["tp"]).split
    if refused:  # the bytes the compiler named, as temporaries
        total = row["required_bytes"]
        parts = {"argument_bytes": 0, "output_bytes": 0, "temp_bytes": total, "code_bytes": 0}
    else:
        total = row["total_bytes"]
        parts = {name: row[name] for name in ("argument_bytes", "output_bytes", "temp_bytes", "code_bytes")}
    return MeshPlan(
        tp=row["tp"], dp=1, split=split, **parts, alias_bytes=sum(parts.values()) - total, total_bytes=total,
        hbm_bytes=hbm, usable_bytes=usable, fits=not refused and total <= usable, flops=row.get("flops", 0.0),
        cost_analysis_flops=None, bytes_accessed=row.get("bytes_accessed", 0.0), halo_bytes=None, collectives={},
        compile_s=row["compile_s"], bound_s=row.get("bound_s", 0.0), refused=refused, source="table",
        compiler=row.get("compiler"), program=row.get("program"))


def table_meshes(vae: VAE, latents: Sequence[int], topology: str, tps: Sequence[int], *,
                 headroom: float | None = None, first_fit: bool = False) -> dict[int, MeshPlan]:
    """The candidate meshes the table answers for: tp → mesh, for a decode of latents ``(C, T, H,
    W)`` at batch 1 (dp 1, uint8 out, automatic inner frames) in ``vae.dtype`` on a single-host
    slice it holds; with ``first_fit``, none past the first that fits.

    Each row is checked against this checkout: its program is lowered here (about a second, no
    compile) and ``plan_table.staleness`` compares it and the compiler installed with the row's.
    Lowering needs the slice's compiler (libtpu, the CUDA plugin); without it the row's ``unchecked``
    says so."""
    facts, model = slice_facts(topology), table_model(vae.config)
    if facts is None or model is None:
        return {}
    chip, name, _ = facts
    width, height, frames = video_for_latents(vae.config, latents)
    found: dict[int, MeshPlan] = {}
    devices: list[jax.Device] | TopologyError | None = None
    for tp in sorted(set(tps)):
        row = lookup(model, f"{width}x{height}x{frames}", name, vae.dtype, tp)
        mesh = None if row is None else mesh_from_row(row, latents, chip=chip, per_chip=1, headroom=headroom)
        if row is None or mesh is None:
            continue
        if devices is None:
            try:
                devices = topology_devices(name)
            except TopologyError as error:
                devices = error
        program, unchecked = None, None
        if isinstance(devices, TopologyError):
            unchecked = f"its program is not lowered here to check it: {devices}"
        else:
            program = decode_program(vae, (1, *latents), make_mesh(tp, devices=devices))[1]
        found[tp] = dataclasses.replace(mesh, stale=staleness(row, platform_of(name), program), unchecked=unchecked)
        if first_fit and mesh.fits:
            break
    return found


# -- every candidate ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class SliceInfo:
    """What a plan says of the devices it plans for: the topology as given, its chip, its devices
    and how many of them share a chip."""

    topology: str
    chip: ChipFacts
    devices: int
    devices_per_chip: int


def describe_slice(topology: str, devices: Sequence[jax.Device] | None) -> SliceInfo:
    """The slice of ``devices`` (``chips.topology_devices``), or without them, of a single-host
    slice the chip table names (one device per chip): what a plan answered from the table needs."""
    if devices is not None:
        devices = list(devices)
        return SliceInfo(topology, chip_facts(devices[0].device_kind), len(devices), devices_per_chip(devices))
    facts = slice_facts(topology)
    if facts is None:
        raise PlanError(f"{topology!r} is not a slice the chip table names: its devices are needed")
    chip, _, count = facts
    return SliceInfo(topology, chip, count, 1)


@dataclasses.dataclass(frozen=True)
class SlicePlan:
    """Every candidate mesh for one decode on one TPU slice, and the recommendation."""

    topology: str
    chip: ChipFacts
    devices: int
    devices_per_chip: int
    model: dict[str, Any]
    dtype: str
    output: str
    latents: tuple[int, ...]  # per dp replica: (batch, C, T, H, W)
    inner_frames: int | None  # frames per inner step after each temporal upsampler (None: automatic)
    video: tuple[int, int, int]  # width, height, frames
    headroom: float
    meshes: list[MeshPlan]
    skipped: list[dict[str, Any]]
    recommendation: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        width, height, frames = self.video
        return {
            "topology": self.topology,
            "chip": {"name": self.chip.name, "hbm_bytes": self.chip.hbm_bytes,
                     "peak_bf16_flops": self.chip.peak_bf16_flops, "hbm_bytes_per_s": self.chip.hbm_bytes_per_s,
                     "chips_per_host": self.chip.chips_per_host},
            "devices": self.devices,
            "devices_per_chip": self.devices_per_chip,
            "model": self.model,
            "dtype": self.dtype,
            "output": self.output,
            "latents": list(self.latents),
            "inner_frames": self.inner_frames,
            "video": {"width": width, "height": height, "frames": frames},
            "headroom": self.headroom,
            "meshes": [dataclasses.asdict(m) for m in self.meshes],
            "skipped": self.skipped,
            "recommendation": self.recommendation,
            "notes": {
                "flops": "model count (models/flops.py) of the whole decode, per device",
                "cost_analysis_flops": "XLA cost_analysis(): a lax.scan body counted once (frame 0 + one later step)",
                "bytes_accessed": "XLA cost_analysis(), scan body counted once: less than the whole decode moves",
                "bound_s": "lower bound max(flops / peak bf16 FLOP/s, bytes_accessed / HBM bandwidth) from the "
                           "chip's public figures; not a measurement (float32 runs several bf16 passes)",
            },
        }


def recommend(meshes: Sequence[MeshPlan], devices: int) -> dict[str, Any]:
    """The smallest tp that fits, and the dp that the remaining devices allow."""
    fitting = [m for m in meshes if m.fits]
    if not fitting:
        if not meshes:
            return {"tp": None, "dp": None, "reason": "no candidate mesh was compiled"}
        least = min(meshes, key=lambda m: m.total_bytes)
        return {"tp": None, "dp": None,
                "reason": f"no candidate fits: the least per device is {least.total_bytes / 1e9:.2f} GB at "
                          f"tp={least.tp} (usable {least.usable_bytes / 1e9:.2f} GB); try more chips, "
                          "bfloat16, fewer latents per replica or a smaller video"}
    best = min(fitting, key=lambda m: (m.tp, m.total_bytes))
    dp = devices // best.tp
    return {"tp": best.tp, "dp": dp, "total_bytes": best.total_bytes, "usable_bytes": best.usable_bytes,
            "reason": f"tp={best.tp} is the smallest tp that fits ({best.total_bytes / 1e9:.2f} of "
                      f"{best.usable_bytes / 1e9:.2f} GB usable per device); the {devices} devices then "
                      f"hold dp={dp} replicas"}


def plan_decode(vae: VAE, latents: Sequence[int], devices: Sequence[jax.Device] | None, *, topology: str,
                tps: Sequence[int] = (1, 2, 4, 8), dp: int = 1, batch: int = 1, output: Output = "uint8",
                headroom: float | None = None, inner_frames: int | None = None, first_fit: bool = False,
                known: Mapping[int, MeshPlan] | None = None, on_mesh: Callable[[MeshPlan], None] | None = None,
                before_compile: Callable[[int], None] | None = None) -> SlicePlan:
    """Plan the decode of latents ``(C, T, H, W)`` (an image model's ``(C, H, W)``), ``batch`` per dp
    replica, on ``devices``.

    Every ``tp`` in ``tps`` with ``dp·tp`` ≤ the devices is compiled (the others are listed in
    ``skipped``), unless ``known`` answers it already (tp → mesh: the table's, ``table_meshes``);
    with ``first_fit``, in ascending order up to the first that fits (the larger are ``skipped``).
    ``devices`` are those of one slice (``chips.topology_devices``) or any others whose
    ``device_kind`` has chip facts; None when ``known`` answers every tp of a slice the chip table
    names. ``before_compile(tp)`` is called as a compile starts, ``on_mesh(mesh)`` as each mesh is
    answered (compiled or known), in tp order.
    """
    output = check_output(output)
    if headroom is not None and not 0 <= headroom < 1:
        raise PlanError(f"headroom must be in [0, 1); received {headroom}")
    if batch < 1 or dp < 1:
        raise PlanError(f"batch and dp must be ≥ 1; received batch={batch}, dp={dp}")
    where = describe_slice(topology, devices)
    chip, per_chip, known = where.chip, where.devices_per_chip, known or {}
    headroom = chip.headroom if headroom is None else headroom
    shape = (batch * dp, *tuple(latents))
    meshes: list[MeshPlan] = []
    skipped: list[dict[str, Any]] = []
    for tp in sorted(set(tps)):
        if tp * dp > where.devices:
            skipped.append({"tp": tp, "dp": dp, "reason": f"needs {tp * dp} devices; the slice has {where.devices}"})
            continue
        fitting = next((m.tp for m in meshes if m.fits), None) if first_fit else None
        if fitting is not None:
            skipped.append({"tp": tp, "dp": dp, "reason": f"tp={fitting} fits: only the smallest tp that fits is "
                                                          "planned unless the candidates are named"})
            continue
        if tp in known:
            meshes.append(known[tp])
        else:
            if devices is None:
                raise PlanError(f"tp={tp} is not in the table: the slice's devices are needed to compile it")
            if before_compile is not None:
                before_compile(tp)
            mesh = make_mesh(tp, dp, devices=list(devices))
            meshes.append(plan_mesh(vae, shape, mesh, chip, hbm_bytes=chip.hbm_bytes // per_chip, output=output,
                                    headroom=headroom, inner_frames=inner_frames))
        if on_mesh is not None:
            on_mesh(meshes[-1])
    return SlicePlan(
        topology=topology, chip=chip, devices=where.devices, devices_per_chip=per_chip,
        model={"source": vae.metadata.get("source"), "parameters": vae.metadata.get("parameters"),
               "config": vae.config.to_dict()},
        dtype=vae.dtype, output=output, latents=(batch, *tuple(latents)), inner_frames=inner_frames,
        video=video_for_latents(vae.config, latents), headroom=headroom, meshes=meshes, skipped=skipped,
        recommendation=recommend(meshes, where.devices),
    )
