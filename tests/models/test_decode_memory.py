"""Peak decode memory does not grow with the number of frames beyond the output itself."""

import pytest

from tests.helpers.sharding_helpers import OUTPUT_OVERHEAD_BYTES
from vaeserve import models

# Activations dominate: ~38 MB temp vs ~1 MB of weights (Wan 2.1); Wan 2.2 in small (residual up
# blocks, DupUp3D, unpatchify; 2x temporal) as in tests/sharding.
CONFIGS = {
    "wan21": (models.WanVAEConfig(base_dim=8, num_res_blocks=1), (1, 16, None, 12, 12)),
    "wan22": (models.WanVAEConfig.wan22(base_dim=8, decoder_base_dim=8, num_res_blocks=1, dim_mult=(1, 2, 2),
                                        temperal_downsample=(False, True), scale_factor_spatial=8,
                                        scale_factor_temporal=2), (1, 48, None, 12, 12)),
}


def _memory(vae, shape, frames, **options):
    return vae.compile(shape[:2] + (frames,) + shape[3:], **options).memory_analysis()


@pytest.mark.parametrize("name", CONFIGS)
def test_temp_memory_is_flat_in_frames(name):
    config, shape = CONFIGS[name]
    vae = models.init_vae(config)
    short, long = _memory(vae, shape, 3, output="uint8"), _memory(vae, shape, 21, output="uint8")
    # The output is the uint8 frames (1 + s·(T-1) of them, s = temporal scale) and the same few
    # bytes of non-finite count beside them ...
    def frame_bytes(latent_frames):
        return (1 + config.temporal_scale * (latent_frames - 1)) * 3 * (shape[3] * config.spatial_scale) * (shape[4] * config.spatial_scale)
    beside = short.output_size_in_bytes - frame_bytes(3)
    assert 0 < beside <= OUTPUT_OVERHEAD_BYTES
    assert long.output_size_in_bytes == frame_bytes(21) + beside
    # ... the working memory does not: one step's activations + the fixed 2-frame caches, plus
    # the channels-last float32 copy of the latents themselves (48 channels: not negligible here).
    latent_frame_bytes = shape[1] * shape[3] * shape[4] * 4
    assert long.temp_size_in_bytes <= 1.05 * short.temp_size_in_bytes + 18 * latent_frame_bytes
    # Negative control: decoding all later frames in one step (chunk = T-1) does grow with T,
    # so the assertion above would catch a decode that is not a constant-memory loop.
    everything = _memory(vae, shape, 21, output="uint8", chunk=20)
    assert everything.temp_size_in_bytes > 5 * short.temp_size_in_bytes
