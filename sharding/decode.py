"""The sharded decode: ``models.decode`` programs under ``jax.shard_map`` over the ``(dp, tp)`` mesh.

Layouts match ``VAE``: latents ``(B, C, T, H, W)`` NCTHW in (``C``: the model's latent channels);
float32 ``(B, 3, F, sH, sW)`` or uint8 ``(B, F, sH, sW, 3)`` out, ``F = 1 + 4(T-1)``, ``s`` the
model's spatial scale; an image model's latents ``(B, C, H, W)`` give images ``(B, 3, sH, sW)`` or
``(B, sH, sW, 3)`` (every layout has H and W last but the uint8 channels, so the specs below follow
from the array's rank). Inside the mesh, the batch is split over
``dp`` and the split axis (height or width, see ``layout.choose_split``) over ``tp``; causal caches
stay on the device of their band, and time is never split. A model that is not causal in time
(HunyuanVideo 1.0, the AutoencoderKL image models) decodes the whole clip (image) on each band, its
statistics summed over the bands. An LTX decoder steps with a look-ahead (``models.families.ltx.layers``); its
per-row timestep and noise (``DecodeConditions``) are split over ``dp`` with the batch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from vaeserve.models.conditions import DecodeConditions
from vaeserve.models.decode import (
    StreamStart,
    check_framewise,
    full_program,
    resolve_chunk,
    step_latents,
    step_program,
    stream_frames,
    stream_start,
    stream_steps,
)
from vaeserve.models.estimate import QUERY_CHUNK
from vaeserve.models.frame_groups import check_inner_frames, inner_frames_option
from vaeserve.models.programs import program_key
from vaeserve.models.shapes import Output, check_latents_shape, check_output, is_image_shape, output_frames, time_axis
from vaeserve.models.vae import DTYPES, VAE

from .bands import BandLayout, Split, SplitError, band_layout
from .halo import BandContext
from .mesh import DP_AXIS, TP_AXIS, mesh_key


# -- layouts ----------------------------------------------------------------------------------------
def _spec(ndim: int, batch_axis: int, split_axis: int) -> P:
    parts: list[Any] = [None] * ndim
    parts[batch_axis] = DP_AXIS
    parts[split_axis] = TP_AXIS
    return P(*parts)


def split_axis(layout: BandLayout, rank: int, *, channels_last: bool = False) -> int:
    """The axis ``layout`` splits of an array of ``rank`` whose last two axes are H and W (or, when
    ``channels_last``, the two before the channels)."""
    return rank - 2 - channels_last + (layout.split == "width")


def latents_spec(layout: BandLayout, rank: int = 5) -> P:
    """NCTHW latents (NCHW: ``rank`` 4): batch over dp, H (or W) over tp."""
    return _spec(rank, 0, split_axis(layout, rank))


def frames_spec(layout: BandLayout, output: Output, rank: int = 5) -> P:
    """float NCTHW ``(B, 3, F, H, W)`` or uint8 NTHWC ``(B, F, H, W, 3)`` frames (images: ``rank`` 4)."""
    return _spec(rank, 0, split_axis(layout, rank, channels_last=output == "uint8"))


def cache_spec(layout: BandLayout) -> P:
    """Every causal cache leaf is ``(B, 2, h, w·C)`` (``models.conv.stored_cache``) or ``(B, n, h, w,
    C)``: H is axis 2 and W axis 3 of both (a band's columns are a contiguous run of ``w·C``)."""
    return _spec(3 if layout.split == "height" else 4, 0, 2 if layout.split == "height" else 3)


def pad_latents(latents: jax.Array, layout: BandLayout) -> jax.Array:
    """Zero-pad NCTHW (or NCHW) latents at the far edge of the split axis up to ``layout.padded``."""
    if layout.pad == 0:
        return latents
    widths = [(0, 0)] * latents.ndim
    widths[split_axis(layout, latents.ndim)] = (0, layout.pad)
    return jnp.pad(latents, widths)


def crop_decoded(frames, latents_shape: tuple[int, ...], spatial_scale: int, output: Output):
    """Frames (or a stream step's) decoded from latents ``latents_shape`` without the rows or columns
    that came from latent rows padded for an uneven split: ``(…, H', W')`` (uint8 ``(…, H', W', 3)``)
    cropped to ``s·H x s·W``. NumPy or JAX arrays.

    The programs leave the padding on their bands and the host crops it (``to_host_cropped``): on a
    sharded array the crop moves rows between devices, because the cropped image's even shards do
    not line up with the bands, and XLA gathers almost the whole image onto every device for it."""
    height, width = (spatial_scale * n for n in latents_shape[-2:])
    if tuple(frames.shape[-3:-1] if output == "uint8" else frames.shape[-2:]) == (height, width):
        return frames  # nothing padded (an even split, one device): no copy
    return frames[..., :height, :width, :] if output == "uint8" else frames[..., :height, :width]


def to_host_cropped(frames: jax.Array, latents_shape: tuple[int, ...], spatial_scale: int,
                    output: Output) -> np.ndarray:
    """A decode program's frames on the host, cropped there (``crop_decoded``)."""
    return crop_decoded(to_host(frames), latents_shape, spatial_scale, output)


# -- checks -----------------------------------------------------------------------------------------
def _check_mesh(mesh: Mesh, batch: int) -> None:
    if tuple(mesh.axis_names) != (DP_AXIS, TP_AXIS):
        raise SplitError(f"mesh axes must be {(DP_AXIS, TP_AXIS)} (see make_mesh); received {mesh.axis_names}")
    dp = mesh.shape[DP_AXIS]
    if batch % dp:
        raise SplitError(f"batch {batch} does not split over dp={dp}: send a multiple of {dp} latents")


def decode_layout(vae: VAE, shape: tuple[int, ...], mesh: Mesh, split: Split | None) -> BandLayout:
    """Validate ``shape`` (NCTHW, or an image model's NCHW) against the model and mesh, and layout its bands."""
    check_latents_shape(tuple(shape), vae.config)
    _check_mesh(mesh, shape[0])
    return band_layout(shape[-2], shape[-1], mesh.shape[TP_AXIS], split)


# -- programs ---------------------------------------------------------------------------------------
def put_latents(latents, mesh: Mesh) -> jax.Array:
    """Latents onto the mesh, batch over dp and replicated over tp (an explicit transfer).

    They are small; each device then slices its band out locally (the split axis may first need
    padding, which a sharded input could not express). On a mesh that spans processes every
    process holds the same latents and places only its own devices' shards: no collective (a
    ``device_put`` would all-gather the whole array across processes to check that they agree).
    """
    latents = np.asarray(latents, np.float32)
    placement = latents_sharding(mesh)
    shards = [jax.device_put(latents[index], device)  # explicit transfers, one per local device
              for device, index in placement.addressable_devices_indices_map(latents.shape).items()]
    return jax.make_array_from_single_device_arrays(latents.shape, placement, shards)


def to_host(array: jax.Array) -> np.ndarray:
    """A (possibly process-spanning) array as one numpy array on this host.

    On one process this is a device-to-host copy. On a mesh that spans processes no process can
    read the other processes' shards, so the array is all-gathered first
    (``multihost_utils.process_allgather``): every process receives the whole array.
    """
    if array.is_fully_addressable:
        return np.asarray(jax.device_get(array))
    return np.asarray(multihost_utils.process_allgather(array, tiled=True))


def latents_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P(DP_AXIS))


