"""Fixtures shared by the multi-host tests: the single-process references and the saved model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import models
import sharding
from service.engine.runner import encode_rows
from tests.helpers.slice_process import micro_encoder_vae, micro_vae, slice_frames, slice_latents


@pytest.fixture(scope="session")
def references():
    """The single-process decodes of ``slice_latents()`` with the MICRO model (this pytest process
    has 8 CPU devices): tp = 4 (uint8, float, stream) and tp = 2 x dp = 2 (float); and the tp = 4
    encode of ``slice_frames()``."""
    vae = micro_vae()
    z = slice_latents()
    tp4, tp2dp2 = sharding.make_mesh(4), sharding.make_mesh(2, dp=2)
    frames, requests = slice_frames()
    options = encode_rows(requests, len(frames))
    return {
        "tp4_encode": sharding.to_host(sharding.sharded_encode(micro_encoder_vae(), frames, tp4, options=options)),
        "tp4_uint8": sharding.to_host(sharding.sharded_decode(vae, z, tp4, output="uint8")),
        "tp4_float": sharding.to_host(sharding.sharded_decode(vae, z, tp4, output="float")),
        "tp4_stream": np.concatenate([step.frames for step in sharding.sharded_decode_stream(vae, z, tp4)], axis=1),
        "tp2dp2_float": sharding.to_host(sharding.sharded_decode(vae, z, tp2dp2, output="float")),
    }


@pytest.fixture(scope="session")
def micro_model_dir(tmp_path_factory) -> Path:
    """The MICRO model as a diffusers-format folder, for ``vaeserve serve --model``."""
    return models.save_vae(micro_vae(), tmp_path_factory.mktemp("micro-vae"))
