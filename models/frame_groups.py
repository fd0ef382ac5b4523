"""Frame groups: running a causal stage over a clip a few frames at a time, carrying its caches.

A video decoder's later stages (after each temporal upsampler) see several frames per latent frame
at up to full resolution; their only link to the past is the causal caches, so they can run
``inner_frames`` frames at a time in an inner ``lax.scan``: the same computation, reordered,
holding one group's activations instead of the whole step's. Any family's decoder uses these.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from .estimate import STREAM_MIN_FRAME_BYTES


def check_inner_frames(inner_frames: int | None) -> int | None:
    """``None`` (automatic: see ``stream_group``) or an integer ≥ 1; anything else is refused."""
    if inner_frames is not None and (not isinstance(inner_frames, int) or isinstance(inner_frames, bool)
                                     or inner_frames < 1):
        raise ValueError(f"inner_frames must be None (automatic) or an integer ≥ 1 frame; received {inner_frames!r}")
    return inner_frames


def inner_frames_option(inner_frames: int | None) -> dict[str, int]:
    """``inner_frames`` as a program-key option: absent for the default (None), so the keys of
    default programs (listed by the service) read as they did before the option existed."""
    return {} if inner_frames is None else {"inner_frames": inner_frames}


def stream_group(inner_frames: int | None, full_frame_bytes: int) -> int | None:
    """Frames per inner step: ``inner_frames`` if given, else 1 for frames of at least
    ``STREAM_MIN_FRAME_BYTES`` at full resolution, else None (no inner loop)."""
    if inner_frames is not None:
        return inner_frames
    return 1 if full_frame_bytes >= STREAM_MIN_FRAME_BYTES else None


Carry = Any  # a pytree of causal caches


def scan_frame_groups(stage: Callable[[jax.Array, Carry], tuple[jax.Array, Carry]], x: jax.Array, carry: Carry,
                      group: int) -> tuple[jax.Array, Carry]:
    """Run a causal stage over ``x (B, T, ...)`` ``group`` frames at a time, carrying its caches.

    ``stage(x_group, carry) → (y_group, carry)`` must map ``g`` input frames to ``r·g`` output
    frames (``r`` fixed) and depend on earlier frames only through ``carry``; the result then equals
    ``stage(x, carry)``. Whole groups run in a ``lax.scan`` (one group's activations alive at a time),
    a shorter last group after it. ``group ≥ T`` is the stage itself, with no loop.
    """
    frames = x.shape[1]
    if group >= frames:
        return stage(x, carry)
    count, remainder = divmod(frames, group)

    def body(carry, index):
        y, carry = stage(lax.dynamic_slice_in_dim(x, index * group, group, axis=1), carry)
        return carry, y

    carry, ys = lax.scan(body, carry, jnp.arange(count))  # ys (count, B, r·g, ...)
    y = jnp.moveaxis(ys, 0, 1)
    y = y.reshape(y.shape[0], count * y.shape[2], *y.shape[3:])
    if remainder:
        tail, carry = stage(x[:, count * group :], carry)
        y = jnp.concatenate([y, tail], axis=1)
    return y, carry
