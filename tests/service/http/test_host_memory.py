"""The host account (``host_memory_bytes``): what requests hold on the host, together, never past
it. A request that fits alone but not beside the others in flight waits its turn until its
deadline, then 503 with ``Retry-After``; one larger than the whole account is refused at once.
A real uvicorn server; ``GatedRunner`` keeps the first request's decode (and what it holds) in
flight until the test lets it go."""

from __future__ import annotations

from tests.helpers.service_helpers import (
    GatedRunner,
    gated_warm_up,
    latents,
    marked,
    post_in_thread,
    thread_server,
    wait_until,
)
from vaeserve.service.http.host_memory import decode_host_bytes
from vaeserve.service.http.schemas import DecodeParams
from vaeserve.service.limits import Limits
from vaeserve.service.settings import Settings

SHAPE = (1, 16, 2, 4, 4)
NPY = DecodeParams(output_type="npy", denormalize=False, partial_postprocess=False, stream=False, mp4_stream=False,
                   fps=16, crf=18, frame=0, shape=None, dtype=None, scaling_factor=None, shift_factor=None,
                   timeout_s=300)


def held_bytes(shape=SHAPE) -> int:
    """What an npy decode of ``shape`` holds on the host (the tiny Wan model: 8x, 4x)."""
    limits = Limits(channels=16, max_batch=1, max_frames=129, max_height=64, max_width=64)
    return decode_host_bytes(shape, NPY, limits, stream_buffer_bytes=Settings().stream_buffer_bytes, causal=True)


def test_a_request_that_fits_alone_but_not_beside_others_waits_then_gets_503(tiny_vae):
    GatedRunner.reset()
    account = int(1.5 * held_bytes())  # one decode fits, two do not
    with thread_server(tiny_vae, runner_factory=GatedRunner, max_batch=1, max_frames=33, host_memory_bytes=account) as srv:
        gated_warm_up(srv.url, SHAPE)
        held: list = []
        first = post_in_thread(srv.url, marked(latents(SHAPE, seed=1), "A"), held)
        wait_until(lambda: srv.metric("vaeserve_host_memory_bytes") == held_bytes(), "the first request held")
        waited: list = []
        post_in_thread(srv.url, marked(latents(SHAPE, seed=2), "B"), waited, timeout_s=2).join(120)
        r = waited[0]
        assert r.status_code == 503 and r.json()["type"].endswith("/busy-host-memory"), r.text
        assert r.headers["Retry-After"] == "1"
        assert r.json()["expected"] == f"{held_bytes()} bytes free of {account}"
        assert GatedRunner.log == []  # it never reached the device
        # Larger than the whole account: refused at once, whatever else is in flight.
        big = (1, 16, 9, 8, 8)
        assert held_bytes(big) > account
        refused: list = []
        post_in_thread(srv.url, marked(latents(big, seed=3), "C"), refused).join(120)
        assert refused[0].status_code == 422 and refused[0].json()["type"].endswith("/too-large-for-memory")
        assert refused[0].json()["received"]["bytes"] == held_bytes(big)
        assert srv.metric("vaeserve_refused_for_memory_total", check="host") == 1
        for _ in range(2):
            GatedRunner.permits.release()
        first.join(120)
        assert held[0].status_code == 200
        assert srv.metric("vaeserve_host_memory_bytes") == 0
        # Negative control: the second request fits alone, once the first let go.
        again: list = []
        for _ in range(2):
            GatedRunner.permits.release()
        post_in_thread(srv.url, marked(latents(SHAPE, seed=2), "B"), again).join(120)
        assert again[0].status_code == 200
        assert GatedRunner.log == ["A0", "A1", "B0", "B1"]
