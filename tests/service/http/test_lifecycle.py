"""Start-up, auth, sharded serving, dropped clients and SIGTERM draining, against one real server
(tp=2 x dp=2 on fake CPU devices, API key set). The SIGTERM test ends the server: it runs last."""

from __future__ import annotations

import importlib.util
import io
import json
import select
import signal
import socket
import threading
import time
from typing import Any

import httpx
import numpy as np
import pytest

from tests.helpers.frames import assert_uint8_frames_match
from tests.helpers.raw_http import read_all, read_head, send_request
from tests.helpers.service_helpers import WARM, latents, launch_server, start_server, wait_until
from vaeserve.service.client import read_stream
from vaeserve.service.codecs.video import mp4_boxes

KEY = "s3cret-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def loading_seen() -> dict:
    return {"readyz": set(), "healthz": set(), "decode": set()}


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory, loading_seen):
    def observe(srv):
        before = httpx.get(srv.url + "/readyz").status_code
        loading_seen["readyz"].add(before)
        loading_seen["healthz"].add(httpx.get(srv.url + "/healthz").status_code)
        x = latents()
        r = httpx.post(srv.url + "/v1/decode", content=x.tobytes(), headers={**AUTH, "Content-Type": "tensor/binary"},
                       params={"shape": "1,16,2,4,4", "dtype": "float32", "output_type": "npy"})
        if before == httpx.get(srv.url + "/readyz").status_code == 503:  # still loading after the POST
            loading_seen["decode"].add((r.status_code, r.headers.get("Retry-After")))

    log = tmp_path_factory.mktemp("logs") / "lifecycle.log"
    srv = start_server(tiny_model_dir, log, "--tp", "2", "--dp", "2", "--max-batch", "2", "--warmup", WARM,
                       "--api-key", KEY, "--drain-timeout-s", "600", while_loading=observe,  # a cold compile under load: minutes
                       unset_env=("JAX_PLATFORMS",))  # the platform the server picks itself (libtpu is installed)
    yield srv
    srv.stop()


def decode_npy(server, x: np.ndarray, timeout: float = 120, **params) -> httpx.Response:
    query = {"shape": ",".join(map(str, x.shape)), "dtype": "float32", "output_type": "npy", **params}
    return httpx.post(server.url + "/v1/decode", content=x.tobytes(), params=query, timeout=timeout,
                      headers={**AUTH, "Content-Type": "application/octet-stream"})


def test_not_ready_until_warm(server, loading_seen):
    # 503 while the warm-up compiles; a 200 may be seen too, when the warm-up ends between two polls.
    assert 503 in loading_seen["readyz"], "readyz never answered 503 while the warm-up compiled"
    assert loading_seen["healthz"] == {200}
    assert loading_seen["decode"] == {(503, "1")}
    info = httpx.get(server.url + "/v1/models", headers=AUTH).json()["data"][0]
    assert info["mesh"]["tp"] == 2 and info["mesh"]["dp"] == 2 and len(info["mesh"]["devices"]) == 4
    assert info["batch_buckets"] == [2]  # one latent is padded to dp=2
    assert ["stream-step", [2, 16, 1, 4, 4], "next"] in info["compiled"]


def test_the_log_says_ready_once_and_nothing_alarming(server):
    log = server.log()
    ready = [line for line in log.splitlines() if " ready on http://" in line]
    assert len(ready) == 1 and f"ready on {server.url}: " in ready[0] and "(dp=2, tp=2)" in ready[0], log
    # libtpu is installed (make test) on a host without a TPU: the server leaves the TPU out rather
    # than letting JAX try it and log the failure.
    assert "Unable to initialize backend" not in log and "ERROR" not in log and "E0000" not in log, log
    if importlib.util.find_spec("libtpu") is not None:
        assert "JAX runs on cpu" in log, log


