"""Negative controls: the sharded decode and encode built around a *broken* band context.

They prove that the halo exchange matters (tests) and show what seams look like without it
(``bench/seams.py``). They are not part of the public API and never enter the program cache: each
call compiles its own program from the same builders the real programs use, with one of these
contexts in place of ``BandContext``.

* ``NoHaloContext``: every band is zero-padded alone, as if it were a whole frame (seams at every
  band edge).
* ``CyclicHaloContext``: the halo permutation wraps around (``(i + 1) % tp``), so the first band's
  top edge receives the last band's bottom row (wrong at the image's top and bottom edges only).

And one of the program's edge: ``decode_cropped_on_devices``, the crop of an uneven split's padding
inside the program (moving the cropped image's rows between devices).

HunyuanVideo's three things that cross bands each have their own (the first also AutoencoderKL's):

* ``BandStatisticsContext``: GroupNorm with each band's own statistics (no sum over the bands).
* ``ZeroEdgeContext``: zeros at the image's edges where the model repeats (HunyuanVideo) or
  reflects (LTX-2.0) its edge rows.
* ``NoFrameMaskContext``: the mid-block attention without the frame-causal mask (every token sees
  every frame's).

And one for memory, not exactness: ``compile_whole_frame_decode`` gathers the latents of the whole
frame onto every band, decodes the whole frame there and keeps its own rows: the right frames, with
each device holding what one device would (the per-tp memory rule must reject it).
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

from vaeserve.models.decode import full_program, resolve_chunk
from vaeserve.models.encode import posterior_options, resolve_encode_chunk
from vaeserve.models.estimate import QUERY_CHUNK
from vaeserve.models.shapes import Output, check_output
from vaeserve.models.spatial import (
    Edge,
    SingleDeviceContext,
    check_edge,
    dot_product_attention,
    group_moments,
    pad_edges,
    zero_pad_hw,
    zero_pad_hw_after,
)
from vaeserve.models.vae import DTYPES, VAE

from .bands import Split
from .decode import (
    COUNTS_SPEC,
    ContextType,
    _conditions,
    _full,
    _latents_aval,
    _shard,
    _state_aval,
    band_counts,
    crop_decoded,
    decode_layout,
    frames_spec,
    jit_for,
    latents_spec,
    mesh_platform,
    put_conditions,
    put_latents,
    replicated_state,
)
from .encode import _encoder, encode_avals, encode_layout, put_frames, put_options, replicated_encoder_state
from .halo import BandContext
from .mesh import TP_AXIS


class NoHaloContext(BandContext):
    """Each band padded on its own (zeros, or its own edge rows): no rows cross devices."""

    def pad_hw(self, x: jax.Array, *, edge: Edge = "zero") -> jax.Array:
        return zero_pad_hw(self.mask_padding(x)) if check_edge(edge) == "zero" else pad_edges(x, edge)

    def pad_hw_after(self, x: jax.Array) -> jax.Array:
        return zero_pad_hw_after(self.mask_padding(x))


class CyclicHaloContext(BandContext):
    """The halo permutation wraps around: the image's edges receive each other's rows."""

    def permutations(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        tp = self.layout.tp
        down = [(i, (i + 1) % tp) for i in range(tp)]
        return down, [(dst, src) for src, dst in down]


class BandStatisticsContext(BandContext):
    """GroupNorm normalizes each band by its own statistics, as a split that forgot the sum would."""

    def group_moments(self, x: jax.Array, groups: int) -> tuple[jax.Array, jax.Array]:
        return group_moments(x, groups, count=x[0].size // groups)


class ZeroEdgeContext(BandContext):
    """Zeros at the image's edges even where the model asks for its edge rows repeated or reflected."""

    def pad_hw(self, x: jax.Array, *, edge: Edge = "zero") -> jax.Array:
        return super().pad_hw(x)


class NoFrameMaskContext(BandContext):
    """The clip's attention without the frame-causal mask: every token sees every frame."""

    def attend_frames(self, q: jax.Array, k: jax.Array, v: jax.Array, *, first_query_frame) -> jax.Array:
        del first_query_frame
        k, v = self._gather_frames(k), self._gather_frames(v)
        b, tq, h, w, c = q.shape
        out = dot_product_attention(q.reshape(b, -1, c), k.reshape(b, -1, c), v.reshape(b, -1, c),
                                    key_valid=self.frame_key_valid(k.shape), query_chunk=self.query_chunk)
        return out.reshape(q.shape)


CONTROLS: dict[str, ContextType] = {"none": NoHaloContext, "cyclic": CyclicHaloContext,
                                    "band-statistics": BandStatisticsContext, "zero-edge": ZeroEdgeContext,
                                    "no-frame-mask": NoFrameMaskContext}