def put_conditions(conditions: DecodeConditions | None, mesh: Mesh) -> tuple[DecodeConditions, ...]:
    """A decode's host ``DecodeConditions`` onto the mesh, rows over dp (``()`` for none: the
    programs of a decoder that takes none have no such argument)."""
    if conditions is None:
        return ()
    placement = latents_sharding(mesh)
    leaves = [jax.make_array_from_single_device_arrays(
        np.shape(leaf), placement, [jax.device_put(np.asarray(leaf)[index], device) for device, index in
                                    placement.addressable_devices_indices_map(np.shape(leaf)).items()])
        for leaf in conditions]
    return (DecodeConditions(*leaves),)


def _conditions(vae: VAE, mesh: Mesh, batch: int) -> tuple[tuple, tuple]:
    """``(in_specs, avals)`` of a decode program's conditions on ``mesh``: empty for a decoder that
    takes none."""
    if not vae.config.decode_conditions:
        return (), ()
    return (DecodeConditions(P(DP_AXIS), P(DP_AXIS), P(DP_AXIS)),), vae.conditions_avals(batch, latents_sharding(mesh))


def replicated_state(vae: VAE, mesh: Mesh):
    """The model weights on every device of ``mesh`` (placed once per mesh, kept by the model)."""
    return vae.placed_state(NamedSharding(mesh, P()))


def mesh_platform(mesh: Mesh) -> str:
    """The platform the mesh's programs are compiled for (``"tpu"`` for abstract TPU devices too)."""
    return mesh.devices.flat[0].platform


