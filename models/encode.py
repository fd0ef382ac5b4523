"""Encode programs: frame 0 outside, later chunks of 4 frames in a ``lax.scan`` (or, for a model
that is not causal in time, HunyuanVideo 1.0, the whole clip at once); the posterior after.

Pure functions of a merged encoder (any family's: ``models.family_modules``) and a spatial context, so
the single-device path (``VAE.encode``) and the sharded path (``sharding.encode``) run the very
same code. The encoder
part (``encode_moments``) is what runs per band; the posterior (mean or sample, normalization)
is per latent pixel and runs on the whole latent array after it, so a sample's noise does not
depend on how the frame was split.

Layouts: frames ``(B, 3, F, H, W)`` NCTHW in [-1, 1] and latents ``(B, z, T, H/s, W/s)`` at the
public boundary (``s`` the spatial scale: 8 for Wan 2.1, 16 for Wan 2.2), ``(B, T, H, W, C)`` inside;
an image model's images ``(B, 3, H, W)`` run as one-frame clips and give latents ``(B, z, H/s, W/s)``.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from .conditions import SEED_RANGE
from .config import VAEConfig
from .family_modules import Caches, EncoderModule
from .rows import each_row
from .shapes import frames_per_step, latents_for_frames, one_frame_clip, without_time
from .spatial import SpatialContext

DEFAULT_ENCODE_CHUNK = 1  # 4-frame groups per encode step: 1 is the reference's chunking and the least memory
LOGVAR_RANGE = (-30.0, 20.0)  # diffusers' DiagonalGaussianDistribution clamps the log-variance here


def latent_frames(frames: int, config: VAEConfig) -> int:
    """Latent frames for ``frames = 1 + 4k`` input frames: ``1 + k`` for Wan 2.1 (``1 + s·k``: ``1 + k``
    for LTX's ``1 + 8k``)."""
    return latents_for_frames(frames, config.temporal_scale)


def resolve_encode_chunk(chunk: int | None) -> int:
    """Frame groups (4 frames, 8 for LTX) per encode step: ``None`` means ``DEFAULT_ENCODE_CHUNK``; otherwise ≥ 1."""
    chunk = DEFAULT_ENCODE_CHUNK if chunk is None else chunk
    if not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be an integer ≥ 1 (groups of frames); received {chunk!r}")
    return chunk


def encode_step(model: EncoderModule, caches: Caches | None, frames: jax.Array, ctx: SpatialContext,
                dtype, clip_frames: int | None = None) -> tuple[jax.Array, Caches]:
    """Frames ``(B, 3, f, H, W)`` NCTHW (``f = 1`` with ``caches=None``, for a causal model) → moments
    ``(B, t, H/s, W/s, 2z)`` and the new caches. Only this chunk is moved channels-last."""
    with jax.named_scope("encode_step"):
        return model(jnp.moveaxis(frames, 1, -1).astype(dtype), caches, ctx, clip_frames=clip_frames)


def encode_moments(model: EncoderModule, frames: jax.Array, ctx: SpatialContext, *, dtype,
                   chunk: int = DEFAULT_ENCODE_CHUNK) -> jax.Array:
    """The posterior moments of frames ``(B, 3, F, H, W)``, ``F = 1 + 4k``: ``(B, T, H/s, W/s, 2z)``.

    Frame 0 runs alone, then ``4 · chunk`` frames (LTX: ``8 · chunk``) per ``lax.scan`` step (a shorter last step if
    ``k`` is not a multiple of ``chunk``), each step slicing its frames out of the input, so the
    working memory is one step's activations and the fixed-shape caches, whatever ``F`` is. A model
    that is not causal (HunyuanVideo 1.0) encodes all frames in one step.
    """
    if not model.steps_with_caches:
        moments, _ = encode_step(model, None, frames, ctx, dtype)
        return moments
    clip_frames = 1 + (frames.shape[2] - 1) // model.temporal_scale
    first, caches = encode_step(model, None, frames[:, :, :1], ctx, dtype, clip_frames=clip_frames)
    step_frames = frames_per_step(model.temporal_scale) * chunk
    num_steps, remainder = divmod(frames.shape[2] - 1, step_frames)
    pieces = [first]
    if num_steps:
        def body(caches, index):
            x = lax.dynamic_slice_in_dim(frames, 1 + index * step_frames, step_frames, axis=2)
            moments, caches = encode_step(model, caches, x, ctx, dtype)
            return caches, moments

        caches, scanned = lax.scan(body, caches, jnp.arange(num_steps))
        pieces.append(jnp.moveaxis(scanned, 0, 1).reshape(scanned.shape[1], -1, *scanned.shape[3:]))
    if remainder:
        last, _ = encode_step(model, caches, frames[:, :, 1 + num_steps * step_frames :], ctx, dtype)
        pieces.append(last)
    return jnp.concatenate(pieces, axis=1)


def normalize_latents(z: jax.Array, config: VAEConfig) -> jax.Array:
    """``(z − latents_mean) / latents_std`` per channel of NCTHW latents (the inverse of
    ``denormalize_latents``; what pipelines apply after encoding)."""
    shape = (len(config.latents_mean), 1, 1, 1)
    mean = jnp.asarray(config.latents_mean, jnp.float32).reshape(shape)
    std = jnp.asarray(config.latents_std, jnp.float32).reshape(shape)
    return (z - mean) / std


class PosteriorOptions(NamedTuple):
    """Per-row options of the posterior, arguments of an encode program (a pytree of arrays).

    Per row, not per call, so that requests with different options share one device batch and
    padding a batch cannot change a request's noise. Row ``b`` of a request with seed ``s`` draws
    ``jax.random.normal(jax.random.fold_in(jax.random.PRNGKey(s), b), (z, T, h, w))``.

    Attributes:
      keys: ``(B, 2)`` uint32, ``jax.random.PRNGKey(seed)`` of the request each row belongs to.
      rows: ``(B,)`` int32, the row's index within its request.
      sample: ``(B,)`` bool, draw from the posterior (else its mean).
      normalize: ``(B,)`` bool, ``(z − latents_mean) / latents_std`` after.
    """

    keys: jax.Array | np.ndarray  # host arrays until a program call puts them on the devices
    rows: jax.Array | np.ndarray
    sample: jax.Array | np.ndarray
    normalize: jax.Array | np.ndarray

    @staticmethod
    def avals(batch: int, sharding=None) -> PosteriorOptions:
        """The abstract options of a batch of ``batch`` rows (to compile a program)."""
        def aval(shape, dtype):
            return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
        return PosteriorOptions(aval((batch, 2), jnp.uint32), aval((batch,), jnp.int32), aval((batch,), jnp.bool_),
                                aval((batch,), jnp.bool_))

    @staticmethod
    def concatenate(parts: list[PosteriorOptions], batch: int | None = None) -> PosteriorOptions:
        """Host options of several requests stacked, then padded with mean-only rows to ``batch``."""
        fields = [np.concatenate([np.asarray(getattr(p, name)) for p in parts]) for name in PosteriorOptions._fields]
        missing = 0 if batch is None else batch - len(fields[1])
        return PosteriorOptions(*(np.concatenate([f, np.zeros((missing, *f.shape[1:]), f.dtype)]) for f in fields))


def prng_key(seed: int | None) -> np.ndarray:
    """``jax.random.PRNGKey(seed)`` as host ``uint32[2]``; a fresh random seed when ``seed`` is None.

    Built on the host, with no device work (a server calls this on its event loop, not on the
    thread that owns the devices): for JAX's default threefry2x32 generator a 32-bit seed's key is
    ``[0, seed]`` (``tests/models/test_encode_parity.py`` checks it against ``jax.random.PRNGKey``).
    """
    if seed is None:
        seed = secrets.randbelow(SEED_RANGE)
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or not 0 <= seed < SEED_RANGE:
        raise ValueError(f"seed must be an integer in [0, 2**32); received {seed!r}")
    impl = jax.config.jax_default_prng_impl
    if impl != "threefry2x32":
        raise ValueError(f"encode seeds assume JAX's threefry2x32 generator; jax_default_prng_impl is {impl!r}")
    return np.array([0, seed], np.uint32)


def posterior_options(batch: int, *, sample: bool = False, seed: int | None = None,
                      normalize: bool = False) -> PosteriorOptions:
    """Host options for one request of ``batch`` rows (a fresh seed when sampling without one)."""
    key = prng_key(seed if sample else 0)
    return PosteriorOptions(np.tile(key, (batch, 1)), np.arange(batch, dtype=np.int32),
                            np.full(batch, sample, np.bool_), np.full(batch, normalize, np.bool_))


def latents_from_moments(moments: jax.Array, options: PosteriorOptions, config: VAEConfig) -> jax.Array:
    """Moments ``(B, T, h, w, 2z)`` → float32 NCTHW latents ``(B, z, T, h, w)``.

    Per row: the posterior mean (diffusers' ``latent_dist.mode()``, what pipelines use), or where
    ``options.sample`` ``mean + exp(logvar / 2) · noise`` (the log-variance clamped to [-30, 20]
    as diffusers does); then, where ``options.normalize``, ``normalize_latents``. The options are
    traced: one compiled program serves every mix of them (the latents are small next to the
    encoder, so the unused branch costs nothing worth a second compile).
    """
    moments = jnp.moveaxis(moments.astype(jnp.float32), -1, 1)
    mean, logvar = jnp.split(moments, 2, axis=1)
    std = jnp.exp(0.5 * jnp.clip(logvar, *LOGVAR_RANGE))
    noise = jax.vmap(lambda key, row: jax.random.normal(jax.random.fold_in(key, row), mean.shape[1:]))(
        options.keys, options.rows)
    rows = (-1,) + (1,) * (mean.ndim - 1)
    z = jnp.where(options.sample.reshape(rows), mean + std * noise, mean)
    return jnp.where(options.normalize.reshape(rows), normalize_latents(z, config), z)


MomentsProgram = Callable[[object, jax.Array], jax.Array]


def moments_program(graphdef, dtype, make_context: Callable[[], SpatialContext], *, chunk: int) -> MomentsProgram:
    """``(state, frames NCTHW) → moments (B, T, h, w, 2z)`` on one band of a mesh
    (the whole frame on a 1x1 mesh; bands differ only in ``make_context``); images ``(B, 3, H, W)``
    as one-frame clips (``T = 1``)."""

    def run_rows(state, frames: jax.Array) -> jax.Array:
        return encode_moments(nnx.merge(graphdef, state), one_frame_clip(frames), make_context(), dtype=dtype,
                              chunk=chunk)

    def run(state, frames: jax.Array) -> jax.Array:
        return each_row(partial(run_rows, state), frames)  # a row's moments do not depend on its batch-mates

    return run


def image_latents(latents: jax.Array, frames_ndim: int) -> jax.Array:
    """The latents of images (``frames_ndim`` 4) without their time axis: ``(B, z, h, w)``."""
    return without_time(latents) if frames_ndim == 4 else latents
