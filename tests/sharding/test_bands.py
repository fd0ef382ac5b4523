"""Band arithmetic and mesh construction: pure functions, no compiles."""

import jax
import numpy as np
import pytest

from vaeserve import sharding
from vaeserve.sharding._controls import CyclicHaloContext
from vaeserve.sharding.bands import band_size, halo_permutations, padding


@pytest.mark.parametrize("size, tp, band, pad", [(8, 1, 8, 0), (8, 4, 2, 0), (5, 4, 2, 3), (7, 3, 3, 2), (13, 8, 2, 3), (3, 8, 1, 5)])
def test_band_size_and_padding(size, tp, band, pad):
    assert band_size(size, tp) == band
    assert padding(size, tp) == pad


@pytest.mark.parametrize(
    "height, width, tp, split",
    [
        (90, 160, 8, "width"),  # 720p: 160 = 8 x 20, 90 would need 6 padded rows
        (60, 104, 8, "width"),  # 480x832: 104 divides by 8, 60 does not
        (64, 90, 8, "height"),
        (60, 104, 4, "height"),  # both divide: ties go to height
        (5, 5, 4, "height"),  # both pad 3
        (1, 1, 1, "height"),
    ],
)
def test_choose_split_picks_least_padding(height, width, tp, split):
    assert sharding.choose_split(height, width, tp) == split


def test_split_can_be_forced_and_is_validated():
    assert sharding.choose_split(90, 160, 8, "height") == "height"
    with pytest.raises(sharding.SplitError, match="split must be one of"):
        sharding.choose_split(90, 160, 8, "diagonal")


def test_layout_scale_and_valid_rows():
    layout = sharding.band_layout(5, 4, 4, "height")
    assert (layout.band, layout.padded, layout.pad, layout.axis) == (2, 8, 3, -3)
    assert [layout.scale(n) for n in (2, 4, 8, 16)] == [1, 2, 4, 8]
    with pytest.raises(ValueError):
        layout.scale(3)
    np.testing.assert_array_equal(layout.valid(1), [1, 1, 1, 1, 1, 0, 0, 0])
    assert layout.valid(8).sum() == 40 and layout.valid(8).size == 64
    assert sharding.band_layout(4, 7, 3, "width").axis == -2


def test_halo_permutations_are_non_cyclic():
    down, up = halo_permutations(4)
    assert down == [(0, 1), (1, 2), (2, 3)]
    assert up == [(1, 0), (2, 1), (3, 2)]
    assert halo_permutations(1) == ([], [])
    layout = sharding.band_layout(8, 8, 4)
    down, up = CyclicHaloContext(layout).permutations()  # the negative control wraps; the exact path must not
    assert (3, 0) in down and (0, 3) in up
    assert sharding.BandContext(layout).permutations() == halo_permutations(4)


def test_make_mesh_axes_and_errors():
    mesh = sharding.make_mesh(4, dp=2)
    assert mesh.axis_names == sharding.MESH_AXES == ("dp", "tp")
    assert dict(mesh.shape) == {"dp": 2, "tp": 4}
    assert list(mesh.devices.flat) == jax.devices()[:8]
    assert sharding.make_mesh(2, devices=jax.devices()[4:]).devices.flat[0] == jax.devices()[4]
    with pytest.raises(sharding.MeshError, match="needs 16 devices; only 8"):
        sharding.make_mesh(8, dp=2)
    with pytest.raises(sharding.MeshError, match="≥ 1"):
        sharding.make_mesh(0)
