"""Two processes x 2 CPU devices decode (and encode) exactly what one process with the same mesh does.

One slice (``tests.helpers.slice_process parity``) runs every check of this module: tp = 4 across both
processes (the halo between bands 1 and 2 crosses processes; uint8, float and streamed frames) and
tp = 2 x dp = 2 (one replica per process; uint8 and float), a stream abandoned after one step, a
call that fails on every process, and a negative control without halos. The references are
decoded in the pytest process, on the same mesh shapes, and are themselves checked against the
single-device decode and encode (``conftest.references``).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers.slice_helpers import start_slice, stop_all

SLICE_TIMEOUT_S = 400  # compiles of ~10 small programs per process on 2 shared cores


@pytest.fixture(scope="module")
def slice_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("parity")
    processes = start_slice("parity", out)
    try:
        yield processes, out
    finally:
        stop_all(processes)


@pytest.fixture(scope="module")
def decoded(slice_run, references):
    processes, out = slice_run
    codes = [process.wait(SLICE_TIMEOUT_S) for process in processes]
    assert codes == [0, 0], "\n".join(process.log()[-3000:] for process in processes)
    return dict(np.load(out / "slice.npz")), json.loads((out / "report.json").read_text())


def _identical(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("name", ["tp4_uint8", "tp4_float", "tp4_stream", "tp2dp2_float", "tp4_encode"])
def test_two_processes_decode_the_same_bytes_as_one(decoded, references, name):
    arrays, _ = decoded
    assert _identical(arrays[name], references[name])


def test_uint8_frames_do_not_depend_on_the_mesh_or_the_processes(decoded, references):
    arrays, _ = decoded
    for name in ("tp2dp2_uint8", "after_abandoned_stream"):
        assert _identical(arrays[name], references["tp4_uint8"]), name
    # float frames of different band shapes may round differently (also in one process): ≤ 1e-5
    assert np.max(np.abs(arrays["tp2dp2_float"] - references["tp4_float"])) <= 1e-5


def test_a_call_that_fails_everywhere_leaves_the_slice_in_step(decoded, references):
    arrays, report = decoded
    assert report["bad_call_error"] == "LatentsError"
    assert _identical(arrays["after_error"], references["tp4_float"])


def test_negative_control_without_halos_differs_at_the_process_boundary(decoded, references):
    arrays, _ = decoded
    error = np.abs(arrays["no_halo"] - references["tp4_float"])  # (B, 3, F, 16, 8): 4 output rows per band
    assert error.max() > 1e-2
    rows = error.max(axis=(0, 1, 2, 4))
    assert rows[7] > 1e-2 and rows[8] > 1e-2  # bands 1 | 2: the cut between process 0 and process 1