def decode_with(control: str, vae: VAE, latents, mesh: Mesh, *, output: Output = "float",
                split: Split | None = None, query_chunk: int = QUERY_CHUNK, **conditions) -> jax.Array:
    """``sharded_decode(vae, latents, mesh, output=, split=, **conditions)`` with the control
    ``control`` (a key of ``CONTROLS``) in place of the band context (compiled for this call, not
    cached); ``conditions``: an LTX decoder's ``timestep``, ``noise_scale``, ``seed``."""
    shape, output = tuple(np.shape(latents)), check_output(output)
    layout = decode_layout(vae, shape, mesh, split)
    run = _full(vae, mesh, layout, denormalize=False, output=output, chunk=resolve_chunk(None), inner_frames=None,
                query_chunk=query_chunk, context_type=CONTROLS[control], rank=len(shape))
    avals = _conditions(vae, mesh, shape[0])[1]
    compiled = jit_for(vae, mesh, run).lower(_state_aval(vae, mesh), _latents_aval(shape, mesh), *avals).compile()
    placed = put_conditions(vae.conditions(shape[0], **conditions), mesh)
    frames, _ = compiled(replicated_state(vae, mesh), put_latents(latents, mesh), *placed)
    return crop_decoded(frames, shape, vae.config.spatial_scale, output)


def encode_with(control: str, vae: VAE, frames, mesh: Mesh, *, split: Split | None = None,
                query_chunk: int = QUERY_CHUNK) -> jax.Array:
    """``sharded_encode(vae, frames, mesh, split=)`` (posterior mean) with the control ``control`` (a
    key of ``CONTROLS``) in place of the band context (compiled for this call, not cached)."""
    shape = tuple(np.shape(frames))
    layout = encode_layout(vae, shape, mesh, split)
    run = _encoder(vae, mesh, layout, chunk=resolve_encode_chunk(None), query_chunk=query_chunk,
                   context_type=CONTROLS[control], rank=len(shape))
    compiled = jit_for(vae, mesh, run).lower(*encode_avals(vae, shape, mesh, layout)).compile()
    return compiled(replicated_encoder_state(vae, mesh), put_frames(frames, layout, mesh, vae.config.spatial_scale),
                    put_options(posterior_options(shape[0]), mesh))


def decode_cropped_on_devices(vae: VAE, shape: tuple[int, ...], mesh: Mesh, *, output: Output = "float",
                              split: Split | None = None) -> jax.stages.Compiled:
    """The decode of latents ``shape`` with the padding of an uneven split cropped inside the
    program (``crop_decoded`` on the sharded frames), compiled, not cached: the cropped image's
    shards do not line up with the bands, so XLA moves its rows between the devices."""
    output = check_output(output)
    layout = decode_layout(vae, tuple(shape), mesh, split)
    run = _full(vae, mesh, layout, denormalize=False, output=output, chunk=resolve_chunk(None), inner_frames=None,
                query_chunk=QUERY_CHUNK, rank=len(shape))

    def cropped(state, latents):
        frames, counts = run(state, latents)
        return crop_decoded(frames, tuple(shape), vae.config.spatial_scale, output), counts
    return jit_for(vae, mesh, cropped).lower(_state_aval(vae, mesh), _latents_aval(tuple(shape), mesh)).compile()


def compile_whole_frame_decode(vae: VAE, shape: tuple[int, ...], mesh: Mesh, *, output: Output = "uint8",
                               inner_frames: int | None = None) -> jax.stages.Compiled:
    """The decode of NCTHW latents ``shape`` (height split evenly over tp, no padding, a model without
    decode conditions) with every band decoding the whole frame: its latents all-gathered over
    ``tp``, decoded as on one device, its own rows kept. Compiled for this call, not cached; its
    memory per device is one device's."""
    output = check_output(output)
    layout = decode_layout(vae, tuple(shape), mesh, "height")
    if layout.pad:
        raise ValueError(f"the whole-frame control splits evenly; {shape[3]} rows do not split over tp={layout.tp}")
    if vae.config.decode_conditions:
        raise ValueError(f"the whole-frame control takes no decode conditions ({vae.config.family})")
    path = vae.conv_path(mesh_platform(mesh))
    whole = full_program(vae.graphdef, vae.config, DTYPES[vae.dtype], lambda: SingleDeviceContext(**path),
                         denormalize=False, output=output,
                         chunk=resolve_chunk(None), inner_frames=inner_frames)
    row_axis = frames_spec(layout, output).index(TP_AXIS)

    def band(state, latents):
        frames, counts = whole(state, jax.lax.all_gather(latents, TP_AXIS, axis=3, tiled=True))
        rows = frames.shape[row_axis] // layout.tp
        mine = jax.lax.dynamic_slice_in_dim(frames, jax.lax.axis_index(TP_AXIS) * rows, rows, axis=row_axis)
        return mine, counts

    run = _shard(mesh, band_counts(band), (P(), latents_spec(layout)), (frames_spec(layout, output), COUNTS_SPEC))
    return jit_for(vae, mesh, run).lower(_state_aval(vae, mesh), _latents_aval(tuple(shape), mesh)).compile()
