"""Decode programs: frame 0 outside, the remaining latent frames in a ``lax.scan`` — or, for a
model that is not causal in time (HunyuanVideo 1.0), the whole clip in one call.

These are pure functions of a merged decoder (any family's: ``models.families``) and a spatial
context, so the single-device path (``VAE.decode``) and the sharded path (``sharding``) run the
very same code. Layouts: ``(B, z, T, H, W)`` NCTHW at the public boundary, ``(B, T, H, W, C)`` inside;
an image model's latents ``(B, z, H, W)`` run as one-frame clips and come out as images
(``models.shapes.one_frame_clip``/``without_time``).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from .config import VAEConfig
from .decoder import DecoderCache
from .families import DecoderModule, family_of
from .shapes import Output, one_frame_clip, output_frames, time_axis, without_time
from .spatial import SpatialContext

DEFAULT_CHUNK = 1  # latent frames per decode step: 1 holds the least memory


def resolve_chunk(chunk: int | None) -> int:
    """Latent frames per decode step: ``None`` means ``DEFAULT_CHUNK``; otherwise ≥ 1."""
    chunk = DEFAULT_CHUNK if chunk is None else chunk
    if not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be an integer ≥ 1 latent frame; received {chunk!r}")
    return chunk


def stream_steps(latent_frames: int, chunk: int) -> list[tuple[int, int]]:
    """``[start, stop)`` latent frames of each streaming step: frame 0 alone, then ``chunk`` at a time."""
    return [(0, 1)] + [(start, min(start + chunk, latent_frames)) for start in range(1, latent_frames, chunk)]


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


def decode_step(model: DecoderModule, caches: DecoderCache | None, z: jax.Array, ctx: SpatialContext, *,
                output: Output, inner_frames: int | None = None,
                clip_frames: int | None = None) -> tuple[jax.Array, DecoderCache, jax.Array]:
    """One decode step: latents ``(B, c, H, W, z)`` and the previous step's caches (None for latent
    frame 0, then ``c`` must be 1) → (frames in the output layout, the new caches, the ``(B,)``
    non-finite count of its frames). ``inner_frames``: frames per inner step after each temporal
    upsampler (``models.decoder.Decoder3d``); ``clip_frames``: the clip's latent frames (the first
    step of a model that ``needs_clip_frames``). A model that is not ``causal`` takes the whole clip
    in one step."""
    with jax.named_scope("decode_step"):
        frames, caches = model(z, caches, ctx, inner_frames=inner_frames, clip_frames=clip_frames)
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
    (``HunyuanVideoDecoder.decode_framewise``: tiles of the clip, blended).
    """
    num_latent = z.shape[1]
    if framewise:
        with jax.named_scope("decode_framewise"):
            frames = model.decode_framewise(z, ctx)  # type: ignore[attr-defined]  # checked by check_framewise
            return _layout(finish_frames(frames, output), output), nonfinite_count(frames)
    if not model.causal:
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


Program = Callable[..., tuple[jax.Array, jax.Array]]
StepProgram = Callable[..., tuple[jax.Array, DecoderCache, jax.Array]]


def has_framewise(config: VAEConfig) -> bool:
    """Whether the model offers diffusers' framewise decode: only HunyuanVideo 1.0's diffusers
    default tiles clips in time."""
    return hasattr(family_of(config).decoder, "decode_framewise")


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
    """``(state, latents NCTHW) → (frames, (B,) non-finite count)``: the whole decode on one device
    (or one band: the single-device and the sharded decode differ only in ``make_context``). Image
    latents ``(B, z, H, W)`` give images: float ``(B, 3, sH, sW)`` or uint8 ``(B, sH, sW, 3)``."""

    def run(state, latents: jax.Array) -> tuple[jax.Array, jax.Array]:
        z = prepare_latents(one_frame_clip(latents), config, dtype, denormalize=denormalize)
        frames, bad = decode_frames(nnx.merge(graphdef, state), z, make_context(), chunk=chunk, output=output,
                                    inner_frames=inner_frames, framewise=framewise)
        return (without_time(frames, output) if latents.ndim == 4 else frames), bad

    return run


def step_program(graphdef, config: VAEConfig, dtype, make_context: Callable[[], SpatialContext], *,
                 denormalize: bool, output: Output, inner_frames: int | None = None,
                 clip_frames: int | None = None) -> StepProgram:
    """``(state, caches, latents NCTHW) → (frames, caches, (B,) non-finite count)``: one streaming
    decode step, with ``caches=None`` for latent frame 0 (``clip_frames``: the stream's latent
    frames, for a model that ``needs_clip_frames``)."""

    def run(state, caches: DecoderCache | None, latents: jax.Array) -> tuple[jax.Array, DecoderCache, jax.Array]:
        z = prepare_latents(latents, config, dtype, denormalize=denormalize)
        return decode_step(nnx.merge(graphdef, state), caches, z, make_context(), output=output,
                           inner_frames=inner_frames, clip_frames=clip_frames if caches is None else None)

    return run
