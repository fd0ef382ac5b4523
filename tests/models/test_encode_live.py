"""Live encoder parity against diffusers itself: a checkpoint from diffusers' own ``save_pretrained``
(encoder tensors included) loads, and the posterior mean matches ≤ 2e-5 (``PARITY_TOL``; needs torch
and diffusers). Wan 2.1 and Wan 2.2 (a small config laid out as the real one: time downsampling in stages 1, 2)."""

import numpy as np
import pytest

from tests.helpers.wan_reference import PARITY_TOL, perturbed_diffusers_vae
from vaeserve import models

WAN22 = {**models.WanVAEConfig.wan22(base_dim=8, decoder_base_dim=8, num_res_blocks=1).to_dict(),
         "latents_mean": [0.0] * 48, "latents_std": [1.0] * 48}
del WAN22["_class_name"]


torch = pytest.importorskip("torch", reason="live parity needs torch")
diffusers = pytest.importorskip("diffusers", reason="live parity needs diffusers")


@pytest.mark.parametrize("overrides, shape, latent_shape", [
    ({"base_dim": 8, "num_res_blocks": 1}, (2, 3, 5, 24, 40), (2, 16, 2, 3, 5)),
    (WAN22, (1, 3, 5, 48, 16), (1, 48, 2, 3, 1)),
], ids=["wan21", "wan22"])
def test_live_diffusers_encode(tmp_path, overrides, shape, latent_shape):
    reference = perturbed_diffusers_vae(overrides, seed=11)
    reference.save_pretrained(tmp_path, safe_serialization=True)
    frames = torch.rand(shape, generator=torch.Generator().manual_seed(5)) * 2 - 1
    with torch.no_grad():
        posterior = reference.encode(frames).latent_dist
    vae = models.load_vae(tmp_path)
    assert vae.has_encoder
    got = np.asarray(vae.encode(frames.numpy()))
    want = posterior.mode().numpy()
    assert got.shape == want.shape == latent_shape
    assert np.abs(got - want).max() <= PARITY_TOL
    assert want.std() > 0.05
