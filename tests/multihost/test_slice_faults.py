"""A slice that loses or disagrees with a process fails clearly, in bounded time; a stop request stops it cleanly.

Each test starts its own pair of processes (``tests.helpers.slice_process SCENARIO``); every wait is bounded.
The stated detection time is ``heartbeat + interval`` (then process 0 exits after its grace): the
product's promise, so it is asserted, with 10 s more for a loaded machine.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.helpers.slice_helpers import start_slice, stop_all, wait_until_ready
from tests.helpers.slice_process import FAULT_HEARTBEAT_S, GRACE_S, INTERVAL_S
from vaeserve.service.slice.control import EXIT_SLICE_FAILED

START_TIMEOUT_S = 240
EXIT_BOUND_S = FAULT_HEARTBEAT_S + INTERVAL_S + GRACE_S + 10


@pytest.fixture
def run_slice(tmp_path):
    started = []

    def run(scenario: str):
        processes = start_slice(scenario, tmp_path)
        started.extend(processes)
        wait_until_ready(tmp_path, processes, START_TIMEOUT_S)
        return processes

    yield run
    stop_all(started)


@pytest.mark.parametrize("scenario", ["idle", "busy"])
def test_a_killed_follower_fails_process_0_within_the_stated_time(run_slice, scenario):
    leader, follower = run_slice(scenario)  # busy: process 0 is ready after its first call, then calls back to back
    killed = time.monotonic()
    follower.kill(signal.SIGKILL)
    code = leader.wait(EXIT_BOUND_S + 30)
    elapsed = time.monotonic() - killed
    log = leader.log()
    assert code == EXIT_SLICE_FAILED, log[-3000:]
    assert "slice failed: process 1 stopped sending heartbeats" in log
    if scenario == "busy":  # the call in flight raised SliceFailed to its caller, no hang
        assert "the slice failed: process 1 stopped sending heartbeats" in log
    assert elapsed <= EXIT_BOUND_S, f"process 0 took {elapsed:.1f} s to fail (bound {EXIT_BOUND_S} s)"
    print(f"{scenario}: process 0 exited {elapsed:.1f} s after the kill")


def test_sigterm_on_a_follower_stops_the_slice_and_every_process_exits_0(run_slice):
    leader, follower = run_slice("sigterm")
    follower.kill(signal.SIGTERM)
    codes = [process.wait(60) for process in (leader, follower)]
    assert codes == [0, 0], leader.log()[-2000:] + follower.log()[-2000:]
    assert "process 1 asks the slice to stop (SIGTERM)" in leader.log()
    assert "stop after" in follower.log()


def test_a_call_that_fails_on_one_process_only_fails_the_slice(run_slice):
    leader, follower = run_slice("diverge")
    codes = [process.wait(EXIT_BOUND_S + 30) for process in (leader, follower)]
    assert codes == [EXIT_SLICE_FAILED] * 2, leader.log()[-2000:] + follower.log()[-2000:]
    reason = "call 1 (diverge) diverged: process 0 ok, process 1 error: RuntimeError"
    assert f"slice failed: {reason}" in leader.log()
    assert f"slice failed: process 0 reported: {reason}" in follower.log()
