"""The decode compiled for a real TPU slice, on this CPU host: libtpu's compiler, abstract devices.

`v5e:2x2` (four compile-only "TPU v5 lite" devices), the tiny model, latents (1, 16, 3, 16, 16)
→ 9 frames of 128x128. Three TPU compiles in all, shared by every test here: tp = 1 and tp = 4 in
this process, and tp = 4 again inside a real `vaeserve plan --json` process that starts first and
compiles while this one does. Nothing runs on a TPU; what is checked is the compiled program:
native convolutions (not the CPU's nine-tap matmul), per-device temp memory, the collectives, and
that the planner reports exactly what `memory_analysis()` says about the same program. Real
processes also show that Ctrl-C stops `vaeserve plan` in the middle of a compile, and that neither
it nor the Python API's planning prints libtpu's errors about the TPU hosts it cannot find.
"""

import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.service_helpers import wait_until
from tests.helpers.sharding_helpers import assert_halo_collectives, assert_memory_split_over_tp
from vaeserve import models, sharding
from vaeserve.service import cli
from vaeserve.sharding.chips import LIBTPU_WITHOUT_TPU, topology_devices
from vaeserve.sharding.introspect import collectives, conv_ops, program_memory
from vaeserve.sharding.planner import device_flops

TOPOLOGY = "v5e:2x2"
SHAPE = (1, 16, 3, 16, 16)
REPO = Path(__file__).resolve().parents[2]
# Three TPU compiles take ~3 min of this host alone; under a shared machine's load, much longer.
pytestmark = pytest.mark.timeout(2400)
# What libtpu prints on a host without a TPU unless it is told it is one worker.
LIBTPU_NOISE = ("unexpected worker hostname", "INVALID_ARGUMENT", "Failed to find host bounds")
PLAN_FIELDS = {"tp", "dp", "split", "argument_bytes", "output_bytes", "temp_bytes", "code_bytes", "total_bytes",
               "hbm_bytes", "fits", "flops", "bytes_accessed", "halo_bytes", "compile_s", "bound_s"}


def _require_libtpu() -> None:
    """Skip without libtpu, saying how to get it; fail instead under ``make test``, which installs it
    (and sets ``VAESERVE_TEST_REQUIRE_LIBTPU=1``): there a missing compiler is a broken install."""
    if importlib.util.find_spec("libtpu") is not None:
        return
    if os.environ.get("VAESERVE_TEST_REQUIRE_LIBTPU") == "1":
        pytest.fail("libtpu is missing: install the aot extra (pip install -e '.[aot]'; `make test` does)")
    if sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64"):
        pytest.skip("libtpu is not installed: pip install -e '.[aot]' (`make test` does) for the TPU compiler")
    pytest.skip(f"libtpu has no wheel for {sys.platform}/{platform.machine()}: no TPU compiler here")


def user_env() -> dict[str, str]:
    """This environment as a user's shell has it: without what planning in this process set for
    libtpu (a child would inherit it and pass whatever the code does)."""
    return {name: value for name, value in os.environ.items() if name not in LIBTPU_WITHOUT_TPU} | {
        "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module")
def tiny_model_dir(vae, tmp_path_factory) -> Path:
    return models.save_vae(vae, tmp_path_factory.mktemp("tiny-vae"))


def plan_command(model_dir: Path, tp: int) -> list[str]:
    return [sys.executable, "-m", "vaeserve", "plan", "--topology", TOPOLOGY, "--shape", "x".join(map(str, SHAPE[1:])),
            "--model", str(model_dir), "--tp", str(tp), "--json"]


@pytest.fixture(scope="module")
def plan_process(tiny_model_dir):
    """`vaeserve plan --json` for tp = 4, started before the in-process compiles (they overlap)."""
    _require_libtpu()
    env, command = user_env(), plan_command(tiny_model_dir, 4)
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    yield process
    if process.poll() is None:
        process.kill()
        process.communicate()


@pytest.fixture(scope="module")
def programs(plan_process, vae):
    devices = topology_devices(TOPOLOGY)
    assert [d.device_kind for d in devices] == ["TPU v5 lite"] * 4
    return {tp: sharding.compile_decode(vae, SHAPE, sharding.make_mesh(tp, devices=devices), output="uint8")
            for tp in (4, 1)}