def test_api_key(server):
    x = latents()
    url = server.url + "/v1/decode"
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = httpx.post(url, content=x.tobytes(), headers={"Content-Type": "tensor/binary", **headers},
                       params={"shape": "1,16,2,4,4", "dtype": "float32"})
        assert r.status_code == 401 and r.headers["content-type"] == "application/problem+json"
        assert r.headers["WWW-Authenticate"].startswith("Bearer")
        assert r.json()["expected"] == "Authorization: Bearer <key>"
    assert httpx.get(server.url + "/v1/models").status_code == 401
    assert httpx.get(server.url + "/healthz").status_code == 200  # probes need no key
    assert decode_npy(server, x).status_code == 200


def test_sharded_server_equals_direct_decode(server, tiny_vae):
    x = latents((1, 16, 2, 4, 4), seed=20)
    r = decode_npy(server, x)
    assert r.status_code == 200, r.text
    frames = np.load(io.BytesIO(r.content), allow_pickle=False)
    direct = np.asarray(tiny_vae.decode(x, output="uint8"))
    assert frames.shape == direct.shape == (1, 5, 32, 32, 3)  # the dp padding row was trimmed
    assert_uint8_frames_match(frames, direct)


def _raw_request(x: np.ndarray) -> bytes:
    body = x.tobytes()
    head = (f"POST /v1/decode?shape={','.join(map(str, x.shape))}&dtype=float32&output_type=npy HTTP/1.1\r\n"
            f"Host: x\r\nAuthorization: Bearer {KEY}\r\nContent-Type: tensor/binary\r\n"
            f"Content-Length: {len(body)}\r\nX-Request-Id: leaver\r\n\r\n").encode()
    return head + body


def _on_the_device(server) -> float:
    """Jobs that have started on the device (the queue-time histogram is observed as a batch starts)."""
    return server.metric("vaeserve_queue_seconds_count")


def test_request_of_a_client_that_left_is_dropped(server):
    dropped0 = server.metric("vaeserve_dropped_total", reason="client-gone")
    started0 = _on_the_device(server)
    # A cold shape keeps the device busy compiling for seconds; meanwhile a second client queues a
    # request of another cold shape and hangs up. That shape must never reach the device.
    busy = threading.Thread(target=decode_npy, args=(server, latents((1, 16, 3, 4, 6))))
    busy.start()
    wait_until(lambda: _on_the_device(server) > started0, "the first request started on the device")
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(_raw_request(latents((1, 16, 1, 4, 8))))
        wait_until(lambda: server.metric("vaeserve_queue_depth") >= 1, "the second request queued")
        assert busy.is_alive(), "the first request was answered before the second queued: nothing was tested"
    # The client has left while its request waited: the worker drops it when it reaches it.
    wait_until(lambda: server.metric("vaeserve_dropped_total", reason="client-gone") - dropped0 >= 1,
               "the abandoned request dropped")
    busy.join(120)
    assert server.metric("vaeserve_dropped_total", reason="client-gone") - dropped0 == 1
    compiled = httpx.get(server.url + "/v1/models", headers=AUTH).json()["data"][0]["compiled"]
    assert ["stream-step", [2, 16, 1, 4, 6], "next"] in compiled  # every decode runs as steps
    assert not [program for program in compiled if program[1] == [2, 16, 1, 4, 8]]
    assert server.metric("vaeserve_requests_total", route="/v1/decode", status="499") >= 1


def _refused(url: str) -> bool:
    try:
        httpx.get(url + "/healthz", timeout=2)
    except httpx.ConnectError:
        return True
    except (httpx.ReadError, httpx.RemoteProtocolError):
        # Accepted in the moment before uvicorn closed the listening socket, then closed unanswered
        # with the other idle connections: not yet a refusal, so ask again.
        return False
    return False


