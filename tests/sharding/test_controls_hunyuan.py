"""Negative controls for what HunyuanVideo sends across bands: each broken context must move the
sharded decode far from the single-device one where it matters, while the exact one stays ≤ 1e-5
on the same pixels.

* no halo: band boundaries (1.0);
* each band's own GroupNorm statistics: everywhere (1.0);
* zeros instead of the repeated edge row at the image's edges (1.0 and 1.5);
* the clip's attention without the frame-causal mask: the first frame, which would see later ones.
"""

import numpy as np
import pytest

from tests.helpers.sharding_helpers import WIDTH, make_latents
from vaeserve import sharding
from vaeserve.sharding._controls import decode_with

TP, SHAPE = 3, (1, 3, 7, WIDTH)  # shared with test_exact_hunyuan (tp = 3): bands of 3, 3 and 1 latent rows


def _decode(vae, control=None):
    mesh, latents = sharding.make_mesh(TP), make_latents(*SHAPE, channels=16)
    if control is None:
        return np.asarray(sharding.sharded_decode(vae, latents, mesh, split="height"))
    return np.asarray(decode_with(control, vae, latents, mesh, split="height"))


def _error(frames, expected, rows=slice(None), columns=slice(None), time=slice(None)) -> float:
    """Max abs error of float ``(B, 3, F, H, W)`` frames over the given frames, rows and columns."""
    return float(np.max(np.abs(frames[:, :, time, rows, columns] - expected[:, :, time, rows, columns])))


@pytest.fixture(scope="module")
def exact(hunyuan):
    return {name: _decode(vae) for name, vae in hunyuan.items()}


def test_no_halo_breaks_band_boundaries(hunyuan, hunyuan_reference, exact):
    expected = hunyuan_reference("hy10", SHAPE)
    band = 3 * hunyuan["hy10"].config.spatial_scale
    boundaries = [band - 1, band, 2 * band - 1, 2 * band]
    assert _error(_decode(hunyuan["hy10"], "none"), expected, boundaries) > 1e-2
    assert _error(exact["hy10"], expected, boundaries) <= 1e-5


def test_band_statistics_break_every_band(hunyuan, hunyuan_reference, exact):
    """GroupNorm normalized by each band's own statistics: wrong even far from any band edge."""
    expected = hunyuan_reference("hy10", SHAPE)
    middle = hunyuan["hy10"].config.spatial_scale  # a row inside the first band
    assert _error(_decode(hunyuan["hy10"], "band-statistics"), expected, [middle]) > 1e-2
    assert _error(exact["hy10"], expected, [middle]) <= 1e-5


@pytest.mark.parametrize("name", ["hy10", "hy15"])
def test_zero_edges_break_the_image_edges(hunyuan, hunyuan_reference, exact, name):
    """The outermost real rows repeat at the edges: the last real row here is the only row of the
    third band (latent row 6 of 9, two padded rows after it)."""
    expected = hunyuan_reference(name, SHAPE)
    last = SHAPE[2] * hunyuan[name].config.spatial_scale - 1
    broken = _decode(hunyuan[name], "zero-edge")
    for rows in ([0], [last]):
        assert _error(broken, expected, rows) > 1e-2, rows
        assert _error(exact[name], expected, rows) <= 1e-5, rows


@pytest.mark.parametrize("name", ["hy10", "hy15"])
def test_attention_without_the_frame_mask_breaks_the_first_frame(hunyuan, hunyuan_reference, exact, name):
    expected = hunyuan_reference(name, SHAPE)
    assert _error(_decode(hunyuan[name], "no-frame-mask"), expected, time=[0]) > 1e-2
    assert _error(exact[name], expected, time=[0]) <= 1e-5
