"""Answers written while the decode runs, on a real uvicorn server (in a thread, so a test can give
it a runner): MP4 encoded step by step, and fragmented MP4, decode to the frames of the whole decode
(lossless H.264); the first fragment leaves before the second decode step ends; an error
mid-stream cuts a fragmented MP4 off; slow readers hold bounded memory, do not hold up the device,
hold no MP4 writer, are dropped at the write deadline when they take nothing, and get their whole
answer when they take it slowly (raw sockets)."""

from __future__ import annotations

import socket
import time

import httpx
import numpy as np
import pytest

from tests.helpers.raw_http import read_all, read_head, send_request
from tests.helpers.service_helpers import (
    FirstStepRunner,
    PoisonRunner,
    latents,
    make_test_model,
    poisoned,
    thread_server,
)
from vaeserve.service.client import read_stream
from vaeserve.service.codecs.video import Mp4Writer, mp4_boxes, mp4_bytes, read_mp4
from vaeserve.service.engine.runner import DeviceRunner
from vaeserve.sharding import Decoded

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


def live_mp4_bytes(frames: np.ndarray, *, fps: int, crf: int) -> bytes:
    """A whole video through the fragmented stream's writer (its encoder settings, not the file's)."""
    writer = Mp4Writer(int(frames.shape[1]), int(frames.shape[2]), fps=fps, crf=crf, fragmented=True)
    return writer.write(frames) + writer.close()


def test_pipelined_and_fragmented_mp4s_decode_to_the_frames_of_the_whole_mp4(tiny_vae):
    # A latent size no other test decodes: the shared tiny model keeps every test's programs, and a
    # whole decode of these latents compiled elsewhere would hide one made here.
    x = latents((1, 16, 5, 4, 6), seed=11)
    # Lossless H.264 (crf=0): the decoded frames are the frames the encoder was given, whatever it
    # chose on the way. libx264's lossy output is not the same from run to run at sizes this small
    # (service.codecs.video), so bytes, or lossy frames, cannot be compared.
    with thread_server(tiny_vae, max_batch=1, **LIMITS) as srv:
        pipelined = post(srv.url, x, output_type="mp4", fps=8, crf=0)
        assert pipelined.status_code == 200 and pipelined.headers["content-type"] == "video/mp4", pipelined.text
        # Made from the steps: stream steps of these latents, no whole decode of them.
        programs = [p[0] for p in compiled(srv.url) if p[1][3:] == list(x.shape[3:])]
        assert "stream-step" in programs and "decode" not in programs, programs
        assert float(pipelined.headers["X-Device-Time-S"]) > 0 and pipelined.headers["X-Batch-Size"] == "1"
        fragmented = post(srv.url, x, output_type="mp4", fps=8, crf=0, stream="true")
        assert fragmented.status_code == 200 and fragmented.headers["content-type"] == "video/mp4"
        frames = np.load(__import__("io").BytesIO(post(srv.url, x, output_type="npy").content))[0]
    expected = read_mp4(mp4_bytes(frames, fps=8, crf=0))  # what the service answered before it pipelined
    assert expected.shape == (17, 32, 48, 3)
    assert mp4_boxes(pipelined.content)[:2] == ["ftyp", "moov"]
    assert np.array_equal(read_mp4(pipelined.content), expected)
    boxes = mp4_boxes(fragmented.content)
    assert boxes[:3] == ["ftyp", "moov", "moof"] and boxes.count("moof") == 17 and "mfra" not in boxes
    assert np.array_equal(read_mp4(live_mp4_bytes(frames, fps=8, crf=0)), expected)  # the stream's encoder too
    assert np.array_equal(read_mp4(fragmented.content), expected)
    # Negative controls: the comparison sees a lossy encode of the same frames, and two frames of
    # one step swapped.
    assert not np.array_equal(read_mp4(mp4_bytes(frames, fps=8, crf=18)), expected)
    assert not np.array_equal(read_mp4(mp4_bytes(frames[[0, 1, 2, 4, 3, *range(5, 17)]], fps=8, crf=0)), expected)


