"""The sharded image decode and encode equal the single-device ones (float32, max abs diff ≤ 1e-5).

AutoencoderKL (SD, SDXL, Flux.1; Flux.2 has the same layers) sends across bands what HunyuanVideo
1.0 does: one-row halos, GroupNorm statistics of the whole image (each band's sums added over
``tp``) and the mid-block attention's keys and values. One latent height, 13 rows, splits unevenly
over every tp: 7 + 6, 5 + 5 + 3, 4 x 3 + 1, 6 x 2 + 1 and a wholly padded band at tp = 8. Also a
width split with dp = 2 and batch 2, the streamed image, the encoder (bands on even rows at every
scale), images in Qwen-Image's Wan layers, and the negative controls: each band's own statistics,
no halo.
"""

import functools

import numpy as np
import pytest

from tests.helpers.image_reference import KL_SHARD, QWEN_TINY, seeded_images
from tests.helpers.sharding_helpers import assert_halo_and_statistics_collectives, make_latents
from vaeserve import models, sharding
from vaeserve.sharding._controls import decode_cropped_on_devices, decode_with, encode_with
from vaeserve.sharding.introspect import program_memory

TOLERANCE = 1e-5
HEIGHT, WIDTH = 13, 4  # latent rows: uneven over tp = 2, 3, 4 and 8
CHANNELS = KL_SHARD.latent_channels


def _max_diff(a, b) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def _latents(batch: int, height: int, width: int, channels: int = CHANNELS) -> np.ndarray:
    """Image latents ``(B, C, H, W)``: ``make_latents``' clip of one frame, without its time axis."""
    return make_latents(batch, 1, height, width, channels=channels)[:, :, 0]


@pytest.fixture(scope="module")
def kl():
    return models.init_vae(KL_SHARD, seed=0)


@pytest.fixture(scope="module")
def reference(kl):
    """``reference((B, H, W))``: the single-device decode of ``_latents(B, H, W)`` (cached)."""

    @functools.cache
    def decode(shape):
        return np.asarray(kl.decode(_latents(*shape)))

    return decode


@pytest.mark.parametrize("tp", [2, 3, 4, 8])
def test_height_split_matches_single_device(kl, reference, tp):
    got = sharding.sharded_decode(kl, _latents(1, HEIGHT, WIDTH), sharding.make_mesh(tp), split="height")
    assert got.shape == (1, 3, 2 * HEIGHT, 2 * WIDTH)  # an image, no time axis
    assert _max_diff(got, reference((1, HEIGHT, WIDTH))) <= TOLERANCE


def test_width_split_and_batch_over_dp(kl, reference):
    """Batch 2 over dp = 2, 13 columns over tp = 3 (5 + 5 + 3): six devices."""
    got = sharding.sharded_decode(kl, _latents(2, WIDTH, HEIGHT), sharding.make_mesh(3, dp=2), split="width")
    assert _max_diff(got, reference((2, WIDTH, HEIGHT))) <= TOLERANCE


def _moves_image_rows(collective: dict) -> bool:
    """A collective of image-resolution pixels: float NCHW with 3 channels, or uint8 NHWC."""
    return collective["dtype"] == "u8" or (len(collective["shape"]) == 4 and collective["shape"][1] == 3)


def test_bands_exchange_halos_statistics_and_keys_only(kl):
    """What crosses bands in the tp = 3 program above (from the cache): one-row halos, the K/V of
    the mid-block attention at latent resolution (padded to 15 rows), and (B, groups) float32
    GroupNorm statistics — never an activation, and no pixel of the image."""
    program = sharding.compile_decode(kl, (1, CHANNELS, HEIGHT, WIDTH), sharding.make_mesh(3), split="height")
    found = sharding.collectives(program.as_text())
    assert not [c for c in found if _moves_image_rows(c)]
    reduces = assert_halo_and_statistics_collectives(found, (15, WIDTH), batch=1, groups=KL_SHARD.norm_num_groups)
    assert len(reduces) >= 2  # a mean, then centred squares, per GroupNorm


