#!/usr/bin/env python
"""Per-chip memory of the Wan 2.1 and HunyuanVideo 1.0 / 1.5 decodes (and SDXL's and Flux.1's of a
4096x4096 image) on TPU v5e-8, v6e-8 and v5p-8
(libtpu's compiler) or on 8-GPU H100 and H200 hosts (XLA's CUDA compiler), compiled on this host:
no TPU, no GPU.

Each row compiles the sharded decode (uint8 output, batch 1) for one (model, video, slice, dtype,
tp) on the slice's abstract devices — the program `vaeserve plan` compiles — and appends one JSON
line to ``--results``. Rows already there are skipped, so an interrupted run resumes where it
stopped, and two processes can share the work (disjoint ``--slices``, ``--models`` or ``--only``;
each skips what the other has finished). A program the TPU compiler refuses for memory is a row
too (it does not fit), with the bytes the compiler says it needs.
``--render`` prints the docs' tables and writes the memory-vs-tp PNG.

    nice -n 19 python -m bench.plan_table                 # every TPU row (hours on 2 cores), resumable
    nice -n 10 python -m bench.plan_table --only 1280x720x81:v5e-8:bfloat16:1   # chosen rows only (Wan 2.1)
    nice -n 19 python -m bench.plan_table --only hunyuan1.0:1280x720x129:v6e-8:bfloat16:8   # MODEL:VIDEO:…
    nice -n 19 python -m bench.plan_table --models hunyuan1.5 --descending   # tp = 8, 4, … down to the last fit
    nice -n 19 python -m bench.plan_table --first-fit --slices v6e-8   # per (video, dtype): tp up to the first fit
    nice -n 19 python -m bench.plan_table --models sdxl,flux1 --descending   # 4096x4096 images
    python -m bench.plan_table --render                   # the docs' tables + docs/tpu-plan/memory.png
    python -m bench.plan_table --platform gpu             # every GPU row (needs the `cuda` extra; seconds each)
    python -m bench.plan_table --platform gpu --render    # docs/gpu-plan/memory.png

Real-size TPU compiles take minutes each and some need many GB of host memory: run it alone.

The tables are shipped with the package (``sharding/plans/*.jsonl``): ``vaeserve plan`` answers
their rows at once. Each row records the compiler's versions and the fingerprint of the lowered
program it compiled (``sharding.plan_table``), so a row whose program this checkout lowers
differently, or that another compiler made, says it is stale; ``--recompile`` compiles the rows
named by ``--only`` again unless they are fresh (the new row replaces the old).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # nothing runs here; the devices are compile-only

VIDEOS = ("1280x720x81", "832x480x81", "1920x1080x81", "1280x720x121")
DTYPES = ("bfloat16", "float32")
DEFAULT_MODEL = "wan2.1"  # rows written before the table had other models name none
# Each model's videos, slices and dtypes (the slices' tps are the table's). HunyuanVideo: the
# videos its pipelines make (129 frames for 1.0, 121 for 1.5 at 720p), on the two slices that
# serve decodes cheaply, bfloat16 first.
MODELS = {
    "wan2.1": (VIDEOS, None, DTYPES),
    "hunyuan1.0": (("1280x720x129",), ("v5e-8", "v6e-8"), DTYPES),
    "hunyuan1.5": (("1280x720x121",), ("v5e-8", "v6e-8"), DTYPES),
    # The image VAEs at the size an upscale hits (an image is a video of one frame here), bfloat16.
    "sdxl": (("4096x4096x1",), ("v5e-8", "v6e-8", "h100-8"), ("bfloat16",)),
    "flux1": (("4096x4096x1",), ("v5e-8", "v6e-8", "h100-8"), ("bfloat16",)),
    # MiniMax-H3: its pipeline's 209-frame videos (17n + 5), every tile spread over the devices.
    "minimax-h3": (("1280x720x209", "1344x768x209"), ("v5e-8", "v6e-8", "h100-8", "h200-8"), ("bfloat16",)),
}
MODEL_TITLES = {"wan2.1": "Wan 2.1", "hunyuan1.0": "HunyuanVideo", "hunyuan1.5": "HunyuanVideo 1.5",
                "sdxl": "SDXL (VAE decode of one image)", "flux1": "Flux.1 (VAE decode of one image)",
                "minimax-h3": "MiniMax-H3 (tiled ViT decode)"}


class Table(NamedTuple):
    slices: dict[str, tuple[int, ...]]  # slice name → candidate tps
    results: Path
    png: Path
    compiler: str


TABLES = {
    "tpu": Table({"v5e-8": (8, 4, 2, 1), "v6e-8": (8, 4, 2, 1), "v5p-8": (4, 2, 1)},
                 REPO / "sharding" / "plans" / "tpu.jsonl", REPO / "docs" / "tpu-plan" / "memory.png",
                 "TPU by libtpu (no TPU)"),
    "gpu": Table({"h100-8": (8, 4, 2, 1), "h200-8": (8, 4, 2, 1)},
                 REPO / "sharding" / "plans" / "gpu.jsonl", REPO / "docs" / "gpu-plan" / "memory.png",
                 "NVIDIA GPUs by XLA's CUDA compiler (no GPU)"),
}
SLICE_STYLES = (("o", "-"), ("s", "--"), ("^", ":"))  # marker and line of each slice in the plot
SLICES = {name: tps for table in TABLES.values() for name, tps in table.slices.items()}


def groups(platform: str, model: str = DEFAULT_MODEL) -> list[tuple[str, str, str, tuple[int, ...]]]:
    """``(dtype, video, slice, tps)`` of one model's rows of a platform's table, in the table's order."""
    videos, slices, dtypes = MODELS[model]
    return [(dtype, video, name, tps) for dtype in dtypes for video in videos
            for name, tps in TABLES[platform].slices.items() if slices is None or name in slices]


