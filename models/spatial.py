"""The spatial seam: how the decoder and encoder pad frames and mix tokens across a frame.

The model never pads H/W or mixes tokens across the frame itself; it asks a *spatial context*.
On one device the context zero-pads and attends over the whole frame. Inside ``shard_map`` the
sharded context (``sharding.halo``) exchanges one-row halos with its neighbours and all-gathers
K/V for attention, so the very same model code decodes a band of the frame exactly.
"""

from __future__ import annotations

from typing import Protocol

import jax
import jax.numpy as jnp
from jax import lax


class SpatialContext(Protocol):
    """Where the frame lives, and which devices the program is compiled for.

    ``native_conv``: use XLA's native convolutions (accelerators) rather than the CPU's nine-tap
    matmuls; decided by the platform of the target devices (``models.conv.native_conv_for``).
    """

    native_conv: bool

    def pad_hw(self, x: jax.Array) -> jax.Array:
        """``(..., H, W, C)`` → ``(..., H+2, W+2, C)``: one row/column of context on every side."""

    def pad_hw_after(self, x: jax.Array) -> jax.Array:
        """``(..., H, W, C)`` → ``(..., H+1, W+1, C)``: one row below and one column to the right
        (the encoder's stride-2 convs pad only there)."""

    def attend(self, q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        """Single-head attention over all tokens of each frame. ``(N, H, W, C)`` each → ``(N, H, W, C)``."""


def matmul_precision(dtype) -> lax.Precision | None:
    """float32 means float32: forbid TF32/bf16 passes on accelerators so parity holds there too."""
    return lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else None


def zero_pad_hw(x: jax.Array) -> jax.Array:
    """Zero-pad the two spatial axes (``-3`` and ``-2``) by one on each side."""
    widths = [(0, 0)] * (x.ndim - 3) + [(1, 1), (1, 1), (0, 0)]
    return jnp.pad(x, widths)


def zero_pad_hw_after(x: jax.Array) -> jax.Array:
    """Zero-pad the two spatial axes (``-3`` and ``-2``) by one at their far end only."""
    widths = [(0, 0)] * (x.ndim - 3) + [(0, 1), (0, 1), (0, 0)]
    return jnp.pad(x, widths)


def dot_product_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    key_valid: jax.Array | None = None,
    query_chunk: int = 4096,
) -> jax.Array:
    """Softmax attention, one head, scale ``C**-0.5``, scores in float32.

    Args:
      q: ``(N, Lq, C)``; k, v: ``(N, Lk, C)``.
      key_valid: optional ``(Lk,)`` bool: keys that exist (padding rows of a sharded frame do not).
      query_chunk: queries per score block. Full scores are ``Lq·Lk`` floats per frame (830 MB for a
        720p latent frame), so longer query sets are processed block by block.
    Returns:
      ``(N, Lq, C)`` in the dtype of ``v``.
    """
    n, lq, c = q.shape
    precision = matmul_precision(q.dtype)
    scale = c**-0.5

    def block(q_block: jax.Array) -> jax.Array:
        scores = jnp.einsum("nqc,nkc->nqk", q_block, k, precision=precision,
                            preferred_element_type=jnp.float32) * scale
        if key_valid is not None:
            scores = jnp.where(key_valid[None, None, :], scores, -jnp.inf)
        weights = jax.nn.softmax(scores, axis=-1)
        # float32 weights: a bfloat16 model still averages values without rounding the weights.
        out = jnp.einsum("nqk,nkc->nqc", weights, v.astype(jnp.float32), precision=precision)
        return out.astype(v.dtype)

    if lq <= query_chunk:
        return block(q)
    num_blocks = -(-lq // query_chunk)
    padded = jnp.pad(q, ((0, 0), (0, num_blocks * query_chunk - lq), (0, 0)))
    blocks = padded.reshape(n, num_blocks, query_chunk, c).transpose(1, 0, 2, 3)
    out = lax.map(block, blocks)  # sequential: only one score block is alive at a time
    return out.transpose(1, 0, 2, 3).reshape(n, num_blocks * query_chunk, c)[:, :lq]


class SingleDeviceContext:
    """The whole frame lives here: zero padding, attention over every token.

    Args:
      native_conv: native XLA convolutions (True on accelerators; see ``SpatialContext``).
    """

    def __init__(self, *, native_conv: bool = False):
        self.native_conv = native_conv

    def pad_hw(self, x: jax.Array) -> jax.Array:
        return zero_pad_hw(x)

    def pad_hw_after(self, x: jax.Array) -> jax.Array:
        return zero_pad_hw_after(x)

    def attend(self, q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        n, h, w, c = q.shape
        out = dot_product_attention(q.reshape(n, h * w, c), k.reshape(n, h * w, c), v.reshape(n, h * w, c))
        return out.reshape(n, h, w, c)