def test_an_uneven_split_leaves_each_band_on_its_device(kl, reference):
    """13 latent rows over tp = 4 (padded to 16): each device's output is its band of the padded
    image (8 of 32 rows) and no collective moves a pixel; the host crops the padding (the served
    and the public decode alike). Control: the crop inside the program (as it once was) makes XLA
    gather the image onto every device, whose output then holds all of it."""
    shape, mesh = (1, CHANNELS, HEIGHT, WIDTH), sharding.make_mesh(4)
    band_bytes = 3 * (2 * 16 // 4) * (2 * WIDTH) * 4  # float32 (1, 3, 8, 8): a quarter of the padded image
    image_bytes = 3 * (2 * HEIGHT) * (2 * WIDTH) * 4
    served = sharding.compile_decode(kl, shape, mesh, split="height")  # the tp = 4 program above, from the cache
    assert band_bytes <= program_memory(served)["output_bytes"] < band_bytes + 64  # + the (1, 1) count
    assert not [c for c in sharding.collectives(served.as_text()) if _moves_image_rows(c)]
    frames, _ = served(sharding.replicated_state(kl, mesh), sharding.put_latents(_latents(1, HEIGHT, WIDTH), mesh))
    assert frames.shape == (1, 3, 2 * 16, 2 * WIDTH)  # the padded rows leave the program
    host = sharding.to_host_cropped(frames, shape, KL_SHARD.spatial_scale, "float")
    assert _max_diff(host, reference((1, HEIGHT, WIDTH))) <= TOLERANCE
    control = decode_cropped_on_devices(kl, shape, mesh, split="height")
    assert program_memory(control)["output_bytes"] >= image_bytes
    assert [c for c in sharding.collectives(control.as_text()) if _moves_image_rows(c)]


def test_an_image_streams_as_one_frame(kl, reference):
    steps = list(sharding.sharded_decode_stream(kl, _latents(1, HEIGHT, WIDTH), sharding.make_mesh(3), split="height"))
    assert [step.frames.shape for step in steps] == [(1, 1, 2 * HEIGHT, 2 * WIDTH, 3)] and not steps[0].nonfinite.any()
    rounded = np.round((np.moveaxis(reference((1, HEIGHT, WIDTH)), 1, -1) + 1) * 127.5)
    assert _max_diff(steps[0].frames[:, 0], rounded) <= 1  # a .5 may round either way


@pytest.mark.parametrize("control", ["band-statistics", "none"])
def test_negative_controls_break_the_decode(kl, reference, control):
    """Each band's own GroupNorm statistics are wrong everywhere (a row inside the first band);
    without halos the band edges are (rows 9 and 10 at 2x: the first band holds latent rows 0-4)."""
    expected = reference((1, HEIGHT, WIDTH))
    broken = np.asarray(decode_with(control, kl, _latents(1, HEIGHT, WIDTH), sharding.make_mesh(3), split="height"))
    rows = [2] if control == "band-statistics" else [9, 10]
    assert _max_diff(broken[:, :, rows], expected[:, :, rows]) > 1e-2


@pytest.fixture(scope="module")
def encoded(kl):
    """Images of 26 x 8 pixels (13 x 4 latents), batch 2: the single-device posterior mean."""
    images = seeded_images((2, 3, 2 * HEIGHT, 2 * WIDTH), 0)
    return images, np.asarray(kl.encode(images))


def test_encode_splits_exactly(kl, encoded):
    images, expected = encoded
    got = sharding.sharded_encode(kl, images, sharding.make_mesh(3, dp=2), split="height")
    assert got.shape == (2, CHANNELS, HEIGHT, WIDTH)
    assert _max_diff(got, expected) <= TOLERANCE
    broken = encode_with("band-statistics", kl, images, sharding.make_mesh(3, dp=2), split="height")
    assert _max_diff(broken, expected) > 1e-2


@pytest.fixture(scope="module")
def qwen():
    return models.init_vae(QWEN_TINY, seed=0)


def test_qwen_image_decodes_images_in_bands(qwen):
    """Qwen-Image is the Wan layers (their sharding is tested as Wan's), one frame: its image
    layout splits as a clip's."""
    latents = _latents(1, 7, 3, channels=QWEN_TINY.z_dim)
    got = sharding.sharded_decode(qwen, latents, sharding.make_mesh(3), split="height")
    assert got.shape == (1, 3, 56, 24) and _max_diff(got, qwen.decode(latents)) <= TOLERANCE
