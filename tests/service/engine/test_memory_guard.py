"""The memory guard: every program is checked against the memory it will run in before it runs.

A real ``vaeserve serve`` process stands in for a small machine (``--device-memory-bytes``): a
request inside the size limits whose programs clearly cannot fit is refused from the estimate
before anything is compiled; one that may fit is compiled and refused from its
``memory_analysis()``, and refused at once the next time; a warm-up program that does not fit
refuses the start. The server serves the next request either way. A program that runs out of
memory anyway answers 503 and is checked against the memory free before it runs again."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import httpx
import numpy as np
import pytest

from tests.helpers.service_helpers import (
    REPO,
    PoisonRunner,
    app_client,
    free_port,
    latents,
    make_test_model,
    poisoned,
    start_server,
)
from vaeserve.models.conv import convs_for
from vaeserve.models.estimate import estimator
from vaeserve.service.engine.runner import DeviceRunner
from vaeserve.service.engine.worker import out_of_memory
from vaeserve.service.settings import Settings
from vaeserve.sharding.fits import program_total_bytes
from vaeserve.sharding.introspect import program_memory

MICRO = dict(dim_mult=(1, 2), temperal_downsample=(True,), scale_factor_temporal=2, scale_factor_spatial=2)
WARM = "16x2x8x8:uint8"
SMALL = (1, 16, 2, 4, 4)
MAYBE = (1, 16, 2, 12, 16)  # estimated under 1.5x the limit below: compiled, then refused
HOPELESS = (1, 16, 2, 24, 32)  # estimated far over it: refused before compiling
FRAMES = (1, 3, 9, 256, 256)  # an encode estimated far over it


def raw(shape, **params) -> dict:
    return {"shape": ",".join(map(str, shape)), "dtype": "float32", "output_type": "npy", **params}


def decode(url: str, shape, **params) -> httpx.Response:
    return httpx.post(url + "/v1/decode", content=latents(shape).tobytes(), params=raw(shape, **params),
                      headers={"Content-Type": "application/octet-stream"}, timeout=300)


@pytest.fixture(scope="module")
def limit(tiny_vae) -> int:
    """Bytes per device that MAYBE's later step may fit by its estimate (1.35x over it, under the
    1.5x a refusal before compiling needs) and does not by its compiled program."""
    model = estimator(tiny_vae.config, dtype="float32", decoder_parameters=tiny_vae.metadata["parameters"],
                      encoder_parameters=tiny_vae.metadata["encoder_parameters"],
                      convs=convs_for("cpu", Settings().cpu_convs))  # the server's
    assert model is not None
    return int(model.decode(MAYBE).total / 1.35)


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory, limit):
    log = tmp_path_factory.mktemp("logs") / "memory.log"
    srv = start_server(tiny_model_dir, log, "--device-memory-bytes", str(limit), "--max-batch", "1",
                       "--max-height", "256", "--max-width", "256")
    yield srv
    srv.stop()


def test_a_request_that_clearly_cannot_fit_is_refused_before_compiling(server, limit):
    compiles = server.metric("vaeserve_compiles_total")
    r = decode(server.url, HOPELESS)
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json", r.text
    problem = r.json()
    assert problem["type"].endswith("/too-large-for-memory")
    assert problem["received"]["input"] == "1x16x2x24x32" and problem["received"]["bytes"] > 1.5 * limit
    assert problem["expected"]["bytes"] == f"<= {limit}" and "refused before compiling" in problem["detail"]
    would_fit = problem["expected"]["would_fit"]  # a smaller frame at these frames, or more tp (8 CPU devices)
    assert any(re.match(r"\d+ frames of \d+x\d+", w) for w in would_fit) and any("tp=" in w for w in would_fit)
    assert server.metric("vaeserve_compiles_total") == compiles  # nothing compiled for it
    assert server.metric("vaeserve_refused_for_memory_total", check="estimate") == 1
    # The encode of frames too large: refused from the body's header, before a frame is decoded.
    frames = np.zeros(FRAMES, np.float32)
    r = httpx.post(server.url + "/v1/encode", content=frames.tobytes(), timeout=300,
                   params={"shape": ",".join(map(str, FRAMES)), "dtype": "float32"},
                   headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 422 and r.json()["type"].endswith("/too-large-for-memory"), r.text
    assert r.json()["received"]["input"] == "1x3x9x256x256"
    assert server.metric("vaeserve_compiles_total") == compiles
    assert decode(server.url, SMALL).status_code == 200  # the server serves the next request


def test_a_compiled_program_that_does_not_fit_is_refused_and_remembered(server, limit):
    estimated = server.metric("vaeserve_refused_for_memory_total", check="estimate")
    r = decode(server.url, MAYBE)
    assert r.status_code == 422, r.text
    problem = r.json()
    assert problem["type"].endswith("/too-large-for-memory")
    needed = int(re.search(rf"\((\d+) > {limit} bytes\)", problem["detail"]).group(1))
    assert needed == problem["received"]["bytes"] > limit  # memory_analysis()'s figure, not the estimate's
    assert problem["detail"].startswith("the decode of latents 1x16x2x12x16: a decode step of latents (1, 16, 1, 12, 16)")
    assert server.metric("vaeserve_refused_for_memory_total", check="compiled") == 1
    compiles = server.metric("vaeserve_compiles_total")
    again = decode(server.url, MAYBE)  # refused at once: the refusal is kept, nothing compiled again
    assert again.status_code == 422 and again.json()["received"] == problem["received"]
    assert server.metric("vaeserve_compiles_total") == compiles
    assert decode(server.url, SMALL).status_code == 200
    # The estimate let MAYBE through (its estimate is under 1.5x the limit): memory_analysis() refused it.
    assert server.metric("vaeserve_refused_for_memory_total", check="estimate") == estimated


def test_models_and_the_log_state_the_largest_video_and_serve_it(server, limit, tiny_vae):
    refused = server.metric("vaeserve_refused_for_memory_total", check="compiled")
    memory = httpx.get(server.url + "/v1/models").json()["data"][0]["memory"]
    assert memory["device_bytes"] == limit and memory["device_source"] == "--device-memory-bytes"
    assert memory["host_bytes"] > 0 and memory["machine_bytes"] > memory["host_bytes"]
    largest = memory["largest_decode"][0]
    assert largest["frames"] == 129 and largest["bytes"] <= limit and largest["width"] % 8 == 0
    assert largest["width"] < 256  # the memory, not the size limits, bounds it
    assert "largest decode with this memory (estimated): 129 frames of" in server.log()
    # What it advertises, it serves: each size exactly, its compiled programs within the memory.
    # (The hostile run: an advertised encode of 129 frames of 632x632, compiled for 53 s, then refused.)
    s, t = tiny_vae.config.spatial_scale, tiny_vae.config.temporal_scale
    for video in memory["largest_decode"]:
        shape = (1, 16, 1 + (video["frames"] - 1) // t, video["height"] // s, video["width"] // s)
        assert decode(server.url, shape).status_code == 200, (video, shape)
    for video in memory["largest_encode"]:
        frames = np.zeros((1, 3, video["frames"], video["height"], video["width"]), np.float32)
        r = httpx.post(server.url + "/v1/encode", content=frames.tobytes(), timeout=600,
                       params={"shape": ",".join(map(str, frames.shape)), "dtype": "float32"},
                       headers={"Content-Type": "application/octet-stream"})
        assert r.status_code == 200, (video, r.text)
    assert server.metric("vaeserve_refused_for_memory_total", check="compiled") == refused


def test_serve_refuses_to_start_when_a_warmup_program_does_not_fit(tiny_model_dir):
    command = [sys.executable, "-m", "vaeserve", "serve", "--model", str(tiny_model_dir), "--port", str(free_port()),
               "--warmup", "16x2x4x4:uint8", "--max-batch", "2", "--device-memory-bytes", "1000000"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 3, done.stderr[-3000:]
    message = done.stderr.strip().splitlines()[-1]
    assert message.startswith("vaeserve serve: start-up refused: the decode of latents 16x2x4x4: a decode step of "
                              "latents (1, 16, 1, 4, 4) at tp=1, dp=1 needs"), message
    needed = int(re.search(r"\((\d+) > 1000000 bytes\)", message).group(1))
    assert needed > 1_000_000 and "but 1.0 MB are available" in message
    assert "tp=2 would fit" in message or "no tp or batch" in message or "--max-batch" in message
    assert "Traceback" not in message


def test_models_lists_the_bytes_of_every_compiled_program():
    vae = make_test_model(**MICRO)
    with app_client(vae, warmup=[WARM], device_memory_bytes=10**12) as client:
        info = client.get("/v1/models").json()["data"][0]
    assert info["device_memory_bytes"] == 10**12
    rows = {(r["program"], tuple(r["shape"]), r["variant"]): r for r in info["program_memory"]}
    assert set(rows) == {("stream-step", (b, 16, 1, 8, 8), step) for b in (1, 2) for step in ("first", "next")}
    for key in vae.programs.keys():  # the numbers are the compiled programs' memory_analysis()
        memory = program_memory(vae.programs.peek(key))
        row = rows[(key.program, key.shape, key.variant)]
        assert row["temp_bytes"] == memory["temp_bytes"] and row["total_bytes"] == program_total_bytes(memory) > 0


class HostFullRunner(DeviceRunner):
    """Poisoned latents fail as a host allocation does (numpy's MemoryError for an array the host
    cannot hold) at their second step; ``free`` stands in for the memory free now."""

    free: int | None = None

    def decode_stream(self, latents, **options):
        for index, step in enumerate(super().decode_stream(latents, **options)):
            if latents[0].flat[0] == PoisonRunner.POISON and index == 1:
                np.empty(2**62, np.uint8)  # raises MemoryError: no host has 4 EiB
            yield step

    def free_bytes(self):
        return HostFullRunner.free


def test_running_out_of_memory_answers_503_and_checks_again_before_the_next_run(tiny_vae):
    x = latents(SMALL)
    with app_client(tiny_vae, runner_factory=HostFullRunner) as client:
        def post(array):
            return client.post("/v1/decode", content=array.tobytes(), params=raw(array.shape),
                               headers={"Content-Type": "tensor/binary"})

        r = post(poisoned(x))
        assert r.status_code == 503 and r.json()["type"].endswith("/out-of-memory"), r.text
        assert r.headers["Retry-After"] == "1" and "ran out of host memory" in r.json()["detail"]
        assert 'vaeserve_out_of_memory_total{where="host"} 1.0' in client.get("/metrics").text
        # Checked again before it runs: with less memory free than it needs, refused without running.
        HostFullRunner.free = 1000
        again = post(x)
        assert again.status_code == 503 and "ran out of memory before" in again.json()["detail"], again.text
        HostFullRunner.free = None  # enough (unknown): it runs, and the check is cleared
        assert post(x).status_code == 200
        HostFullRunner.free = 1000
        assert post(x).status_code == 200  # no longer suspect: not checked against the free memory


def test_what_counts_as_out_of_memory():
    assert out_of_memory(MemoryError()) == "host"
    assert out_of_memory(RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 90459383000 bytes")) == "device"
    assert out_of_memory(RuntimeError("device fell over")) is None


@pytest.mark.parametrize("family", ["autoencoder-kl", "ltx2"])
def test_image_and_ltx_models_are_estimated_before_compiling(family):
    """The image and LTX families have an estimate too: an image's (B, C, H, W) latents and frames
    (and an LTX clip) far over the memory are refused before compiling, naming what would fit; the
    largest sizes are stated. No server, no compile: the estimate alone."""
    from tests.helpers.image_reference import SD_TINY
    from tests.helpers.ltx_reference import LTX23
    from vaeserve.models.estimate import family_estimate
    from vaeserve.service.engine.errors import TooLargeForMemory
    from vaeserve.service.engine.memory import MemoryGuard, MemoryPlan
    from vaeserve.service.limits import Limits

    config = SD_TINY if family == "autoencoder-kl" else LTX23
    assert family_estimate(config) is not None
    model = estimator(config, dtype="float32", decoder_parameters=100_000, encoder_parameters=100_000)
    assert model is not None
    image = config.is_image
    small = (1, config.z_dim, 8, 8) if image else (1, config.z_dim, 3, 4, 4)
    huge = (1, config.z_dim, 512, 512) if image else (1, config.z_dim, 9, 128, 128)
    frames = (1, 3, 4096, 4096) if image else (1, 3, 65, 2048, 2048)
    limit = int(2 * model.decode(small).total)
    plan = MemoryPlan(platform="cpu", device_bytes=limit, device_source="test", host_bytes=2**30, host_source="test",
                      machine=None, reserve_bytes=0)
    s, t = config.spatial_scale, config.temporal_scale
    limits = Limits(channels=config.z_dim, max_batch=1, max_frames=1 if image else 1 + 8 * t, max_height=4096,
                    max_width=4096, temporal_scale=t, spatial_scale=s)
    guard = MemoryGuard(plan=plan, estimate=model, limits=limits, devices=1)
    guard.check_decode(small, "uint8")
    with pytest.raises(TooLargeForMemory, match="refused before compiling; would fit: ") as refused:
        guard.check_decode(huge, "uint8")
    assert refused.value.would_fit
    with pytest.raises(TooLargeForMemory, match="refused before compiling"):
        guard.check_encode(frames)
    assert guard.largest_decode() and guard.largest_decode()[0].bytes <= limit