def test_a_shape_warmed_for_uint8_serves_every_uint8_answer_from_the_same_steps():
    x = latents((1, 16, 2, 4, 4), seed=12)
    with thread_server(make_test_model(), max_batch=1, warmup=["16x2x4x4:uint8"], shapes="warmed", **LIMITS) as srv:
        r = post(srv.url, x, output_type="mp4", fps=8, crf=0)  # lossless: see the test above
        assert r.status_code == 200, r.text
        frames = np.load(__import__("io").BytesIO(post(srv.url, x, output_type="npy").content))
        streamed = post(srv.url, x, output_type="mp4", stream="true")
        assert streamed.status_code == 200
        # A fresh model: what it ran, the two uint8 steps of the warm-up, and nothing else.
        assert sorted(program[2] for program in compiled(srv.url)) == ["first", "next"]
        refused = post(srv.url, x, output_type="pt")  # float frames: not warmed
    assert np.array_equal(read_mp4(r.content), read_mp4(mp4_bytes(frames[0], fps=8, crf=0)))
    assert refused.status_code == 422 and refused.json()["type"].endswith("/shape-not-allowed")


# ---- fragments leave while the decode runs ------------------------------------------------------


def test_the_first_fragment_leaves_before_the_second_decode_step_ends(tiny_vae):
    # The runner yields the first step (latent frame 0: one frame) and holds the rest: a fragment
    # that arrives while it holds came from the first step alone.
    x = latents(FRAMES_5, seed=13)
    FirstStepRunner.release.clear()
    with thread_server(tiny_vae, runner_factory=FirstStepRunner, max_batch=1, **LIMITS) as srv:
        received = bytearray()
        with httpx.stream("POST", srv.url + "/v1/decode", content=x.tobytes(), timeout=120,
                          params=raw(x, output_type="mp4", stream="true"),
                          headers={"Content-Type": "application/octet-stream"}) as response:
            assert response.status_code == 200
            chunks = response.iter_bytes()
            while "mdat" not in mp4_boxes(bytes(received)):
                received += next(chunks)
            second_step_held = not FirstStepRunner.release.is_set()
            FirstStepRunner.release.set()
            first = bytes(received)
            for chunk in chunks:
                received += chunk
    assert second_step_held  # the init segment and the first frame's fragment came from the first step
    assert mp4_boxes(first) == ["ftyp", "moov", "moof", "mdat"]
    assert read_mp4(first).shape == (1, 32, 32, 3)  # a playable MP4 of the first frame
    assert read_mp4(bytes(received)).shape == (17, 32, 32, 3)


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

    def decode_stream(self, latents, **options):
        if latents.shape[2] != 2:
            yield from super().decode_stream(latents, **options)
            return
        for index in range(STEPS):
            BigStepRunner.made += 1
            yield Decoded(np.full(STEP, index, np.uint8), np.zeros(1, np.int32))


def stalled_stream(address: tuple[str, int], x: np.ndarray, **params) -> socket.socket:
    """Send a stream request, then read nothing (a receive buffer as small as the OS allows)."""
    return send_request(address, "/v1/decode", x.tobytes(), params=raw(x, stream="true", **params))


def read_to_the_end(sock: socket.socket) -> int:
    """Bytes the server had sent before it closed the connection (EOF or reset)."""
    return len(read_all(sock, timeout=30).body)


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


class NoiseRunner(DeviceRunner):
    """Streams of noise, whatever the model (the HTTP side is under test): latents with T = 2 give
    ``NOISE_STEPS`` steps of four 512x512 frames (an MP4 of megabytes, more than the kernel buffers
    for a reader), any other T two steps of four 32x32 frames."""

    def decode_stream(self, latents, **options):
        big = latents.shape[2] == 2
        rng = np.random.default_rng(int(latents.shape[2]))
        for _ in range(NOISE_STEPS if big else 2):
            frames = rng.integers(0, 256, (1, 4, *((512, 512) if big else (32, 32)), 3), dtype=np.uint8)
            yield Decoded(frames, np.zeros(1, np.int32))


