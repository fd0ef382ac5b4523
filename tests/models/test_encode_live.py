"""Live encoder parity against diffusers itself: a checkpoint from diffusers' own ``save_pretrained``
(encoder tensors included) loads, and the posterior mean matches ≤ 1e-4 (needs torch + diffusers)."""

import numpy as np
import pytest

import models
from tests.helpers.wan_reference import perturbed_diffusers_vae

PARITY_TOL = 1e-4

torch = pytest.importorskip("torch", reason="live parity needs torch")
diffusers = pytest.importorskip("diffusers", reason="live parity needs diffusers")


def test_live_diffusers_encode(tmp_path):
    reference = perturbed_diffusers_vae({"base_dim": 8, "num_res_blocks": 1}, seed=11)
    reference.save_pretrained(tmp_path, safe_serialization=True)
    frames = torch.rand((2, 3, 5, 24, 40), generator=torch.Generator().manual_seed(5)) * 2 - 1
    with torch.no_grad():
        posterior = reference.encode(frames).latent_dist
    vae = models.load_vae(tmp_path)
    assert vae.has_encoder
    got = np.asarray(vae.encode(frames.numpy()))
    want = posterior.mode().numpy()
    assert got.shape == want.shape == (2, 16, 2, 3, 5)
    assert np.abs(got - want).max() <= PARITY_TOL
    assert want.std() > 0.05