def rows(platform: str, models: tuple[str, ...] = tuple(MODELS)) -> list[dict]:
    """Every row of one platform's table (of ``models``)."""
    found = []
    for model in models:
        for dtype, video, name, tps in groups(platform, model):
            found += [{**({"model": model} if model != DEFAULT_MODEL else {}), "video": video, "slice": name,
                       "dtype": dtype, "tp": tp} for tp in tps]
    return found


def key(row: dict) -> tuple:
    return row.get("model", DEFAULT_MODEL), row["video"], row["slice"], row["dtype"], row["tp"]


def parse_row(text: str) -> tuple:
    """``"1280x720x81:v5e-8:bfloat16:1"`` (Wan 2.1) or ``"hunyuan1.0:1280x720x129:v6e-8:bfloat16:8"``
    → the row's key."""
    parts = text.split(":")
    model = parts.pop(0) if len(parts) == 5 else DEFAULT_MODEL
    video, name, dtype, tp = parts
    return model, video, name, dtype, int(tp)


def done(path: Path) -> dict[tuple, dict]:
    if not path.is_file():
        return {}
    results = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {key(r): r for r in results}


def fits_below(results: dict[tuple, dict], row: dict) -> bool:
    """Whether a smaller tp of the same model, video, slice and dtype already fits."""
    return any(results.get((*key(row)[:4], tp), {}).get("fits") for tp in SLICES[row["slice"]] if tp < row["tp"])


def fails_above(results: dict[tuple, dict], row: dict) -> bool:
    """Whether a larger tp of the same model, video, slice and dtype does not fit (then a smaller
    one will not either: the per-chip bytes fall with tp)."""
    return any(key(row)[:4] + (tp,) in results and not results[(*key(row)[:4], tp)].get("fits")
               for tp in SLICES[row["slice"]] if tp > row["tp"])