def test_sigterm_drains_in_flight_work_and_exits_0(server):
    # Cold shape again: the first request compiles for seconds, the others wait in the queue.
    x = latents((2, 16, 3, 8, 8), seed=21)
    results: list = [None] * 3
    started0 = _on_the_device(server)

    def call(i: int) -> None:
        try:
            results[i] = decode_npy(server, x)
        except httpx.HTTPError as exc:  # recorded, so a lost request fails the test below
            results[i] = exc

    threads = [threading.Thread(target=call, args=(i,)) for i in range(3)]
    threads[0].start()
    wait_until(lambda: _on_the_device(server) > started0, "the first request started on the device")
    for t in threads[1:]:
        t.start()
    wait_until(lambda: server.metric("vaeserve_queue_depth") >= 2, "two requests queued behind it")
    assert results == [None] * 3, "a request was answered before the signal: the drain would be empty"
    server.process.send_signal(15)
    # As the README says: the listening socket closes at once, so new connections are refused
    # while the work already received still finishes.
    wait_until(lambda: _refused(server.url), "new connections refused after SIGTERM")
    assert any(r is None for r in results), "the drain was over before the refusal was checked"
    for t in threads:
        t.join(120)
    assert server.process.wait(60) == 0, server.log()
    statuses = [getattr(r, "status_code", repr(r)) for r in results]
    assert statuses == [200, 200, 200], statuses
    shapes = {json.dumps(np.load(io.BytesIO(r.content), allow_pickle=False).shape) for r in results}
    assert shapes == {json.dumps([2, 9, 64, 64, 3])}
    log = server.log()
    assert "Shutting down" in log and "Application shutdown complete" in log
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/healthz")


def test_failed_model_load_is_reported_not_hidden(tmp_path):
    # A server whose model cannot load stays up to say why: liveness and readiness both 503.
    missing = tmp_path / "no-such-model"
    server = launch_server(missing, tmp_path / "log")
    try:
        deadline, health = time.monotonic() + 90, None
        while time.monotonic() < deadline and health != 503:
            time.sleep(0.3)
            try:
                health = httpx.get(server.url + "/healthz").status_code
            except httpx.HTTPError:
                pass
        assert health == 503
        ready = httpx.get(server.url + "/readyz")
        assert ready.status_code == 503 and ready.json()["status"] == "failed"
        assert str(missing) in ready.json()["detail"]
    finally:
        server.process.send_signal(15)
        assert server.process.wait(30) == 0


def test_sigterm_while_warming_up_exits_0_without_waiting_for_the_warm_up(tiny_model_dir, tmp_path):
    # Three cold warm-up compiles (seconds each) and a drain time far beyond them: a server that
    # waited for its start-up would compile all three before exiting.
    warmups = ["16x2x4x4:uint8", "16x3x4x4:uint8", "16x2x8x4:uint8"]
    server = launch_server(tiny_model_dir, tmp_path / "log", "--tp", "2", "--dp", "2", "--drain-timeout-s", "600",
                           *[arg for w in warmups for arg in ("--warmup", w)])
    try:
        def loading() -> bool:
            try:
                return httpx.get(server.url + "/readyz", timeout=2).json()["status"] == "loading"
            except httpx.HTTPError:
                return False

        wait_until(loading, "the server answers while it loads")
        server.process.send_signal(15)
        assert server.process.wait(120) == 0, server.log()
    finally:
        if server.process.poll() is None:
            server.process.kill()
    text = server.log()
    assert "stopped while starting" in text, text
    compiled = text.count("warm-up 16x")
    assert compiled < len(warmups), f"every warm-up compiled before the exit ({compiled}):\n{text}"
    assert "Application shutdown complete" in text


# ---- Ctrl-C, and a second signal --------------------------------------------------------------------


def _upload_begun(address: tuple[str, int], x: np.ndarray) -> tuple[socket.socket, bytes]:
    """A decode whose headers and first 100 body bytes are sent: it holds a queue slot while the
    rest of its body is awaited. Returns the socket and the rest."""
    head = (f"POST /v1/decode?shape={','.join(map(str, x.shape))}&dtype=float32&output_type=npy HTTP/1.1\r\n"
            f"Host: x\r\nContent-Type: tensor/binary\r\nContent-Length: {x.nbytes}\r\n\r\n").encode()
    body = x.tobytes()
    sock = socket.create_connection(address)
    sock.sendall(head + body[:100])
    return sock, body[100:]


