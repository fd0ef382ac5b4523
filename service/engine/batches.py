"""Batch sizes: a device batch is padded up to a *bucket* (powers of two up to ``max_batch``, each a
multiple of ``dp``), so that the number of compiled programs per input shape stays at
log2(max_batch) + 1. Pure NumPy.
"""

from __future__ import annotations

import numpy as np


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
