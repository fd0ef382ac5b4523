"""Comparisons of decoded frames shared by the model, sharding and service tests."""

from __future__ import annotations

import numpy as np

# float32 decodes ~1e-6 apart (another program, batch or mesh) round to the same uint8 except where a
# value sits at an exact .5: one level off, on a handful of values. A systematic bug (truncating
# instead of rounding, an off-by-one offset) moves about half of them, so the fraction catches it
# where ``max |diff| <= 1`` alone cannot.
MIN_EQUAL_FRACTION = 0.999


def assert_uint8_frames_match(got, expected) -> None:
    """uint8 frames equal to ``expected`` up to a rare rounding flip: ``max |diff| <= 1`` and at
    least ``MIN_EQUAL_FRACTION`` of the values identical. ``expected`` may hold whole numbers of
    another dtype (e.g. ``np.round`` of float frames)."""
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.dtype == np.uint8, got.dtype
    assert got.shape == expected.shape, (got.shape, expected.shape)
    diff = np.abs(got.astype(np.float64) - expected.astype(np.float64))
    assert diff.max() <= 1, f"max |diff| {diff.max()}"
    equal = float(np.mean(diff == 0))
    assert equal >= MIN_EQUAL_FRACTION, f"only {equal:.4f} of the values are equal"
