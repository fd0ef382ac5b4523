"""Helpers for the service tests: a tiny model factory, latents, and real uvicorn servers in subprocesses.

Servers run ``python -m service serve`` (the same code path as ``vaeserve serve``) on 127.0.0.1 and
a free port, with the tiny model saved to a temporary diffusers-format folder. They inherit the
test environment (tests/conftest.py sets XLA_FLAGS for 8 CPU devices before JAX starts).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable

import httpx
import numpy as np

import models

REPO = Path(__file__).resolve().parents[2]
TINY = dict(base_dim=8, num_res_blocks=1)
LATENT = (1, 16, 2, 4, 4)  # -> (1, 5, 32, 32, 3) frames
WARM = "16x2x4x4"


def make_test_model(**overrides):
    return models.init_vae(models.WanVAEConfig(**{**TINY, **overrides}), seed=0)


def latents(shape=LATENT, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metric(self, name: str, **labels) -> float:
        """One sample from /metrics (0 when the labelled series does not exist yet)."""
        text = httpx.get(self.url + "/metrics").text
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in text.splitlines():
            match = re.match(r"^(\w+)(?:\{(.*)\})? (\S+)$", line)
            if match and match.group(1) == name:
                got = ",".join(sorted((match.group(2) or "").split(","))) if match.group(2) else ""
                if got == want:
                    return float(match.group(3))
        return 0.0

    def stop(self, sig=signal.SIGTERM, timeout: float = 60) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def start_server(model_dir: Path, log_path: Path, *args: str, ready_timeout: float = 120,
                 while_loading: Callable[[Server], None] | None = None) -> Server:
    """Start ``python -m service serve`` and return once /readyz is 200. ``while_loading`` is called
    with the server at every poll that is not ready yet (after the socket accepts)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "service", "serve", "--model", str(model_dir), "--host", "127.0.0.1",
           "--port", str(port), *args]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    server = Server(f"http://127.0.0.1:{port}", process, log_path)
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{server.log()}")
        try:
            if httpx.get(server.url + "/readyz", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        else:
            if while_loading is not None:
                while_loading(server)
        time.sleep(0.2)
    server.stop(signal.SIGKILL)
    raise RuntimeError(f"server not ready in {ready_timeout} s:\n{server.log()}")
