"""Negative controls: the sharded decode and encode built around a *broken* band context.

They prove that the halo exchange matters (tests) and show what seams look like without it
(``bench/seams.py``). They are not part of the public API and never enter the program cache: each
call compiles its own program from the same builders the real programs use, with one of these
contexts in place of ``BandContext``.

* ``NoHaloContext``: every band is zero-padded alone, as if it were a whole frame (seams at every
  band edge).
* ``CyclicHaloContext``: the halo permutation wraps around (``(i + 1) % tp``), so the first band's
  top edge receives the last band's bottom row (wrong at the image's top and bottom edges only).
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh

from models.decode import resolve_chunk
from models.encode import posterior_options, resolve_encode_chunk
from models.shapes import Output, check_output
from models.spatial import zero_pad_hw, zero_pad_hw_after
from models.vae import WanVAE

from .bands import Split
from .decode import ContextType, _full, _latents_aval, _state_aval, decode_layout, put_latents, replicated_state
from .encode import _encoder, encode_avals, encode_layout, put_frames, put_options, replicated_encoder_state
from .halo import BandContext


class NoHaloContext(BandContext):
    """Each band zero-padded on its own: no rows cross devices."""

    def pad_hw(self, x: jax.Array) -> jax.Array:
        return zero_pad_hw(self.mask_padding(x))

    def pad_hw_after(self, x: jax.Array) -> jax.Array:
        return zero_pad_hw_after(self.mask_padding(x))


class CyclicHaloContext(BandContext):
    """The halo permutation wraps around: the image's edges receive each other's rows."""

    def permutations(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        tp = self.layout.tp
        down = [(i, (i + 1) % tp) for i in range(tp)]
        return down, [(dst, src) for src, dst in down]


CONTROLS: dict[str, ContextType] = {"none": NoHaloContext, "cyclic": CyclicHaloContext}


def decode_with(control: str, vae: WanVAE, latents, mesh: Mesh, *, output: Output = "float",
                split: Split | None = None, query_chunk: int = 4096) -> jax.Array:
    """``sharded_decode(vae, latents, mesh, output=, split=)`` with the control ``"none"`` or
    ``"cyclic"`` in place of the halo exchange (compiled for this call, not cached)."""
    shape, output = tuple(np.shape(latents)), check_output(output)
    layout = decode_layout(vae, shape, mesh, split)
    run = _full(vae, mesh, layout, denormalize=False, output=output, chunk=resolve_chunk(None), inner_frames=None,
                query_chunk=query_chunk, context_type=CONTROLS[control])
    compiled = jax.jit(run).lower(_state_aval(vae, mesh), _latents_aval(shape, mesh)).compile()
    frames, _ = compiled(replicated_state(vae, mesh), put_latents(latents, mesh))
    return frames


def encode_with(control: str, vae: WanVAE, frames, mesh: Mesh, *, split: Split | None = None,
                query_chunk: int = 4096) -> jax.Array:
    """``sharded_encode(vae, frames, mesh, split=)`` (posterior mean) with the control ``"none"``
    or ``"cyclic"`` in place of the halo exchange (compiled for this call, not cached)."""
    shape = tuple(np.shape(frames))
    layout = encode_layout(vae, shape, mesh, split)
    run = _encoder(vae, mesh, layout, chunk=resolve_encode_chunk(None), query_chunk=query_chunk,
                   context_type=CONTROLS[control])
    compiled = jax.jit(run).lower(*encode_avals(vae, shape, mesh, layout)).compile()
    return compiled(replicated_encoder_state(vae, mesh), put_frames(frames, layout, mesh, vae.config.spatial_scale),
                    put_options(posterior_options(shape[0]), mesh))