@pytest.fixture(scope="module")
def plan(plan_process):
    out, err = plan_process.communicate(timeout=900)
    assert plan_process.returncode == 0, err[-3000:]
    assert not any(noise in err for noise in LIBTPU_NOISE), err
    return json.loads(out)


def test_tpu_program_uses_native_convolutions(programs, vae):
    for tp, compiled in programs.items():
        ops = conv_ops(compiled.as_text())
        assert ops["tap_matmul"] == 0, (tp, ops)
        assert ops["convolution"] >= 50, (tp, ops)  # 25 convs per step, frame 0 and the scan body
    # Negative control: the same decode compiled for this host's CPU with the nine-tap convs
    # (cpu_convs="matmul") takes the matmul path, and the same check sees it.
    nine_tap = models.abstract_vae(vae.config)
    nine_tap.cpu_convs = "matmul"
    cpu = conv_ops(sharding.compile_decode(nine_tap, SHAPE, sharding.make_mesh(4), output="uint8").as_text())
    assert cpu["convolution"] == 0 and cpu["tap_matmul"] >= 50, cpu


def test_temp_memory_per_device_shrinks_with_tp(programs):
    assert_memory_split_over_tp(programs, 4, temp_at_most=0.4)


def test_tpu_collectives_are_one_row_halos_and_latent_kv(programs, vae):
    assert collectives(programs[1].as_text()) == []
    permutes = assert_halo_collectives(collectives(programs[4].as_text()), SHAPE[3:])
    assert len(permutes) == 100  # 25 convs x 2 directions x (frame 0 + scan body)
    traced = sharding.halo_bytes(vae, SHAPE, 4, split="height")
    assert sum(c["bytes"] for c in permutes) == traced["first_per_device"] + traced["next_per_device"]


def test_plan_json_is_the_compiled_program(plan, programs, vae):
    assert plan["topology"] == TOPOLOGY and plan["chip"]["name"] == "v5e" and plan["devices"] == 4
    (mesh,) = plan["meshes"]
    assert PLAN_FIELDS <= set(mesh), PLAN_FIELDS - set(mesh)
    memory = program_memory(programs[4])
    for field in ("argument_bytes", "output_bytes", "temp_bytes", "code_bytes"):
        assert mesh[field] == memory[field], (field, mesh[field], memory[field])
    assert mesh["total_bytes"] == sum(memory[f] for f in ("argument_bytes", "output_bytes", "temp_bytes", "code_bytes"))
    assert (mesh["tp"], mesh["dp"], mesh["split"]) == (4, 1, "height")
    assert mesh["hbm_bytes"] == 16 * 10**9 and mesh["fits"] is True
    assert mesh["flops"] == pytest.approx(device_flops(vae.config, SHAPE, 4, 1, "height", 4))
    assert mesh["bytes_accessed"] > 0 and mesh["compile_s"] > 0
    assert mesh["bound_s"] >= mesh["flops"] / plan["chip"]["peak_bf16_flops"]
    traced = sharding.halo_bytes(vae, SHAPE, 4, split="height")
    assert mesh["halo_bytes"] == traced["first_per_device"] + (SHAPE[2] - 1) * traced["next_per_device"]
    assert mesh["collectives"]["collective-permute"]["count"] == 100
    assert plan["recommendation"]["tp"] == 4 and plan["recommendation"]["dp"] == 1


def test_plan_reports_meshes_the_compiler_refuses_as_rows_that_do_not_fit(vae, tmp_path, capsys):
    """libtpu refuses a program past the chip's HBM while compiling (in seconds): `vaeserve plan`
    answers with that row (the bytes the compiler names), goes on to the next tp, and exits 0."""
    _require_libtpu()
    model_dir = models.save_vae(vae, tmp_path / "tiny-vae")
    code = cli.main(["plan", "--topology", TOPOLOGY, "--shape", "16x1x768x768", "--model", str(model_dir),
                     "--tp", "1,2", "--json"])
    assert code == 0
    plan = json.loads(capsys.readouterr().out)
    tp1, tp2 = plan["meshes"]
    for mesh in (tp1, tp2):
        assert mesh["fits"] is False
        # libtpu 0.0.50 puts an error code between the two ("RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: ...").
        assert mesh["refused"].startswith("RESOURCE_EXHAUSTED:") and "Ran out of memory on HBM" in mesh["refused"]
        assert mesh["total_bytes"] == mesh["temp_bytes"] > 16 * 10**9  # the compiler's figure (GiB)
    assert (tp1["tp"], tp2["tp"]) == (1, 2) and tp2["total_bytes"] < tp1["total_bytes"]
    assert plan["recommendation"]["tp"] is None and "no candidate fits" in plan["recommendation"]["reason"]