def run(args: argparse.Namespace) -> None:
    from tqdm import tqdm

    from vaeserve import models, sharding
    from vaeserve.models.shapes import parse_shape_text
    from vaeserve.sharding.chips import chip_facts, topology_devices
    from vaeserve.sharding.plan_table import compiler_versions
    from vaeserve.sharding.planner import decode_program, latent_shape_for_video, plan_mesh

    finished = done(args.results)
    if args.recompile:  # the rows named are compiled again; each replaces its old line when done
        finished = {k: r for k, r in finished.items() if k not in (args.only or ())}
    todo = [r for r in rows(args.platform, tuple(args.models or MODELS)) if key(r) not in finished
            and (not args.only or key(r) in args.only) and (not args.slices or r["slice"] in args.slices)]
    if args.first_fit or args.descending:
        # The smallest tp that fits answers "what do I need": ascending stops at the first fit;
        # descending (where small tps surely do not fit) at the first that does not.
        todo.sort(key=lambda r: (DTYPES.index(r["dtype"]), *key(r)[:3], -r["tp"] if args.descending else r["tp"]))
    if args.limit:
        todo = todo[: args.limit]
    args.results.parent.mkdir(parents=True, exist_ok=True)
    print(f"{len(finished)} rows done, {len(todo)} to compile → {args.results}", file=sys.stderr)
    compiler = compiler_versions(args.platform)
    for row in (bar := tqdm(todo, unit="compile")):
        latest = done(args.results)  # another process (``--only``, another ``--slices``) may have finished it
        recompiling = args.recompile and key(row) in (args.only or ())
        if (key(row) in latest and not recompiling) or (args.first_fit and fits_below(latest, row)) or (
                args.descending and fails_above(latest, row)):
            continue
        config = models.MODEL_NAMES[key(row)[0]]()
        vae = models.abstract_vae(config, dtype=row["dtype"])  # a fresh program cache: one program at a time
        devices = topology_devices(row["slice"])
        latents = latent_shape_for_video(config, *parse_shape_text(row["video"], 3, "video"))
        mesh = sharding.make_mesh(row["tp"], devices=devices)
        program = decode_program(vae, (1, *latents), mesh)[1]  # lowered (a second), not compiled
        old = latest.get(key(row), {})
        if recompiling and (old.get("program"), old.get("compiler")) == (program, compiler):
            continue  # fresh already: this program, this compiler
        bar.set_postfix_str(" ".join(map(str, key(row))))
        start, cpu = time.perf_counter(), time.process_time()
        try:
            chip = chip_facts(devices[0].device_kind)
            plan = plan_mesh(vae, (1, *latents), mesh, chip, hbm_bytes=chip.hbm_bytes, output="uint8")
            if plan.refused:  # the compiler's own verdict: it does not fit, and needs at least this much
                result = {**row, "error": plan.refused[:300], "required_bytes": plan.total_bytes,
                          "usable_bytes": plan.usable_bytes, "fits": False, "compile_s": plan.compile_s,
                          "compile_cpu_s": round(time.process_time() - cpu, 1)}
                record(args.results, {**result, "compiler": compiler, "program": program})
                continue
            result = {**row, **{k: getattr(plan, k) for k in (
                "split", "argument_bytes", "output_bytes", "temp_bytes", "code_bytes", "total_bytes", "hbm_bytes",
                "usable_bytes", "fits", "flops", "bytes_accessed", "compile_s", "bound_s")},
                      "compile_cpu_s": round(time.process_time() - cpu, 1)}
        except Exception as e:  # noqa: BLE001 - the compiler's refusal (out of HBM) is a result too
            result = {**row, "error": str(e).splitlines()[0][:300],
                      "compile_s": round(time.perf_counter() - start, 1)}
        record(args.results, {**result, "compiler": compiler, "program": program})


