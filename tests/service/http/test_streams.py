"""Answers written while the decode runs, on a real uvicorn server (in a thread, so a test can give
it a runner): MP4 encoded step by step and fragmented MP4 give the frames of the MP4 made from the
whole decode; fragments leave before the decode ends; an error mid-stream cuts a fragmented MP4
off; slow readers hold bounded memory, do not hold up the device, and are dropped at the write
deadline (raw sockets)."""

from __future__ import annotations

import socket
import time

import httpx
import numpy as np
import pytest

from service.codecs.video import mp4_boxes, mp4_bytes, read_mp4
from service.engine.runner import DeviceRunner
from sharding import Decoded
from tests.helpers.service_helpers import (
    HeldRunner,
    PoisonRunner,
    latents,
    make_test_model,
    poisoned,
    thread_server,
)

FRAMES_5 = (1, 16, 5, 4, 4)  # -> 17 frames of 32x32, in steps of 1, 4, 4, 4, 4
LIMITS = dict(max_frames=21, max_height=64, max_width=64)


def raw(x: np.ndarray, **params) -> dict:
    return {"shape": ",".join(map(str, x.shape)), "dtype": "float32", **params}


def post(url: str, x: np.ndarray, **params) -> httpx.Response:
    return httpx.post(url + "/v1/decode", content=x.tobytes(), params=raw(x, **params), timeout=120,
                      headers={"Content-Type": "application/octet-stream"})


def compiled(url: str) -> list:
    return httpx.get(url + "/v1/models").json()["data"][0]["compiled"]


# ---- the same frames, however the MP4 is made ---------------------------------------------------


def test_pipelined_and_fragmented_mp4s_decode_to_the_frames_of_the_whole_mp4(tiny_vae):
    # A latent size no other test decodes: the shared tiny model keeps every test's programs, and a
    # whole decode of these latents compiled elsewhere would hide one made here.
    x = latents((1, 16, 5, 4, 6), seed=11)
    with thread_server(tiny_vae, max_batch=1, **LIMITS) as srv:
        pipelined = post(srv.url, x, output_type="mp4", fps=8)
        assert pipelined.status_code == 200 and pipelined.headers["content-type"] == "video/mp4", pipelined.text
        # Made from the steps: stream steps of these latents, no whole decode of them.
        programs = [p[0] for p in compiled(srv.url) if p[1][3:] == list(x.shape[3:])]
        assert "stream-step" in programs and "decode" not in programs, programs
        assert float(pipelined.headers["X-Device-Time-S"]) > 0 and pipelined.headers["X-Batch-Size"] == "1"
        fragmented = post(srv.url, x, output_type="mp4", fps=8, stream="true")
        assert fragmented.status_code == 200 and fragmented.headers["content-type"] == "video/mp4"
        frames = np.load(__import__("io").BytesIO(post(srv.url, x, output_type="npy").content))
    whole = mp4_bytes(frames[0], fps=8, crf=18)  # what the service answered before it pipelined
    expected = read_mp4(whole)
    assert expected.shape == (17, 32, 48, 3)
    assert mp4_boxes(pipelined.content)[:2] == ["ftyp", "moov"] and pipelined.content == whole
    boxes = mp4_boxes(fragmented.content)
    assert boxes[:3] == ["ftyp", "moov", "moof"] and boxes.count("moof") == 17 and "mfra" not in boxes
    for video in (pipelined.content, fragmented.content):
        assert np.array_equal(read_mp4(video), expected)
    # Negative control: the comparison sees a change as small as another quality setting.
    assert not np.array_equal(read_mp4(mp4_bytes(frames[0], fps=8, crf=30)), expected)


def test_a_shape_warmed_for_uint8_serves_every_uint8_answer_from_the_same_steps():
    x = latents((1, 16, 2, 4, 4), seed=12)
    with thread_server(make_test_model(), max_batch=1, warmup=["16x2x4x4:uint8"], shapes="warmed", **LIMITS) as srv:
        r = post(srv.url, x, output_type="mp4", fps=8)
        assert r.status_code == 200, r.text
        frames = np.load(__import__("io").BytesIO(post(srv.url, x, output_type="npy").content))
        streamed = post(srv.url, x, output_type="mp4", stream="true")
        assert streamed.status_code == 200
        # A fresh model: what it ran, the two uint8 steps of the warm-up, and nothing else.
        assert sorted(program[2] for program in compiled(srv.url)) == ["first", "next"]
        refused = post(srv.url, x, output_type="pt")  # float frames: not warmed
    assert np.array_equal(read_mp4(r.content), read_mp4(mp4_bytes(frames[0], fps=8, crf=18)))
    assert refused.status_code == 422 and refused.json()["type"].endswith("/shape-not-allowed")


# ---- fragments leave while the decode runs ------------------------------------------------------


def test_fragments_leave_before_the_decode_ends(tiny_vae):
    x = latents((1, 16, 6, 4, 4), seed=13)  # 21 frames: libx264 lets go of the first after about 12
    HeldRunner.release.clear()
    with thread_server(tiny_vae, runner_factory=HeldRunner, max_batch=1, **LIMITS) as srv:
        received = bytearray()
        with httpx.stream("POST", srv.url + "/v1/decode", content=x.tobytes(), timeout=120,
                          params=raw(x, output_type="mp4", stream="true"),
                          headers={"Content-Type": "application/octet-stream"}) as response:
            assert response.status_code == 200
            chunks = response.iter_bytes()
            while "moof" not in mp4_boxes(bytes(received)):
                received += next(chunks)
            playable_before_the_end = not HeldRunner.release.is_set()
            HeldRunner.release.set()
            for chunk in chunks:
                received += chunk
    assert playable_before_the_end  # an init segment and a fragment, and the last step not decoded
    assert read_mp4(bytes(received)).shape == (21, 32, 32, 3)


