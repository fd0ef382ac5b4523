"""Decode programs: frame 0 outside, the remaining latent frames in a ``lax.scan`` — or, for a
model that is not causal in time (HunyuanVideo 1.0), the whole clip in one call; for an LTX decoder,
a first step of ``1 + lookahead`` latent frames, then a scan of steps that run on past the clip's
end until every frame is out (``models.families.ltx.layers``).

These are pure functions of a merged decoder (any family's: ``models.family_modules``) and a spatial
context: ``sharding`` runs them on every band of a mesh (one device is a 1x1 mesh, where the
context pads the whole frame itself). A batch's rows run one after another inside a program (``models.rows``), so an
answer is bit for bit the same whatever it is batched with. Layouts: ``(B, z, T, H, W)`` NCTHW at the public boundary, ``(B, T, H, W, C)`` inside;
an image model's latents ``(B, z, H, W)`` run as one-frame clips and come out as images
(``models.shapes.one_frame_clip``/``without_time``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from .conditions import TIMESTEP_RANGE, DecodeConditions, condition_defaults, refused_conditions
from .config import VAEConfig
from .encode import prng_key
from .family_modules import Caches, DecoderModule, family_modules
from .rows import each_row
from .shapes import Output, one_frame_clip, output_frames, time_axis, without_time
from .spatial import SpatialContext

DEFAULT_CHUNK = 1  # latent frames per decode step: 1 holds the least memory


def resolve_chunk(chunk: int | None) -> int:
    """Latent frames per decode step: ``None`` means ``DEFAULT_CHUNK``; otherwise ≥ 1."""
    chunk = DEFAULT_CHUNK if chunk is None else chunk
    if not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be an integer ≥ 1 latent frame; received {chunk!r}")
    return chunk


def stream_steps(latent_frames: int, chunk: int, config: VAEConfig | None = None) -> list[tuple[int, int]]:
    """``[start, stop)`` latent frames of each streaming step: frame 0 alone, then ``chunk`` at a time.
    For a decoder with a ``lookahead`` (``config``: LTX), the first step takes ``1 + lookahead``
    frames and later steps ``chunk`` each, past the clip's end (zeros there: ``step_latents``) until
    the steps have given every frame (``stream_frames``)."""
    lookahead = None if config is None else config.lookahead
    if lookahead is None:
        return [(0, 1)] + [(start, min(start + chunk, latent_frames)) for start in range(1, latent_frames, chunk)]
    first, per_step = 1 + lookahead, config.temporal_scale * chunk  # type: ignore[union-attr]
    later = max(0, config.num_output_frames(latent_frames) - config.first_step_frames(first))  # type: ignore[union-attr]
    return [(0, first)] + [(first + i * chunk, first + (i + 1) * chunk) for i in range(-(-later // per_step))]


def stream_frames(config: VAEConfig, latent_frames: int, chunk: int) -> list[tuple[int, int]]:
    """``[start, stop)`` output frames each ``stream_steps`` step gives: frame 0, then
    ``temporal_scale`` per latent frame; an LTX decoder's steps give theirs behind their input (the
    first ``config.first_step_frames``), all cropped to the clip's frames."""
    total, scale = config.num_output_frames(latent_frames), config.temporal_scale
    steps = stream_steps(latent_frames, chunk, config)
    if config.lookahead is None:
        return [(0 if start == 0 else 1 + scale * (start - 1), 1 + scale * (stop - 1)) for start, stop in steps]
    ends = [config.first_step_frames(steps[0][1])]  # type: ignore[attr-defined]
    ends += [ends[0] + scale * (stop - steps[0][1]) for _, stop in steps[1:]]
    return [(min(a, total), min(b, total)) for a, b in zip([0, *ends[:-1]], ends, strict=True)]


def step_latents(latents, start: int, stop: int):
    """Latent frames ``[start, stop)`` of NCTHW ``latents``, zeros past the clip's end (a host array)."""
    piece = np.asarray(latents[:, :, start:stop], np.float32)
    missing = stop - start - piece.shape[2]
    return np.pad(piece, [(0, 0), (0, 0), (0, missing), (0, 0), (0, 0)]) if missing else piece


