"""A server of several models reads the warm-up and ``--shapes`` entries each as its own: those of
its latents (channels, and a video's CxTxHxW or an image's CxHxW) and frames; an entry no model
takes refuses the start."""

from __future__ import annotations

import pytest

from tests.helpers.image_reference import FLUX1_TINY
from tests.helpers.ltx_reference import LTX090
from tests.helpers.service_helpers import make_test_model, settings_for_tests
from vaeserve import models
from vaeserve.service.engine.errors import StartupRefused
from vaeserve.service.engine.startup import check_warmups_taken, own_warmups


@pytest.fixture(scope="module")
def served():
    return {"wan": make_test_model(), "ltx": models.init_vae(LTX090, seed=1, encoder=False),
            "flux1": models.init_vae(FLUX1_TINY, seed=2)}


def test_each_model_takes_the_entries_of_its_latents(served):
    settings = settings_for_tests(warmup=["16x2x4x4:uint8", "8x2x4x4", "16x4x6"], shapes=["16x2x4x4", "16x4x6"],
                                  encode_warmup=["3x5x32x32", "3x8x12"])
    own = {name: own_warmups(settings, vae) for name, vae in served.items()}
    assert {name: [str(w) for w in each.warmup] for name, each in own.items()} == {
        "wan": ["16x2x4x4:uint8"], "ltx": ["8x2x4x4:uint8,float,stream"], "flux1": ["16x4x6:uint8,float,stream"]}
    assert {name: each.shapes for name, each in own.items()} == {
        "wan": [(16, 2, 4, 4)], "ltx": [], "flux1": [(16, 4, 6)]}
    # A decode-only checkpoint warms up no encode.
    assert {name: each.encode_warmup for name, each in own.items()} == {
        "wan": [(3, 5, 32, 32)], "ltx": [], "flux1": [(3, 8, 12)]}
    check_warmups_taken(settings, list(own.values()))
    orphan = settings_for_tests(warmup=["48x2x4x4"])
    with pytest.raises(StartupRefused, match="48x2x4x4"):
        check_warmups_taken(orphan, [own_warmups(orphan, vae) for vae in served.values()])
