"""The start-up memory guard: every warm-up program's ``memory_analysis()`` is compared with the
device's memory before anything runs. CPU devices report no limit, so the tests give one
(``--device-memory-bytes``): a real ``vaeserve serve`` process that would not fit exits non-zero
with one message, and one that fits lists each program's per-device bytes in ``/v1/models``."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from sharding.fits import program_total_bytes
from sharding.introspect import program_memory
from tests.helpers.service_helpers import REPO, app_client, free_port, make_test_model

MICRO = dict(dim_mult=(1, 2), temperal_downsample=(True,), scale_factor_temporal=2, scale_factor_spatial=2)
WARM = "16x2x8x8:uint8"


def test_serve_refuses_to_start_when_a_warmup_program_does_not_fit(tiny_model_dir):
    command = [sys.executable, "-m", "service", "serve", "--model", str(tiny_model_dir), "--port", str(free_port()),
               "--warmup", "16x2x4x4:uint8", "--max-batch", "2", "--device-memory-bytes", "1000000"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 3, done.stderr[-3000:]
    message = done.stderr.strip().splitlines()[-1]
    assert message.startswith("vaeserve serve: start-up refused: the decode of latents (1, 16, 2, 4, 4) at tp=1, dp=1 needs")
    needed = int(re.search(r"\((\d+) > 1000000 bytes\)", message).group(1))
    assert needed > 1_000_000 and "but 1.0 MB are available" in message
    assert "tp=2 would fit" in message or "no tp or batch" in message or "--max-batch" in message
    assert "Traceback" not in message


def test_models_lists_the_bytes_of_every_compiled_program():
    vae = make_test_model(**MICRO)
    with app_client(vae, warmup=[WARM], device_memory_bytes=10**12) as client:
        info = client.get("/v1/models").json()["data"][0]
    assert info["device_memory_bytes"] == 10**12
    rows = {(r["program"], tuple(r["shape"]), r["variant"]): r for r in info["program_memory"]}
    assert set(rows) == {("decode", (1, 16, 2, 8, 8), "uint8"), ("decode", (2, 16, 2, 8, 8), "uint8")}
    for key in vae.programs.keys():  # the numbers are the compiled programs' memory_analysis()
        memory = program_memory(vae.programs.peek(key))
        row = rows[(key.program, key.shape, key.variant)]
        assert row["temp_bytes"] == memory["temp_bytes"] and row["total_bytes"] == program_total_bytes(memory) > 0