def _shard(mesh: Mesh, fn: Callable, in_specs, out_specs) -> Callable:
    # check_vma=False: the scan carries start as replicated zeros and become band-varying.
    return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)


# The spatial context each band decodes with. Always ``BandContext`` in the programs this package
# compiles and caches; the builders below take it as an argument so that the negative controls
# (``sharding._controls``: no halo, cyclic halo) can build the same program around a broken one.
ContextType = type[BandContext]


def _band_context(vae: VAE, mesh: Mesh, layout: BandLayout, query_chunk: int,
                  context_type: ContextType = BandContext) -> Callable[[], BandContext]:
    path = vae.conv_path(mesh_platform(mesh))

    def make() -> BandContext:
        return context_type(layout, query_chunk=query_chunk, **path)
    return make


# Each band's ``(B,)`` non-finite count leaves the program as one column of a ``(B, tp)`` array: no
# collective at all (a sum over the bands on the devices would be an all-reduce); the host sums the
# columns (``band_total``).
COUNTS_SPEC = P(DP_AXIS, TP_AXIS)


def band_counts(local: Callable) -> Callable:
    """A band program whose last output is its ``(B,)`` count → the same with it as ``(B, 1)``."""

    def run(*args):
        *outputs, counts = local(*args)
        return (*outputs, counts[:, None])
    return run


def band_total(counts: jax.Array) -> np.ndarray:
    """A program's ``(B, tp)`` per-band int32 non-finite counts → ``(B,)`` int64 on the host (the
    bands' sum may pass what one band's int32 holds)."""
    return to_host(counts).sum(axis=1, dtype=np.int64)


def _full(vae: VAE, mesh: Mesh, layout: BandLayout, *, denormalize: bool, output: Output, chunk: int,
          inner_frames: int | None, query_chunk: int, context_type: ContextType = BandContext,
          framewise: bool = False, rank: int = 5) -> Callable:
    """The whole decode on each band under ``shard_map``; latents padded and frames cropped around it.
    ``rank``: of the latents (4 for images), and so of the frames."""
    context = _band_context(vae, mesh, layout, query_chunk, context_type)
    local = full_program(vae.graphdef, vae.config, DTYPES[vae.dtype], context, denormalize=denormalize,
                         output=output, chunk=chunk, inner_frames=inner_frames, framewise=framewise)
    conditions, _ = _conditions(vae, mesh, 0)
    sharded = _shard(mesh, band_counts(local), (P(), latents_spec(layout, rank), *conditions),
                     (frames_spec(layout, output, rank), COUNTS_SPEC))

    def run(state, latents, *conditions):
        return sharded(state, pad_latents(latents, layout), *conditions)  # frames still padded: crop_decoded
    return run


def _step(vae: VAE, mesh: Mesh, layout: BandLayout, *, first: bool, denormalize: bool, inner_frames: int | None,
          query_chunk: int, clip: dict[str, Any], output: Output = "uint8") -> Callable:
    """One stream step on each band; its caches (None for latent frame 0, or a replicated
    ``StreamStart``) stay on their bands. ``clip``: ``vae.clip_frames_option`` of the stream;
    ``output``: its frames, as ``compile_decode``'s."""
    local = step_program(vae.graphdef, vae.config, DTYPES[vae.dtype], _band_context(vae, mesh, layout, query_chunk),
                         denormalize=denormalize, output=output, inner_frames=inner_frames,
                         clip_frames=clip.get("clip_frames"))
    caches = cache_spec(layout)
    start = StreamStart(P()) if clip.get("clip_at_run_time") else None
    conditions, _ = _conditions(vae, mesh, 0)
    sharded = _shard(mesh, band_counts(local), (P(), start if first else caches, latents_spec(layout), *conditions),
                     (frames_spec(layout, output), caches, COUNTS_SPEC))

    def run(state, step_caches, latents, *conditions):
        return sharded(state, step_caches, pad_latents(latents, layout), *conditions)  # frames still padded: crop_decoded
    return run


def _latents_aval(shape: tuple[int, ...], mesh: Mesh) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(shape), jnp.float32, sharding=latents_sharding(mesh))


def _state_aval(vae: VAE, mesh: Mesh):
    return vae.state_avals(NamedSharding(mesh, P()))