def to_uint8(frames: jax.Array) -> jax.Array:
    """``[-1, 1]`` floats → ``round((x + 1) · 127.5)`` as uint8 (values outside are clamped)."""
    scaled = (jnp.clip(frames.astype(jnp.float32), -1.0, 1.0) + 1.0) * 127.5
    return jnp.round(scaled).astype(jnp.uint8)


def nonfinite_count(frames: jax.Array) -> jax.Array:
    """``(B,)`` int32: NaN/Inf values of each row of frames ``(B, ...)``, read before ``finish_frames``
    (after it, a uint8 frame would show them only as black). One reduction per step; the service
    refuses a decode whose count is not zero (finite latents can still overflow the network)."""
    return jnp.sum(~jnp.isfinite(frames), axis=tuple(range(1, frames.ndim)), dtype=jnp.int32)


def finish_frames(frames: jax.Array, output: Output) -> jax.Array:
    """Clamp to [-1, 1] (as the reference does) and convert: float32 NCTHW-ready or uint8 frames."""
    if output == "uint8":
        return to_uint8(frames)
    return jnp.clip(frames.astype(jnp.float32), -1.0, 1.0)


def denormalize_latents(z: jax.Array, config: VAEConfig) -> jax.Array:
    """``z · latents_std + latents_mean`` per channel; ``z`` is channels-last."""
    mean = jnp.asarray(config.latents_mean, jnp.float32)
    std = jnp.asarray(config.latents_std, jnp.float32)
    return (z.astype(jnp.float32) * std + mean).astype(z.dtype)


def prepare_latents(latents: jax.Array, config: VAEConfig, dtype, *, denormalize: bool) -> jax.Array:
    """``(B, z, T, H, W)`` → channels-last ``(B, T, H, W, z)`` in the model dtype."""
    z = jnp.moveaxis(jnp.asarray(latents, jnp.float32), 1, -1)
    if denormalize:
        z = denormalize_latents(z, config)
    return z.astype(dtype)


def _layout(frames: jax.Array, output: Output) -> jax.Array:
    """Per-step frames ``(B, f, H, W, 3)`` → the output layout: float NCTHW, uint8 NTHWC."""
    return jnp.moveaxis(frames, -1, 1) if output == "float" else frames


# A first step that takes the clip's length at run time serves every clip of up to a power of two
# latent frames (at least this many) or of at least its reach: its program computes the frames of the
# longest of them. A few first-step programs for every clip length, none of which computes much more
# than its clip needs.
CLIP_BUCKET_MIN = 4


class StreamStart(NamedTuple):
    """The caches argument of a stream's first step for a decoder that takes the clip's length at run
    time (``runtime_clip_frames``): ``clip_frames``, an int32 scalar."""

    clip_frames: Any


def first_step_clip(config: VAEConfig, latent_frames: int) -> int:
    """The clip length a stream's first step is compiled for: the clip's own, or for a decoder that
    takes it at run time the longest clip its program serves: ``latent_frames`` rounded up to a power
    of two (at least ``CLIP_BUCKET_MIN``), at most the first step's reach (``1 + lookahead``: every
    longer clip's first step is the same)."""
    if not family_modules(config).decoder.runtime_clip_frames:
        return latent_frames
    reach = 1 + (config.lookahead or 0)
    return min(reach, max(CLIP_BUCKET_MIN, 1 << (latent_frames - 1).bit_length()))


def stream_start(config: VAEConfig, latent_frames: int) -> StreamStart | None:
    """The first step's caches: None, or for a decoder that takes the clip's length at run time its
    ``StreamStart``."""
    if not family_modules(config).decoder.runtime_clip_frames:
        return None
    return StreamStart(np.asarray(latent_frames, np.int32))


def is_first_step(caches: Any) -> bool:
    return caches is None or isinstance(caches, StreamStart)


