"""Live float32 parity against diffusers itself (needs torch + diffusers; `make test` installs both).

Checkpoints come from diffusers' own ``save_pretrained``, single-file and sharded-index forms,
encoder tensors included (the decoder skips them); Wan 2.1 and a held-out Wan 2.2 config.
"""

import numpy as np
import pytest

from tests.helpers.wan_reference import PARITY_TOL, WAN22_SMALL, perturbed_diffusers_vae
from vaeserve import models

# A held-out Wan 2.2 config (not the fixtures'): two res blocks, time upsampling in stages 0 and 2.
WAN22_HELD_OUT = {**WAN22_SMALL, "decoder_base_dim": 16, "num_res_blocks": 2, "temperal_downsample": [True, False, True]}


torch = pytest.importorskip("torch", reason="live parity needs torch")
diffusers = pytest.importorskip("diffusers", reason="live parity needs diffusers")


@pytest.mark.parametrize(
    "overrides,shape,shard",
    [({"base_dim": 8, "num_res_blocks": 1}, (2, 16, 2, 3, 5), None),
     ({"base_dim": 12, "num_res_blocks": 2}, (1, 16, 5, 5, 3), "40KB"),
     (WAN22_HELD_OUT, (1, 48, 3, 3, 5), "200KB")],
    ids=["save_pretrained", "sharded-index", "wan22-full-checkpoint"],
)
def test_live_diffusers_save_pretrained(tmp_path, overrides, shape, shard):
    reference = perturbed_diffusers_vae(overrides, seed=7)
    kwargs = {"max_shard_size": shard} if shard else {}
    reference.save_pretrained(tmp_path, safe_serialization=True, **kwargs)
    if shard:
        assert (tmp_path / "diffusion_pytorch_model.safetensors.index.json").is_file()
    latents = torch.randn(shape, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = reference.decode(latents).sample.numpy()
    got = np.asarray(models.load_vae(tmp_path).decode(latents.numpy()))
    assert np.abs(got - want).max() <= PARITY_TOL