def compile_decode(vae: VAE, shape: tuple[int, ...], mesh: Mesh, *, output: Output = "float",
                   denormalize: bool = False, split: Split | None = None, chunk: int | None = None,
                   inner_frames: int | None = None, query_chunk: int = QUERY_CHUNK,
                   framewise: bool = False) -> jax.stages.Compiled:
    """The compiled sharded decode of NCTHW latents of ``shape`` on ``mesh`` (see ``sharded_decode``).

    Compiled ahead of time from abstract weights and latents, so ``mesh`` may hold abstract devices
    (a TPU topology compiled on a CPU host); the convolution path follows the mesh's platform.
    Cached in ``vae.programs``: ``compiled(replicated_state(vae, mesh), put_latents(x, mesh))`` returns
    the frames, still with the rows (columns) of an uneven split's padding (``to_host_cropped``
    takes them to the host without), and their ``(B, tp)`` non-finite counts per band
    (``models.decode.nonfinite_count``; ``band_total`` sums them on the host), or read
    ``memory_analysis()`` / ``as_text()`` without running it.
    """
    shape, output, chunk = tuple(shape), check_output(output), resolve_chunk(chunk)
    inner_frames = check_inner_frames(inner_frames)
    tiling = check_framewise(vae.config, framewise)
    if vae.own_programs is not None:
        return compile_own_decode(vae, shape, mesh, output=output, denormalize=denormalize)
    layout = decode_layout(vae, shape, mesh, split)
    key = program_key("decode", shape, output, mesh=mesh_key(mesh), layout=layout, denormalize=denormalize, chunk=chunk,
                      query_chunk=query_chunk, **inner_frames_option(inner_frames), **tiling)
    return vae.programs.get(key, functools.partial(
        lower_decode, vae, shape, mesh, output=output, denormalize=denormalize, split=split, chunk=chunk,
        inner_frames=inner_frames, query_chunk=query_chunk, framewise=framewise))


# The mesh axes a family with its own programs spreads its independent pieces over (MiniMax-H3's
# tiles): every device of the mesh, the batch's rows and the frame's tiles alike.
OWN_PROGRAM_AXES = (DP_AXIS, TP_AXIS)


def compile_own_decode(vae: VAE, shape: tuple[int, ...], mesh: Mesh, *, output: Output,
                       denormalize: bool) -> jax.stages.Compiled:
    """``compile_decode`` of a family that builds its own programs (``vae.own_programs``), called
    the same way: its work spread over ``OWN_PROGRAM_AXES``, its ``(B,)`` non-finite count one
    column (``band_total`` sums it), its frames unpadded (no bands)."""
    check_latents_shape(shape, vae.config)
    _check_mesh(mesh, shape[0])
    key = program_key("decode", shape, output, mesh=mesh_key(mesh), denormalize=denormalize)
    return vae.programs.get(key, functools.partial(lower_own_decode, vae, shape, mesh, output=output,
                                                   denormalize=denormalize))


def lower_own_decode(vae: VAE, shape: tuple[int, ...], mesh: Mesh, *, output: Output = "uint8",
                     denormalize: bool = False) -> jax.stages.Lowered:
    """What ``compile_own_decode`` compiles, lowered and not compiled: the family's
    ``decode_program`` spread over ``OWN_PROGRAM_AXES``, its ``(B,)`` count one column."""
    assert vae.own_programs is not None
    run = vae.own_programs.decode_program(vae.graphdef, vae.config, DTYPES[vae.dtype], denormalize=denormalize,
                                          output=output, mesh=mesh, axes=OWN_PROGRAM_AXES)
    return jit_for(vae, mesh, band_counts(run)).lower(_state_aval(vae, mesh), _latents_aval(shape, mesh))


def compile_own_chunk(vae: VAE, shape: tuple[int, ...], mesh: Mesh, *, first: bool, denormalize: bool,
                      output: Output) -> jax.stages.Compiled:
    """One chunk's program of a streamed decode of a family with its own programs
    (``FamilyPrograms.chunk_program``), for chunk latents ``shape``; a later chunk's also takes the
    previous one's read-ahead frames ``(B, frame_overlap, sH, sW, 3)`` (rows over ``dp``)."""
    key = program_key("stream-step", shape, "first" if first else "next", mesh=mesh_key(mesh),
                      denormalize=denormalize, **step_output_option(output))

    def lower() -> jax.stages.Lowered:
        assert vae.own_programs is not None
        run = vae.own_programs.chunk_program(vae.graphdef, vae.config, DTYPES[vae.dtype], first=first,
                                             denormalize=denormalize, output=output, mesh=mesh, axes=OWN_PROGRAM_AXES)
        ahead = () if first else (_latents_aval(vae.own_programs.ahead_shape(shape, vae.config), mesh),)
        return jit_for(vae, mesh, band_counts(run)).lower(_state_aval(vae, mesh), _latents_aval(shape, mesh), *ahead)

    return vae.programs.get(key, lower)