def _answered(sock: socket.socket) -> bool:
    """The server has sent something on ``sock`` (or closed it)."""
    return bool(select.select([sock], [], [], 0)[0])


@pytest.mark.parametrize("first,second,uploads", [("SIGINT", "SIGINT", 2), ("SIGTERM", "SIGTERM", 1)])
def test_sigint_drains_like_sigterm_and_a_second_signal_ends_the_drain(tiny_model_dir, tmp_path, first, second,
                                                                       uploads):
    """Uploads under way hold their queue slots; a long drain. After the first signal, one that
    finishes its upload is served (the drain waits for them: the SIGINT case, which pays for the
    decode's compile); after the second the drain is over: the last one is answered 503
    problem+json, and the process exits 0 without a traceback. (Before: SIGINT ended in a
    KeyboardInterrupt traceback and status -2, a second SIGINT cancelled the requests in flight
    with plain-text 500s, a second SIGTERM changed nothing.)"""
    server = launch_server(tiny_model_dir, tmp_path / "log", "--max-batch", "1", "--drain-timeout-s", "600",
                           "--read-timeout-s", "600", "--upload-stall-s", "600")
    try:
        wait_until(lambda: _ready(server.url), "the server is ready", timeout=120)
        host, port = server.url.removeprefix("http://").split(":")
        begun = [_upload_begun((host, int(port)), latents(seed=40 + i)) for i in range(uploads)]
        wait_until(lambda: server.metric("vaeserve_uploads") == uploads, "the uploads are under way")
        server.process.send_signal(getattr(signal, first))
        wait_until(lambda: _refused(server.url), "new connections refused")
        for sock, rest in begun[:-1]:
            sock.sendall(rest)
            answer = read_all(sock)
            assert answer.status == 200 and answer.headers["content-type"] == "application/x-npy", answer
        server.process.send_signal(getattr(signal, second))
        sock, rest = begun[-1]
        wait_until(lambda: f"signal {second} again: the drain ends now" in server.log() or _answered(sock),
                   "the second signal taken")
        sock.sendall(rest)
        late = read_all(sock)
        exit_code = server.process.wait(60)
    finally:
        if server.process.poll() is None:
            server.process.kill()
    assert late.status == 503 and late.headers["content-type"] == "application/problem+json", late
    assert json.loads(late.body)["type"].endswith("/unavailable") and late.headers["retry-after"]
    log = server.log()
    assert exit_code == 0, log
    assert "Traceback" not in log and "KeyboardInterrupt" not in log and "Internal Server Error" not in log, log


# ---- SIGTERM past the drain time ------------------------------------------------------------------

SLOW = (1, 16, 9, 32, 32)  # 33 frames of 256x256: a cold compile, then seconds of device work each
# The MP4 stream's latents: 97 frames of 256x256 (the same step programs as SLOW's), about 8 MB at
# crf 0, twice what the kernel's send buffer takes in (net.ipv4.tcp_wmem's most: 4 MB), so with
# its reader stalled the server's writes block and the stream is under way at the drain's end
# however fast the device (SLOW's 2.75 MB fitted the buffer and could finish inside the drain).
LONG_MP4 = (1, 16, 25, 32, 32)


def _stream_messages(body: bytes) -> list[dict]:
    return [header for header, _ in read_stream(iter([body]))]


