"""The planner's pure parts: video ↔ latent shapes, chip facts, recommendations, HLO parsing, the CLI's
refusals, and the serve-time memory guard on a real compiled CPU program (the one
``test_sharded_memory.py`` compiles). ``test_tpu_aot.py`` compiles for a TPU slice."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import pytest

from tests.helpers.sharding_helpers import cuda_compiler_installed
from vaeserve import models, sharding
from vaeserve.models.shapes import parse_shape_text
from vaeserve.service import cli
from vaeserve.service.cli.plan import meshes_to_compile
from vaeserve.sharding.chips import CHIPS, TopologyError, chip_facts, gpu_target_config, topology_devices, topology_name
from vaeserve.sharding.fits import WontFitError, check_fits, device_bytes_limit, program_total_bytes, what_would_fit
from vaeserve.sharding.introspect import collective_summary, collectives, conv_ops, program_memory
from vaeserve.sharding.planner import (
    MeshPlan,
    PlanError,
    latent_shape_for_video,
    plan_decode,
    recommend,
    video_for_latents,
)

WAN21 = models.WanVAEConfig()


@pytest.mark.parametrize("video, latents", [
    ((832, 480, 81), (16, 21, 60, 104)),
    ((1280, 720, 81), (16, 21, 90, 160)),
    ((1280, 720, 121), (16, 31, 90, 160)),
    ((1920, 1080, 81), (16, 21, 135, 240)),
    ((8, 8, 1), (16, 1, 1, 1)),
])
def test_video_to_latents_and_back(video, latents):
    assert latent_shape_for_video(WAN21, *video) == latents
    assert video_for_latents(WAN21, latents) == video


@pytest.mark.parametrize("video, message", [
    ((1280, 720, 80), "the frame count must be 1 + 4k: expected [77, 81], received 80"),
    ((1280, 720, 2), "expected [1, 5], received 2"),
    ((1281, 720, 81), "the width must be a multiple of 8: expected [1280, 1288], received 1281"),
    ((1280, 724, 81), "the height must be a multiple of 8: expected [720, 728], received 724"),
    ((1281, 724, 80), "the frame count must be 1 + 4k: expected [77, 81], received 80; the height must be a "
                      "multiple of 8: expected [720, 728], received 724; the width must be"),
])
def test_invalid_videos_name_the_nearest_valid_sizes(video, message):
    with pytest.raises(PlanError, match=re.escape(message)):
        latent_shape_for_video(WAN21, *video)


def test_shape_text():
    assert parse_shape_text("1280x720x81", 3, "video") == (1280, 720, 81)
    assert parse_shape_text(" 16 x 2×4,4 ", 4, "latents") == (16, 2, 4, 4)
    for bad in ("1280x720", "1280x720x0", "axbxc", "1280x720x81x1", "1280x720x-81", "1280x720x８１", "1280x720x"):
        with pytest.raises(ValueError, match="video must be 3 positive integers"):
            parse_shape_text(bad, 3, "video")


def test_chip_facts_and_slice_names():
    assert chip_facts("TPU v5 lite").name == "v5e" and chip_facts("TPU v6 lite").name == "v6e"
    assert chip_facts("TPU v5").name == "v5p" and chip_facts("TPU v4").name == "v4"
    assert topology_name("v6e-8") == "v6e:2x4" and topology_name("v5p-8") == "v5p:2x2x1"
    assert topology_name("v5e:4x4") == "v5e:4x4"
    assert chip_facts("NVIDIA H100 80GB HBM3").name == "h100" and chip_facts("NVIDIA H200 141GB HBM3e").name == "h200"
    assert topology_name("h100-8") == "1x1x8"
    with pytest.raises(TopologyError, match="no chip facts"):
        chip_facts("NVIDIA A100-SXM4-80GB")
    assert {c.name: c.platform for c in CHIPS} == {"v4": "tpu", "v5e": "tpu", "v5p": "tpu", "v6e": "tpu",
                                                   "h100": "cuda", "h200": "cuda"}
    assert all(c.hbm_bytes > 0 and c.peak_bf16_flops > 1e14 and c.hbm_bytes_per_s > 5e11 for c in CHIPS)


def test_gpu_description_carries_the_chip_facts():
    h200 = chip_facts("NVIDIA H200 141GB HBM3e")
    text = gpu_target_config(h200)
    assert "device_memory_size: 141000000000" in text and "memory_bandwidth: 4800000000000" in text
    assert 'device_description_str: "NVIDIA H200 141GB HBM3e"' in text  # what devices report as device_kind
    assert "cuda_compute_capability { major: 9 minor: 0 }" in text and 'platform_name: "CUDA"' in text
    assert "core_count: 132" in text and text.count("{") == text.count("}")


@pytest.mark.skipif(cuda_compiler_installed(), reason="the CUDA compiler is installed")
def test_gpu_topology_without_the_cuda_compiler_names_the_extra():
    with pytest.raises(TopologyError, match=r"GPU host 'h100-8'.*vaeserve\[cuda\]"):
        topology_devices("h100-8")


def test_conv_ops_counts_cudnn_convolutions_and_cublas_taps():
    hlo = """
  %cudnn-conv = (f32[1,18,18,32]{3,2,1,0}, u8[0]{0}) custom-call(%p, %w), custom_call_target="__cudnn$convForward", metadata={op_name="jit(run)/CausalConv3d/conv"}
  %gemm = (f32[64,32]{1,0}, s8[4]{0}) custom-call(%a, %b), custom_call_target="__cublas$gemm", metadata={op_name="jit(run)/CausalConv3d/tap"}
  %gemm.1 = (f32[64,32]{1,0}, s8[4]{0}) custom-call(%a, %b), custom_call_target="__cublas$gemm", metadata={op_name="jit(run)/AttentionBlock/qk"}
