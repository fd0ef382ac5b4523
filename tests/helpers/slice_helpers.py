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
SLICE_MODULE = "tests.helpers.slice_process"  # run with -m from REPO: it imports tests.helpers as pytest does


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def slice_env() -> dict[str, str]:
    """The test environment without the 8 fake devices tests/conftest.py asks for: every slice
    process fakes its own 2 (``jax_num_cpu_devices``)."""
    env = {key: value for key, value in os.environ.items() if key != "XLA_FLAGS"}
    return {**env, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1", "PYTHONPATH": str(REPO)}


@dataclass
class SliceProcess:
    process_id: int
    process: subprocess.Popen
    log_path: Path
    url: str | None = None  # a ``vaeserve serve`` process: its HTTP address

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        """The exit code; a process still running after ``timeout`` fails the test, with its
        threads' Python stacks (SIGABRT makes faulthandler print them) in the message."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGABRT)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
            raise AssertionError(f"process {self.process_id} still running after {timeout} s:\n{self.log()[-6000:]}") from None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)


def start_slice(scenario: str, out: Path, num_processes: int = 2) -> list[SliceProcess]:
    """``num_processes`` processes of ``tests.helpers.slice_process SCENARIO``, logs in ``out``."""
    port = free_port()
    processes = []
    for pid in range(num_processes):
        log_path = out / f"process{pid}.log"
        with open(log_path, "wb") as log:
            cmd = [sys.executable, "-m", SLICE_MODULE, scenario, "--process-id", str(pid), "--port", str(port),
                   "--out", str(out)]
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


def start_serve_slice(model_dir: Path, out: Path, *args: str, num_processes: int = 2) -> list[SliceProcess]:
    """``num_processes`` × ``python -m service serve`` (2 CPU devices each) forming one slice, each
    on its own HTTP port; ``args`` are added to every command line."""
    coordinator = free_port()
    processes = []
    for pid in range(num_processes):
        port = free_port()
        log_path = out / f"serve{pid}.log"
        cmd = [sys.executable, "-m", "vaeserve", "serve", "--model", str(model_dir), "--host", "127.0.0.1",
               "--port", str(port), "--cpu-devices", "2", "--coordinator-address", f"127.0.0.1:{coordinator}",
               "--num-processes", str(num_processes), "--process-id", str(pid), *args]
        with open(log_path, "wb") as log:
            process = subprocess.Popen(cmd, cwd=REPO, env=slice_env(), stdout=log, stderr=subprocess.STDOUT)
        processes.append(SliceProcess(pid, process, log_path, f"http://127.0.0.1:{port}"))
    return processes


def wait_until_serving(processes: list[SliceProcess], timeout: float) -> None:
    """Wait until every process answers ``/readyz`` 200; fail at once if one exits."""
    import httpx

    deadline = time.monotonic() + timeout
    waiting = list(processes)
    while waiting:
        for process in list(waiting):
            if process.process.poll() is not None:
                stop_all(processes)
                raise AssertionError(f"process {process.process_id} exited with {process.process.returncode}:\n"
                                     f"{process.log()[-3000:]}")
            try:
                if httpx.get(f"{process.url}/readyz", timeout=2).status_code == 200:
                    waiting.remove(process)
            except httpx.HTTPError:
                pass
        if waiting and time.monotonic() > deadline:
            stop_all(processes)
            raise AssertionError(f"processes {[p.process_id for p in waiting]} not ready within {timeout} s")
        time.sleep(0.2)
