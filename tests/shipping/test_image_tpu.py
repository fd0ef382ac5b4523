"""The tpu image: it builds, carries the TPU compiler (libtpu), and ``vaeserve plan`` inside it
compiles a tiny model's sharded decode for a v5e slice (abstract devices: no TPU here). Slow (a
build with libtpu, a TPU compile): ``make test-images`` runs it."""

from __future__ import annotations

import json

import pytest

from tests.helpers.image_helpers import container

pytestmark = pytest.mark.image


def test_plan_compiles_for_a_v5e_slice_inside_the_image(tpu_image, tiny_model_dir):
    config = tpu_image.config()
    assert config["User"] not in ("", "root", "0") and config["Cmd"] == ["vaeserve", "serve"]
    with container(tpu_image, volumes={str(tiny_model_dir): "/models/tiny:ro"}) as box:
        done = box.run("vaeserve", "plan", "--topology", "v5e:2x2", "--model", "/models/tiny", "--shape", "16x2x4x4",
                       "--tp", "2", "--json", timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    plan = json.loads(done.stdout)
    assert plan["chip"]["name"] == "v5e" and plan["devices"] == 4
    assert plan["model"]["config"]["base_dim"] == 8  # the mounted model's config, not the default's
    (mesh,) = plan["meshes"]
    assert mesh["tp"] == 2 and mesh["fits"] and mesh["refused"] is None
    # Compiled by libtpu for two chips: the halo exchange is in the program, bytes are counted.
    assert mesh["collectives"]["collective-permute"]["count"] > 0 and mesh["total_bytes"] > 0
