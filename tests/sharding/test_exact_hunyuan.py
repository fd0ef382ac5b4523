"""The sharded HunyuanVideo decode equals the single-device decode (float32, max abs diff ≤ 1e-5).

What crosses bands here that does not in Wan: GroupNorm statistics of the whole frame (1.0:
per-band sums added over ``tp``), replicate padding at the image's edges (the outermost real rows,
never a padded one, also with uneven splits) and the clip-wide frame-causal attention (1.5 keeps
its keys and values across the steps of the stream). Matrix: tp ∈ {1, 2, 3, 4, 8} with latent
heights that do not divide (tp = 4: the last band wholly padded), a width split, dp = 2 batches,
and streaming.
"""

import numpy as np
import pytest

from tests.helpers.sharding_helpers import WIDTH, make_latents
from vaeserve import sharding

TOLERANCE = 1e-5
FRAMES = 3  # 1.0: statistics over three latent frames; 1.5: frame 0, then a scan of two steps
HEIGHTS = {1: 5, 2: 5, 3: 7, 4: 5, 8: 13}  # uneven for every tp > 1 (tp=3: 3+3+1; tp=8: 2 x 6 + 1)
CASES = [pytest.param(name, tp, id=f"{name}-tp{tp}") for name in ("hy10", "hy15") for tp in HEIGHTS]


def _max_diff(a, b) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


@pytest.mark.parametrize("name, tp", CASES)
def test_height_split_matches_single_device(hunyuan, hunyuan_reference, name, tp):
    shape = (1, FRAMES, HEIGHTS[tp], WIDTH)
    got = sharding.sharded_decode(hunyuan[name], make_latents(*shape, channels=16), sharding.make_mesh(tp), split="height")
    assert _max_diff(got, hunyuan_reference(name, shape)) <= TOLERANCE


def test_width_split_matches_single_device(hunyuan, hunyuan_reference):
    shape = (1, FRAMES, WIDTH, 7)  # 7 columns over 3 bands: 3 + 3 + 1
    got = sharding.sharded_decode(hunyuan["hy10"], make_latents(*shape, channels=16), sharding.make_mesh(3), split="width")
    assert _max_diff(got, hunyuan_reference("hy10", shape)) <= TOLERANCE


@pytest.mark.parametrize("name", ["hy10", "hy15"])
def test_batch_over_dp(hunyuan, hunyuan_reference, name):
    shape = (2, FRAMES, HEIGHTS[2], WIDTH)
    got = sharding.sharded_decode(hunyuan[name], make_latents(*shape, channels=16), sharding.make_mesh(2, dp=2), split="height")
    assert _max_diff(got, hunyuan_reference(name, shape)) <= TOLERANCE


@pytest.mark.parametrize("name", ["hy10", "hy15"])
def test_stream_concatenates_to_the_whole_decode(hunyuan, hunyuan_reference, name):
    """1.5: steps with the mid-block's keys and values carried, sharded on their bands; 1.0: the
    whole clip decoded, then sent in the same pieces."""
    shape = (1, FRAMES, HEIGHTS[3], WIDTH)
    steps = [step.frames for step in sharding.sharded_decode_stream(
        hunyuan[name], make_latents(*shape, channels=16), sharding.make_mesh(3), split="height")]
    scale = hunyuan[name].config.temporal_scale
    assert [step.shape[1] for step in steps] == [1, scale, scale]
    expected = np.round((np.moveaxis(hunyuan_reference(name, shape), 1, -1) + 1) * 127.5)
    frames = np.concatenate(steps, axis=1)
    assert _max_diff(frames, expected) <= 1 and np.mean(frames == expected) > 0.999  # a .5 may round either way
