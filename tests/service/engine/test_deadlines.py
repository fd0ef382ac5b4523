"""A request whose deadline passes while it decodes stops using the device at the next step
boundary, and the next request starts then. Measured in steps — which request's step the device
starts next — not in seconds (``GatedRunner``: each step waits for the test's permit), against a
negative control: without the deadline, the next request waits for every step of the first."""

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

LONG = (1, 16, 6, 4, 4)  # six decode steps
SHORT = (1, 16, 2, 4, 4)  # two, of the same programs


def next_step(answered: list) -> None:
    """Let the device start one more step; return once it has (or the request waited on answered)."""
    started = len(GatedRunner.log)
    GatedRunner.permits.release()
    wait_until(lambda: bool(answered) or len(GatedRunner.log) > started, "the next step", timeout=300)


def steps_before_the_next_request(tiny_vae, *, timeout_s: float | None) -> tuple[list[str], list]:
    """A decodes two of its six steps; the test waits for A's answer if it has a deadline (it is
    the 504), then sends B and lets the device go on one permit at a time: the steps it started."""
    GatedRunner.reset()
    first: list = []
    second: list = []
    with thread_server(tiny_vae, runner_factory=GatedRunner, max_batch=1, max_frames=21) as srv:
        gated_warm_up(srv.url, SHORT)  # LONG and SHORT run the same two step programs
        params = {} if timeout_s is None else {"timeout_s": timeout_s}
        a = post_in_thread(srv.url, marked(latents(LONG, seed=1), "A"), first, **params)
        for _ in range(2):
            GatedRunner.permits.release()
        wait_until(lambda: GatedRunner.log == ["A0", "A1"], "A's first two steps")
        if timeout_s is not None:  # the device waits in A's third step; A's deadline passes
            a.join(120)
            assert first and first[0].status_code == 504, first
        b = post_in_thread(srv.url, marked(latents(SHORT, seed=2), "B"), second)
        wait_until(lambda: srv.metric("vaeserve_queue_depth") == 1, "B queued")
        while not second:  # one permit at a time: each is one step started, whose request the log names
            next_step(second)
        b.join(120)
        a.join(120)
        assert second[0].status_code == 200 and (timeout_s is not None or first[0].status_code == 200)
        dropped = srv.metric("vaeserve_dropped_total", reason="deadline")
    return GatedRunner.log, [dropped]


def test_a_deadline_that_passes_mid_decode_frees_the_device_within_one_step(tiny_vae):
    log, (dropped,) = steps_before_the_next_request(tiny_vae, timeout_s=10.0)
    # A's third step was in flight when its deadline passed; it is A's last. B starts next.
    assert log == ["A0", "A1", "A2", "B0", "B1"], log
    assert dropped == 1


def test_without_a_deadline_the_next_request_waits_for_every_step(tiny_vae):
    log, _ = steps_before_the_next_request(tiny_vae, timeout_s=None)
    assert log == ["A0", "A1", "A2", "A3", "A4", "A5", "B0", "B1"], log
