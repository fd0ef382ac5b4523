"""Peak decode memory does not grow with the number of frames beyond the output itself."""

import models

CONFIG = models.WanVAEConfig(base_dim=8, num_res_blocks=1)
SHAPE = (1, 16, None, 12, 12)  # activations dominate: ~38 MB temp vs ~1 MB of weights


def _memory(vae, frames, **options):
    shape = SHAPE[:2] + (frames,) + SHAPE[3:]
    return vae.compile(shape, **options).memory_analysis()


def test_temp_memory_is_flat_in_frames():
    vae = models.init_vae(CONFIG)
    short, long = _memory(vae, 3, output="uint8"), _memory(vae, 21, output="uint8")
    # The output grows with the frames (1 + 4·20 vs 1 + 4·2) ...
    assert long.output_size_in_bytes / short.output_size_in_bytes == 81 / 9
    # ... the working memory does not: one step's activations + the fixed 2-frame caches.
    assert long.temp_size_in_bytes <= 1.05 * short.temp_size_in_bytes
    # Negative control: decoding all later frames in one step (chunk = T-1) does grow with T,
    # so the assertion above would catch a decode that is not a constant-memory loop.
    everything = _memory(vae, 21, output="uint8", chunk=20)
    assert everything.temp_size_in_bytes > 5 * short.temp_size_in_bytes