def _hops(devices) -> list[int]:
    """Chip-to-chip distance (torus coordinates, no wrap-around) between consecutive devices."""
    coords = [tuple(device.coords) for device in devices]
    return [sum(abs(a - b) for a, b in zip(c, d, strict=True)) for c, d in zip(coords, coords[1:], strict=False)]


@pytest.mark.parametrize("topology, tp", [("v5e:4x4", 16), ("v5e:2x2", 4), ("v5e:2x4", 4)])
def test_neighbouring_bands_sit_on_neighbouring_chips(topology, tp):
    """Each band exchanges halos with the next one only: `make_mesh` lays tp ranks on the torus so
    that they are physical neighbours (one hop). Negative control: the devices in id order are not."""
    _require_libtpu()
    devices = topology_devices(topology)
    assert _hops(sharding.make_mesh(tp, devices=devices).devices.flat) == [1] * (tp - 1)
    assert max(_hops(devices[:tp])) > 1


def _cpu_seconds(pid: int) -> float:
    """CPU time (user + system, every thread) of a running process, from ``/proc``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_ctrl_c_stops_a_plan_in_the_middle_of_a_compile(tiny_model_dir, tmp_path):
    """XLA compiles in C++, where Python's SIGINT handler cannot run: `vaeserve plan` compiles in a
    worker thread and its main thread leaves at Ctrl-C within 2 s (asserted with 8 s to spare for a
    loaded machine; the compile itself takes a minute and more)."""
    _require_libtpu()
    log = tmp_path / "stderr.txt"
    with log.open("w") as stderr:
        process = subprocess.Popen(plan_command(tiny_model_dir, 1), cwd=REPO, env=user_env(), stdout=subprocess.PIPE,
                                   stderr=stderr, text=True)
    try:
        wait_until(lambda: "compiling tp=1" in log.read_text() or process.poll() is not None, "the compile's start")
        started = _cpu_seconds(process.pid)
        # Lowering the tiny decode takes a fraction of a second: 3 CPU-seconds later XLA is compiling.
        wait_until(lambda: process.poll() is not None or _cpu_seconds(process.pid) > started + 3, "XLA compiling")
        assert process.poll() is None, log.read_text()  # still compiling when the signal lands
        sent = time.monotonic()
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)
        waited = time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    err = log.read_text()
    assert process.returncode == 130 and "vaeserve plan: interrupted" in err, err
    assert waited < 2 + 8, f"exited {waited:.1f} s after SIGINT"
    assert process.stdout is not None and process.stdout.read() == ""  # no plan: it was interrupted
    assert not any(noise in err for noise in LIBTPU_NOISE), err


PYTHON_API = """
from vaeserve import models, sharding

vae = models.abstract_vae(models.load_config("wan2.1"), dtype="bfloat16")
devices = sharding.topology_devices("v6e-8")
print(len(devices), devices[0].device_kind)
"""

BARE_LIBTPU = """
import os
os.environ.update(TPU_SKIP_MDS_QUERY="1", ALLOW_MULTIPLE_LIBTPU_LOAD="1")  # as topology_devices sets them
from jax.experimental import topologies

print(len(topologies.get_topology_desc(platform="tpu", topology_name="v6e:2x4").devices))
"""


def test_planning_from_python_prints_no_libtpu_errors():
    """The Python API's planning (docs/planning.md) as a user runs it, JAX_PLATFORMS unset: libtpu
    is told this host is one worker, and prints nothing. Control: libtpu loaded the same way
    without vaeserve prints its errors about the TPU hosts it cannot find."""
    _require_libtpu()
    env = {name: value for name, value in user_env().items() if name != "JAX_PLATFORMS"}
    ours = subprocess.run([sys.executable, "-c", PYTHON_API], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert ours.returncode == 0 and ours.stdout == "8 TPU v6 lite\n", ours.stderr
    assert not any(noise in ours.stderr for noise in LIBTPU_NOISE), ours.stderr
    bare = subprocess.run([sys.executable, "-c", BARE_LIBTPU], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert bare.returncode == 0 and bare.stdout == "8\n", bare.stderr
    assert all(noise in bare.stderr for noise in LIBTPU_NOISE), bare.stderr
