#!/usr/bin/env python
"""Where a compiled TPU program's temp bytes go, read from libtpu's own dumps.

Compile with ``XLA_FLAGS=--xla_dump_to=DIR`` (``vaeserve plan ... --compile`` does one compile per
tp; dump each into its own DIR), then:

    python -m bench.tpu_buffers DIR [--top 20]

prints three figures of the program's HBM temporaries and the largest buffers alive at its peak:

- *live at the peak*: the bytes of every temp buffer alive at the busiest point of the schedule
  (``*buffer-assignment.txt`` for the buffers, ``*live-range.txt`` for when each lives);
- *heap*: the size of the block the buffer assignment packs them into (its packing costs the
  difference);
- the op that makes each of the largest live buffers, from its ``op_name`` (the model's named
  scopes), so a buffer can be traced to the layer that made it.

``memory_analysis().temp_size_in_bytes`` (what ``vaeserve plan`` reports) can exceed the heap:
libtpu reserves bytes outside the assignment it dumps. docs/planning.md shows the figures of the
Wan 2.1 decode at tp = 1, 2 and 4.
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path

_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*)$", re.M)
_LIVE_RANGE = re.compile(r"^\s{4}([\w.\-]+\{[\d,]*\}):(\d+)-(\d+)$", re.M)
_VALUE = re.compile(r"value: <\d+ ([\w.\-]+)(\{[\d,]*\})? @\d+> \(size=(\d+),offset=(\d+)\): (\S+)")


def _one(directory: Path, suffix: str) -> str:
    """The text of the one dumped file of the main program (``jit_*``) ending in ``suffix``; a
    directory holding several compiles' dumps is refused rather than read at random."""
    found = sorted(directory.glob(f"*jit_*{suffix}"))
    if len(found) != 1:
        raise SystemExit(f"{len(found)} *jit_*{suffix} in {directory}: dump one compile per directory "
                         f"(XLA_FLAGS=--xla_dump_to={directory})")
    return found[0].read_text()


def temp_buffers(assignment: str) -> tuple[int, list[tuple[str, int, str]]]:
    """The HBM temp allocation's size and its buffers ``(value, bytes, shape)``: the allocation marked
    ``preallocated-temp`` in the default memory space (no ``color``: VMEM and the others have one)."""
    for block in re.split(r"\n(?=allocation \d+:)", assignment):
        header = block.split("\n", 1)[0]
        if "preallocated-temp" in header and "color" not in header:
            size = int(header.split("size ", 1)[1].split(",", 1)[0])
            return size, [(m.group(1) + (m.group(2) or "{}"), int(m.group(3)), m.group(5))
                          for m in _VALUE.finditer(block)]
    raise SystemExit("no HBM preallocated-temp allocation in the buffer assignment")


def _op_name(instruction: str) -> str:
    """The ``op_name`` of an HLO instruction's metadata (the model's named scopes), or ""."""
    found = re.search(r'op_name="([^"]*)"', instruction)
    return found.group(1) if found else ""


def peak(buffers: list[tuple[str, int, str]], ranges: dict[str, tuple[int, int]]) -> tuple[int, int]:
    """``(bytes, time)`` of the most bytes alive at once."""
    change: defaultdict[int, int] = defaultdict(int)
    for name, size, _ in buffers:
        if name in ranges:
            start, end = ranges[name]
            change[start] += size
            change[end + 1] -= size
    alive = most = when = 0
    for time in sorted(change):
        alive += change[time]
        if alive > most:
            most, when = alive, time
    return most, when


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dump", type=Path, help="the --xla_dump_to directory of one compile")
    parser.add_argument("--top", type=int, default=20, help="how many of the largest live buffers to list")
    args = parser.parse_args(argv)
    heap, buffers = temp_buffers(_one(args.dump, "after_optimizations-buffer-assignment.txt"))
    ranges = {m.group(1): (int(m.group(2)), int(m.group(3)))
              for m in _LIVE_RANGE.finditer(_one(args.dump, "after_optimizations-live-range.txt"))}
    made_by = {m.group(1): _op_name(m.group(2)) for m in _INSTRUCTION.finditer(_one(args.dump, "after_optimizations.txt"))}
    live, when = peak(buffers, ranges)
    print(f"live at the peak {live / 1e9:.3f} GB · heap {heap / 1e9:.3f} GB (packing: +{heap / max(live, 1) - 1:.0%})")
    alive = sorted(((size, name, shape) for name, size, shape in buffers
                    if name in ranges and ranges[name][0] <= when <= ranges[name][1]), reverse=True)
    for size, name, shape in alive[: args.top]:
        print(f"{size / 2**20:9.2f} MiB  {shape[:60]:60s}  {made_by.get(name.split('{')[0], '')[-100:]}")


if __name__ == "__main__":
    main()