def compile_own_stream(vae: VAE, shape: tuple[int, ...], mesh: Mesh, *, denormalize: bool,
                       output: Output) -> tuple[jax.stages.Compiled, ...]:
    """The chunk programs a streamed decode of latents ``shape`` runs (the first chunk's, and the
    later chunks' where there are more)."""
    assert vae.own_programs is not None
    check_latents_shape(shape, vae.config)
    _check_mesh(mesh, shape[0])
    chunks = vae.own_programs.chunk_shapes(shape, vae.config)
    return tuple(compile_own_chunk(vae, chunk, mesh, first=index == 0, denormalize=denormalize, output=output)
                 for index, chunk in enumerate(chunks[:2]))


def _own_stream(vae: VAE, latents: np.ndarray, mesh: Mesh, *, denormalize: bool, output: Output) -> Iterator[Decoded]:
    """A streamed decode of a family with its own programs, a chunk at a time: each chunk's piece
    leaves before the next chunk is decoded (the last with the last read-ahead frames), cut to the
    clip's frames."""
    assert vae.own_programs is not None
    chunks = vae.own_programs.chunk_latents(latents, vae.config)
    programs = compile_own_stream(vae, latents.shape, mesh, denormalize=denormalize, output=output)
    state, axis = replicated_state(vae, mesh), time_axis(output)
    left = vae.config.num_output_frames(latents.shape[2])
    ahead: np.ndarray | None = None
    for index, chunk in enumerate(chunks):
        run = programs[min(index, 1)]
        previous = () if ahead is None else (put_latents(ahead, mesh),)
        piece, ahead_floats, ahead_frames, counts = run(state, put_latents(chunk, mesh), *previous)
        ahead, frames = to_host(ahead_floats), to_host(piece)
        if index == len(chunks) - 1:
            frames = np.concatenate([frames, to_host(ahead_frames)], axis=axis)
        frames = frames[(slice(None),) * axis + (slice(0, left),)]  # the repeated last latent frame's frames cut
        left -= frames.shape[axis]
        yield Decoded(frames, band_total(counts))


def lower_decode(vae: VAE, shape: tuple[int, ...], mesh: Mesh, *, output: Output = "float",
                 denormalize: bool = False, split: Split | None = None, chunk: int | None = None,
                 inner_frames: int | None = None, query_chunk: int = 4096,
                 framewise: bool = False) -> jax.stages.Lowered:
    """What ``compile_decode`` compiles, lowered and not compiled (about a second for a real-size
    decode): its StableHLO (``as_text()``) names the program whatever Python wrote it."""
    shape, output, chunk = tuple(shape), check_output(output), resolve_chunk(chunk)
    layout = decode_layout(vae, shape, mesh, split)
    run = _full(vae, mesh, layout, denormalize=denormalize, output=output, chunk=chunk,
                inner_frames=check_inner_frames(inner_frames), query_chunk=query_chunk, framewise=framewise,
                rank=len(shape))
    return jit_for(vae, mesh, run).lower(_state_aval(vae, mesh), _latents_aval(shape, mesh),
                                         *_conditions(vae, mesh, shape[0])[1])


def jit_for(vae: VAE, mesh: Mesh, run: Callable, *, donate: tuple[int, ...] = ()):
    """``jax.jit(run)`` with the compiler options of the mesh's platform (``VAE.jit``)."""
    return vae.jit(run, mesh_platform(mesh), donate_argnums=donate)


def _lower(vae: VAE, mesh: Mesh, run: Callable, *avals: Any, donate: tuple[int, ...] = ()) -> jax.stages.Lowered:
    """``jit_for(vae, mesh, run, donate=donate).lower(*avals)``: what a ``ProgramCache`` miss
    compiles (bound now, run then)."""
    return jit_for(vae, mesh, run, donate=donate).lower(*avals)


def _lower_later(vae: VAE, mesh: Mesh, run: Callable, state: Any, caches: Callable[[], Any],
                 z: jax.ShapeDtypeStruct, *conditions: Any) -> jax.stages.Lowered:
    """``_lower`` of a later stream step, its abstract caches traced only now (a cache miss)."""
    return _lower(vae, mesh, run, state, caches(), z, *conditions, donate=(STEP_CACHES,))


