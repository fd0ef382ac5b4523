"""The spatial seam: how the decoder and encoder pad frames, mix tokens across a frame and take
statistics over a frame.

The model never pads H/W, mixes tokens across the frame or reduces over it itself; it asks a
*spatial context*. On one device the context pads, attends over the whole frame and reduces
locally. Inside ``shard_map`` the sharded context (``sharding.halo``) exchanges one-row halos with
its neighbours, all-gathers K/V for attention and sums statistics over the bands, so the very same
model code decodes a band of the frame exactly.

Three edge modes: ``"zero"`` (Wan, LTX-Video: zero padding), ``"replicate"`` (HunyuanVideo: the
edge row or column repeated, PyTorch's ``F.pad(mode="replicate")``) and ``"reflect"`` (LTX-2.0's
decoder: the row or column next to the edge, ``mode="reflect"``).

The context also draws noise (LTX decoders inject it): ``frame_noise`` gives a band the values the
whole frame's noise has at its pixels, so a seeded decode is the same however the frame is split.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Protocol

import jax
import jax.numpy as jnp
from jax import lax

from .estimate import QUERY_CHUNK

Edge = Literal["zero", "replicate", "reflect"]
EDGES: tuple[Edge, ...] = ("zero", "replicate", "reflect")

# Keys per block of the frame-causal attention's online softmax: a block of scores is
# ``query_chunk x KEY_CHUNK`` floats (256 MB at 4096 x 16384). Attention over fewer keys (one Wan
# frame at 720p: 14,400) is one plain softmax.
KEY_CHUNK = 16384


class SpatialContext(Protocol):
    """Where the frame lives, and which devices the program is compiled for.

    ``native_conv``: use XLA's native convolutions (accelerators) rather than the CPU's nine-tap
    matmuls; decided by the platform of the target devices (``models.conv.native_conv_for``).
    ``rounded_conv_sums``: native convolutions return their sums rounded to the operands' type
    (GPUs; ``models.conv.rounded_conv_sums_for``).
    ``onednn_conv``: on CPU, run the convolutions as oneDNN's (the program is compiled with
    ``models.conv.compiler_options_for("cpu", "onednn")``; ``models.conv.onednn_conv_for``).
    ``exchanges_halos``: the frame is split over devices that trade halo rows (tp > 1).
    """

    native_conv: bool
    rounded_conv_sums: bool
    onednn_conv: bool
    exchanges_halos: bool

    def pad_hw(self, x: jax.Array, *, edge: Edge = "zero") -> jax.Array:
        """``(..., H, W, C)`` → ``(..., H+2, W+2, C)``: one row/column of context on every side; at
        the image's edges zeros, the edge row/column (``edge="replicate"``) or the one next to it
        (``edge="reflect"``)."""

    def pad_hw_after(self, x: jax.Array) -> jax.Array:
        """``(..., H, W, C)`` → ``(..., H+1, W+1, C)``: one row below and one column to the right
        (the encoder's stride-2 convs pad only there)."""

    def attend(self, q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        """Single-head attention over all tokens of each frame. ``(N, H, W, C)`` each → ``(N, H, W, C)``."""

    def attend_frames(self, q: jax.Array, k: jax.Array, v: jax.Array, *, first_query_frame) -> jax.Array:
        """Single-head frame-causal attention over every token of a clip: query frame ``t`` (of the
        clip: ``first_query_frame + i`` for ``q``'s frame ``i``) attends to the tokens of key frames
        ``0..t``. ``q (B, Tq, H, W, C)``, ``k, v (B, Tk, H, W, C)`` → ``(B, Tq, H, W, C)``."""

    def group_moments(self, x: jax.Array, groups: int) -> tuple[jax.Array, jax.Array]:
        """GroupNorm statistics over the whole clip and frame: ``x (B, T, H, W, C)`` → mean and
        variance ``(B, groups)`` in float32 over (T, H, W, C/groups)."""

    def frame_noise(self, keys: jax.Array, shape: tuple[int, int, int]) -> jax.Array:
        """Standard normal noise of the whole frame, at this context's pixels: ``keys (B, 2)`` uint32
        (one per row), ``shape`` the local ``(h, w, C)`` → float32 ``(B, h, w, C)``. Row ``b`` of the
        whole ``(H, W, C)`` frame is ``frame_normal(keys[b], (H, W, C))``."""


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


def reflect_pad_hw(x: jax.Array) -> jax.Array:
    """Pad the two spatial axes (``-3`` and ``-2``) by one on each side with the row/column next to
    the edge (PyTorch's ``mode="reflect"``: needs two rows and two columns)."""
    widths = [(0, 0)] * (x.ndim - 3) + [(1, 1), (1, 1), (0, 0)]
    return jnp.pad(x, widths, mode="reflect")


def pad_edges(x: jax.Array, edge: Edge) -> jax.Array:
    """Pad both spatial axes by one, as the whole frame's edges ask (``edge``)."""
    if check_edge(edge) == "replicate":
        return replicate_pad_hw(x)
    return reflect_pad_hw(x) if edge == "reflect" else zero_pad_hw(x)


def frame_normal(keys: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """``(B, *shape)`` float32 standard normal values, row ``b`` drawn from ``keys[b]`` (``(B, 2)`` uint32)."""
    return jax.vmap(lambda key: jax.random.normal(key, shape, jnp.float32))(keys)


def replicate_pad_hw(x: jax.Array) -> jax.Array:
    """Pad the two spatial axes (``-3`` and ``-2``) by one on each side with their edge values."""
    widths = [(0, 0)] * (x.ndim - 3) + [(1, 1), (1, 1), (0, 0)]
    return jnp.pad(x, widths, mode="edge")


def check_edge(edge: str) -> Edge:
    if edge not in EDGES:
        raise ValueError(f"edge must be one of {EDGES}; received {edge!r}")
    return edge


def _allowed(key_valid: jax.Array | None, query_frames: jax.Array | None,
             key_frames: jax.Array | None) -> jax.Array | None:
    """``(Lq, Lk)`` (or ``(1, Lk)``) bool: which keys each query may see; None: all of them."""
    allowed = None if key_valid is None else key_valid[None, :]
    if query_frames is not None and key_frames is not None:
        causal = key_frames[None, :] <= query_frames[:, None]
        allowed = causal if allowed is None else allowed & causal
    return allowed


def dot_product_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    key_valid: jax.Array | None = None,
    query_frames: jax.Array | None = None,
    key_frames: jax.Array | None = None,
    query_chunk: int = QUERY_CHUNK,
    key_chunk: int = KEY_CHUNK,
) -> jax.Array:
    """Softmax attention, one head, scale ``C**-0.5``, scores in float32.

    Args:
      q: ``(N, Lq, C)``; k, v: ``(N, Lk, C)``.
      key_valid: optional ``(Lk,)`` bool: keys that exist (padding rows of a sharded frame do not).
      query_frames, key_frames: optional ``(Lq,)`` / ``(Lk,)`` int frame of each token: a query
        then sees only keys of its own and earlier frames (HunyuanVideo's frame-causal mask).
      query_chunk: queries per score block. Full scores are ``Lq·Lk`` floats per frame (830 MB for a
        720p latent frame), so longer query sets are processed block by block.
      key_chunk: keys per score block; more keys than this are taken block by block with an online
        softmax (running maximum and sum in float32), so a block of scores is ``query_chunk x
        key_chunk`` whatever ``Lk`` is (a whole 720p clip of HunyuanVideo latents has 475k tokens).
    Returns:
      ``(N, Lq, C)`` in the dtype of ``v``.
    """
    n, lq, c = q.shape
    lk = k.shape[1]
    precision = matmul_precision(q.dtype)
    scale = c**-0.5

    def scores(q_block: jax.Array, k_block: jax.Array, allowed: jax.Array | None) -> jax.Array:
        s = jnp.einsum("nqc,nkc->nqk", q_block, k_block, precision=precision,
                       preferred_element_type=jnp.float32) * scale
        return s if allowed is None else jnp.where(allowed[None], s, -jnp.inf)

    def block(q_block: jax.Array, q_frames: jax.Array | None) -> jax.Array:
        if lk <= key_chunk:
            weights = jax.nn.softmax(scores(q_block, k, _allowed(key_valid, q_frames, key_frames)), axis=-1)
            # float32 weights: a bfloat16 model still averages values without rounding the weights.
            out = jnp.einsum("nqk,nkc->nqc", weights, v.astype(jnp.float32), precision=precision)
        else:
            out = _online_softmax_attention(scores, q_block, q_frames, k, v, key_valid, key_frames, key_chunk,
                                            precision)
        return out.astype(v.dtype)

    if lq <= query_chunk:
        return block(q, query_frames)
    num_blocks = -(-lq // query_chunk)
    padded = jnp.pad(q, ((0, 0), (0, num_blocks * query_chunk - lq), (0, 0)))
    blocks = padded.reshape(n, num_blocks, query_chunk, c).transpose(1, 0, 2, 3)
    if query_frames is None:
        out = lax.map(lambda b: block(b, None), blocks)  # sequential: one score block alive at a time
    else:  # padded queries take frame 0: they see some key, and are cropped below
        frames = jnp.pad(query_frames, (0, num_blocks * query_chunk - lq)).reshape(num_blocks, query_chunk)
        out = lax.map(lambda args: block(*args), (blocks, frames))
    return out.transpose(1, 0, 2, 3).reshape(n, num_blocks * query_chunk, c)[:, :lq]


def _online_softmax_attention(scores: Callable, q_block: jax.Array, q_frames: jax.Array | None, k: jax.Array,
                              v: jax.Array, key_valid: jax.Array | None, key_frames: jax.Array | None,
                              key_chunk: int, precision) -> jax.Array:
    """Attention of ``q_block`` over keys taken ``key_chunk`` at a time (float32 ``(N, Lq, C)``):
    the running maximum ``m``, sum ``l`` and weighted values are rescaled by ``exp(m_old − m_new)``
    as each block comes (flash attention's recurrence). Keys padded up to whole blocks are invalid."""
    n, lq, c = q_block.shape
    lk = k.shape[1]
    count = -(-lk // key_chunk)
    pad = count * key_chunk - lk
    valid = jnp.ones((lk,), bool) if key_valid is None else key_valid
    frames = jnp.zeros((lk,), jnp.int32) if key_frames is None else key_frames
    blocks = (jnp.pad(k, ((0, 0), (0, pad), (0, 0))).reshape(n, count, key_chunk, c).swapaxes(0, 1),
              jnp.pad(v, ((0, 0), (0, pad), (0, 0))).reshape(n, count, key_chunk, c).swapaxes(0, 1),
              jnp.pad(valid, (0, pad)).reshape(count, key_chunk),
              jnp.pad(frames, (0, pad)).reshape(count, key_chunk))

    def step(carry, block):
        m, l, acc = carry
        k_block, v_block, valid_block, frames_block = block
        s = scores(q_block, k_block, _allowed(valid_block, q_frames, None if key_frames is None else frames_block))
        m_new = jnp.maximum(m, s.max(axis=-1))
        m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)  # a query that has seen no key yet
        p = jnp.exp(s - m_safe[..., None])
        correction = jnp.exp(m - m_safe)
        acc = acc * correction[..., None] + jnp.einsum("nqk,nkc->nqc", p, v_block.astype(jnp.float32),
                                                       precision=precision)
        return (m_new, l * correction + p.sum(axis=-1), acc), None

    init = (jnp.full((n, lq), -jnp.inf, jnp.float32), jnp.zeros((n, lq), jnp.float32),
            jnp.zeros((n, lq, c), jnp.float32))
    (_, l, acc), _ = lax.scan(step, init, blocks)
    return acc / l[..., None]


def frame_tokens(frames: int, tokens_per_frame: int, first_frame=0) -> jax.Array:
    """``(frames · tokens_per_frame,)`` int32: the frame of each token of frames laid out in order."""
    return first_frame + jnp.repeat(jnp.arange(frames, dtype=jnp.int32), tokens_per_frame)


def attend_frames_local(q: jax.Array, k: jax.Array, v: jax.Array, *, first_query_frame, query_chunk: int,
                        key_valid: jax.Array | None = None) -> jax.Array:
    """``SpatialContext.attend_frames`` over the tokens at hand: ``q (B, Tq, h, w, C)``, ``k, v
    (B, Tk, H, W, C)`` (the whole frame), ``key_valid`` optional ``(Tk·H·W,)``."""
    b, tq, h, w, c = q.shape
    tk, hw = k.shape[1], k.shape[2] * k.shape[3]
    out = dot_product_attention(q.reshape(b, tq * h * w, c), k.reshape(b, tk * hw, c), v.reshape(b, tk * hw, c),
                                key_valid=key_valid, query_frames=frame_tokens(tq, h * w, first_query_frame),
                                key_frames=frame_tokens(tk, hw), query_chunk=query_chunk)
    return out.reshape(b, tq, h, w, c)


def group_moments(x: jax.Array, groups: int, *, count: int, valid: jax.Array | None = None,
                  total: Callable[[jax.Array], jax.Array] | None = None) -> tuple[jax.Array, jax.Array]:
    """GroupNorm's mean and (biased) variance ``(B, groups)`` of ``x (B, T, H, W, C)`` over (T, H, W,
    C/groups), in float32: the mean first, then the mean of the centred squares — not
    E[x²] − E[x]², which loses the variance to cancellation when the mean is large.

    ``valid``: optional bool broadcastable to ``(1, 1, H, W, 1)``, the pixels that exist (a band's
    padded rows do not); ``count``: how many values one group has over the whole frame (all bands);
    ``total``: sums per-band partial sums over the bands (None on one device: nothing to add).
    """
    b, t, h, w, c = x.shape
    x32 = x.astype(jnp.float32).reshape(b, t, h, w, groups, c // groups)
    mask = None if valid is None else valid.reshape(*valid.shape[:4], 1, 1)

    def group_sum(values: jax.Array) -> jax.Array:
        values = values if mask is None else jnp.where(mask, values, 0.0)
        sums = values.sum(axis=(1, 2, 3, 5))
        return sums if total is None else total(sums)

    mean = group_sum(x32) / count
    centred = x32 - mean[:, None, None, None, :, None]
    return mean, group_sum(centred * centred) / count


class SingleDeviceContext:
    """The whole frame lives here: padding, attention over every token, local statistics.

    Args:
      native_conv: native XLA convolutions (True on accelerators; see ``SpatialContext``).
      rounded_conv_sums: native convolutions round their sums to the operands' type (GPUs).
      onednn_conv: oneDNN's convolutions on CPU (see ``SpatialContext``).
      query_chunk: attention queries per score block (``dot_product_attention``).
    """

    exchanges_halos = False

    def __init__(self, *, native_conv: bool = False, rounded_conv_sums: bool = False, onednn_conv: bool = False,
                 query_chunk: int = QUERY_CHUNK):
        self.native_conv, self.rounded_conv_sums, self.onednn_conv = native_conv, rounded_conv_sums, onednn_conv
        self.query_chunk = query_chunk

    def pad_hw(self, x: jax.Array, *, edge: Edge = "zero") -> jax.Array:
        return pad_edges(x, edge)

    def pad_hw_after(self, x: jax.Array) -> jax.Array:
        return zero_pad_hw_after(x)

    def attend(self, q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        n, h, w, c = q.shape
        out = dot_product_attention(q.reshape(n, h * w, c), k.reshape(n, h * w, c), v.reshape(n, h * w, c),
                                    query_chunk=self.query_chunk)
        return out.reshape(n, h, w, c)

    def attend_frames(self, q: jax.Array, k: jax.Array, v: jax.Array, *, first_query_frame) -> jax.Array:
        return attend_frames_local(q, k, v, first_query_frame=first_query_frame, query_chunk=self.query_chunk)

    def group_moments(self, x: jax.Array, groups: int) -> tuple[jax.Array, jax.Array]:
        return group_moments(x, groups, count=x[0].size // groups)

    def frame_noise(self, keys: jax.Array, shape: tuple[int, int, int]) -> jax.Array:
        return frame_normal(keys, shape)
