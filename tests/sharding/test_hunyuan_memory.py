"""Memory of the HunyuanVideo decodes, shown structurally on the compiled programs.

1.0 decodes the whole clip (its statistics span it): its temp memory grows with the frames and
each device's falls about as 1/tp. 1.5 streams: its temp memory stays flat in the frames but for
the mid-block's attention memory (keys and values of every latent frame, and a query frame's
scores over them), at latent resolution.
"""

import sharding
from tests.helpers.sharding_helpers import assert_memory_split_over_tp

SHARDED = (1, 16, 3, 32, 32)  # 1.0: frames (1, 3, 9, 128, 128); activations dominate tiny weights


def test_hunyuan10_temp_falls_with_tp(hunyuan):
    programs = {tp: sharding.compile_decode(hunyuan["hy10"], SHARDED, sharding.make_mesh(tp), split="height",
                                            output="uint8") for tp in (1, 8)}
    assert_memory_split_over_tp(programs, 8, temp_at_most=0.2)


def _temp(vae, frames: int) -> int:
    return vae.compile((1, 16, frames, 12, 12), output="uint8").memory_analysis().temp_size_in_bytes


def test_hunyuan15_temp_is_flat_in_frames_but_for_its_attention_memory(hunyuan):
    vae = hunyuan["hy15"]
    short, long = _temp(vae, 3), _temp(vae, 21)
    pixels, width = 12 * 12, vae.config.decoder_channels[0]
    # Per latent frame more: its keys and values (float32), and one query frame's scores over it.
    per_frame = 2 * pixels * width * 4 + pixels * pixels * 4
    assert long <= 1.05 * short + 18 * per_frame, (short, long, per_frame)


def test_hunyuan10_temp_grows_with_frames(hunyuan):
    """Negative control for the test above: a whole-clip decode's temp memory does grow."""
    vae = hunyuan["hy10"]
    assert _temp(vae, 9) > 2.5 * _temp(vae, 3)
