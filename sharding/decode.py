"""The sharded decode: ``models.decode`` programs under ``jax.shard_map`` over the ``(dp, tp)`` mesh.

Layouts match ``WanVAE``: latents ``(B, 16, T, H, W)`` NCTHW in; float32 ``(B, 3, F, 8H, 8W)`` or
uint8 ``(B, F, 8H, 8W, 3)`` out, ``F = 1 + 4(T-1)``. Inside the mesh, the batch is split over
``dp`` and the split axis (height or width, see ``plan.choose_split``) over ``tp``; causal caches
stay on the device of their band, and time is never split.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from models.decode import Output, local_program
from models.vae import DEFAULT_CHUNK, DTYPES, WanVAE, check_latents_shape, check_options, stream_steps

from .halo import BandContext
from .mesh import DP_AXIS, TP_AXIS, mesh_key
from .plan import HALOS, BandPlan, Split, SplitError, plan_bands

# Per model: the weights replicated over each mesh, and the compiled programs. Weak keys: a
# dropped model takes its programs and replicated weights with it.
_CACHE: "weakref.WeakKeyDictionary[WanVAE, dict]" = weakref.WeakKeyDictionary()


# -- layouts ----------------------------------------------------------------------------------------
def _spec(ndim: int, batch_axis: int, split_axis: int) -> P:
    parts: list[Any] = [None] * ndim
    parts[batch_axis] = DP_AXIS
    parts[split_axis] = TP_AXIS
    return P(*parts)


def latents_spec(plan: BandPlan) -> P:
    """NCTHW latents: batch over dp, H (or W) over tp."""
    return _spec(5, 0, 3 if plan.split == "height" else 4)


def frames_spec(plan: BandPlan, output: Output) -> P:
    """float NCTHW ``(B, 3, F, H, W)`` or uint8 NTHWC ``(B, F, H, W, 3)`` frames."""
    first_spatial = 3 if output == "float" else 2
    return _spec(5, 0, first_spatial + (plan.split == "width"))


def cache_spec(plan: BandPlan) -> P:
    """Every causal cache leaf is channels-last ``(B, 2, h, w, C)``."""
    return _spec(5, 0, 2 if plan.split == "height" else 3)


def pad_latents(latents: jax.Array, plan: BandPlan) -> jax.Array:
    """Zero-pad NCTHW latents at the far edge of the split axis up to ``plan.padded``."""
    if plan.pad == 0:
        return latents
    widths = [(0, 0)] * 5
    widths[3 if plan.split == "height" else 4] = (0, plan.pad)
    return jnp.pad(latents, widths)


def crop_frames(frames: jax.Array, plan: BandPlan, output: Output) -> jax.Array:
    """Drop the frame rows (columns) that came from padded latent rows."""
    if plan.pad == 0:
        return frames
    axis = frames_spec(plan, output).index(TP_AXIS)
    factor = frames.shape[axis] // plan.padded
    return jax.lax.slice_in_dim(frames, 0, plan.size * factor, axis=axis)


# -- checks -----------------------------------------------------------------------------------------
def _check_mesh(mesh: Mesh, batch: int) -> None:
    if tuple(mesh.axis_names) != (DP_AXIS, TP_AXIS):
        raise SplitError(f"mesh axes must be {(DP_AXIS, TP_AXIS)} (see make_mesh); received {mesh.axis_names}")
    dp = mesh.shape[DP_AXIS]
    if batch % dp:
        raise SplitError(f"batch {batch} does not split over dp={dp}: send a multiple of {dp} latents")


def make_plan(vae: WanVAE, shape: tuple[int, ...], mesh: Mesh, split: Split | None) -> BandPlan:
    """Validate ``shape`` (NCTHW) against the model and mesh, and plan its bands."""
    check_latents_shape(tuple(shape), vae.config)
    _check_mesh(mesh, shape[0])
    return plan_bands(shape[3], shape[4], mesh.shape[TP_AXIS], split)


# -- programs ---------------------------------------------------------------------------------------
def put_latents(latents, mesh: Mesh) -> jax.Array:
    """Latents onto the mesh, batch over dp and replicated over tp (an explicit transfer).

    They are small; each device then slices its band out locally (the split axis may first need
    padding, which a sharded input could not express).
    """
    return jax.device_put(np.asarray(latents, np.float32), NamedSharding(mesh, P(DP_AXIS)))


def model_cache(vae: WanVAE) -> dict:
    """This model's replicated weights (per mesh), programs and compiled programs."""
    return _CACHE.setdefault(vae, {"state": {}, "programs": {}})


def replicated_state(vae: WanVAE, mesh: Mesh):
    """The model weights on every device of ``mesh`` (made once per mesh)."""
    states = model_cache(vae)["state"]
    key = mesh_key(mesh)
    if key not in states:
        states[key] = jax.device_put(vae.state, NamedSharding(mesh, P()))
    return states[key]


def _shard(mesh: Mesh, fn: Callable, in_specs, out_specs) -> Callable:
    # check_vma=False: the scan carries start as replicated zeros and become band-varying.
    return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)


