"""``python -m bench.device_check --tiny``: the prepared accelerator check runs its every part on this CPU
(small configs; one family), so that the run prepared for a GPU window cannot rot. Real processes:
the check's own parts, a real server for the end to end, diffusers for the reference."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import jax
import pytest
from PIL import Image

from bench.device_check import service_table
from tests.helpers.wan_reference import PARITY_TOL

REPO = Path(__file__).resolve().parents[2]


def run_check(out: Path, *args: str) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "bench.device_check", "--tiny", "--models", "wan2.1", "--out", str(out), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=880)
    print(done.stdout[-3000:], done.stderr[-3000:])
    return done.returncode, json.loads((out / "device_check.json").read_text())


@pytest.fixture(scope="module")
def check(tmp_path_factory) -> tuple[int, dict, Path]:
    out = tmp_path_factory.mktemp("device-check")
    # A loaded 2-core host: nothing may be skipped. Three variants: the reference, a step geometry, an XLA flag.
    code, doc = run_check(out, "--budget-s", "3000", "--variants", "current", "chunk-4", "nhwc-inner-4")
    return code, doc, out


def test_versions_device_and_parity(check):
    code, doc, _ = check
    assert code == 0 and doc["mode"] == "tiny" and doc["notes"] == []
    assert doc["versions"]["jax"] == jax.__version__ and doc["versions"]["diffusers"]
    assert doc["device"]["jax"]["platform"] == "cpu"
    parity = doc["parity"]["wan2.1"]
    assert parity["ok"] and parity["latents"] == [1, 16, 2, 3, 5] and parity["frames"] == [1, 3, 5, 24, 40]
    assert 0 < parity["decode_max_abs"] <= PARITY_TOL and 0 < parity["encode_max_abs"] <= PARITY_TOL


def test_every_measurement_of_the_case(check):
    _, doc, _ = check
    (case,) = doc["cases"]
    assert case["model"] == "wan2.1" and case["video"] == "40x24x5"
    assert case["ours"]["shapes"] == case["diffusers"]["shapes"] == {"latents": [1, 16, 2, 3, 5],
                                                                      "frames": [1, 3, 5, 24, 40]}
    timed = [case["ours"][op][dtype] for op in ("decode", "encode") for dtype in ("bfloat16", "float32")]
    timed += [case["diffusers"][op]["float32"] for op in ("decode", "encode")]  # float32 only on a CPU
    timed.append(case["diffusers"]["decode"]["float32-exact"])  # TF32 off: like for like with ours on a GPU
    for m in timed:
        assert len(m["times_s"]) == 2 and 0 < m["min_s"] <= m["median_s"] and m["warmup_s"] > 0
    assert case["ours"]["decode"]["float32"]["program_bytes"]["temp_bytes"] > 0
    assert all(case["ours"][op][dtype]["compile_s"] > 0 for op in ("decode", "encode") for dtype in ("bfloat16", "float32"))
    assert case["diffusers"]["decode"]["float32"]["tiling"] is False
    # bfloat16 differs from float32 (the same seeded weights), by a rounding-sized amount.
    error = case["ours"]["bf16_vs_f32"]
    assert 1e-3 < error["max_abs"] < 0.5 and 20 < error["psnr_db"] < 80


def test_variants_are_timed_each_in_its_process(check):
    _, doc, _ = check
    variants = doc["variants"]
    assert (variants["model"], variants["video"], variants["dtype"]) == ("wan2.1", "40x24x5", "bfloat16")
    results = variants["results"]
    assert list(results) == ["current", "chunk-4", "nhwc-inner-4"] and variants["fastest"] in results
    assert results["chunk-4"]["options"]["chunk"] == 4 and results["chunk-4"]["options"]["inner_frames"] == 16
    assert "--xla_gpu_force_conv_nhwc=true" in results["nhwc-inner-4"]["options"]["xla_flags"]
    assert "nhwc" not in results["current"]["options"]["xla_flags"]  # a variant's flags stay in its process
    for name, result in results.items():
        decode = result["decode"]
        assert len(decode["times_s"]) == 2 and 0 < decode["min_s"] <= decode["median_s"]
        assert decode["program_bytes"]["temp_bytes"] > 0
        trace = decode["trace"]  # a CPU trace: the host's XLA threads stand in for a device's streams
        assert trace["source"] == "host XLA threads" and trace["kernels"] > 0 and trace["top_kernels"]
        # The same frames, however they are stepped (the first variant's are the reference).
        assert ("max_abs_vs_first" in decode) == (name != "current")
        assert decode.get("max_abs_vs_first", 0.0) <= 1e-2


def test_service_end_to_end_and_the_files(check):
    _, doc, out = check
    service = doc["service"]
    assert service["server"]["latents"] == [1, 16, 2, 3, 5] and service["ready_s"] > 0
    for concurrency in ("1", "2", "4"):
        summary = service["concurrency"][concurrency]
        assert summary["ok"] == summary["requests"] == 2 * int(concurrency)
        assert summary["bytes_per_response"] > 1000  # an MP4, not a problem document
    lines = service_table(doc).splitlines()  # each answer against our decode of the same video alone
    assert lines[0].startswith("served MP4 answers (our decode alone: ") and len(lines) == 2 + 3
    assert all(float(line.split()[4]) > 0 for line in lines[2:])
    with Image.open(out / "device_check.png") as png:
        assert png.format == "PNG" and png.size[0] > 800
    with tarfile.open(out / "trace.tar.gz") as tar:
        assert any(name.endswith(".xplane.pb") for name in tar.getnames())
    assert doc["trace"] == "trace.tar.gz"
    assert doc["trace_summary"]["kernels"] > 0 and doc["trace_summary"]["top_kernels"]  # of that trace


def test_a_spent_budget_stops_cleanly_and_says_so(tmp_path):
    code, doc = run_check(tmp_path, "--budget-s", "0", "--no-service", "--variants")
    assert code == 1  # nothing compared: not a pass
    assert doc["parity"]["wan2.1"]["skipped"].startswith("skipped:")
    assert doc["cases"] == [{"model": "wan2.1", "video": "40x24x5", "skipped": "no time left of the budget"}]
    assert set(doc["variants"]["results"]) == {"current", "inner-4", "nhwc-inner-4", "chunk-4", "nhwc-chunk-4"}
    assert all(r == {"skipped": "no time left of the budget"} for r in doc["variants"]["results"].values())
    assert "fastest" not in doc["variants"]
    assert doc["versions"]["jax"] == jax.__version__  # what costs nothing is still there
    assert not (tmp_path / "device_check.png").exists()