def test_sigterm_past_the_drain_time_answers_every_request_503_and_exits_0(tiny_model_dir, tmp_path):
    """Work that outlasts the drain: a raw stream (its reader slow) and a fragmented MP4 (its
    reader stalled) begun, six decodes and an encode queued. At the drain's end each gets
    the documented answer — an ordinary 503 problem, the stream's in-band error message, the MP4
    cut off — and the process exits 0. (Before: uvicorn's graceful timeout, equal to the drain's,
    cancelled the handlers first: 500 text/plain for all, and SIGABRT, exit 134.)"""
    server = launch_server(tiny_model_dir, tmp_path / "log", "--max-batch", "1", "--drain-timeout-s", "3",
                           "--max-frames", "97", "--max-height", "256", "--max-width", "256",
                           "--stream-buffer-bytes", "1")
    try:
        wait_until(lambda: _ready(server.url), "the server is ready", timeout=120)
        x = latents(SLOW, seed=30)
        query = {"shape": ",".join(map(str, SLOW)), "dtype": "float32"}
        host, port = server.url.removeprefix("http://").split(":")
        address = (host, int(port))
        long_query = {"shape": ",".join(map(str, LONG_MP4)), "dtype": "float32"}
        streams = {"raw": send_request(address, "/v1/decode", x.tobytes(), params={**query, "stream": "true"}),
                   "mp4": send_request(address, "/v1/decode", latents(LONG_MP4, seed=32).tobytes(),
                                       params={**long_query, "stream": "true", "output_type": "mp4", "crf": "0"})}
        began = {kind: read_head(sock) for kind, sock in streams.items()}  # their first step left the device
        # The raw stream's reader reads slowly (its 6.4 MB of frames take the drain and more), so the
        # stream is still under way when the drain ends and its in-band error message can reach it;
        # the MP4's never reads again (LONG_MP4).
        raw_read: dict[str, Any] = {}
        raw_reader = threading.Thread(
            target=lambda: raw_read.update(answer=read_all(streams["raw"], began["raw"], rate=128 * 1024)))
        raw_reader.start()
        answers: dict[str, httpx.Response | str] = {}

        def call(name: str, path: str, body: bytes, params: dict) -> None:
            try:
                answers[name] = httpx.post(server.url + path, content=body, params=params, timeout=120,
                                           headers={"Content-Type": "application/octet-stream"})
            except httpx.HTTPError as exc:
                answers[name] = repr(exc)

        frames = np.random.default_rng(31).uniform(-1, 1, (1, 3, 5, 16, 16)).astype(np.float32)
        calls = [threading.Thread(target=call, args=(f"decode{i}", "/v1/decode", x.tobytes(),
                                                     {**query, "output_type": "npy"})) for i in range(6)]
        calls.append(threading.Thread(target=call, args=("encode", "/v1/encode", frames.tobytes(),
                                                         {"shape": "1,3,5,16,16", "dtype": "float32"})))
        for thread in calls:
            thread.start()
        wait_until(lambda: server.metric("vaeserve_queue_depth") >= 6, "the decodes and the encode queued")
        server.process.send_signal(15)
        for thread in calls:
            thread.join(120)
        exit_code = server.process.wait(120)
        raw_reader.join(120)
        streamed = {"raw": raw_read["answer"], "mp4": read_all(streams["mp4"], began["mp4"])}
    finally:
        if server.process.poll() is None:
            server.process.kill()
    assert exit_code == 0, server.log()
    statuses = {name: getattr(answer, "status_code", answer) for name, answer in answers.items()}
    assert set(statuses.values()) <= {200, 503} and len(statuses) == 7, statuses
    for answer in answers.values():
        assert isinstance(answer, httpx.Response)
        if answer.status_code == 503:
            assert answer.headers["content-type"] == "application/problem+json" and answer.headers["retry-after"]
            assert answer.json()["type"].endswith("/unavailable"), answer.text
    # The streams had begun: the raw one ends with its error message, the MP4 is cut off.
    raw = streamed["raw"]
    assert raw.status == 200 and raw.complete, raw
    messages = _stream_messages(raw.body)
    assert messages[0]["type"] == "frames" and messages[-1]["type"] == "error", messages
    assert messages[-1]["problem"]["status"] == 503 and messages[-1]["problem"]["type"].endswith("/unavailable")
    mp4 = streamed["mp4"]
    assert mp4.status == 200 and mp4.headers["content-type"] == "video/mp4" and not mp4.complete
    assert not mp4.body or mp4_boxes(mp4.body)[:2] == ["ftyp", "moov"]  # a prefix (libx264 holds its first frames)
    log = server.log()
    assert "Internal Server Error" not in log and "Cancel" not in log, log


def _ready(url: str) -> bool:
    try:
        return httpx.get(url + "/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
