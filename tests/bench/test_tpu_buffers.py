"""``python -m bench.tpu_buffers``: the live bytes at the peak and the heap, read from dump files in
libtpu's format (the excerpts a real dump of a v6e program holds, three buffers)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.tpu_buffers import peak, temp_buffers

REPO = Path(__file__).resolve().parents[2]

ASSIGNMENT = """\
allocation 0: size 4096, parameter 0, shape |bf16[32,64]| at ShapeIndex {}:
 value: <1 param.1 @0> (size=4096,offset=0): bf16[32,64]{1,0:T(8,128)(2,1)}
allocation 7: size 3000, page 0, preallocated-temp:
 value: <10 fusion.1 @0> (size=1000,offset=0): bf16[1,2,8,64]{3,2,1,0:T(8,128)(2,1)}
 value: <11 copy.2 @0> (size=1500,offset=1000): bf16[3,8,64]{2,1,0:T(8,128)(2,1)}
 value: <12 slice.3{} @0> (size=500,offset=2500): bf16[1,8,64]{2,1,0:T(8,128)(2,1)}
allocation 8: size 9999, color 1, page 0, preallocated-temp:
 value: <13 fusion.9 @0> (size=9999,offset=0): bf16[99]{0}
"""


def _live_range(ranges: dict[str, tuple[int, int]]) -> str:
    return "HloLiveRange (max 9):\n  BufferLiveRange:\n" + "".join(
        f"    {name}:{start}-{end}\n" for name, (start, end) in ranges.items())


HLO = """\
  %fusion.1 = bf16[1,2,8,64]{3,2,1,0} fusion(%param.1), metadata={op_name="jit(run)/conv1/concatenate"}
  %copy.2 = bf16[3,8,64]{2,1,0} copy(%fusion.1), metadata={op_name="jit(run)/conv1/conv_general_dilated"}
  %slice.3 = bf16[1,8,64]{2,1,0} slice(%copy.2)
"""


def _dump(directory: Path, ranges: dict[str, tuple[int, int]]) -> Path:
    directory.mkdir()
    stem = "module_0000.jit_run.cl_1.after_optimizations"
    (directory / f"{stem}-buffer-assignment.txt").write_text(ASSIGNMENT)
    (directory / f"{stem}-live-range.txt").write_text(_live_range(ranges))
    (directory / f"{stem}.txt").write_text(HLO)
    return directory


def test_the_hbm_temp_allocation_and_its_buffers():
    heap, buffers = temp_buffers(ASSIGNMENT)
    assert heap == 3000  # the default memory space's, not VMEM's (color 1) 9999
    assert buffers == [("fusion.1{}", 1000, "bf16[1,2,8,64]{3,2,1,0:T(8,128)(2,1)}"),
                       ("copy.2{}", 1500, "bf16[3,8,64]{2,1,0:T(8,128)(2,1)}"),
                       ("slice.3{}", 500, "bf16[1,8,64]{2,1,0:T(8,128)(2,1)}")]


def test_the_peak_sums_only_the_buffers_alive_together():
    _, buffers = temp_buffers(ASSIGNMENT)
    together = {"fusion.1{}": (0, 5), "copy.2{}": (2, 6), "slice.3{}": (4, 8)}
    assert peak(buffers, together) == (3000, 4)
    one_after_another = {"fusion.1{}": (0, 1), "copy.2{}": (2, 3), "slice.3{}": (4, 5)}
    assert peak(buffers, one_after_another) == (1500, 2)


def test_the_command_names_the_op_of_each_live_buffer(tmp_path):
    dump = _dump(tmp_path / "dump", {"fusion.1{}": (0, 5), "copy.2{}": (2, 6), "slice.3{}": (7, 8)})
    done = subprocess.run([sys.executable, "-m", "bench.tpu_buffers", str(dump)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "live at the peak 0.000 GB · heap 0.000 GB (packing: +20%)"
    assert "conv1/conv_general_dilated" in lines[1] and "conv1/concatenate" in lines[2]
    assert len(lines) == 3  # slice.3 is not alive at the peak


def test_a_directory_of_several_compiles_is_refused(tmp_path):
    dump = _dump(tmp_path / "dump", {"fusion.1{}": (0, 5)})
    stem = "module_0000.jit_run.cl_1.after_optimizations"
    (dump / f"{stem}-buffer-assignment.txt").rename(dump / "module_0001.jit_run.cl_2.after_optimizations-buffer-assignment.txt")
    (dump / f"{stem}-buffer-assignment.txt").write_text(ASSIGNMENT)
    done = subprocess.run([sys.executable, "-m", "bench.tpu_buffers", str(dump)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "2 *jit_*after_optimizations-buffer-assignment.txt" in done.stderr
    assert "one compile per directory" in done.stderr