# A later step's caches (its argument 1) are donated: the new caches take their place, so a step
# holds one set of them, not two (at 720p they are most of a Wan step's bytes).
STEP_CACHES = 1


def stream_start_aval(vae: VAE, latent_frames: int, mesh: Mesh) -> StreamStart | None:
    """The abstract first caches of a stream of ``latent_frames`` (``models.decode.stream_start``)."""
    start = stream_start(vae.config, latent_frames)
    return None if start is None else StreamStart(jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(mesh, P())))


def put_stream_start(vae: VAE, latent_frames: int, mesh: Mesh) -> StreamStart | None:
    """A stream's first caches on the mesh (replicated), or None."""
    start = stream_start(vae.config, latent_frames)
    return None if start is None else StreamStart(jax.device_put(start.clip_frames, NamedSharding(mesh, P())))


def step_output_option(output: Output) -> dict[str, str]:
    """A stream step's output as a program-key option: absent for uint8 (what streams send), so
    the keys of the uint8 steps read as they did before float steps existed."""
    return {} if output == "uint8" else {"output": output}


def _stream_programs(vae: VAE, shape: tuple[int, ...], mesh: Mesh, *, denormalize: bool, split: Split | None,
                     chunk: int, inner_frames: int | None, query_chunk: int,
                     output: Output = "uint8") -> dict[tuple[int, int], jax.stages.Compiled]:
    """``{(start, stop): compiled step}`` for every step of a stream of latents ``shape``; steps of
    equal length after the first share one program."""
    layout = decode_layout(vae, shape, mesh, split)
    inner_frames = check_inner_frames(inner_frames)
    clip = vae.clip_frames_option(shape[2])
    state = _state_aval(vae, mesh)
    first_caches = stream_start_aval(vae, shape[2], mesh)
    cache_sharding = NamedSharding(mesh, cache_spec(layout))
    programs: dict[tuple[int, int], jax.stages.Compiled] = {}
    conditions = _conditions(vae, mesh, shape[0])[1]
    traced: list[Any] = []  # the first step's abstract caches, traced once and only to compile a later step

    def caches_of(first_run: Callable, first_z: jax.ShapeDtypeStruct) -> Any:
        if not traced:
            _, out, _ = jax.eval_shape(first_run, state, first_caches, first_z, *conditions)
            traced.append(jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=cache_sharding), out))
        return traced[0]

    first_step: tuple[Callable, jax.ShapeDtypeStruct] | None = None
    for start, stop in stream_steps(shape[2], chunk, vae.config):
        z = _latents_aval((*shape[:2], stop - start, *shape[3:]), mesh)
        first = start == 0
        run = _step(vae, mesh, layout, first=first, denormalize=denormalize, inner_frames=inner_frames,
                    query_chunk=query_chunk, clip=clip, output=output)
        key = program_key("stream-step", z.shape, "first" if first else "next", mesh=mesh_key(mesh), layout=layout,
                          denormalize=denormalize, query_chunk=query_chunk,
                          **inner_frames_option(inner_frames), **clip, **step_output_option(output))
        if first:
            first_step = (run, z)
            lower = functools.partial(_lower, vae, mesh, run, state, first_caches, z, *conditions)
        else:
            assert first_step is not None
            lower = functools.partial(_lower_later, vae, mesh, run, state, functools.partial(caches_of, *first_step), z,
                                      *conditions)
        programs[start, stop] = vae.programs.get(key, lower)
    return programs


def compile_decode_stream(vae: VAE, shape: tuple[int, ...], mesh: Mesh, *, denormalize: bool = False,
                          split: Split | None = None, chunk: int | None = None, inner_frames: int | None = None,
                          query_chunk: int = QUERY_CHUNK, framewise: bool = False,
                          output: Output = "uint8") -> tuple[jax.stages.Compiled, ...]:
    """Every compiled program a ``sharded_decode_stream`` of latents ``shape`` runs (first step, later
    steps, a shorter last step), compiled now and cached in ``vae.programs`` (for a model that is not
    causal in time: its whole decode, ``framewise`` or not)."""
    check_framewise(vae.config, framewise)
    output = check_output(output)
    if vae.own_programs is not None:
        return compile_own_stream(vae, tuple(shape), mesh, denormalize=denormalize, output=output)
    if not vae.steps or is_image_shape(tuple(shape)):  # one program: the whole clip, or the image
        return (compile_decode(vae, shape, mesh, output=output, denormalize=denormalize, split=split,
                               query_chunk=query_chunk, framewise=framewise),)
    programs = _stream_programs(vae, tuple(shape), mesh, denormalize=denormalize, split=split,
                                chunk=resolve_chunk(chunk), inner_frames=inner_frames, query_chunk=query_chunk,
                                output=output)
    return tuple(dict.fromkeys(programs.values()))


