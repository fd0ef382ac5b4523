"""Batches never exceed the memory, and a refusal means what it says: two requests that each fit,
batched into a program that does not, are run again in smaller batches (each alone here) and both
answered 200; a request that cannot fit alone still gets 422 ``too-large-for-memory``."""

from __future__ import annotations

import threading

import httpx
import numpy as np

from tests.helpers.service_helpers import HeldRunner, app_client, latents, make_test_model
from vaeserve import sharding
from vaeserve.sharding.fits import program_total_bytes
from vaeserve.sharding.introspect import program_memory

SHAPE = (16, 2, 8, 8)  # (C, T, H, W): one request's latents


class PairRunner(HeldRunner):
    """Holds the first stream's last step until ``release``: the requests sent meanwhile queue up
    and are taken as one batch."""

    release = threading.Event()


def step_bytes(vae, batch: int) -> int:
    mesh = sharding.make_mesh(1, 1)
    programs = sharding.compile_decode_stream(vae, (batch, *SHAPE), mesh)
    return max(program_total_bytes(program_memory(p)) for p in programs)


def test_two_requests_that_each_fit_are_run_apart_when_their_batch_does_not():
    sizing = make_test_model()  # a model of its own: the server's compiles every program anew, and checks it
    alone, pair = step_bytes(sizing, 1), step_bytes(sizing, 2)
    vae = make_test_model()
    assert pair > alone
    limit = (alone + pair) // 2  # one request's programs fit, a batch of two's do not
    with app_client(vae, runner_factory=PairRunner, device_memory_bytes=limit, max_batch=2, max_queue=8) as client:
        def post(seed: int) -> httpx.Response:
            return client.post("/v1/decode", content=latents((1, *SHAPE), seed).tobytes(),
                               params={"shape": ",".join(map(str, (1, *SHAPE))), "dtype": "float32",
                                       "output_type": "npy"})

        answers: dict[int, httpx.Response] = {}
        threads = [threading.Thread(target=lambda s=s: answers.__setitem__(s, post(s))) for s in (1, 2, 3)]
        threads[0].start()  # on the device, held
        while client.get("/metrics").text.count("vaeserve_queue_depth 0.0") == 0 and not answers:
            threading.Event().wait(0.05)
        for thread in threads[1:]:
            thread.start()
        waited = 0.0
        while "vaeserve_queue_depth 2.0" not in client.get("/metrics").text and waited < 60:
            threading.Event().wait(0.1)
            waited += 0.1
        PairRunner.release.set()
        for thread in threads:
            thread.join(300)
        metrics = client.get("/metrics").text
    assert [answers[s].status_code for s in (1, 2, 3)] == [200, 200, 200], [answers[s].text[:300] for s in answers]
    # The pair's batch was refused once (compiled and checked), then each request ran alone; no
    # request was refused (the control: the same pair without the split got two 422s).
    assert "vaeserve_batches_split_total 1.0" in metrics
    assert 'vaeserve_refused_for_memory_total{check="compiled"} 1.0' not in metrics
    frames = np.load(__import__("io").BytesIO(answers[2].content))
    assert frames.shape == (1, 5, 64, 64, 3)