def record(path: Path, result: dict) -> None:
    """Append a row, or replace the row of the same key (a row compiled again)."""
    lines = [line for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    kept = [line for line in lines if key(json.loads(line)) != key(result)]
    if len(kept) == len(lines):
        with path.open("a") as f:
            f.write(json.dumps(result) + "\n")
        return
    path.write_text("".join(f"{line}\n" for line in [*kept, json.dumps(result)]))


def coverage(platform: str, results: dict[tuple, dict], model: str = DEFAULT_MODEL) -> str:
    """One line: rows compiled per slice, and for how many (video, slice, dtype) the smallest tp
    that fits is known (a fitting tp with every smaller one compiled, or every tp compiled, or — a
    larger tp known not to fit — every larger one that fits)."""
    every = rows(platform, (model,))
    per_slice = ", ".join(f"{name} {sum(key(r) in results for r in every if r['slice'] == name)}/"
                          f"{sum(r['slice'] == name for r in every)}" for name in TABLES[platform].slices
                          if any(r["slice"] == name for r in every))
    answered = sum(smallest_fit(results, model, video, name, dtype, tps) is not None
                   for dtype, video, name, tps in groups(platform, model))
    return (f"{sum(key(r) in results for r in every)} of {len(every)} rows compiled ({per_slice}); "
            f"the smallest tp that fits is known for {answered} of {len(groups(platform, model))} "
            "(video, slice, dtype)")


def smallest_fit(results: dict[tuple, dict], model: str, video: str, name: str, dtype: str,
                 tps: tuple[int, ...]) -> int | str | None:
    """The smallest tp that fits, ``"none"`` when none up to the largest does, or None when the rows
    compiled so far do not tell."""
    verdicts = {tp: results[(model, video, name, dtype, tp)].get("fits", False)
                for tp in tps if (model, video, name, dtype, tp) in results}
    fitting = [tp for tp, fits in verdicts.items() if fits]
    if fitting and all(tp in verdicts for tp in tps if tp < min(fitting)):
        return min(fitting)
    if max(tps) in verdicts and not verdicts[max(tps)]:
        return "none"
    return None


def _cell(r: dict | None, tp: int, tps: tuple[int, ...]) -> str:
    if tp not in tps:
        return "—"
    if r is None:
        return "not run"
    if "RESOURCE_EXHAUSTED" in r.get("error", ""):  # the TPU compiler's own verdict, in seconds
        return f"✗ refused: ≥ {r['required_bytes'] / 1e9:.1f} GB" if "required_bytes" in r else "✗ refused: > HBM"
    if "error" in r:
        return "compile failed"
    return f"{r['total_bytes'] / 1e9:.1f} GB {'✓' if r['fits'] else '✗'}"


def render(args: argparse.Namespace) -> None:
    results = done(args.results)
    for model in args.models or MODELS:
        if not any(key(r) in results for r in rows(args.platform, (model,))):
            continue
        print(f"{MODEL_TITLES[model]}: {coverage(args.platform, results, model)}\n")
        print("| video | slice | dtype | tp=1 | tp=2 | tp=4 | tp=8 | smallest tp that fits "
              "| compile s, wall/CPU, per row compiled (tp = 1 … 8) |")
        print("|---|---|---|---|---|---|---|---|---|")
        for dtype, video, name, tps in groups(args.platform, model):
            found = [results.get((model, video, name, dtype, tp)) for tp in (1, 2, 4, 8)]
            cells = [_cell(r, tp, tps) for r, tp in zip(found, (1, 2, 4, 8), strict=True)]
            times = [f"{r['compile_s']:.0f}/{r['compile_cpu_s']:.0f}" if "compile_cpu_s" in r else f"{r['compile_s']:.0f}/—"
                     for r in found if r is not None]
            fit = smallest_fit(results, model, video, name, dtype, tps)
            if any(c not in ("—", "not run") for c in cells):
                print(f"| {video.replace('x', '×', 1).replace('x', ' × ')} | {name} | {dtype} | "
                      f"{' | '.join(cells)} | {'?' if fit is None else fit} | {' · '.join(times)} |")
        print()
    plot(results, TABLES[args.platform])


def plot(results: dict[tuple, dict], table: Table) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from vaeserve.sharding.chips import CHIPS

    fig, axes = plt.subplots(1, len(DTYPES), figsize=(12, 4.5), sharey=True)
    for ax, dtype in zip(axes, DTYPES, strict=True):
        for color, video in enumerate(VIDEOS):  # one colour per video, one marker and line per slice
            for index, (name, tps) in enumerate(table.slices.items()):
                marker, line = SLICE_STYLES[index % len(SLICE_STYLES)]
                points = [(tp, results[(DEFAULT_MODEL, video, name, dtype, tp)]["total_bytes"] / 1e9) for tp in tps
                          if "total_bytes" in results.get((DEFAULT_MODEL, video, name, dtype, tp), {})]
                if points:
                    ax.plot(*zip(*sorted(points), strict=True), color=f"C{color}", marker=marker, linestyle=line,
                            label=f"{video} {name}")
        for chip in CHIPS:
            if any(name.startswith(f"{chip.name}-") for name in table.slices):
                usable = chip.hbm_bytes / 1e9 * (1 - chip.headroom)
                ax.axhline(usable, linestyle="--", linewidth=0.8, color="grey")
                ax.text(1, usable, f" {chip.name} HBM −{chip.headroom:.0%}", fontsize=7, va="bottom")
        ax.set(xscale="log", yscale="log", xlabel="tp (chips per frame)", title=f"{dtype}, uint8 out, batch 1",
               xticks=[1, 2, 4, 8], xticklabels=["1", "2", "4", "8"])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6, loc="upper right")
    axes[0].set_ylabel("GB per chip (memory_analysis: args + out + temp + code)")
    fig.suptitle(f"Wan 2.1 decode, compiled for {table.compiler}: per-chip memory vs tp")
    fig.tight_layout()
    table.png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(table.png, dpi=110)
    print(f"\nwrote {table.png.relative_to(REPO)}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--platform", choices=sorted(TABLES), default="tpu", help="which table (default tpu)")
    parser.add_argument("--results", type=Path, help="JSON lines, appended to (resumable); default "
                        "sharding/plans/tpu.jsonl or sharding/plans/gpu.jsonl")
    parser.add_argument("--render", action="store_true", help="print the table and write the PNG; compile nothing")
    parser.add_argument("--limit", type=int, help="compile at most this many rows now")
    parser.add_argument("--only", type=parse_row, action="append", metavar="[MODEL:]VIDEO:SLICE:DTYPE:TP",
                        help="compile only this row (repeatable), e.g. 1280x720x81:v5e-8:bfloat16:1 (Wan 2.1) or "
                             "hunyuan1.0:1280x720x129:v6e-8:bfloat16:8")
    parser.add_argument("--models", type=lambda text: text.split(","), metavar="wan2.1,hunyuan1.0",
                        help=f"compile (or render) only rows of these models (of {', '.join(MODELS)})")
    parser.add_argument("--descending", action="store_true",
                        help="per model, video, slice and dtype, compile tp = 8, 4, … only down to the first that "
                             "does not fit (for models whose small tps surely do not)")
    parser.add_argument("--slices", type=lambda text: text.split(","), metavar="v5e-8,v6e-8",
                        help=f"compile only rows of these slices (of {', '.join(SLICES)})")
    parser.add_argument("--recompile", action="store_true",
                        help="with --only: compile those rows again although the table has them (stale rows)")
    parser.add_argument("--first-fit", action="store_true",
                        help="per video, slice and dtype, compile tp = 1, 2, … only up to the first that fits")
    args = parser.parse_args(argv)
    args.results = args.results or TABLES[args.platform].results
    render(args) if args.render else run(args)


if __name__ == "__main__":
    main()
