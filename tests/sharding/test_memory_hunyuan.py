"""Memory and communication of the HunyuanVideo decodes, shown structurally on the compiled programs.

1.0 decodes the whole clip (its statistics span it): its temp memory grows with the frames and
each device's falls about as 1/tp. 1.5 streams: its temp memory stays flat in the frames but for
the mid-block's attention memory (keys and values of every latent frame, and a query frame's
scores over them), at latent resolution. What crosses the bands (HLO, even splits): one-row halos and latent-resolution
K/V for both; 1.0 also all-reduces its GroupNorm statistics, (B, groups) floats and nothing else.
"""

import pytest

from tests.helpers.sharding_helpers import (
    WIDTH,
    assert_halo_and_statistics_collectives,
    assert_halo_collectives,
    assert_memory_split_over_tp,
)
from vaeserve import models, sharding

SHARDED = (1, 16, 3, 32, 32)  # 1.0: frames (1, 3, 9, 128, 128); activations dominate tiny weights
EVEN = (1, 16, 3, 4, WIDTH)  # 1.5's HLO: 2 latent rows per band at tp = 2 (uneven splits move padding too)


@pytest.fixture(scope="module")
def hy10_programs(hunyuan):
    return {tp: sharding.compile_decode(hunyuan["hy10"], SHARDED, sharding.make_mesh(tp), split="height",
                                        output="uint8") for tp in (1, 8)}


def test_hunyuan10_temp_falls_with_tp(hy10_programs):
    assert_memory_split_over_tp(hy10_programs, 8, temp_at_most=0.2)


def test_hunyuan10_all_reduces_its_group_statistics_only(hunyuan, hy10_programs):
    found = sharding.collectives(hy10_programs[8].as_text())
    groups = hunyuan["hy10"].config.norm_num_groups
    reduces = assert_halo_and_statistics_collectives(found, SHARDED[3:], batch=1, groups=groups)
    assert len(reduces) >= 2  # a mean, then centred squares, per GroupNorm
    with pytest.raises(AssertionError):  # the rule every other model's decode keeps: no all-reduce
        assert_halo_collectives(found, SHARDED[3:])


def test_hunyuan15_crosses_bands_with_halos_and_kv_only(hunyuan):
    program = sharding.compile_decode(hunyuan["hy15"], EVEN, sharding.make_mesh(2), split="height", output="uint8")
    assert_halo_collectives(sharding.collectives(program.as_text()), EVEN[3:])


def _temp(vae, frames: int) -> int:
    return vae.compile((1, 16, frames, 12, 12), output="uint8").memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("cpu_convs, copies", [("onednn", 2), ("matmul", 1)])
def test_hunyuan15_temp_is_flat_in_frames_but_for_its_attention_memory(hunyuan, cpu_convs, copies):
    """The whole-clip scan's temp grows by the attention's keys, values and scores per latent frame;
    compiled with oneDNN's convs it holds them twice (measured: 230 KB more per latent frame at
    12x12 against 120 KB of them; the server's stream steps keep them as arguments instead)."""
    vae = hunyuan["hy15"] if cpu_convs == "onednn" else models.abstract_vae(hunyuan["hy15"].config)
    vae.cpu_convs = cpu_convs  # the fixture's is the default: unchanged
    short, long = _temp(vae, 3), _temp(vae, 21)
    pixels, width = 12 * 12, vae.config.decoder_channels[0]
    # Per latent frame more: its keys and values (float32), and one query frame's scores over it.
    per_frame = 2 * pixels * width * 4 + pixels * pixels * 4
    assert long <= 1.05 * short + 18 * copies * per_frame, (short, long, per_frame)


def test_hunyuan10_temp_grows_with_frames(hunyuan):
    """Negative control for the test above: a whole-clip decode's temp memory does grow."""
    vae = hunyuan["hy10"]
    assert _temp(vae, 9) > 2.5 * _temp(vae, 3)
