"""Streams set aside keep their decode state on the device, and it is counted: a request that
would not fit beside it waits, and a reader behind for ``slow_reader_s`` while others wait for
what it holds (the memory, or its batch-mates the device) is ended in-band (``slow-reader``), its
state freed. A real uvicorn server (in a thread, to give it a runner whose big streams stand in
for large videos: their frames megabytes, their caches ``HELD`` bytes per device).

(The hostile run: four raw streams at the largest advertised size whose readers took 8 KB every
5 s grew the server from 3.8 to 7.3 GB, and the kernel's OOM killer ended it.)"""

from __future__ import annotations

import json
import threading

import httpx
import numpy as np

from tests.helpers.raw_http import read_all, send_request
from tests.helpers.service_helpers import latents, thread_server, wait_until
from vaeserve.service.client import read_stream
from vaeserve.service.engine.runner import DeviceRunner
from vaeserve.sharding import Decoded

BIG = (1, 16, 9, 4, 4)  # a big stream: 33 frames of 512x512 (24 MiB, more than the kernel holds for a reader)
GATED = (1, 16, 3, 4, 4)  # holds the device until the test opens the gate
ORDINARY = (1, 16, 1, 4, 4)
SIDE = 512
HELD = 2 * 10**9  # the big stream's caches between steps, per device
LIMIT = 10**9  # the devices' memory: an ordinary request fits alone, not beside a big stream's state
SETTINGS = dict(max_batch=2, max_queue=8, max_frames=33, max_height=64, max_width=64, device_memory_bytes=LIMIT,
                stream_buffer_bytes=4 * 2**20)


class BigStateRunner(DeviceRunner):
    """The model's own decode, but for ``BIG`` latents (steps of 1, then 4 frames of SIDE x SIDE,
    every pixel of a step its index; their state ``HELD`` bytes) and ``GATED`` ones (waiting for
    ``gate`` first)."""

    gate = threading.Event()

    def decode_stream(self, latents, **options):
        if latents.shape[2] == GATED[2]:
            assert BigStateRunner.gate.wait(120)
        if latents.shape[2] != BIG[2]:
            yield from super().decode_stream(latents, **options)
            return
        for index, frames in enumerate([1] + [4] * (BIG[2] - 1)):
            yield Decoded(np.full((latents.shape[0], frames, SIDE, SIDE, 3), index, np.uint8),
                          np.zeros(latents.shape[0], np.int32))

    def held_bytes(self, shape, **options):
        return HELD if shape[1] == BIG[2] else super().held_bytes(shape, **options)


def post(url: str, x: np.ndarray, **params) -> httpx.Response:
    query = {"shape": ",".join(map(str, x.shape)), "dtype": "float32", "output_type": "npy", **params}
    return httpx.post(url + "/v1/decode", content=x.tobytes(), params=query, timeout=120,
                      headers={"Content-Type": "application/octet-stream"})


def stalled_stream(address: tuple[str, int]) -> object:
    x = latents(BIG, seed=1)
    return send_request(address, "/v1/decode", x.tobytes(),
                        params={"shape": ",".join(map(str, BIG)), "dtype": "float32", "stream": "true"})


def stream_messages(sock) -> list[dict]:
    answer = read_all(sock, timeout=60)
    return [header for header, _ in read_stream(iter([answer.body]))]


def test_a_request_waits_for_the_memory_a_stream_set_aside_holds_and_its_slow_reader_is_ended(tiny_vae):
    with thread_server(tiny_vae, runner_factory=BigStateRunner, slow_reader_s=1.0, **SETTINGS) as srv:
        assert post(srv.url, latents(ORDINARY)).status_code == 200  # compiled before the clock matters
        sock = stalled_stream(srv.address)
        try:
            wait_until(lambda: srv.metric("vaeserve_stream_buffered_bytes") >= 4 * 2**20, "the stream set aside")
            served = post(srv.url, latents(ORDINARY, seed=2))  # does not fit beside the stream's state
            messages = stream_messages(sock)
        finally:
            sock.close()
        assert served.status_code == 200
        assert srv.metric("vaeserve_dropped_total", reason="slow-reader") == 1
    errors = [m["problem"] for m in messages if m["type"] == "error"]
    assert len(errors) == 1 and errors[0]["type"].endswith("/slow-reader"), messages
    assert "waited for the memory its decode holds" in errors[0]["detail"]
    assert int(errors[0]["received"].split()[0]) >= 4 * 2**20


def test_control_with_a_patient_server_the_request_waits_out_its_deadline(tiny_vae):
    # The same stream and request with slow_reader_s far away: the request is not run beside the
    # stream's state (it would be, were that state not counted), and it is answered at its deadline.
    with thread_server(tiny_vae, runner_factory=BigStateRunner, slow_reader_s=600.0, **SETTINGS) as srv:
        assert post(srv.url, latents(ORDINARY)).status_code == 200
        sock = stalled_stream(srv.address)
        try:
            wait_until(lambda: srv.metric("vaeserve_stream_buffered_bytes") >= 4 * 2**20, "the stream set aside")
            late = post(srv.url, latents(ORDINARY, seed=2), timeout_s=3)
        finally:
            sock.close()
        assert late.status_code == 504 and srv.metric("vaeserve_dropped_total", reason="slow-reader") == 0


def test_a_slow_reader_does_not_stall_its_batch_mates(tiny_vae):
    BigStateRunner.gate.clear()
    with thread_server(tiny_vae, runner_factory=BigStateRunner, slow_reader_s=1.0, **SETTINGS) as srv:
        holder: list = []
        threading.Thread(target=lambda: holder.append(post(srv.url, latents(GATED))), daemon=True).start()
        wait_until(lambda: srv.metric("vaeserve_queue_seconds_count") == 1, "the gated request on the device")
        sock = stalled_stream(srv.address)  # queued with its batch-mate behind the gated request
        mate: list = []
        threading.Thread(target=lambda: mate.append(post(srv.url, latents(BIG, seed=3))), daemon=True).start()
        try:
            wait_until(lambda: srv.metric("vaeserve_queue_depth") == 2, "the stream and its batch-mate queued")
            BigStateRunner.gate.set()
            wait_until(lambda: bool(mate), "the batch-mate answered", timeout=120)
            messages = stream_messages(sock)
        finally:
            sock.close()
    assert holder[0].status_code == 200 and mate[0].status_code == 200
    frames = np.load(__import__("io").BytesIO(mate[0].content))
    assert frames.shape == (1, 33, SIDE, SIDE, 3)
    assert [int(frames[0, f, 0, 0, 0]) for f in (0, 1, 4, 5, 32)] == [0, 1, 1, 2, 8]  # every step, in order
    errors = [m["problem"] for m in messages if m["type"] == "error"]
    assert len(errors) == 1 and "its batch-mates waited for it" in errors[0]["detail"], messages
    assert json.dumps(errors[0]).count("slow-reader") >= 1