def split_stream(frames: np.ndarray, latent_frames: int, chunk: int, temporal_scale: int, *,
                 axis: int = 1) -> Iterator[np.ndarray]:
    """Decoded frames, their time on ``axis`` (1 of uint8 ``(B, F, H, W, 3)``, 2 of float ``(B, 3, F,
    H, W)``), in the pieces a causal stream yields: frame 0, then ``temporal_scale`` frames per
    latent frame of each ``stream_steps`` step."""
    for start, stop in stream_steps(latent_frames, chunk):
        first = 0 if start == 0 else output_frames(start, temporal_scale)
        index: list[slice] = [slice(None)] * frames.ndim
        index[axis] = slice(first, output_frames(stop, temporal_scale))
        yield frames[tuple(index)]  # a view: the pieces share the whole clip's buffer


# -- public API -------------------------------------------------------------------------------------
def sharded_decode(
    vae: VAE,
    latents,
    mesh: Mesh,
    *,
    denormalize: bool = False,
    output: Output = "float",
    split: Split | None = None,
    chunk: int | None = None,
    inner_frames: int | None = None,
    query_chunk: int = QUERY_CHUNK,
    framewise: bool = False,
    timestep: float | None = None,
    noise_scale: float | None = None,
    seed: int | None = None,
    conditions: DecodeConditions | None = None,
) -> jax.Array:
    """Decode ``(B, C, T, H, W)`` latents on ``mesh``; the same frames as ``vae.decode``.

    Args:
      vae: the model (its weights are replicated onto the mesh once and kept).
      latents: ``(B, C, T, H, W)`` NCTHW (``C``: the model's latent channels), or an image model's
        ``(B, C, H, W)`` (images out: float ``(B, 3, sH, sW)``, uint8 ``(B, sH, sW, 3)``); ``B`` a
        multiple of the mesh's ``dp``.
      mesh: a ``(dp, tp)`` mesh from ``make_mesh``.
      denormalize: apply ``z · latents_std + latents_mean`` first.
      output: ``"float"`` → float32 ``(B, 3, F, sH, sW)`` in [-1, 1]; ``"uint8"`` → ``(B, F, sH, sW, 3)``.
      split: ``"height"``, ``"width"`` or None (the axis that needs less padding).
      chunk: latent frames per scan step (default 1: least memory).
      inner_frames: frames per inner step of the stages after each temporal upsampler (None:
        automatic, one frame at a time once a band's full-resolution frame holds ≥ 4 MB; see
        ``models.families.wan.decoder.Decoder3d``). The frames are the same computation whatever it is.
      query_chunk: attention queries per score block on each device.
      framewise: HunyuanVideo 1.0 only: diffusers' default tiled decode instead of the whole clip
        (see ``VAE.decode``).
      timestep, noise_scale, seed: an LTX decoder's timestep and noise, as in ``VAE.decode`` (the
        same seed gives the same frames, however the frame is split).
      conditions: per-row ``DecodeConditions`` instead of ``timestep``/``noise_scale``/``seed`` (a
        server batching several requests passes each request's rows).
    Returns:
      A ``jax.Array`` sharded over the mesh (batch over dp, the split axis over tp). An uneven
      split's padding is cropped off after the program, on the devices (which moves rows between
      them, see ``crop_decoded``); a server takes the frames to the host first, where it is free.
    """
    run = compile_decode(vae, np.shape(latents), mesh, output=output, denormalize=denormalize, split=split,
                         chunk=chunk, inner_frames=inner_frames, query_chunk=query_chunk, framewise=framewise)
    if conditions is None:
        conditions = vae.conditions(np.shape(latents)[0], timestep=timestep, noise_scale=noise_scale, seed=seed)
    frames, _ = run(replicated_state(vae, mesh), put_latents(latents, mesh), *put_conditions(conditions, mesh))
    return crop_decoded(frames, np.shape(latents), vae.config.spatial_scale, output)


class Decoded(NamedTuple):
    """A decode (or one step of a streamed decode) on the host: its frames — uint8 ``(B, F, sH, sW,
    3)`` or float32 ``(B, 3, F, sH, sW)`` — and the ``(B,)`` count of NaN/Inf values the decoder
    produced for them (0 when all is well)."""

    frames: np.ndarray
    nonfinite: np.ndarray