def _build(vae: WanVAE, mesh: Mesh, plan: BandPlan, kind: str, *, halo: str, query_chunk: int, **options) -> Callable:
    """``models.decode.local_program`` on each band under ``shard_map``, latents padded and frames
    cropped around it. ``kind`` as there: ``"full"`` or ``"step"`` (caches stay on their bands)."""
    def band_context():
        return BandContext(plan, halo=halo, query_chunk=query_chunk)

    local = local_program(kind, vae.graphdef, vae.config, DTYPES[vae.dtype], band_context, **options)
    output = options["output"]
    frames, caches, latents = frames_spec(plan, output), cache_spec(plan), latents_spec(plan)
    if kind == "full":
        sharded = _shard(mesh, local, (P(), latents), frames)

        def run(state, z):
            return crop_frames(sharded(state, pad_latents(z, plan)), plan, output)
        return run

    # A step's caches: None for latent frame 0, then the sharded pytree of the previous step.
    def run_step(state, step_caches, z):
        cache_specs = None if step_caches is None else caches
        sharded = _shard(mesh, local, (P(), cache_specs, latents), (frames, caches))
        out, new_caches = sharded(state, step_caches, pad_latents(z, plan))
        return crop_frames(out, plan, output), new_caches
    return run_step


def program(vae: WanVAE, kind: str, mesh: Mesh, plan: BandPlan, **options) -> Callable:
    """The jitted sharded program ``kind`` ("full" or "step"), cached per (mesh, plan, options).

    ``jax.jit`` then caches its compilations per input shape, so a program is compiled once per
    (shape, mesh, options).
    """
    if options.get("halo", "exchange") not in HALOS:
        raise ValueError(f"halo must be one of {HALOS}; received {options['halo']!r}")
    programs = model_cache(vae)["programs"]
    key = (kind, mesh_key(mesh), plan, tuple(sorted(options.items())))
    if key not in programs:
        programs[key] = jax.jit(_build(vae, mesh, plan, kind, **options))
    return programs[key]


# -- public API -------------------------------------------------------------------------------------
def sharded_decode(
    vae: WanVAE,
    latents,
    mesh: Mesh,
    *,
    denormalize: bool = False,
    output: Output = "float",
    split: Split | None = None,
    chunk: int | None = None,
    halo: str = "exchange",
    query_chunk: int = 4096,
) -> jax.Array:
    """Decode ``(B, 16, T, H, W)`` latents on ``mesh``; the same frames as ``vae.decode``.

    Args:
      vae: the model (its weights are replicated onto the mesh once and kept).
      latents: ``(B, 16, T, H, W)`` NCTHW; ``B`` must be a multiple of the mesh's ``dp``.
      mesh: a ``(dp, tp)`` mesh from ``make_mesh``.
      denormalize: apply ``z · latents_std + latents_mean`` first.
      output: ``"float"`` → float32 ``(B, 3, F, 8H, 8W)`` in [-1, 1]; ``"uint8"`` → ``(B, F, 8H, 8W, 3)``.
      split: ``"height"``, ``"width"`` or None (the axis that needs less padding).
      chunk: latent frames per scan step (default 1: least memory).
      halo: ``"exchange"``; ``"none"``/``"cyclic"`` are broken on purpose (negative controls).
      query_chunk: attention queries per score block on each device.
    Returns:
      A ``jax.Array`` sharded over the mesh (batch over dp, the split axis over tp).
    """
    chunk = chunk or DEFAULT_CHUNK
    check_options(output, chunk)
    shape = tuple(np.shape(latents))
    plan = make_plan(vae, shape, mesh, split)
    run = program(vae, "full", mesh, plan, denormalize=denormalize, output=output, chunk=chunk,
                  halo=halo, query_chunk=query_chunk)
    return run(replicated_state(vae, mesh), put_latents(latents, mesh))


def sharded_decode_stream(
    vae: WanVAE,
    latents,
    mesh: Mesh,
    *,
    denormalize: bool = False,
    split: Split | None = None,
    chunk: int | None = None,
    halo: str = "exchange",
    query_chunk: int = 4096,
) -> Iterator[np.ndarray]:
    """Yield host uint8 frames ``(B, f, 8H, 8W, 3)`` as each sharded decode step finishes.

    Step 0 decodes latent frame 0 (``f = 1``); every later step ``chunk`` latent frames
    (``f = 4 · chunk``, fewer at the end). The caches between steps stay sharded on the mesh.
    Concatenated along axis 1, the steps equal ``sharded_decode(..., output="uint8")``.
    """
    chunk = chunk or DEFAULT_CHUNK
    check_options("uint8", chunk)
    latents = np.asarray(latents, np.float32)
    plan = make_plan(vae, latents.shape, mesh, split)
    step = program(vae, "step", mesh, plan, denormalize=denormalize, output="uint8", halo=halo,
                   query_chunk=query_chunk)
    state = replicated_state(vae, mesh)
    caches = None
    for start, stop in stream_steps(latents.shape[2], chunk):
        frames, caches = step(state, caches, put_latents(latents[:, :, start:stop], mesh))
        yield jax.device_get(frames)