def test_an_error_mid_stream_cuts_the_fragmented_mp4_off(tiny_vae):
    x = latents(FRAMES_5, seed=14)
    with thread_server(tiny_vae, runner_factory=PoisonRunner, max_batch=1, **LIMITS) as srv:
        with httpx.stream("POST", srv.url + "/v1/decode", content=poisoned(x).tobytes(), timeout=120,
                          params=raw(x, output_type="mp4", stream="true"),
                          headers={"Content-Type": "application/octet-stream"}) as response:
            assert response.status_code == 200  # the first step left the device before the failure
            with pytest.raises(httpx.RemoteProtocolError):  # no last chunk: the answer is incomplete
                response.read()
        assert srv.metric("vaeserve_requests_total", route="/v1/decode", status="500") == 1
        assert srv.metric("vaeserve_requests_total", route="/v1/decode", status="200") == 0
        assert post(srv.url, x, output_type="mp4", stream="true").status_code == 200  # and it serves on


# ---- slow readers -------------------------------------------------------------------------------

STEP = (1, 4, 512, 512, 3)  # 3 MiB a step
STEPS = 40


class BigStepRunner(DeviceRunner):
    """Streams of 40 steps of 3 MiB for latents of 2 frames (a stand-in for a large video; the
    worker and the HTTP stream are under test, not the model), the model's own decode of any
    other latents (an ordinary request). Counts the big steps it made."""

    made = 0

    def decode_stream(self, latents, *, output="uint8", framewise=False):
        if latents.shape[2] != 2:
            yield from super().decode_stream(latents, output=output, framewise=framewise)
            return
        for index in range(STEPS):
            BigStepRunner.made += 1
            yield Decoded(np.full(STEP, index, np.uint8), np.zeros(1, np.int32))


def stalled_stream(address: tuple[str, int], x: np.ndarray) -> socket.socket:
    """Send a stream request, then read nothing (a receive buffer as small as the OS allows)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(address)
    query = "&".join(f"{k}={v}" for k, v in raw(x, stream="true").items())
    body = x.tobytes()
    sock.sendall(f"POST /v1/decode?{query} HTTP/1.1\r\nHost: test\r\nContent-Type: application/octet-stream\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return sock


def read_to_the_end(sock: socket.socket) -> int:
    """Bytes the server had sent before it closed the connection (EOF or reset)."""
    sock.settimeout(30)
    received = 0
    try:
        while data := sock.recv(2**20):
            received += len(data)
    except ConnectionResetError:
        pass
    return received


def wait_until(condition, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_slow_readers_hold_bounded_memory_and_are_dropped_at_the_write_deadline(tiny_vae):
    bound, write_timeout = 4 * 2**20, 4.0
    x = latents((1, 16, 2, 4, 4), seed=15)
    ordinary = latents((1, 16, 1, 4, 4), seed=16)
    BigStepRunner.made = 0
    with thread_server(tiny_vae, runner_factory=BigStepRunner, max_batch=1, stream_buffer_bytes=bound,
                       write_timeout_s=write_timeout, max_queue=8, **LIMITS) as srv:
        assert post(srv.url, ordinary, output_type="npy").status_code == 200  # compiled before the clock matters
        sockets = [stalled_stream(srv.address, x) for _ in range(3)]
        buffered = lambda: srv.metric("vaeserve_stream_buffered_bytes")  # noqa: E731
        # Each stream fills its bound (plus the step that crossed it), then is set aside.
        assert wait_until(lambda: buffered() >= 3 * bound)
        made_while_stalled = BigStepRunner.made
        # The device is not held by them: an ordinary request is answered while they stall.
        assert post(srv.url, ordinary, output_type="npy").status_code == 200
        assert srv.metric("vaeserve_requests_total", route="/v1/decode", status="499") == 0  # still stalled
        assert buffered() <= 3 * (bound + np.prod(STEP))
        assert made_while_stalled <= 3 * (bound // np.prod(STEP) + 6)  # far from 3 x 40: set aside
        # At the write deadline each is dropped: its memory freed, counted as a client gone.
        assert wait_until(lambda: srv.metric("vaeserve_requests_total", route="/v1/decode", status="499") == 3,
                          timeout=write_timeout + 30)
        assert wait_until(lambda: buffered() == 0, timeout=10)
        assert srv.metric("vaeserve_dropped_total", reason="client-gone") == 3
        for sock in sockets:  # what the kernel held for them, then the end, far short of the stream
            assert read_to_the_end(sock) < STEPS * np.prod(STEP) / 4
            sock.close()
        assert BigStepRunner.made < 3 * STEPS  # their remaining steps were never decoded
        # A reader that reads gets every step, at the bound's pace.
        r = httpx.post(srv.url + "/v1/decode", content=x.tobytes(), params=raw(x, stream="true"), timeout=120,
                       headers={"Content-Type": "application/octet-stream"})
        assert r.status_code == 200 and len(r.content) > STEPS * np.prod(STEP)
