"""Per-chip memory divides with tp on the TPU compiler, for every family that streams.

libtpu compiles each family's decode for `v6e:2x2` at tp = 1, 2 and 4 (small configs laid out as
the real ones, with VMEM cut so that their activations live in HBM as real sizes' do: see
``tests.sharding.tpu_temp``). Each chip's temp bytes must fall as 1/tp: temp(tp=2) ≤ 0.6 ×
temp(tp=1) and temp(tp=4) ≤ 0.35 × temp(tp=1). The negative control, a decode that gathers the whole
frame onto every band (``sharding._controls.compile_whole_frame_decode``), must fail that rule.

The compiles run in one child process (libtpu takes its VMEM size when it loads): ten compiles,
about 110 CPU-seconds and 1.4 GB of host memory.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sharding.test_tpu_aot import _require_libtpu
from tests.sharding.tpu_temp import CONTROL, FAMILIES, LIBTPU_ARGS

REPO = Path(__file__).resolve().parents[2]
# At most these fractions of tp = 1's temp bytes per chip (1/tp, plus room for the halo rows).
RULE = {2: 0.6, 4: 0.35}

pytestmark = pytest.mark.timeout(900)


def assert_temp_divides(temp: dict[int, int]) -> None:
    """``{tp: temp bytes per chip}``: each tp > 1 present within its share of tp = 1's (``RULE``)."""
    for tp, most in RULE.items():
        if tp in temp:
            assert temp[tp] <= most * temp[1], (tp, round(temp[tp] / temp[1], 3), temp)


def _ratios(temp: dict[int, int]) -> str:
    return ", ".join(f"tp={tp}: {temp[tp] / 1e6:.2f} MB ({temp[tp] / temp[1]:.3f})" for tp in sorted(temp))


@pytest.fixture(scope="module")
def measured() -> dict:
    """``tests.sharding.tpu_temp``'s compiles, in a child process with its VMEM size."""
    _require_libtpu()
    env = dict(os.environ, PYTHONPATH=str(REPO),
               LIBTPU_INIT_ARGS=f"{os.environ.get('LIBTPU_INIT_ARGS', '')} {LIBTPU_ARGS}".strip())
    done = subprocess.run([sys.executable, "-m", "tests.sharding.tpu_temp"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=840)
    assert done.returncode == 0, done.stderr[-4000:]
    raw = json.loads(done.stdout.strip().splitlines()[-1])

    def by_tp(temps: dict[str, int]) -> dict[int, int]:  # JSON's keys are strings
        return {int(tp): temp for tp, temp in temps.items()}

    families = {name: by_tp(temps) for name, temps in raw["families"].items()}
    whole_frame = by_tp(raw["whole_frame"])
    for name, temps in families.items():
        print(f"{name} {FAMILIES[name][1]}: {_ratios(temps)}")
    print(f"whole-frame control, {CONTROL[0]}: {_ratios(whole_frame)}")
    return {"families": families, "whole_frame": whole_frame}


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("tp", list(RULE))
def test_temp_per_chip_divides_with_tp(measured, family, tp):
    temps = measured["families"][family]
    assert_temp_divides({1: temps[1], tp: temps[tp]})


def test_a_decode_that_gathers_the_whole_frame_fails_the_rule(measured):
    """At tp = 4 each chip of the control holds a whole frame's working set: far above 0.35 × tp = 1."""
    gathered = measured["whole_frame"]
    assert gathered[CONTROL[1]] > 0.8 * gathered[1], gathered
    with pytest.raises(AssertionError):
        assert_temp_divides(gathered)
