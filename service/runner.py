"""The one interface to the devices: ``DeviceRunner``.

Everything that touches JAX after start-up goes through this class, from one thread (the
worker's). Its methods take host arrays and return host arrays and are deterministic, which keeps
a later multi-host mode small: process 0 would broadcast each call's inputs
(``multihost_utils.broadcast_one_to_all``) and every process would make the same call.

Batches are padded up to a *bucket* size (powers of two up to ``max_batch``, each a multiple of
``dp``) so that the number of compiled programs per latent shape stays at log2(max_batch) + 1.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from models.programs import ProgramKey
from models.shapes import Output


def batch_buckets(max_batch: int, dp: int) -> list[int]:
    """Padded batch sizes: powers of two below ``max_batch`` and ``max_batch`` itself, each
    rounded up to a multiple of ``dp`` (every dp replica gets the same share)."""
    sizes, size = set(), 1
    while size < max_batch:
        sizes.add(size)
        size *= 2
    sizes.add(max_batch)
    return sorted({-(-s // dp) * dp for s in sizes})


def bucket_for(n: int, buckets: list[int]) -> int:
    for size in buckets:
        if size >= n:
            return size
    raise ValueError(f"batch of {n} exceeds the largest bucket {buckets[-1]}")


def pad_batch(latents: np.ndarray, size: int) -> np.ndarray:
    """Pad axis 0 with zeros to ``size``; zeros decode to finite frames that are trimmed after."""
    missing = size - latents.shape[0]
    if missing == 0:
        return latents
    return np.concatenate([latents, np.zeros((missing, *latents.shape[1:]), latents.dtype)], axis=0)


class DeviceRunner:
    """Holds the model and the mesh; decodes and encodes host batches to host arrays.

    ``decode(latents (B, C, T, H, W) float32)`` returns ``(B, F, 8H, 8W, 3)`` uint8 for
    ``output="uint8"`` or ``(B, 3, F, 8H, 8W)`` float32 in [-1, 1] for ``output="float"``.
    Latents are expected *already denormalized* (the service does it on the host, so the
    device program does not depend on that flag). ``encode(frames (B, 3, F, H, W) float32,
    options)`` returns float32 latents ``(B, z, T, H/s, W/s)`` (``s = config.spatial_scale``).
    """

    def __init__(self, vae: Any, mesh: Any, *, max_batch: int, dp: int):
        self.vae = vae
        self.mesh = mesh
        self.buckets = batch_buckets(max_batch, dp)
        self._thread: int | None = None

    def _check_thread(self) -> None:
        # One thread owns the devices; a second caller would interleave collectives.
        ident = threading.get_ident()
        if self._thread is None:
            self._thread = ident
        elif self._thread != ident:
            raise RuntimeError("DeviceRunner used from two threads")

    def decode(self, latents: np.ndarray, *, output: Output = "uint8") -> np.ndarray:
        import sharding

        self._check_thread()
        n = latents.shape[0]
        padded = pad_batch(latents, bucket_for(n, self.buckets))
        result = sharding.sharded_decode(self.vae, padded, self.mesh, output=output)
        return sharding.to_host(result)[:n]  # all-gathered when the mesh spans processes

    def decode_stream(self, latents: np.ndarray) -> Iterator[np.ndarray]:
        """Yields ``(B, f, 8H, 8W, 3)`` uint8 chunks as each decode step finishes."""
        import sharding

        self._check_thread()
        n = latents.shape[0]
        padded = pad_batch(latents, bucket_for(n, self.buckets))
        for chunk in sharding.sharded_decode_stream(self.vae, padded, self.mesh):
            yield np.asarray(chunk)[:n]

    def encode(self, frames: np.ndarray, options: Any) -> np.ndarray:
        """Encode a batch: ``options`` is the ``PosteriorOptions`` of its rows, each request's rows
        with that request's seed and flags (so requests with different options share the call)."""
        import sharding
        from models.encode import PosteriorOptions

        self._check_thread()
        n = frames.shape[0]
        size = bucket_for(n, self.buckets)
        result = sharding.sharded_encode(self.vae, pad_batch(frames, size), self.mesh,
                                         options=PosteriorOptions.concatenate([options], size))
        return sharding.to_host(result)[:n]  # all-gathered when the mesh spans processes

    def compile_encode(self, shape: tuple[int, ...]) -> list[tuple[tuple[int, ...], Any]]:
        """Compile, without running, the encode of frames ``shape`` ``(3, F, H, W)`` at every batch
        bucket (one program serves every sampling/normalization option); returned as ``compile``
        returns them, each with the batched frames ``(B, 3, F, H, W)`` it serves."""
        import sharding

        self._check_thread()
        return [((size, *shape), sharding.compile_encode(self.vae, (size, *shape), self.mesh))
                for size in self.buckets]

    def compile(self, shape: tuple[int, ...], *, output: Output, stream: bool) -> list[tuple[tuple[int, ...], Any]]:
        """Compile, without running, every program a request of latent ``shape`` ``(C, T, H, W)``
        can need, at every batch bucket: the decode of ``output``, or every step of a stream.
        The programs land in the model's cache (``vae.programs``), where requests find them;
        they are returned too, each with the batched latents ``(B, C, T, H, W)`` it serves, so
        that their ``memory_analysis()`` can be read before anything runs."""
        import sharding

        self._check_thread()
        programs: list[tuple[tuple[int, ...], Any]] = []
        for size in self.buckets:
            batched = (size, *shape)
            if stream:
                programs += [(batched, p) for p in sharding.compile_decode_stream(self.vae, batched, self.mesh)]
            else:
                programs.append((batched, sharding.compile_decode(self.vae, batched, self.mesh, output=output)))
        return programs

    def program_memory(self) -> list[dict[str, Any]]:
        """Per-device bytes of every compiled program of this runner's mesh (``memory_analysis()``):
        ``{"program", "shape", "variant", "argument_bytes", "output_bytes", "temp_bytes",
        "code_bytes", "total_bytes"}``, least recently used first (as ``programs()``)."""
        from sharding.introspect import program_memory
        from sharding.planner import program_total_bytes

        rows = []
        for key in self._keys():
            compiled = self.vae.programs.peek(key)
            if compiled is None:  # evicted since listed
                continue
            program, shape, variant = key.describe()
            memory = program_memory(compiled)
            rows.append({"program": program, "shape": shape, "variant": variant,
                         **{k: v for k, v in memory.items() if k != "alias_bytes"},
                         "total_bytes": program_total_bytes(memory)})
        return rows

    def programs(self) -> list[list]:
        """The compiled programs of this runner's mesh in the model's cache, least recently used
        first: ``["decode", [B, C, T, H, W], output]``, ``["stream-step", [B, C, t, H, W],
        "first" | "next"]`` or ``["encode", [B, 3, F, H, W], "latents"]``. (A read of the cache; it
        is safe from any thread.)"""
        return [key.describe() for key in self._keys()]

    def _keys(self) -> list[ProgramKey]:
        """Cache keys of this mesh's decode, stream-step and encode programs, least recently used first."""
        from sharding.mesh import mesh_key

        mesh = mesh_key(self.mesh)
        return [key for key in self.vae.programs.keys() if isinstance(key, ProgramKey) and key.mesh == mesh]
