"""The sharded LTX decode equals the single-device decode (float32, max abs diff ≤ 1e-5).

The model pads by reflection (LTX-2.0): the band at the top reflects its own rows, interior bands
take halos, and the last real row reflects the row above it — in its band or in the halo from the
band above, never a padded row, with uneven splits (34 and 22 latent rows over 8 bands, as 1088 and
704 pixel frames give; the last band wholly padded). It also sees one frame ahead (the
stream runs past the clip's end) and injects seeded noise, drawn for the whole frame and kept per
band. Matrix: tp ∈ {2, 3, 4, 8} with latent heights that do not divide, a width split, dp = 2, a
stream; negative controls (zeros where reflection is due, no halo) must break it.
"""

import numpy as np
import pytest

from tests.helpers.sharding_helpers import assert_one_row_permutes, make_latents
from tests.sharding.conftest import LTX_CONDITIONS
from vaeserve import sharding
from vaeserve.sharding._controls import decode_with
from vaeserve.sharding.introspect import collectives, hlo_text

TOLERANCE = 1e-5
FRAMES = 2  # one step: the first takes 1 + lookahead (7) latent frames, zeros past the clip's end
WIDTH = 2  # reflection needs two columns; the frames are 8 pixels wide
# (tp, dp, (B, T, H, W)): uneven for every tp (7 rows: 4+3 over 2, 3+3+1 over 3, 2+2+2+1 over 4; 34 = 8 x 5 − 6
# and 22 = 8 x 3 − 2 over 8, the last band wholly padded); one reference decode serves the first three.
CASES = {"tp2-dp2": (2, 2, (2, FRAMES, 7, WIDTH)), "tp3": (3, 1, (2, FRAMES, 7, WIDTH)),
         "tp4": (4, 1, (2, FRAMES, 7, WIDTH)), "tp8-34rows": (8, 1, (1, FRAMES, 34, WIDTH)),
         "tp8-22rows": (8, 1, (1, FRAMES, 22, WIDTH))}


def _max_diff(a, b) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def _decode(vae, shape, mesh, split="height", control=None):
    latents = make_latents(*shape, channels=8)
    if control is None:
        return np.asarray(sharding.sharded_decode(vae, latents, mesh, split=split, **LTX_CONDITIONS))
    return np.asarray(decode_with(control, vae, latents, mesh, split=split, **LTX_CONDITIONS))


@pytest.mark.parametrize("case", CASES)
def test_height_split_matches_single_device(ltx, ltx_reference, case):
    tp, dp, shape = CASES[case]
    assert _max_diff(_decode(ltx, shape, sharding.make_mesh(tp, dp=dp)), ltx_reference(shape)) <= TOLERANCE


def test_width_split_matches_single_device(ltx, ltx_reference):
    shape = (1, FRAMES, WIDTH, 7)  # 7 columns over 3 bands: 3 + 3 + 1
    assert _max_diff(_decode(ltx, shape, sharding.make_mesh(3), split="width"), ltx_reference(shape)) <= TOLERANCE


def test_only_one_row_halos_cross_bands(ltx):
    """Reflection at the edges and the noise need nothing from other bands: the only collectives
    are one-row halo exchanges (and, the split being uneven, XLA's crop of the output frames
    ``(B, 3, F, H, W)`` after the bands: a permute and an all-gather)."""
    tp, _, shape = CASES["tp3"]
    found = collectives(hlo_text(ltx, (shape[0], 8, *shape[1:]), sharding.make_mesh(tp), split="height"))
    halos = [c for c in found if c["op"] == "collective-permute" and c["shape"][2] == 1]
    assert_one_row_permutes(halos)
    assert all(c["shape"][:2] == (shape[0], 3) for c in found if c not in halos), found


@pytest.mark.parametrize("control", ["zero-edge", "none"])
def test_controls_break_it(ltx, ltx_reference, control):
    """Zeros at the image's edges where the model reflects, or bands padded alone: wrong at the
    image's first and last rows (zero-edge) or at the band boundaries (no halo)."""
    tp, _, shape = CASES["tp3"]
    expected, scale = ltx_reference(shape), ltx.config.spatial_scale
    broken = _decode(ltx, shape, sharding.make_mesh(tp), control=control)
    rows = [0, shape[2] * scale - 1] if control == "zero-edge" else [3 * scale - 1, 3 * scale]
    assert _max_diff(broken[..., rows, :], expected[..., rows, :]) > 1e-2


def test_stream_past_the_clips_end_matches_single_device(ltx, ltx_reference):
    """Nine latent frames: the first step (7), then steps of one that run past the clip's end, their
    caches (and frame counters) on their bands."""
    shape = (1, 9, 7, WIDTH)
    steps = list(sharding.sharded_decode_stream(ltx, make_latents(*shape, channels=8), sharding.make_mesh(3),
                                                split="height", **LTX_CONDITIONS))
    frames = np.concatenate([step.frames for step in steps], axis=1).astype(np.float64)
    expected = np.round((np.moveaxis(ltx_reference(shape), 1, -1) + 1) * 127.5)
    assert frames.shape == expected.shape and len(steps) > 2
    assert _max_diff(frames, expected) <= 1 and np.mean(frames == expected) > 0.999  # a .5 may round either way
