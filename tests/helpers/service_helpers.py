"""Helpers for the service tests: a tiny model factory, latents, real uvicorn servers in subprocesses
and in threads, in-process clients, and a runner that fails on demand.

Servers run ``python -m service serve`` (the same code path as ``vaeserve serve``) on 127.0.0.1 and
a free port, with the tiny model saved to a temporary diffusers-format folder. They inherit the
test environment (tests/conftest.py sets XLA_FLAGS for 8 CPU devices before JAX starts).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx
import numpy as np
import pytest
import uvicorn
from fastapi.testclient import TestClient

from vaeserve import models
from vaeserve.service import Settings, create_app
from vaeserve.service.engine.runner import DeviceRunner
from vaeserve.service.problem import Problem
from vaeserve.sharding import Decoded

REPO = Path(__file__).resolve().parents[2]
# The real 832x480x81 video in the shared folder beside the checkout (CI clones next to it too).
SAMPLE_VIDEO = REPO.parent / "shared" / "data" / "sample-832x480x81.mp4"
TINY = dict(base_dim=8, num_res_blocks=1)
LATENT = (1, 16, 2, 4, 4)  # -> (1, 5, 32, 32, 3) frames
WARM = "16x2x4x4:uint8"  # the uint8 programs only: each compile costs seconds on 2 cores


def make_test_model(**overrides):
    return models.init_vae(models.WanVAEConfig(**{**TINY, **overrides}), seed=0)


def latents(shape=LATENT, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def problem_of(fn, *args, **kwargs) -> Problem:
    """The ``Problem`` that ``fn(*args, **kwargs)`` raises (the test fails if it raises none)."""
    with pytest.raises(Problem) as info:
        fn(*args, **kwargs)
    return info.value


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def metric(url: str, name: str, **labels) -> float:
    """One sample from ``url``/metrics (0 when the labelled series does not exist yet)."""
    text = httpx.get(url + "/metrics").text
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        match = re.match(r"^(\w+)(?:\{(.*)\})? (\S+)$", line)
        if match and match.group(1) == name:
            got = ",".join(sorted((match.group(2) or "").split(","))) if match.group(2) else ""
            if got == want:
                return float(match.group(3))
    return 0.0


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 120, interval: float = 0.02) -> None:
    """Poll ``condition`` until it holds; fail after ``timeout`` seconds, naming ``what`` was awaited.
    Tests wait on observable state (a metric, a log line, a socket) this way instead of sleeping
    for a time that is too short on a loaded machine and wasted on a quiet one."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(interval)


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metric(self, name: str, **labels) -> float:
        return metric(self.url, name, **labels)

    def stop(self, sig=signal.SIGTERM, timeout: float = 60) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def launch_server(model_dir: Path, log_path: Path, *args: str, unset_env: tuple[str, ...] = ()) -> Server:
    """``python -m service serve`` on a free port, its output in ``log_path``; returns at once.
    ``unset_env``: variables of the test environment the server does not inherit."""
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if k not in unset_env}, "PYTHONPATH": str(REPO),
           "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "vaeserve", "serve", "--model", str(model_dir), "--host", "127.0.0.1",
           "--port", str(port), *args]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    return Server(f"http://127.0.0.1:{port}", process, log_path)


def start_server(model_dir: Path, log_path: Path, *args: str, ready_timeout: float = 120,
                 while_loading: Callable[[Server], None] | None = None, unset_env: tuple[str, ...] = ()) -> Server:
    """Start ``python -m service serve`` and return once /readyz is 200. ``while_loading`` is called
    with the server at every poll that is not ready yet (after the socket accepts)."""
    server = launch_server(model_dir, log_path, *args, unset_env=unset_env)
    process = server.process
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


# ---- in-process: the app with a runner of the test's choosing ----------------------------------

class PoisonRunner(DeviceRunner):
    """A real runner that fails like a device would for latents whose first value is POISON
    (so one app can show the failure and then serve the next request): at the second decode step,
    after the first chunk of a stream went out."""

    POISON = 7.0

    def decode_stream(self, latents, **options):
        for index, step in enumerate(super().decode_stream(latents, **options)):
            if latents[0].flat[0] == self.POISON and index == 1:
                raise RuntimeError("device fell over mid-stream")
            yield step


class GarbageRunner(DeviceRunner):
    """Frames of a shape no video encoder takes: mp4 answers (encoded from the stream's steps)
    fail inside the app, an internal error, not a device error; npy answers still work."""

    def decode_stream(self, latents, **options):
        yield Decoded(np.zeros((latents.shape[0], 2), np.uint8), np.zeros(latents.shape[0], np.int32))


class HeldRunner(DeviceRunner):
    """A real runner that holds the last step of every stream until ``release`` is set (or 60 s
    pass): a test sees what the service did while the decode had not ended."""

    release = threading.Event()
    steps_before_the_hold: int | None = None  # None: every step but the last

    def decode_stream(self, latents, **options):
        steps = list(super().decode_stream(latents, **options))
        split = len(steps) - 1 if self.steps_before_the_hold is None else self.steps_before_the_hold
        yield from steps[:split]
        self.release.wait(60)
        yield from steps[split:]


class FirstStepRunner(HeldRunner):
    """A real runner that yields the first step of every stream and holds the others until
    ``release`` is set (or 60 s pass): what a test sees came from the first step alone."""

    release = threading.Event()
    steps_before_the_hold = 1


