"""The sharded decode equals the single-device decode (float32, max abs diff ≤ 1e-5).

Matrix: tp ∈ {1, 2, 3, 4, 8} x latent heights that divide by tp and that do not x T ∈ {1, 3},
plus width splits, the automatic split, dp = 2 batches, uint8 output, denormalize and streaming.
"""

import jax
import numpy as np
import pytest

from tests.helpers.sharding_helpers import WIDTH, make_latents
from vaeserve import sharding

TOLERANCE = 1e-5

# (tp, latent height, T): every tp with a height that divides and one that does not (tp = 1:
# every height divides), each with T = 1 (frame 0 alone) and T = 3 (frame 0, then the scan). The
# uneven heights leave partly padded bands (tp=3: 7 → 9, tp=8: 13 → 16) and wholly padded ones
# (tp=4: 5 → 8 leaves rank 3 empty).
HEIGHTS = {1: (5,), 2: (8, 5), 3: (6, 7), 4: (8, 5), 8: (8, 13)}
CASES = [pytest.param(tp, height, frames, id=f"tp{tp}-h{height}-t{frames}")
         for tp, heights in HEIGHTS.items() for height in heights for frames in (1, 3)]


def _max_diff(a, b) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


@pytest.mark.parametrize("tp, height, frames", CASES)
def test_height_split_matches_single_device(vae, reference, tp, height, frames):
    shape = (1, frames, height, WIDTH)
    mesh = sharding.make_mesh(tp)
    got = sharding.sharded_decode(vae, make_latents(*shape), mesh, split="height")
    assert got.dtype == np.float32
    assert _max_diff(np.asarray(got), reference(shape)) <= TOLERANCE


@pytest.mark.parametrize("tp, width, frames", [(4, 8, 1), (3, 7, 3)])
def test_width_split_matches_single_device(vae, reference, tp, width, frames):
    shape = (1, frames, 4, width)
    got = sharding.sharded_decode(vae, make_latents(*shape), sharding.make_mesh(tp), split="width")
    assert _max_diff(np.asarray(got), reference(shape)) <= TOLERANCE


def test_automatic_split_takes_width_when_height_does_not_divide(vae, reference):
    shape = (1, 1, 3, 8)  # tp=4: height 3 would pad 1 row, width 8 divides
    mesh = sharding.make_mesh(4)
    got = sharding.sharded_decode(vae, make_latents(*shape), mesh)
    assert sharding.band_layout(3, 8, 4).split == "width"
    assert got.sharding.spec[4] == sharding.TP_AXIS  # (B, 3, F, H, W): W is split
    assert _max_diff(np.asarray(got), reference(shape)) <= TOLERANCE


@pytest.mark.parametrize("tp, height, frames", [(2, 5, 3), (4, 8, 1)])
def test_batch_over_dp(vae, reference, tp, height, frames):
    shape = (2, frames, height, WIDTH)
    mesh = sharding.make_mesh(tp, dp=2)
    got = sharding.sharded_decode(vae, make_latents(*shape), mesh, split="height")
    assert _max_diff(np.asarray(got), reference(shape)) <= TOLERANCE


def test_batch_not_divisible_by_dp_is_refused(vae):
    with pytest.raises(sharding.SplitError, match="batch 3 does not split over dp=2"):
        sharding.sharded_decode(vae, make_latents(3, 1, 4, 4), sharding.make_mesh(2, dp=2))


def test_uint8_and_denormalize(vae, reference):
    shape = (1, 3, 5, WIDTH)
    mesh = sharding.make_mesh(4)
    latents = make_latents(*shape)
    got = np.asarray(sharding.sharded_decode(vae, latents, mesh, split="height", output="uint8", denormalize=True))
    expected = reference(shape, output="uint8", denormalize=True)
    assert got.dtype == np.uint8 and got.shape == expected.shape == (1, 9, 40, 32, 3)
    # ~1e-6 float differences may flip a rounding at an exact .5: allow 1 level on a few pixels.
    assert _max_diff(got, expected) <= 1
    assert np.mean(got == expected) > 0.999


def test_stream_concatenates_to_the_full_decode(vae, reference):
    shape = (1, 3, 5, WIDTH)
    mesh = sharding.make_mesh(4)
    with jax.transfer_guard("disallow"):  # the hot path makes only explicit transfers
        decoded = list(sharding.sharded_decode_stream(vae, make_latents(*shape), mesh, split="height"))
    steps = [step.frames for step in decoded]
    assert all(isinstance(step, np.ndarray) and step.dtype == np.uint8 for step in steps)
    assert all(step.nonfinite.tolist() == [0] for step in decoded)
    assert [step.shape[1] for step in steps] == [1, 4, 4]  # caches carried across two steps
    frames = np.concatenate(steps, axis=1)
    expected = reference(shape, output="uint8")
    assert _max_diff(frames, expected) <= 1
    assert np.mean(frames == expected) > 0.999


def test_the_decoder_counts_the_nonfinite_values_it_produces(vae):
    """Finite latents can overflow the network (values near float32's limit): the count is read on
    the device before the uint8 conversion hides NaN as black. Same programs as the stream above."""
    shape = (1, 3, 5, WIDTH)
    mesh = sharding.make_mesh(4)
    huge = np.full((1, 16, *shape[1:]), 3e38, np.float32)
    steps = list(sharding.sharded_decode_stream(vae, huge, mesh, split="height"))
    assert all(int(step.nonfinite[0]) > 0 for step in steps)
    assert all(step.nonfinite.dtype == np.int64 for step in steps)


def test_programs_are_compiled_once_per_shape_and_mesh(vae):
    mesh = sharding.make_mesh(2)
    latents = make_latents(1, 1, 8, WIDTH)
    sharding.sharded_decode(vae, latents, mesh, split="height")
    before = vae.programs.compiles
    sharding.sharded_decode(vae, latents, mesh, split="height")
    sharding.sharded_decode(vae, latents, sharding.make_mesh(2), split="height")  # an equal mesh
    assert vae.programs.compiles == before
    other_devices = sharding.make_mesh(2, devices=jax.devices()[6:])  # same shape, other devices: compiles
    sharding.sharded_decode(vae, latents, other_devices, split="height")
    assert vae.programs.compiles == before + 1
