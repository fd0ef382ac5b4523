"""The queue-depth gauge says what waits for the device, also when nothing happens: a request
whose deadline passed in the queue (504) or whose client left (499) waits for nothing, though its
job stays queued until the device thread reaches it."""

from __future__ import annotations

import socket

from tests.helpers.raw_http import send_request
from tests.helpers.service_helpers import (
    GatedRunner,
    gated_warm_up,
    latents,
    marked,
    post_in_thread,
    thread_server,
    wait_until,
)

SHORT = (1, 16, 2, 4, 4)  # two decode steps


def test_requests_that_expire_or_leave_while_queued_leave_the_queue_depth(tiny_vae):
    # The hostile run: vaeserve_queue_depth stayed at 15 on an idle server after 15 queued requests got 504.
    GatedRunner.reset()
    with thread_server(tiny_vae, runner_factory=GatedRunner, max_batch=1, max_queue=8) as srv:
        gated_warm_up(srv.url, SHORT)
        started = srv.metric("vaeserve_queue_seconds_count")  # observed as a batch starts on the device
        holder: list = []
        post_in_thread(srv.url, marked(latents(SHORT, seed=1), "A"), holder)  # waits on the device for a permit
        wait_until(lambda: srv.metric("vaeserve_queue_seconds_count") > started, "A on the device")
        expired: list = []
        threads = [post_in_thread(srv.url, marked(latents(SHORT, seed=2), "B"), expired, timeout_s=3)
                   for _ in range(2)]
        x = latents(SHORT, seed=3)
        leaver = send_request(srv.address, "/v1/decode", x.tobytes(),
                              params={"shape": ",".join(map(str, SHORT)), "dtype": "float32", "output_type": "npy"})
        wait_until(lambda: srv.metric("vaeserve_queue_depth") == 3, "the three requests queued behind A")
        leaver.shutdown(socket.SHUT_RDWR)
        leaver.close()
        for thread in threads:
            thread.join(120)
        assert [r.status_code for r in expired] == [504, 504]
        wait_until(lambda: srv.metric("vaeserve_requests_total", route="/v1/decode", status="499") == 1,
                   "the client that left counted")
        assert srv.metric("vaeserve_queue_depth") == 0  # the device still holds A: nothing new ran
        assert GatedRunner.log == [] and not holder
        for _ in range(SHORT[2]):
            GatedRunner.permits.release()
        wait_until(lambda: bool(holder), "A answered")
        assert holder[0].status_code == 200
