"""Every LTX decoder starts like any video model: one that takes a timestep (0.9.1 and later) or
injects noise too, its conditions request parameters (served, warmed up and batched in
``tests/service/http/test_serving_ltx.py``)."""

from tests.helpers.ltx_reference import LTX090, LTX2_SHARD
from vaeserve import models
from vaeserve.service.engine.startup import load_model
from vaeserve.service.settings import Settings


def test_decoders_with_and_without_conditions_start():
    conditioned = models.init_vae(LTX2_SHARD, encoder=False)
    assert conditioned.config.decode_conditions
    assert load_model(Settings(), vae=conditioned).vae is conditioned
    plain = models.init_vae(LTX090, encoder=False)
    assert not plain.config.decode_conditions
    assert load_model(Settings(), vae=plain).vae is plain
