"""``vaeserve plan`` for MiniMax-H3, whose decode is its own tiled program (no frame steps, no
bands): its frame counts (its chunks': not ``1 + 4k``), and a plan compiled from the family's program for a TPU
slice (libtpu, no TPU) whose bytes are those of the program a server compiles on that mesh; a
shipped row of the real model answered from the table, its program found unchanged."""

from __future__ import annotations

import json
import math
import re

import pytest

from tests.sharding.test_tpu_aot import _require_libtpu
from vaeserve import models, sharding
from vaeserve.models.families.minimax_h3.config import AutoencoderKLMiniMaxH3Config
from vaeserve.models.families.minimax_h3.programs import work_pieces
from vaeserve.models.flops import decode_flops
from vaeserve.service import cli
from vaeserve.sharding import planner
from vaeserve.sharding.chips import topology_devices
from vaeserve.sharding.fits import program_total_bytes
from vaeserve.sharding.introspect import program_memory
from vaeserve.sharding.plan_table import lookup
from vaeserve.sharding.planner import PlanError, latent_shape_for_video, plan_decode, video_for_latents

H3 = AutoencoderKLMiniMaxH3Config()
TINY = AutoencoderKLMiniMaxH3Config.tiny()
TOPOLOGY = "v5e:2x2"


@pytest.mark.parametrize("video, latents", [
    ((1280, 720, 209), (24, 62, 45, 80)),
    ((1344, 768, 209), (24, 62, 48, 84)),
    ((1280, 720, 22), (24, 7, 45, 80)),
])
def test_h3_videos_to_latents_and_back(video, latents):
    assert latent_shape_for_video(H3, *video) == latents
    assert video_for_latents(H3, latents) == video


@pytest.mark.parametrize("video, message", [
    ((1280, 720, 208), "makes no video of that many frames: expected [205, 209], received 208"),
    ((1280, 720, 37), "expected [35, 39], received 37"),  # Wan's 1 + 4k is not H3's
    ((1288, 720, 209), "the width must be a multiple of 16: expected [1280, 1296], received 1288"),
])
def test_h3_refuses_frame_counts_its_decode_does_not_make(video, message):
    with pytest.raises(PlanError, match=re.escape(message)):
        latent_shape_for_video(H3, *video)


def test_plan_cli_refuses_h3_frames_before_compiling(capsys):
    assert cli.main(["plan", "--topology", "v6e-8", "--model", "minimax-h3", "--video", "1280x720x37"]) == 2
    assert "expected [35, 39], received 37" in capsys.readouterr().err


def test_h3_plan_is_the_served_program_spread_over_the_devices():
    """tp = 1 and an uneven 3: each mesh's bytes equal memory_analysis() of ``compile_decode``'s
    program on the same abstract devices, its FLOPs the busiest device's share of the tiles."""
    _require_libtpu()
    vae = models.abstract_vae(TINY)
    latents = (4, 12, 6, 8)  # 2 chunks of 2x3 tiles: 12 tiles
    devices = topology_devices(TOPOLOGY)
    plan = plan_decode(vae, latents, devices, topology=TOPOLOGY, tps=(1, 3))
    pieces = work_pieces((1, *latents), TINY)
    assert pieces == 12
    for mesh in plan.meshes:
        compiled = sharding.compile_decode(vae, (1, *latents), sharding.make_mesh(mesh.tp, devices=devices),
                                           output="uint8")
        assert (mesh.split, mesh.halo_bytes) == ("tiles", None)
        assert mesh.total_bytes == program_total_bytes(program_memory(compiled)), mesh
        share = math.ceil(pieces / mesh.tp) / pieces
        assert mesh.flops == pytest.approx(decode_flops(TINY, (1, *latents)) * share)
    assert json.loads(json.dumps(plan.to_dict()))["meshes"][1]["tp"] == 3


def test_h3_rows_are_answered_from_the_table_fresh(monkeypatch, capsys):
    """The shipped 1344x768 x 209 row on v6e-8 at tp = 8: answered without a compile, its program
    lowered here (the real model, abstract weights: a few seconds) and found the same."""
    _require_libtpu()
    monkeypatch.setattr(planner, "plan_mesh", lambda *args, **kwargs: pytest.fail("compiled: the table answers"))
    assert cli.main(["plan", "--topology", "v6e-8", "--model", "minimax-h3", "--video", "1344x768x209",
                     "--dtype", "bfloat16", "--tp", "8", "--json"]) == 0
    (mesh,) = json.loads(capsys.readouterr().out)["meshes"]
    row = lookup("minimax-h3", "1344x768x209", "v6e-8", "bfloat16", 8)
    assert row is not None and (mesh["source"], mesh["split"], mesh["total_bytes"]) == ("table", "tiles",
                                                                                          row["total_bytes"])
    assert mesh["stale"] is None, f"recompile it: python -m bench.plan_table --recompile --only " \
                                  f"minimax-h3:1344x768x209:v6e-8:bfloat16:8 ({mesh['stale']})"
