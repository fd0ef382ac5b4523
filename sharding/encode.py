"""The sharded encode: ``models.encode`` programs under ``jax.shard_map`` over the ``(dp, tp)`` mesh.

Layouts match ``VAE.encode``: frames ``(B, 3, F, H, W)`` NCTHW in; float32 latents
``(B, z, T, H/s, W/s)`` out (``s = config.spatial_scale``: 8 for Wan 2.1, 16 for Wan 2.2). The
band layout is made in *latent* rows (``band_layout(H/s, W/s, tp)``), so every band holds ``s·band``
frame rows: Wan 2.1's three downsamplers see ``8·band``, ``4·band`` and ``2·band`` rows; Wan 2.2's
2x2 patchify turns ``16·band`` rows into ``8·band`` before the same three (its AvgDown3D shortcuts
average the same 2x2 blocks as the strided convs). Every band starts on an even row at the input
of every stride-2 step, so the strided rows of each band are those of the whole frame. The split
axis is padded at the far edge to ``s · tp · band`` rows on the host, and the padded rows are
masked to zero at every conv input as in the decoder (a valid output row of a 2x step reads only
valid rows, as the valid rows are a whole number of 2x2 blocks). The encoder runs per band; the
posterior (mean or sample, normalization) runs on the whole latent array after the bands are
cropped, so a sample's noise is that of one device. An image model's images ``(B, 3, H, W)`` split
the same way (as one-frame clips inside) and give latents ``(B, z, H/s, W/s)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from vaeserve.models.encode import (
    PosteriorOptions,
    image_latents,
    latents_from_moments,
    moments_program,
    posterior_options,
    resolve_encode_chunk,
)
from vaeserve.models.estimate import QUERY_CHUNK
from vaeserve.models.programs import program_key
from vaeserve.models.shapes import check_frames_shape
from vaeserve.models.vae import DTYPES, VAE

from .bands import BandLayout, Split, band_layout
from .decode import (
    OWN_PROGRAM_AXES,
    ContextType,
    _band_context,
    _check_mesh,
    _shard,
    _spec,
    jit_for,
    latents_sharding,
    put_latents,
    split_axis,
)
from .halo import BandContext
from .mesh import TP_AXIS, mesh_key


def frames_spec(layout: BandLayout, rank: int = 5) -> P:
    """NCTHW frames (and latents; NCHW images: ``rank`` 4): batch over dp, H (or W) over tp."""
    return _spec(rank, 0, split_axis(layout, rank))


def moments_spec(layout: BandLayout) -> P:
    """Channels-last moments ``(B, T, h, w, 2z)``: batch over dp, h (or w) over tp."""
    return _spec(5, 0, 2 if layout.split == "height" else 3)


def encode_layout(vae: VAE, shape: tuple[int, ...], mesh: Mesh, split: Split | None) -> BandLayout:
    """Validate frames ``shape`` (NCTHW) against the model and mesh; layout bands in latent rows."""
    vae.require_encoder()
    check_frames_shape(tuple(shape), vae.config)
    _check_mesh(mesh, shape[0])
    scale = vae.config.spatial_scale
    return band_layout(shape[-2] // scale, shape[-1] // scale, mesh.shape[TP_AXIS], split)


def padded_frames_shape(shape: tuple[int, ...], layout: BandLayout, scale: int) -> tuple[int, ...]:
    """Frames ``shape`` with the split axis padded to ``scale · layout.padded`` rows."""
    padded = list(shape)
    padded[split_axis(layout, len(shape))] = scale * layout.padded
    return tuple(padded)


def put_frames(frames, layout: BandLayout, mesh: Mesh, scale: int) -> jax.Array:
    """Frames onto the mesh, each device receiving only its band (an explicit transfer).

    The split axis is zero-padded on the host first: frames are the large input here, so they are
    neither replicated over ``tp`` nor padded on the devices.
    """
    frames = np.asarray(frames, np.float32)
    widths = [(0, 0)] * frames.ndim
    axis = split_axis(layout, frames.ndim)
    widths[axis] = (0, scale * layout.padded - frames.shape[axis])
    return jax.device_put(np.pad(frames, widths), NamedSharding(mesh, frames_spec(layout, frames.ndim)))


def put_options(options: PosteriorOptions, mesh: Mesh) -> PosteriorOptions:
    """Host posterior options onto the mesh, replicated (a few bytes per row)."""
    return jax.device_put(options, NamedSharding(mesh, P()))


def crop_moments(moments: jax.Array, layout: BandLayout) -> jax.Array:
    """Drop the latent rows (columns) of channels-last moments that came from padded frame rows."""
    if layout.pad == 0:
        return moments
    return jax.lax.slice_in_dim(moments, 0, layout.size, axis=moments_spec(layout).index(TP_AXIS))


def _encoder(vae: VAE, mesh: Mesh, layout: BandLayout, *, chunk: int, query_chunk: int,
             context_type: ContextType = BandContext, rank: int = 5):
    """The encode on each band under ``shard_map``, then the posterior on the cropped latents:
    ``run(state, padded frames, options)``; ``rank``: of the frames (4 for images)."""
    local = moments_program(vae.encoder_graphdef, DTYPES[vae.dtype],
                            _band_context(vae, mesh, layout, query_chunk, context_type), chunk=chunk)
    sharded = _shard(mesh, local, (P(), frames_spec(layout, rank)), moments_spec(layout))

    def run(state, frames, options):
        latents = latents_from_moments(crop_moments(sharded(state, frames), layout), options, vae.config)
        return image_latents(latents, rank)
    return run


def encode_avals(vae: VAE, shape: tuple[int, ...], mesh: Mesh, layout: BandLayout):
    """Abstract ``(state, padded frames, options)`` of the encode of frames ``shape`` on ``mesh``."""
    replicated = NamedSharding(mesh, P())
    frames = jax.ShapeDtypeStruct(padded_frames_shape(shape, layout, vae.config.spatial_scale), jnp.float32,
                                  sharding=NamedSharding(mesh, frames_spec(layout, len(shape))))
    return vae.encoder_state_avals(replicated), frames, PosteriorOptions.avals(shape[0], replicated)


def compile_encode(vae: VAE, shape: tuple[int, ...], mesh: Mesh, *, split: Split | None = None,
                   chunk: int | None = None, query_chunk: int = QUERY_CHUNK) -> jax.stages.Compiled:
    """The compiled sharded encode of NCTHW frames of ``shape`` on ``mesh`` (see ``sharded_encode``).

    Compiled ahead of time from abstract weights and frames (``mesh`` may hold abstract devices)
    and cached in ``vae.programs``; one program serves every sampling/normalization option. Call
    it as ``compiled(replicated_encoder_state(vae, mesh), put_frames(...), put_options(...))``.
    """
    shape, chunk = tuple(shape), resolve_encode_chunk(chunk)
    if vae.own_programs is not None:
        return compile_own_encode(vae, shape, mesh)
    layout = encode_layout(vae, shape, mesh, split)
    key = program_key("encode", shape, "latents", mesh=mesh_key(mesh), layout=layout, chunk=chunk,
                      query_chunk=query_chunk)

    def lower():
        run = _encoder(vae, mesh, layout, chunk=chunk, query_chunk=query_chunk, rank=len(shape))
        return jit_for(vae, mesh, run).lower(*encode_avals(vae, shape, mesh, layout))

    return vae.programs.get(key, lower)


def compile_own_encode(vae: VAE, shape: tuple[int, ...], mesh: Mesh) -> jax.stages.Compiled:
    """``compile_encode`` of a family that builds its own programs (``vae.own_programs``): its work
    spread over ``OWN_PROGRAM_AXES``, the frames' rows over ``dp`` (``put_latents``), no bands.
    Called as ``compiled(replicated_encoder_state(vae, mesh), put_latents(frames, mesh), put_options(...))``."""
    vae.require_encoder()
    check_frames_shape(shape, vae.config)
    _check_mesh(mesh, shape[0])
    key = program_key("encode", shape, "latents", mesh=mesh_key(mesh))

    def lower() -> jax.stages.Lowered:
        assert vae.own_programs is not None
        run = vae.own_programs.encode_program(vae.encoder_graphdef, vae.config, DTYPES[vae.dtype], mesh=mesh,
                                              axes=OWN_PROGRAM_AXES)
        replicated = NamedSharding(mesh, P())
        return jit_for(vae, mesh, run).lower(vae.encoder_state_avals(replicated),
                                             jax.ShapeDtypeStruct(shape, jnp.float32, sharding=latents_sharding(mesh)),
                                             PosteriorOptions.avals(shape[0], replicated))

    return vae.programs.get(key, lower)


def replicated_encoder_state(vae: VAE, mesh: Mesh):
    """The encoder weights on every device of ``mesh`` (placed once per mesh, kept by the model)."""
    return vae.placed_encoder_state(NamedSharding(mesh, P()))


def sharded_encode(
    vae: VAE,
    frames,
    mesh: Mesh,
    *,
    sample: bool = False,
    seed: int | None = None,
    normalize: bool = False,
    options: PosteriorOptions | None = None,
    split: Split | None = None,
    chunk: int | None = None,
    query_chunk: int = QUERY_CHUNK,
) -> jax.Array:
    """Encode frames ``(B, 3, F, H, W)`` on ``mesh``; the same latents as ``vae.encode``.

    Args:
      vae: a model with an encoder (its weights are replicated onto the mesh once and kept).
      frames: ``(B, 3, F, H, W)`` NCTHW in [-1, 1], ``F = 1 + 4k``, ``H``, ``W`` multiples of the
        spatial scale ``s`` (8 for Wan 2.1, 16 for Wan 2.2), or an image model's images ``(B, 3, H, W)``
        (latents ``(B, z, H/s, W/s)`` out); ``B`` a multiple of the mesh's ``dp``.
      mesh: a ``(dp, tp)`` mesh from ``make_mesh``.
      sample, seed, normalize, chunk: as in ``VAE.encode`` (the same seed gives the same noise).
      options: per-row posterior options instead of ``sample``/``seed``/``normalize`` (a server
        batching several requests passes each request's rows; see ``PosteriorOptions``).
      split: ``"height"``, ``"width"`` or None (the latent axis that needs less padding).
      query_chunk: attention queries per score block on each device.
    Returns:
      float32 latents ``(B, z, 1 + k, H/s, W/s)`` as a ``jax.Array`` on the mesh.
    """
    program = compile_encode(vae, np.shape(frames), mesh, split=split, chunk=chunk, query_chunk=query_chunk)
    if options is None:
        options = posterior_options(np.shape(frames)[0], sample=sample, seed=seed, normalize=normalize)
    if vae.own_programs is not None:
        return program(replicated_encoder_state(vae, mesh), put_latents(frames, mesh), put_options(options, mesh))
    layout = encode_layout(vae, np.shape(frames), mesh, split)
    return program(replicated_encoder_state(vae, mesh), put_frames(frames, layout, mesh, vae.config.spatial_scale),
                   put_options(options, mesh))
