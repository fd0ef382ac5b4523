"""An image VAE loads in the models and sharding APIs but is not served yet: start-up refuses it
with a message (the server exits 3) instead of answering its requests as a video model's."""

import pytest

import models
from service.engine.errors import StartupRefused
from service.engine.startup import load_model
from service.settings import Settings
from tests.helpers.image_reference import KL_SHARD


def test_an_image_model_is_refused_at_start_up():
    with pytest.raises(StartupRefused, match="AutoencoderKL is an image VAE"):
        load_model(Settings(), vae=models.init_vae(KL_SHARD, encoder=False))
    video = models.init_vae(models.WanVAEConfig(base_dim=8, num_res_blocks=1), encoder=False)
    assert load_model(Settings(), vae=video).vae is video  # the check refuses image models only