"""
    assert conv_ops(hlo) == {"convolution": 1, "tap_matmul": 1}


def _mesh(tp: int, total: int, usable: int = 100) -> MeshPlan:
    return MeshPlan(tp=tp, dp=1, split="width", argument_bytes=1, output_bytes=1, alias_bytes=0, temp_bytes=total - 2,
                    code_bytes=0, total_bytes=total, hbm_bytes=usable + 10, usable_bytes=usable, fits=total <= usable,
                    flops=1.0, cost_analysis_flops=1.0, bytes_accessed=1.0, halo_bytes=0, collectives={},
                    compile_s=1.0, bound_s=1.0)


def test_without_named_candidates_the_plan_stops_at_the_first_tp_that_fits(vae):
    """The table's meshes (``known``) answer; nothing is compiled (no devices are given). With
    ``first_fit`` the larger tps are skipped, saying why; named candidates are all planned."""
    known = {1: _mesh(1, 400), 2: _mesh(2, 90), 4: _mesh(4, 50), 8: _mesh(8, 30)}
    plan = plan_decode(vae, (16, 2, 8, 8), None, topology="v5e-8", known=known, first_fit=True)
    assert [m.tp for m in plan.meshes] == [1, 2] and plan.recommendation["tp"] == 2
    assert [(s["tp"], s["reason"]) for s in plan.skipped] == [
        (tp, "tp=2 fits: only the smallest tp that fits is planned unless the candidates are named") for tp in (4, 8)]
    every = plan_decode(vae, (16, 2, 8, 8), None, topology="v5e-8", known=known)
    assert [m.tp for m in every.meshes] == [1, 2, 4, 8] and every.skipped == []
    # What the CLI will compile: the tps the table lacks, none past one it says fits.
    assert meshes_to_compile([1, 2, 4, 8], {2: known[2]}, first_fit=True, devices=8, dp=1) == [1]
    assert meshes_to_compile([1, 2, 4, 8], {2: known[2]}, first_fit=False, devices=8, dp=1) == [1, 4, 8]
    assert meshes_to_compile([1, 2, 4, 8], {}, first_fit=True, devices=4, dp=2) == [1, 2]


def test_recommend_the_smallest_tp_that_fits_and_the_dp_left():
    rec = recommend([_mesh(1, 400), _mesh(2, 180), _mesh(4, 90), _mesh(8, 50)], devices=8)
    assert (rec["tp"], rec["dp"]) == (4, 2)
    assert "tp=4 is the smallest tp that fits" in rec["reason"]
    rec = recommend([_mesh(1, 400), _mesh(2, 180)], devices=8)
    assert rec["tp"] is None and "least per device is 0.00 GB at tp=2" in rec["reason"]


# Lines from the HLO libtpu compiled for v5e (tests/sharding/test_tpu_aot.py's program), shortened.
TPU_HLO = """
  %collective-permute-start = (f32[1,1,1,16,16]{3,4,2,1,0:T(8,128)S(1)}, f32[1,1,1,16,16]{3,4,2,1,0:T(8,128)S(1)}, u32[]{:S(2)}, u32[]{:S(2)}) collective-permute-start(%get-tuple-element.6373), channel_id=1, source_target_pairs={{1,0},{2,1},{3,2}}, metadata={op_name="jit(run)/shard_map/decode_step/ppermute"}
  %collective-permute-done = f32[1,1,1,16,16]{3,4,2,1,0:T(8,128)S(1)} collective-permute-done(%collective-permute-start), metadata={op_name="jit(run)/shard_map/decode_step/ppermute"}
  %all-gather.9 = f32[1,16,16,32]{3,2,0,1:T(8,128)} all-gather(%param_0.4607), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={1}, use_global_device_ids=true, frontend_attributes={chain_id="0"}
  ROOT %all-gather-start.2 = (bf16[1,4,16,32]{3,2,1,0}, bf16[1,16,16,32]{3,2,1,0}) all-gather-start(%p), dimensions={1}
  %cp.3 = f32[2,1,8,4]{3,2,1,0} collective-permute(%x), source_target_pairs={{0,1}}