def sharded_decode_stream(
    vae: VAE,
    latents,
    mesh: Mesh,
    *,
    denormalize: bool = False,
    split: Split | None = None,
    chunk: int | None = None,
    inner_frames: int | None = None,
    query_chunk: int = QUERY_CHUNK,
    framewise: bool = False,
    timestep: float | None = None,
    noise_scale: float | None = None,
    seed: int | None = None,
    conditions: DecodeConditions | None = None,
    output: Output = "uint8",
) -> Iterator[Decoded]:
    """Yield each sharded decode step's host frames (``Decoded``) as soon as it finishes.

    Step 0 decodes latent frame 0 (``f = 1``); every later step ``chunk`` latent frames
    (``f = 4 · chunk``, fewer at the end). The caches between steps stay sharded on the mesh (each
    later step's caches replace the previous ones in place: donated). Concatenated along the time
    axis (1 for uint8 ``(B, f, H, W, 3)``, 2 for float ``(B, 3, f, H, W)``), the steps' frames equal
    ``sharded_decode(..., output=output)``. A
    model that is not causal in time (HunyuanVideo 1.0: its statistics span the clip) decodes the
    whole clip first and yields it in the same pieces, the whole clip's non-finite count with the
    first (nothing is sent before the whole clip is known to be finite); ``framewise``: that whole
    clip decoded as diffusers does by default (see ``sharded_decode``). Images ``(B, C, H, W)`` decode
    in one step, yielded as one frame ``(B, 1, sH, sW, 3)``. An LTX decoder's first step takes
    ``1 + lookahead`` latent frames and its steps give their frames that far behind
    (``models.decode.stream_frames``); ``timestep``, ``noise_scale``, ``seed``, ``conditions``: as in
    ``sharded_decode``.
    """
    latents = np.asarray(latents, np.float32)
    check_framewise(vae.config, framewise)
    output = check_output(output)
    scale = vae.config.spatial_scale
    if conditions is None:
        conditions = vae.conditions(latents.shape[0], timestep=timestep, noise_scale=noise_scale, seed=seed)
    placed = put_conditions(conditions, mesh)
    if is_image_shape(latents.shape):  # one frame: its whole decode, as a one-frame step
        run = compile_decode(vae, latents.shape, mesh, output=output, denormalize=denormalize, split=split,
                             query_chunk=query_chunk)
        images, counts = run(replicated_state(vae, mesh), put_latents(latents, mesh), *placed)
        images = to_host_cropped(images, latents.shape, scale, output)
        yield Decoded(images[:, None] if output == "uint8" else images[:, :, None], band_total(counts))
        return
    if vae.own_programs is not None:  # a chunk at a time
        yield from _own_stream(vae, latents, mesh, denormalize=denormalize, output=output)
        return
    if not vae.steps:
        run = compile_decode(vae, latents.shape, mesh, output=output, denormalize=denormalize, split=split,
                             query_chunk=query_chunk, framewise=framewise)
        frames, counts = run(replicated_state(vae, mesh), put_latents(latents, mesh), *placed)
        frames, nonfinite = to_host_cropped(frames, latents.shape, scale, output), band_total(counts)
        for index, piece in enumerate(split_stream(frames, latents.shape[2], resolve_chunk(chunk),
                                                   vae.config.temporal_scale, axis=time_axis(output))):
            yield Decoded(piece, nonfinite if index == 0 else np.zeros_like(nonfinite))
        return
    programs = _stream_programs(vae, latents.shape, mesh, denormalize=denormalize, split=split,
                                chunk=resolve_chunk(chunk), inner_frames=inner_frames, query_chunk=query_chunk,
                                output=output)
    state = replicated_state(vae, mesh)
    caches: Any = put_stream_start(vae, latents.shape[2], mesh)
    kept = stream_frames(vae.config, latents.shape[2], resolve_chunk(chunk))
    for ((start, stop), step), (first, end) in zip(programs.items(), kept, strict=True):
        frames, caches, nonfinite = step(state, caches, put_latents(step_latents(latents, start, stop), mesh), *placed)
        host = to_host_cropped(frames, latents.shape, scale, output)
        kept_frames = (slice(None),) * time_axis(output) + (slice(0, end - first),)  # behind a look-ahead: fewer
        yield Decoded(host[kept_frames], band_total(nonfinite))
