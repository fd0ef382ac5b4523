"""Start-up within the memory: a model whose weights cannot be loaded in the memory this process may
use is refused before a weight is drawn or read (a clear message, exit status 3), never killed by
the kernel; half-written copies of the embedded weights left by a killed start are cleaned."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.service_helpers import REPO, free_port
from vaeserve.models.loading import remove_abandoned_partials
from vaeserve.models.registry import EMBEDDED
from vaeserve.models.vae import parameter_count
from vaeserve.service.engine.errors import StartupRefused
from vaeserve.service.engine.memory import Machine, check_weights_fit, weights_load_bytes

EIGHT_GB = Machine(8 * 2**30, "cgroup memory.limit_in_bytes")


def test_ltx_videos_weights_are_refused_in_8_gb_and_wans_fit():
    """LTX-Video 0.9.5's VAE (1.25 G parameters: 5 GB in float32, drawn and written: about 10 GB at
    the peak) cannot start in 8 GB; Wan 2.1's (127 M) can (the control)."""
    ltx = parameter_count(EMBEDDED["ltx-video"].config())
    assert 1.2e9 < ltx < 1.3e9 and weights_load_bytes(ltx) > EIGHT_GB.bytes
    with pytest.raises(StartupRefused, match=r"1247 M parameters: loading them holds about 9.98 GB .* refused before"):
        check_weights_fit(ltx, what="the model 'ltx-video'", machine=EIGHT_GB, in_use=2**30)
    check_weights_fit(parameter_count(EMBEDDED["wan2.1"].config()), what="wan2.1", machine=EIGHT_GB, in_use=2**30)


def test_abandoned_partials_are_removed_and_a_live_writers_kept(tmp_path):
    folder = tmp_path / "ltx-video-random-weights-seed0"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    abandoned = tmp_path / f".{folder.name}.{dead.pid}.partial"
    writing = tmp_path / f".{folder.name}.{os.getpid()}.partial"
    for partial in (abandoned, writing):
        partial.mkdir()
        (partial / "config.json").write_text("{}")
    assert remove_abandoned_partials(folder) == [abandoned]
    assert not abandoned.exists() and writing.exists()


def memory_cgroup(limit: int) -> Path | None:
    """A child of this process's cgroup v1 memory cgroup limited to ``limit`` bytes, or None where
    none can be made (no v1 memory controller, or not allowed)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        ours = next(line.split(":", 2)[2] for line in lines if line.split(":", 2)[1] == "memory")
        group = Path("/sys/fs/cgroup/memory") / ours.lstrip("/") / f"vaeserve-test-{os.getpid()}"
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(limit))
        return group
    except (OSError, StopIteration):
        return None


@pytest.mark.parametrize(("served", "said"), [
    (["ltx-video"], "1247 M parameters"),
    # Each fits alone (Wan 2.2's 705 M: 5.6 GB at its peak); together they do not.
    (["wan2.2", "hunyuan1.0", "wan2.1"], "1078 M parameters together")])
def test_a_server_refuses_to_start_models_its_cgroup_cannot_hold(tmp_path, served, said):
    """``vaeserve serve --model ltx-video`` (or three models that fit only alone) in a 6 GB memory
    cgroup: exit status 3 within seconds, the reason in its log, no weights drawn and nothing left in
    the weights cache."""
    group = memory_cgroup(6 * 2**30)
    if group is None:
        pytest.skip("no cgroup v1 memory controller this process may write")
    cache = tmp_path / "weights"
    command = [sys.executable, "-m", "vaeserve", "serve", *[flag for name in served for flag in ("--model", name)],
               "--port", str(free_port()), "--embedded-weights-cache", str(cache)]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    try:
        start = time.monotonic()
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())))
        log, _ = process.communicate(timeout=240)
        seconds = time.monotonic() - start
    finally:
        group.rmdir()
    assert process.returncode == 3, log[-3000:]
    assert "machine 6.44 GB (cgroup memory.limit_in_bytes)" in log or "6.44 GB" in log, log[-3000:]
    assert "refused before loading" in log and said in log and seconds < 120
    assert not cache.exists() or not any(cache.iterdir())


def test_several_models_weights_are_checked_together():
    """Two models that each fit alone are refused together: those loaded stay while the next loads
    (each model's weights once, the largest's second copy at the peak)."""
    wan = parameter_count(EMBEDDED["wan2.1"].config())
    machine = Machine(int(1.4 * weights_load_bytes(wan)), "MemTotal")
    check_weights_fit(wan, what="wan2.1", machine=machine, in_use=0)
    assert weights_load_bytes(wan, wan) == 3 * 4 * wan
    with pytest.raises(StartupRefused, match=r"the models 'a', 'b' have 254 M parameters together: .* refused"):
        check_weights_fit([wan, wan], what="the models 'a', 'b'", machine=machine, in_use=0)