"""


def test_collectives_parse_asynchronous_tpu_and_gpu_forms():
    found = collectives(TPU_HLO)
    assert [(c["op"], c["dtype"], c["shape"], c["bytes"]) for c in found] == [
        ("collective-permute", "f32", (1, 1, 1, 16, 16), 1024),  # the result of the start, once (not -done)
        ("all-gather", "f32", (1, 16, 16, 32), 32768),
        ("all-gather", "bf16", (1, 16, 16, 32), 16384),  # async: the gathered result, not the operand
        ("collective-permute", "f32", (2, 1, 8, 4), 256),
    ]
    assert collective_summary(found) == {"collective-permute": {"count": 2, "bytes": 1280},
                                         "all-gather": {"count": 2, "bytes": 49152}}


def test_plan_cli_refuses_invalid_frames_before_compiling(capsys):
    assert cli.main(["plan", "--topology", "v5e:2x4", "--video", "1280x720x80", "--json"]) == 2
    err = capsys.readouterr().err
    assert "the frame count must be 1 + 4k: expected [77, 81], received 80" in err


def test_plan_cli_refuses_wrong_latent_channels(capsys):
    assert cli.main(["plan", "--topology", "v5e:2x4", "--shape", "48x21x90x160"]) == 2
    assert "latent channels: expected 16, received 48" in capsys.readouterr().err


def test_load_config_reads_no_weights(vae, tmp_path):
    folder = models.save_vae(vae, tmp_path / "vae")
    (folder / "diffusion_pytorch_model.safetensors").write_bytes(b"not read")
    assert models.load_config(folder) == vae.config
    assert models.load_config("wan2.1") == models.load_config(None) == WAN21
    with pytest.raises(FileNotFoundError, match="nor a model name"):
        models.load_config(tmp_path / "missing")


def test_abstract_vae_has_the_shapes_of_the_real_one(vae):
    real, abstract = vae, models.abstract_vae(vae.config, dtype="bfloat16")
    assert abstract.metadata["parameters"] == real.metadata["parameters"]
    assert abstract.metadata["abstract"] is True
    real_shapes = [x.shape for x in jax.tree.leaves(real.state_avals())]
    abstract_avals = jax.tree.leaves(abstract.state_avals())
    assert [x.shape for x in abstract_avals] == real_shapes
    assert {x.dtype for x in abstract_avals} == {jnp.dtype(jnp.bfloat16)}


def test_mesh_plan_fields_are_the_documented_json_fields():
    fields = {f.name for f in dataclasses.fields(MeshPlan)}
    assert {"tp", "dp", "split", "argument_bytes", "output_bytes", "temp_bytes", "code_bytes", "total_bytes",
            "hbm_bytes", "fits", "flops", "bytes_accessed", "halo_bytes", "compile_s", "bound_s"} <= fields


def test_guard_passes_what_fits_and_refuses_what_does_not(vae):
    shape, mesh = (1, 16, 2, 32, 32), sharding.make_mesh(1)  # test_sharded_memory's tp = 1 program
    compiled = sharding.compile_decode(vae, shape, mesh, split="height")
    memory = program_memory(compiled)
    needed = program_total_bytes(memory)
    assert check_fits(compiled, shape=shape, mesh=mesh, limit=needed) == needed
    with pytest.raises(WontFitError) as refused:
        check_fits(compiled, shape=shape, mesh=mesh, limit=needed - 1, devices=8)
    message = str(refused.value)
    assert f"latents {shape} at tp=1, dp=1" in message and f"({needed} > {needed - 1} bytes)" in message
    assert "tp=2 would fit" in message and "--tp 2 --dp 4" in message
    fixed = memory["argument_bytes"] + memory["code_bytes"]
    with pytest.raises(WontFitError, match="no tp or batch on these devices fits"):
        check_fits(compiled, shape=shape, mesh=mesh, limit=fixed, devices=1)
    assert device_bytes_limit(mesh.devices.flat) is None  # CPU devices report no limit: no guard


def test_what_would_fit_suggests_a_smaller_batch_when_tp_cannot_grow():
    memory = {"argument_bytes": 100, "code_bytes": 0, "alias_bytes": 0, "temp_bytes": 300, "output_bytes": 100}
    # 4 latents per replica: 100 fixed + 100 per latent; 250 bytes hold 1 latent.
    hint = what_would_fit(memory, batch=4, tp=1, dp=1, devices=1, limit=250)
    assert hint.startswith("a batch of 1 per replica would fit") and "--max-batch 1" in hint
    assert "tp=4 would fit" in what_would_fit(memory, batch=4, tp=1, dp=1, devices=8, limit=250)
