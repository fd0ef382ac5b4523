"""The one interface to the devices: ``DeviceRunner.decode(batch)``.

Everything that touches JAX after start-up goes through this class, from one thread (the
worker's). That keeps a later multi-host mode small: process 0 would broadcast each batch
(``multihost_utils.broadcast_one_to_all``) and every process would call the same method.

Batches are padded up to a *bucket* size (powers of two up to ``max_batch``, each a multiple of
``dp``) so that the number of compiled programs per latent shape stays at log2(max_batch) + 1.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Literal

import numpy as np

log = logging.getLogger("vaeserve")

Output = Literal["uint8", "float"]


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
    """Holds the model and the mesh; decodes host batches to host arrays.

    ``decode(latents (B, C, T, H, W) float32)`` returns ``(B, F, 8H, 8W, 3)`` uint8 for
    ``output="uint8"`` or ``(B, 3, F, 8H, 8W)`` float32 in [-1, 1] for ``output="float"``.
    Latents are expected *already denormalized* (the worker does it on the host, so the
    device program does not depend on that flag).
    """

    def __init__(self, vae, mesh, *, max_batch: int, dp: int, on_compile=None):
        self.vae = vae
        self.mesh = mesh
        self.buckets = batch_buckets(max_batch, dp)
        self._seen: set[tuple] = set()
        self._on_compile = on_compile or (lambda key: None)
        self._thread: int | None = None

    def _check_thread(self) -> None:
        # One thread owns the devices; a second caller would interleave collectives.
        ident = threading.get_ident()
        if self._thread is None:
            self._thread = ident
        elif self._thread != ident:
            raise RuntimeError("DeviceRunner used from two threads")

    def _note_shape(self, key: tuple) -> None:
        if key not in self._seen:
            self._seen.add(key)
            self._on_compile(key)

    def decode(self, latents: np.ndarray, *, output: Output = "uint8", fault: bool = False) -> np.ndarray:
        import sharding

        self._check_thread()
        n = latents.shape[0]
        padded = pad_batch(latents, bucket_for(n, self.buckets))
        self._note_shape(("decode", padded.shape, output))
        if fault:
            raise RuntimeError("injected device fault (fault_injection is on)")
        result = sharding.sharded_decode(self.vae, padded, self.mesh, output=output)
        return sharding.to_host(result)[:n]  # all-gathered when the mesh spans processes

    def decode_stream(self, latents: np.ndarray, *, fault: bool = False) -> Iterator[np.ndarray]:
        """Yields ``(B, f, 8H, 8W, 3)`` uint8 chunks as each decode chunk finishes."""
        import sharding

        self._check_thread()
        n = latents.shape[0]
        padded = pad_batch(latents, bucket_for(n, self.buckets))
        self._note_shape(("stream", padded.shape))
        if fault:
            raise RuntimeError("injected device fault (fault_injection is on)")
        for chunk in sharding.sharded_decode_stream(self.vae, padded, self.mesh):
            yield np.asarray(chunk)[:n]

    @property
    def compiled_shapes(self) -> list[list]:
        return sorted([[kind, list(shape), *rest] for kind, shape, *rest in self._seen], key=str)
