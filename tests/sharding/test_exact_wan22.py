"""The Wan 2.2 decoder sharded exactly like Wan 2.1: ≤ 1e-5 max abs vs the single-device decode.

What 2.2 adds is spatially local: the DupUp3D shortcut and the 2x2 unpatchify move values between
channels and the sub-pixels of one input pixel, so a band of h rows becomes 2h rows with no halo;
the residual blocks and upsamplers are 2.1's layers (one-row halos at every 3x3 conv). The
matrix: tp ∈ {1, 2, 3, 4, 8} on a height that no tp > 1 divides (tp = 8: a wholly padded band),
a width split, batch 2 over dp = 2 on an even split, and streaming; T = 3 everywhere (frame 0 and
its first-chunk shortcut, then two cached steps). The HLO shows the locality: no collective but
one-row halos and the latent-resolution K/V gather. Negative control: no halo breaks the seams.
"""

import numpy as np
import pytest

from tests.helpers.sharding_helpers import make_latents
from vaeserve import sharding
from vaeserve.models.decode import to_uint8
from vaeserve.sharding._controls import decode_with

TOLERANCE = 1e-5
SHAPE = (1, 3, 7, 5)  # (B, T, H, W): 7 rows over tp = 2, 3, 4, 8 pad to 8, 9, 8, 8
BATCH2 = (2, 3, 8, 5)  # dp = 2 x tp = 4, even split
SCALE = 8  # latent row → frame rows (TINY22: 4x decoder, 2x2 patches)
FRAMES = 5  # 1 + 2 (T - 1): TINY22 doubles time once


def _latents(shape):
    return make_latents(*shape, channels=48)


@pytest.fixture(scope="module")
def reference22(vae22):
    cache = {}

    def decode(shape):
        if shape not in cache:
            cache[shape] = np.asarray(vae22.decode(_latents(shape)))
        return cache[shape]

    return decode


def _diff(got, expected) -> float:
    assert got.shape == expected.shape, (got.shape, expected.shape)
    return float(np.abs(np.asarray(got, np.float64) - expected).max())


@pytest.mark.parametrize("tp", [1, 2, 3, 4, 8])
def test_height_split_matches_single_device(vae22, reference22, tp):
    got = sharding.sharded_decode(vae22, _latents(SHAPE), sharding.make_mesh(tp), split="height")
    assert got.shape == (1, 3, FRAMES, 7 * SCALE, 5 * SCALE)
    assert _diff(got, reference22(SHAPE)) <= TOLERANCE


def test_width_split_matches_single_device(vae22, reference22):
    got = sharding.sharded_decode(vae22, _latents(SHAPE), sharding.make_mesh(3), split="width")
    assert _diff(got, reference22(SHAPE)) <= TOLERANCE


def test_batch_over_dp_even_split(vae22, reference22):
    got = sharding.sharded_decode(vae22, _latents(BATCH2), sharding.make_mesh(4, dp=2), split="height")
    assert _diff(got, reference22(BATCH2)) <= TOLERANCE


def test_stream_concatenates_to_the_full_decode(vae22, reference22):
    steps = [step.frames for step in sharding.sharded_decode_stream(vae22, _latents(SHAPE), sharding.make_mesh(4),
                                                                    split="height")]
    assert [step.shape[1] for step in steps] == [1, 2, 2]
    frames = np.concatenate(steps, axis=1)
    expected = np.asarray(to_uint8(np.moveaxis(reference22(SHAPE), 1, -1)))
    assert _diff(frames, expected) <= 1  # ~1e-6 float differences may flip a rounding at .5
    assert np.mean(frames == expected) > 0.999


def test_only_one_row_halos_and_latent_kv_cross_devices(vae22):
    found = sharding.collectives(sharding.hlo_text(vae22, (1, 48, *SHAPE[1:]), sharding.make_mesh(4),
                                                   split="height"))
    halos = [c for c in found if c["op"] == "collective-permute" and c["shape"][2] == 1]  # (B, T, 1, w, C)
    assert len(halos) > 20
    for collective in found:
        if collective in halos:
            continue
        # the mid-block K/V: (N, 8, 5, C) at latent resolution (7 rows padded to 8); no output row
        # moves (the host crops the uneven split's padding)
        assert collective["op"] == "all-gather" and collective["shape"][1:3] == (8, 5), collective


def test_no_halo_breaks_band_boundaries(vae22, reference22):
    """Negative control: bands zero-padded alone differ at the cuts; the exact decode does not."""
    tp, band_rows = 4, 2 * SCALE  # 7 rows → bands of 2 latent rows
    got = np.asarray(decode_with("none", vae22, _latents(SHAPE), sharding.make_mesh(tp), split="height"))
    cuts = [r for b in range(1, tp) for r in (b * band_rows - 1, b * band_rows) if r < SHAPE[2] * SCALE]
    expected = reference22(SHAPE)
    assert np.abs(got[:, :, :, cuts] - expected[:, :, :, cuts]).max() > 1e-2
