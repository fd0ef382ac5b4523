"""The decode compiled for absent NVIDIA GPUs, on this CPU host: XLA's CUDA compiler, a GPU described
by ``sharding.chips.gpu_target_config``, no GPU and no driver.

Needs the CUDA plugin (``pip install "vaeserve[cuda]"``, about 5.5 GB of CUDA wheels), which
``make test`` does not install: here the tests skip, saying so. Where it is installed, four
compiles of the tiny model (a few seconds each): tp = 1 and tp = 4 on `h100-4`, and tp = 4 again
inside ``plan_decode``, and two more at tp = 1 in bfloat16 and float32. The same checks as the TPU
program's: cuDNN convolutions and no nine-tap matmul, per-device temp memory, one-row
collective-permutes, and the planner's numbers; and cuDNN's bfloat16 kernels for a bfloat16 decode.
"""

import re

import pytest

from tests.helpers.sharding_helpers import (
    assert_halo_collectives,
    assert_memory_split_over_tp,
    cuda_compiler_installed,
)
from vaeserve import models, sharding
from vaeserve.sharding.chips import topology_devices
from vaeserve.sharding.introspect import collectives, conv_ops, program_memory
from vaeserve.sharding.planner import plan_decode

TOPOLOGY = "h100-4"
SHAPE = (1, 16, 3, 16, 16)


pytestmark = pytest.mark.skipif(
    not cuda_compiler_installed(),
    reason="XLA's CUDA compiler is not installed (pip install 'vaeserve[cuda]', ≈ 5.5 GB; not in `make test`)")


@pytest.fixture(scope="module")
def devices():
    devices = topology_devices(TOPOLOGY)
    assert [d.device_kind for d in devices] == ["NVIDIA H100 80GB HBM3"] * 4
    assert {d.platform for d in devices} == {"gpu"}
    return devices


@pytest.fixture(scope="module")
def programs(vae, devices):
    return {tp: sharding.compile_decode(vae, SHAPE, sharding.make_mesh(tp, devices=devices), output="uint8")
            for tp in (4, 1)}


def test_gpu_program_uses_cudnn_convolutions(programs):
    for tp, compiled in programs.items():
        ops = conv_ops(compiled.as_text())
        assert ops["tap_matmul"] == 0, (tp, ops)
        assert ops["convolution"] >= 50, (tp, ops)  # 25 convs per step, frame 0 and the scan body


def test_temp_memory_per_device_shrinks_with_tp(programs):
    assert_memory_split_over_tp(programs, 4, temp_at_most=0.5)


def test_gpu_collectives_are_one_row_halos_and_latent_kv(programs):
    assert collectives(programs[1].as_text()) == []
    # K/V gathered at latent resolution: (H, W, C) here, the batch of one squeezed away by the GPU compiler.
    assert_halo_collectives(collectives(programs[4].as_text()), SHAPE[3:])


def test_plan_is_the_compiled_program(programs, vae, devices):
    fresh = models.abstract_vae(vae.config, dtype=vae.dtype)  # its own program cache: the plan compiles anew
    plan = plan_decode(fresh, SHAPE[1:], devices, topology=TOPOLOGY, tps=(4,)).to_dict()
    assert plan["chip"]["name"] == "h100" and plan["devices"] == 4 and plan["devices_per_chip"] == 1
    (mesh,) = plan["meshes"]
    memory = program_memory(programs[4])
    for field in ("argument_bytes", "output_bytes", "temp_bytes", "code_bytes"):
        assert mesh[field] == memory[field], (field, mesh[field], memory[field])
    assert mesh["hbm_bytes"] == 80 * 10**9 and mesh["fits"] is True
    assert plan["recommendation"]["tp"] == 4


def test_bfloat16_convolutions_stay_bfloat16(vae, devices):
    """cuDNN has no bfloat16 convolution with float32 sums: asked for one, XLA converts the operands
    to float32 and cuDNN convolves in TF32. Every cuDNN conv of the bfloat16 decode returns bfloat16
    (the float32 decode's, the control, float32)."""
    mesh = sharding.make_mesh(1, devices=devices[:1])
    for dtype, expected in (("bfloat16", "bf16"), ("float32", "f32")):
        program = sharding.compile_decode(models.abstract_vae(vae.config, dtype=dtype), SHAPE, mesh, output="uint8")
        types = re.findall(r'= \(?(\w+)\[[^\n]*custom_call_target="__cudnn\$conv', program.as_text())
        assert len(types) >= 50 and set(types) == {expected}, (dtype, sorted(set(types)), len(types))