def poisoned(x: np.ndarray) -> np.ndarray:
    x = x.copy()
    x.reshape(-1)[0] = PoisonRunner.POISON
    return x


def settings_for_tests(**overrides) -> Settings:
    """Settings that ignore VAESERVE_* variables of the environment running the tests."""
    base = dict(max_batch=2, max_queue=4, max_frames=9, max_height=64, max_width=64, max_body_bytes=65536,
                max_reading_bytes=65536 * 4, warmup=[], log_level="warning")
    return Settings(**{**base, **overrides})


@contextlib.contextmanager
def app_client(vae, *, runner_factory=None, expect_ready=True, **settings) -> Iterator[TestClient]:
    """A TestClient (in-process, lifespan run) around ``create_app`` once its start-up is over
    (ready, or with ``expect_ready=False`` ready or failed)."""
    app = create_app(settings_for_tests(**settings), vae=vae, runner_factory=runner_factory)
    with TestClient(app, raise_server_exceptions=False) as client:
        wait_ready(lambda: client.get("/readyz"), expect_ready=expect_ready)
        yield client


class StatusAnswer(Protocol):
    """What ``wait_ready`` reads of a response: httpx's, or the TestClient's (httpx2's)."""

    status_code: int

    def json(self) -> Any: ...


def wait_ready(probe: Callable[[], StatusAnswer | None], timeout: float = 120, expect_ready: bool = True) -> None:
    deadline = time.monotonic() + timeout
    while True:
        response = probe()
        if response is not None and (response.status_code == 200 or (
                not expect_ready and response.json().get("status") == "failed")):
            return
        if time.monotonic() > deadline:
            raise RuntimeError("app not ready in time")
        time.sleep(0.05)


# ---- a real uvicorn server in a thread of the test process --------------------------------------

@dataclass
class ThreadServer:
    url: str
    server: uvicorn.Server
    app: object

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.url.removeprefix("http://").split(":")
        return host, int(port)

    def metric(self, name: str, **labels) -> float:
        return metric(self.url, name, **labels)


@contextlib.contextmanager
def thread_server(vae, *, runner_factory=None, **settings) -> Iterator[ThreadServer]:
    """``create_app`` served by uvicorn (configured as ``vaeserve serve`` configures it) on
    127.0.0.1 in a thread: real sockets, real HTTP/1.1, and the runner a test injects."""
    from vaeserve.service.http.server import uvicorn_config

    config_settings = settings_for_tests(port=free_port(), **settings)
    app = create_app(config_settings, vae=vae, runner_factory=runner_factory)
    server = uvicorn.Server(uvicorn_config(app, config_settings, log_config=None))
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{config_settings.port}"
    try:
        wait_ready(lambda: _get(url + "/readyz"))
        yield ThreadServer(url, server, app)
    finally:
        server.should_exit = True
        thread.join(60)


def _get(url: str) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=2)
    except httpx.HTTPError:
        return None


class GatedRunner(DeviceRunner):
    """A real runner whose decode steps each wait for a permit (``permits.release()``) and are
    logged, as ``"<marker><step>"`` (the marker: ``MARKERS`` of the latents' first value), when
    they start: a test sees which request the device serves, step by step, with no clock."""

    permits = threading.Semaphore(0)
    log: list[str] = []
    MARKERS = {1.0: "A", 2.0: "B", 3.0: "C"}

    @classmethod
    def reset(cls) -> None:
        cls.permits, cls.log = threading.Semaphore(0), []

    def decode_stream(self, latents, **options):
        marker = self.MARKERS.get(float(latents[0].flat[0]), "?")
        steps = super().decode_stream(latents, **options)
        for index in range(latents.shape[2] if self.vae.config.causal else 1):  # one step per latent frame
            if not GatedRunner.permits.acquire(timeout=120):
                raise RuntimeError("no permit for a decode step within 120 s")
            GatedRunner.log.append(f"{marker}{index}")
            yield next(steps)
        yield from steps


def marked(x: np.ndarray, marker: str) -> np.ndarray:
    """``x`` with its first value the marker ``GatedRunner`` logs its steps by."""
    x = x.copy()
    x.reshape(-1)[0] = {v: k for k, v in GatedRunner.MARKERS.items()}[marker]
    return x


def post_in_thread(url: str, x: np.ndarray, results: list, **params) -> threading.Thread:
    """POST the raw latents ``x`` for npy frames in a thread of its own; the response lands in ``results``."""
    query = {"shape": ",".join(map(str, x.shape)), "dtype": "float32", "output_type": "npy", **params}

    def post() -> None:
        results.append(httpx.post(url + "/v1/decode", content=x.tobytes(), params=query, timeout=600,
                                  headers={"Content-Type": "application/octet-stream"}))
    thread = threading.Thread(target=post, daemon=True)
    thread.start()
    return thread


def gated_warm_up(url: str, shape: tuple[int, ...]) -> None:
    """Compile the step programs of latents ``shape`` on a ``GatedRunner`` server before the clock
    matters (a request of that shape, let through), then forget its steps."""
    warm: list = []
    for _ in range(shape[2]):
        GatedRunner.permits.release()
    post_in_thread(url, marked(latents(shape), "C"), warm).join(600)
    assert warm[0].status_code == 200, warm[0].text
    GatedRunner.log.clear()