NOISE_STEPS = 12


def test_readers_that_never_read_hold_no_mp4_writer(tiny_vae):
    # The hostile run: two fragmented-MP4 streams whose sockets were never read held both MP4
    # writers until the write deadline; another client's 5-frame MP4 waited for it (29.3 s, 37.1 s).
    stalled_x, quick_x = latents((1, 16, 2, 4, 4), seed=16), latents((1, 16, 3, 4, 4), seed=17)
    with thread_server(tiny_vae, runner_factory=NoiseRunner, max_batch=1, mp4_writers=2,
                       stream_buffer_bytes=4 * 2**20, write_timeout_s=30, max_queue=8, **LIMITS) as srv:
        # Lossless noise: megabytes of MP4 after a few frames, more than the kernel holds for them.
        stalled = [stalled_stream(srv.address, stalled_x, output_type="mp4", crf=0) for _ in range(2)]
        for sock in stalled:
            assert read_head(sock).startswith(b"HTTP/1.1 200")  # their MP4s began: each has its writer
        answer = post(srv.url, quick_x, output_type="mp4", fps=8)
        # Answered while both are held: neither was dropped nor finished.
        assert srv.metric("vaeserve_requests_total", route="/v1/decode", status="499") == 0
        assert answer.status_code == 200 and read_mp4(answer.content).shape == (8, 32, 32, 3)
        # Blocked on their sockets, they encode nothing and hold no slot of the pool (their frames
        # wait in their jobs, within the stream buffer).
        assert wait_until(lambda: srv.metric("vaeserve_encoders_busy") == 0
                          and srv.metric("vaeserve_stream_buffered_bytes") >= 2 * 4 * 2**20)
        assert srv.metric("vaeserve_requests_total", route="/v1/decode", status="499") == 0
        for sock in stalled:
            sock.close()
        assert wait_until(lambda: srv.metric("vaeserve_requests_total", route="/v1/decode", status="499") == 2)


STEADY_STEP = (1, 4, 128, 128, 3)  # 192 KiB
STEADY_STEPS = 20  # 3.75 MiB: more than the kernel holds for a reader (about 3 MB on loopback)


class SteadyRunner(DeviceRunner):
    def decode_stream(self, latents, **options):
        for index in range(STEADY_STEPS):
            yield Decoded(np.full(STEADY_STEP, index, np.uint8), np.zeros(1, np.int32))


def test_a_slow_but_steady_reader_gets_its_whole_answer(tiny_vae):
    # The hostile run: a reader at 16 KiB/s (write_timeout_s 4) was cut off after 298 KiB: the
    # deadline ran from the transport's pause until its resume, which waits for the kernel's send
    # buffer to drain by a third (about a megabyte), not for the first byte taken. Here: 512 KiB/s,
    # write_timeout_s 1, so taking that megabyte lasts twice the deadline; the old timer cut it.
    x = latents((1, 16, 2, 4, 4), seed=18)
    with thread_server(tiny_vae, runner_factory=SteadyRunner, max_batch=1, write_timeout_s=1.0,
                       stream_buffer_bytes=2**20, **LIMITS) as srv:
        answer = read_all(stalled_stream(srv.address, x), rate=512 * 2**10)
        assert srv.metric("vaeserve_requests_total", route="/v1/decode", status="499") == 0
    assert answer.status == 200 and answer.complete
    messages = list(read_stream(iter([answer.body])))
    assert [header["type"] for header, _ in messages] == ["frames"] * STEADY_STEPS + ["end"]
    assert all(payload == bytes([index]) * int(np.prod(STEADY_STEP))
               for index, (_, payload) in enumerate(messages[:-1]))
