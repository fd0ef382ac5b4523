"""``vaeserve serve`` as a 2-process slice: real servers, real HTTP, real signals.

Each process is ``python -m service serve --cpu-devices 2 --coordinator-address ... --num-processes 2
--process-id I`` on its own port, with the MICRO model; the mesh is tp = 2 x dp = 2 over the 4
devices of both processes (one replica per process, so every batch is split across processes and
gathered back). One slice serves the HTTP checks and ends with SIGTERM on process 0; two more,
without warm-up, cover a killed follower (a request in flight) and a follower's SIGTERM.
"""

from __future__ import annotations

import io
import re
import signal
import threading
import time

import httpx
import numpy as np
import pytest

from tests.helpers.service_helpers import metric, wait_until
from tests.helpers.slice_helpers import start_serve_slice, stop_all, wait_until_serving
from tests.helpers.slice_process import slice_latents
from vaeserve.service.client import decode_stream

HEARTBEAT_S, GRACE_S = 3, 3
MESH = ["--tp", "2", "--dp", "2", "--max-batch", "2", "--heartbeat-timeout-s", str(HEARTBEAT_S),
        "--failure-grace-s", str(GRACE_S)]
READY_TIMEOUT_S = 300
# The product's promise: a lost process is seen within heartbeat + monitor interval, and process 0
# exits after its grace. The bounds allow 10 s more for a loaded machine.
FAIL_BOUND_S = HEARTBEAT_S + 1 + 10


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def _post(url: str, latents: np.ndarray, timeout: float = 120) -> httpx.Response:
    return httpx.post(f"{url}/v1/decode?output_type=npy", content=_npy(latents),
                      headers={"content-type": "application/x-npy"}, timeout=timeout)


@pytest.fixture(scope="module")
def served(micro_model_dir, tmp_path_factory):
    processes = start_serve_slice(micro_model_dir, tmp_path_factory.mktemp("served"), *MESH,
                                  "--warmup", "16x3x8x4:uint8,stream", "--drain-timeout-s", "600")
    try:
        wait_until_serving(processes, READY_TIMEOUT_S)
        yield processes
    finally:
        stop_all(processes)


def test_process_0_answers_with_the_bytes_of_a_one_process_decode(served, references):
    leader, _ = served
    response = _post(leader.url, slice_latents())
    assert response.status_code == 200, response.text
    frames = np.load(io.BytesIO(response.content))
    assert frames.dtype == np.uint8 and frames.tobytes() == references["tp4_uint8"].tobytes()


def test_process_0_streams_the_same_bytes(served, references):
    leader, _ = served
    chunks = list(decode_stream(leader.url, slice_latents(), timeout=120))
    assert [chunk.shape[1] for chunk in chunks] == [1, 2, 2]  # frame 0, then 2 frames per latent frame
    assert np.concatenate(chunks, axis=1).tobytes() == references["tp4_stream"].tobytes()


def test_followers_answer_probes_and_send_requests_to_process_0(served):
    leader, follower = served
    assert httpx.get(f"{follower.url}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{follower.url}/readyz").status_code == 200
    refused = _post(follower.url, slice_latents())
    assert refused.status_code == 503 and "follows process 0" in refused.json()["detail"]
    mesh = httpx.get(f"{leader.url}/v1/models").json()["data"][0]["mesh"]
    assert (mesh["dp"], mesh["tp"], mesh["processes"], len(mesh["devices"])) == (2, 2, 2, 4)


def _on_the_device(process) -> float:
    """Jobs process 0 has started on the slice's devices (the queue-time histogram is observed as a
    batch starts)."""
    return metric(process.url, "vaeserve_queue_seconds_count")


def test_sigterm_on_process_0_drains_and_every_process_exits_0(served):
    leader, follower = served
    result: dict = {}
    started0 = _on_the_device(leader)
    # A shape not warmed up (T = 2 and half the width: its step programs are new too): the call
    # compiles for seconds on both processes.
    request = threading.Thread(target=lambda: result.update(response=_post(leader.url, slice_latents()[:, :, :2, :, :2])))
    request.start()
    wait_until(lambda: _on_the_device(leader) > started0, "the request started on the devices")
    assert not result, "the request was answered before the signal: the drain would be empty"
    leader.kill(signal.SIGTERM)
    codes = [process.wait(600 + 90) for process in served]
    request.join(30)
    assert codes == [0, 0], leader.log()[-2000:] + follower.log()[-2000:]
    assert result["response"].status_code == 200  # drained, not dropped
    assert np.load(io.BytesIO(result["response"].content)).shape == (2, 3, 16, 4, 3)
    assert re.search(r"process 1: stop after \d+ calls", follower.log())  # STOP came through the slice


@pytest.fixture
def cold_slice(micro_model_dir, tmp_path):
    """A slice without warm-up (fast to start); stopped at the end whatever happened."""
    processes = start_serve_slice(micro_model_dir, tmp_path, *MESH)
    try:
        wait_until_serving(processes, READY_TIMEOUT_S)
        yield processes
    finally:
        stop_all(processes)


def test_a_killed_follower_turns_into_503s_and_exit_3(cold_slice):
    leader, follower = cold_slice
    result: dict = {}
    started0 = _on_the_device(leader)
    # Not warmed: the request compiles for seconds on both processes, so it is in flight at the kill.
    request = threading.Thread(target=lambda: result.update(response=_post(leader.url, slice_latents())))
    request.start()
    wait_until(lambda: _on_the_device(leader) > started0, "the request started on the devices")
    assert not result, "the request was answered before the kill: nothing was in flight"
    follower.kill(signal.SIGKILL)
    killed = time.monotonic()
    health = None
    while time.monotonic() - killed < FAIL_BOUND_S and health is None:
        response = httpx.get(f"{leader.url}/healthz", timeout=2)
        if response.status_code == 503:
            health = (time.monotonic() - killed, response.json())
        time.sleep(0.1)
    assert health is not None, f"/healthz still 200 {FAIL_BOUND_S} s after the kill"
    assert health[1]["status"] == "failed" and "process 1 stopped sending heartbeats" in health[1]["detail"]
    request.join(30)
    answer = result["response"]
    assert answer.status_code == 503 and "multi-host slice failed" in answer.json()["detail"], (
        answer.text + leader.log()[-4000:])
    assert leader.wait(FAIL_BOUND_S + GRACE_S + 30) == 3
    exited = time.monotonic() - killed
    assert exited <= FAIL_BOUND_S + GRACE_S, f"process 0 exited {exited:.1f} s after the kill"
    print(f"/healthz 503 {health[0]:.1f} s after the kill; process 0 exited 3 after {exited:.1f} s")


def test_sigterm_on_a_follower_stops_the_slice_and_every_process_exits_0(cold_slice):
    leader, follower = cold_slice
    follower.kill(signal.SIGTERM)
    codes = [process.wait(90) for process in cold_slice]
    assert codes == [0, 0], leader.log()[-2000:] + follower.log()[-2000:]
    assert "process 1 asks the slice to stop (signal SIGTERM)" in leader.log()
