"""Start the processes of a test slice and wait for them, every wait bounded."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("slice_process.py")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def slice_env() -> dict[str, str]:
    """The test environment without the 8 fake devices tests/conftest.py asks for: every slice
    process fakes its own 2 (``jax_num_cpu_devices``)."""
    env = {key: value for key, value in os.environ.items() if key != "XLA_FLAGS"}
    return {**env, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}


@dataclass
class SliceProcess:
    process_id: int
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        """The exit code; a process still running after ``timeout`` is killed and the test fails."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
            raise AssertionError(f"process {self.process_id} still running after {timeout} s:\n{self.log()[-3000:]}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)


def start_slice(scenario: str, out: Path, num_processes: int = 2) -> list[SliceProcess]:
    """``num_processes`` processes of ``slice_process.py SCENARIO``, logs in ``out``."""
    port = free_port()
    processes = []
    for pid in range(num_processes):
        log_path = out / f"process{pid}.log"
        with open(log_path, "wb") as log:
            cmd = [sys.executable, str(SCRIPT), scenario, "--process-id", str(pid), "--port", str(port), "--out", str(out)]
            process = subprocess.Popen(cmd, cwd=REPO, env=slice_env(), stdout=log, stderr=subprocess.STDOUT)
        processes.append(SliceProcess(pid, process, log_path))
    return processes


def wait_until_ready(out: Path, processes: list[SliceProcess], timeout: float) -> None:
    """Wait for every process's ``ready{I}`` file; fail at once if one of them exits first."""
    deadline = time.monotonic() + timeout
    while not all((out / f"ready{process.process_id}").exists() for process in processes):
        for process in processes:
            if process.process.poll() is not None:
                raise AssertionError(f"process {process.process_id} exited with {process.process.returncode}:\n"
                                     f"{process.log()[-3000:]}")
        if time.monotonic() > deadline:
            for process in processes:
                process.kill()
            raise AssertionError(f"the slice was not ready within {timeout} s")
        time.sleep(0.05)


def stop_all(processes: list[SliceProcess]) -> None:
    for process in processes:
        process.kill()
        try:
            process.process.wait(10)
        except subprocess.TimeoutExpired:
            pass
