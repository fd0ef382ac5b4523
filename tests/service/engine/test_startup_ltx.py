"""An LTX decoder that takes a timestep (0.9.1 and later) or injects noise loads in the models and
sharding APIs but is not served yet (requests cannot give its timestep and seed): start-up refuses
it with a message. One that takes neither (LTX-Video 0.9.0, LTX-2) starts like any video model."""

import pytest

import models
from service.engine.errors import StartupRefused
from service.engine.startup import load_model
from service.settings import Settings
from tests.helpers.ltx_reference import LTX090, LTX2_SHARD


def test_a_decoder_that_takes_a_timestep_is_refused_at_start_up():
    with pytest.raises(StartupRefused, match="timestep-conditioned or injects noise"):
        load_model(Settings(), vae=models.init_vae(LTX2_SHARD, encoder=False))
    plain = models.init_vae(LTX090, encoder=False)
    assert load_model(Settings(), vae=plain).vae is plain
