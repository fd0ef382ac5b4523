"""Live float32 parity against diffusers itself (needs torch + diffusers; `make test` installs both).

Checkpoints come from diffusers' own ``save_pretrained``, single-file and sharded-index forms.
"""

import numpy as np
import pytest

import models
from wan_reference import perturbed_diffusers_vae

PARITY_TOL = 1e-4

torch = pytest.importorskip("torch", reason="live parity needs torch")
diffusers = pytest.importorskip("diffusers", reason="live parity needs diffusers")


@pytest.mark.parametrize(
    "overrides,shape,shard",
    [({"base_dim": 8, "num_res_blocks": 1}, (2, 16, 2, 3, 5), None),
     ({"base_dim": 12, "num_res_blocks": 2}, (1, 16, 5, 5, 3), "40KB")],
    ids=["save_pretrained", "sharded-index"],
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