def decode_step(model: DecoderModule, caches: Caches | None, z: jax.Array, ctx: SpatialContext, *,
                output: Output, inner_frames: int | None = None, clip_frames: int | None = None,
                conditions: DecodeConditions | None = None) -> tuple[jax.Array, Caches, jax.Array]:
    """One decode step: latents ``(B, c, H, W, z)`` and the previous step's caches (None for latent
    frame 0, then ``c`` must be 1 — ``1 + lookahead`` for an LTX decoder) → (frames in the output
    layout, the new caches, the ``(B,)`` non-finite count of its frames). ``inner_frames``: frames per
    inner step after each temporal upsampler (``models.families.wan.decoder.Decoder3d``); ``clip_frames``: the
    clip's latent frames (the first step of a model that ``needs_clip_frames``); ``conditions``: the
    rows' timestep and noise (a decoder whose config takes ``decode_conditions``). A model that is
    not ``causal`` takes the whole clip in one step."""
    with jax.named_scope("decode_step"):
        frames, caches = model(z, caches, ctx, inner_frames=inner_frames, clip_frames=clip_frames,
                               conditions=conditions)
        return _layout(finish_frames(frames, output), output), caches, nonfinite_count(frames)


def decode_frames(
    model: DecoderModule,
    z: jax.Array,
    ctx: SpatialContext,
    *,
    chunk: int = 1,
    output: Output = "float",
    inner_frames: int | None = None,
    framewise: bool = False,
    conditions: DecodeConditions | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Decode channels-last latents ``(B, T, H, W, z)``.

    Returns the frames, float32 ``(B, 3, F, sH, sW)`` (``output="float"``) or uint8 ``(B, F, sH, sW,
    3)``, ``F = 1 + 4(T-1)``, ``s`` the spatial scale (8 or 16), and their ``(B,)`` non-finite count.
    For a causal model every step writes its
    frames into one preallocated output buffer carried through the scan, so peak memory is the
    output plus one step's activations and caches, whatever ``T`` is (plus, for HunyuanVideo 1.5,
    the mid-block's keys and values of every latent frame). Inside a step, the stages after each
    temporal upsampler run ``inner_frames`` frames at a time (None: automatic; see ``Decoder3d``).
    A model that is not causal (HunyuanVideo 1.0) decodes the whole clip in one step: its memory
    grows with ``T``; with ``framewise``, it decodes as diffusers does by default instead
    (``HunyuanVideoDecoder.decode_framewise``: tiles of the clip, blended). An LTX decoder (a
    ``lookahead``) runs ``decode_ahead``: its memory too is one step's, whatever ``T`` is.
    """
    num_latent = z.shape[1]
    if model.lookahead is not None:
        return decode_ahead(model, z, ctx, chunk=chunk, output=output, conditions=conditions)
    if framewise:
        with jax.named_scope("decode_framewise"):
            frames = model.decode_framewise(z, ctx)  # type: ignore[attr-defined]  # checked by check_framewise
            return _layout(finish_frames(frames, output), output), nonfinite_count(frames)
    if not model.steps_with_caches:
        frames, _, bad = decode_step(model, None, z, ctx, output=output, inner_frames=inner_frames)
        return frames, bad
    # One frame: no inner loop.
    first, caches, bad = decode_step(model, None, z[:, :1], ctx, output=output, clip_frames=num_latent)
    axis = time_axis(output)
    per_latent = model.temporal_scale  # frames per later latent frame; frame 0 yields one
    shape = list(first.shape)
    shape[axis] = output_frames(num_latent, per_latent)
    buffer = lax.dynamic_update_slice_in_dim(jnp.zeros(shape, first.dtype), first, 0, axis)

    def step(carry, z_chunk, start):
        caches, buffer, bad = carry
        frames, caches, step_bad = decode_step(model, caches, z_chunk, ctx, output=output, inner_frames=inner_frames)
        return caches, lax.dynamic_update_slice_in_dim(buffer, frames, start, axis), bad + step_bad

    rest = z[:, 1:]
    num_chunks, remainder = divmod(num_latent - 1, chunk)
    if num_chunks:
        scanned = rest[:, : num_chunks * chunk]
        scanned = scanned.reshape(scanned.shape[0], num_chunks, chunk, *scanned.shape[2:]).swapaxes(0, 1)

        def body(carry, xs):
            index, z_chunk = xs
            return step(carry, z_chunk, 1 + index * chunk * per_latent), None

        (caches, buffer, bad), _ = lax.scan(body, (caches, buffer, bad), (jnp.arange(num_chunks), scanned))
    if remainder:
        caches, buffer, bad = step((caches, buffer, bad), rest[:, num_chunks * chunk :],
                                   1 + num_chunks * chunk * per_latent)
    return buffer, bad


def decode_ahead(model: DecoderModule, z: jax.Array, ctx: SpatialContext, *, chunk: int, output: Output,
                 conditions: DecodeConditions | None) -> tuple[jax.Array, jax.Array]:
    """An LTX decode (``models.families.ltx.layers``): the first step on latent frames ``[0, 1 + lookahead)``, then a
    ``lax.scan`` of steps of ``chunk`` latent frames, zeros past the clip's end, until the steps have
    given every frame (they come behind their input); frames past the clip's end are cropped.
    ``z (B, T, H, W, z)`` → frames in the output layout and their ``(B,)`` non-finite count."""
    num_latent, first = z.shape[1], 1 + (model.lookahead or 0)
    total, per_step = output_frames(num_latent, model.temporal_scale), model.temporal_scale * chunk
    padded = jnp.pad(z, [(0, 0), (0, max(0, first - num_latent))] + [(0, 0)] * 3)
    frames, caches, bad = decode_step(model, None, padded[:, :first], ctx, output=output, clip_frames=num_latent,
                                      conditions=conditions)
    axis = time_axis(output)
    emitted = frames.shape[axis]
    steps = -(-max(0, total - emitted) // per_step)
    if steps:
        padded = jnp.pad(padded, [(0, 0), (0, first + steps * chunk - padded.shape[1])] + [(0, 0)] * 3)
        shape = list(frames.shape)
        shape[axis] = emitted + steps * per_step
        buffer = lax.dynamic_update_slice_in_dim(jnp.zeros(shape, frames.dtype), frames, 0, axis)

        def body(carry, index):
            caches, buffer, bad = carry
            z_chunk = lax.dynamic_slice_in_dim(padded, first + index * chunk, chunk, axis=1)
            out, caches, step_bad = decode_step(model, caches, z_chunk, ctx, output=output, conditions=conditions)
            return (caches, lax.dynamic_update_slice_in_dim(buffer, out, emitted + index * per_step, axis),
                    bad + step_bad), None

        (_, frames, bad), _ = lax.scan(body, (caches, buffer, bad), jnp.arange(steps))
    return lax.slice_in_dim(frames, 0, total, axis=axis), bad


def decode_conditions(config: VAEConfig, batch: int, *, timestep: float | None = None,
                      noise_scale: float | None = None, seed: int | None = None,
                      defaults: dict[str, Any] | None = None) -> DecodeConditions | None:
    """The host ``DecodeConditions`` of ``batch`` rows for a decoder that takes them (None for one that
    does not, which refuses them). ``timestep`` and ``noise_scale`` (a timestep-conditioned decoder
    only: pipelines mix noise into its latents): default ``condition_defaults(defaults)``; the
    timestep in ``TIMESTEP_RANGE``, ``noise_scale`` in [0, 1]. ``seed``: the noise's (a fresh one
    when None): one seed gives one answer."""
    refused = refused_conditions(config, timestep=timestep, noise_scale=noise_scale, seed=seed)
    if refused is not None:
        received = ", ".join(f"{name}={value}" for name, value in refused.received.items())
        raise ValueError(f"{refused.detail}; received {received}")
    if not config.decode_conditions:
        return None
    default_timestep, default_noise_scale = condition_defaults(defaults)
    timestep = float(default_timestep if timestep is None else timestep)
    noise_scale = float(default_noise_scale if noise_scale is None else noise_scale)
    low, high = TIMESTEP_RANGE
    if not (math.isfinite(timestep) and low <= timestep <= high):
        raise ValueError(f"timestep must be a finite number in [{low}, {high}]; received {timestep}")
    if not 0 <= noise_scale <= 1:
        raise ValueError(f"noise_scale must be in [0, 1]; received {noise_scale}")
    key = prng_key(seed)
    return DecodeConditions(np.full(batch, timestep, np.float32), np.full(batch, noise_scale, np.float32),
                            np.tile(key, (batch, 1)))


Program = Callable[..., tuple[jax.Array, jax.Array]]
StepProgram = Callable[..., tuple[jax.Array, Caches, jax.Array]]


def has_framewise(config: VAEConfig) -> bool:
    """Whether the model offers diffusers' framewise decode: only HunyuanVideo 1.0's diffusers
    default tiles clips in time."""
    return hasattr(family_modules(config).decoder, "decode_framewise")


def check_framewise(config: VAEConfig, framewise: bool) -> dict[str, bool]:
    """``framewise`` as a program-key option (absent when False); refused for a model without a
    framewise decode (``has_framewise``)."""
    if not framewise:
        return {}
    if not has_framewise(config):
        raise ValueError(f"framewise decoding is diffusers' default for HunyuanVideo 1.0 only; the {config.family} "
                         "VAE decodes a clip exactly as it is")
    return {"framewise": True}


def full_program(graphdef, config: VAEConfig, dtype, make_context: Callable[[], SpatialContext], *,
                 denormalize: bool, output: Output, chunk: int, inner_frames: int | None = None,
                 framewise: bool = False) -> Program:
    """``(state, latents NCTHW[, conditions]) → (frames, (B,) non-finite count)``: the whole decode on
    one band of a mesh (the whole frame on a 1x1 mesh; bands differ only in ``make_context``); ``conditions`` for a decoder that takes them (``decode_conditions``). Image
    latents ``(B, z, H, W)`` give images: float ``(B, 3, sH, sW)`` or uint8 ``(B, sH, sW, 3)``."""

    def run_rows(state, rows: tuple[jax.Array, DecodeConditions | None]) -> tuple[jax.Array, jax.Array]:
        latents, conditions = rows
        z = prepare_latents(one_frame_clip(latents), config, dtype, denormalize=denormalize)
        frames, bad = decode_frames(nnx.merge(graphdef, state), z, make_context(), chunk=chunk, output=output,
                                    inner_frames=inner_frames, framewise=framewise, conditions=conditions)
        return (without_time(frames, output) if latents.ndim == 4 else frames), bad

    def run(state, latents: jax.Array, conditions: DecodeConditions | None = None) -> tuple[jax.Array, jax.Array]:
        return each_row(partial(run_rows, state), (latents, conditions))

    return run


def step_program(graphdef, config: VAEConfig, dtype, make_context: Callable[[], SpatialContext], *,
                 denormalize: bool, output: Output, inner_frames: int | None = None,
                 clip_frames: int | None = None) -> StepProgram:
    """``(state, caches, latents NCTHW[, conditions]) → (frames, caches, (B,) non-finite count)``: one
    streaming decode step, with ``caches`` None (or a ``StreamStart``) for the first (``clip_frames``:
    ``first_step_clip`` of the stream's latent frames, for a model that ``needs_clip_frames``)."""

    def run_rows(state, start: StreamStart | None,
                 rows: tuple[Caches | None, jax.Array, DecodeConditions | None]) -> tuple[jax.Array, Caches, jax.Array]:
        caches, latents, conditions = rows
        z = prepare_latents(latents, config, dtype, denormalize=denormalize)
        return decode_step(nnx.merge(graphdef, state), start if caches is None else caches, z, make_context(),
                           output=output, inner_frames=inner_frames,
                           clip_frames=clip_frames if caches is None else None, conditions=conditions)

    def run(state, caches: Caches | None, latents: jax.Array,
            conditions: DecodeConditions | None = None) -> tuple[jax.Array, Caches, jax.Array]:
        # A first step's caches (None or a StreamStart, the clip's length) are the batch's, not a row's.
        start, caches = (caches, None) if is_first_step(caches) else (None, caches)
        return each_row(partial(run_rows, state, start), (caches, latents, conditions))

    return run
