"""Negative controls: the exactness tests can fail.

Without halos each band is zero-padded alone; with a cyclic permutation the bottom edge of the
image wraps onto the top. Both must differ from the single-device decode by > 1e-2 where it
matters (band boundaries; image edges), while the exact path stays ≤ 1e-5 on those same rows.
"""

import numpy as np
import pytest

from tests.helpers.sharding_helpers import WIDTH, make_latents
from vaeserve import sharding
from vaeserve.sharding._controls import decode_with

SHAPE = (1, 3, 8, WIDTH)  # shared with test_exact (tp=8 there; tp=4 here)
TP = 4
SCALE = 8  # latent row → frame rows


def _rows_error(frames: np.ndarray, reference: np.ndarray, rows) -> float:
    """Max abs error over frame rows ``rows`` of float ``(B, 3, F, H, W)`` frames."""
    return float(np.max(np.abs(frames[:, :, :, rows] - reference[:, :, :, rows])))


def _decode(vae, control=None):
    """The exact sharded decode, or with a broken halo (``sharding._controls``)."""
    mesh, latents = sharding.make_mesh(TP), make_latents(*SHAPE)
    if control is None:
        return np.asarray(sharding.sharded_decode(vae, latents, mesh, split="height"))
    return np.asarray(decode_with(control, vae, latents, mesh, split="height"))


def test_no_halo_breaks_band_boundaries(vae, reference):
    expected = reference(SHAPE)
    band_rows = SHAPE[2] // TP * SCALE
    boundaries = [r for b in range(1, TP) for r in (b * band_rows - 1, b * band_rows)]
    assert _rows_error(_decode(vae, "none"), expected, boundaries) > 1e-2
    assert _rows_error(_decode(vae), expected, boundaries) <= 1e-5


def test_cyclic_halo_breaks_image_edges(vae, reference):
    expected = reference(SHAPE)
    edges = [0, SHAPE[2] * SCALE - 1]
    assert _rows_error(_decode(vae, "cyclic"), expected, edges) > 1e-2
    assert _rows_error(_decode(vae), expected, edges) <= 1e-5


def test_the_halo_mode_is_not_a_public_option(vae):
    """The controls reach tests only through ``sharding._controls``."""
    with pytest.raises(TypeError, match="halo"):
        sharding.sharded_decode(vae, make_latents(*SHAPE), sharding.make_mesh(TP), halo="none")
