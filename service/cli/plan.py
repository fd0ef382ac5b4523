"""``vaeserve plan``: will this decode fit that TPU slice or GPU host? Answered with the real
compiler (libtpu, or XLA's CUDA compiler), no TPU and no GPU.

    vaeserve plan --topology v5e:2x4 --video 1280x720x81 --dtype bfloat16
    vaeserve plan --topology v6e-8 --shape 16x21x90x160 --tp 4,8 --json
    vaeserve plan --topology h100-8 --video 1920x1080x81 --dtype bfloat16   # needs the `cuda` extra
    vaeserve plan --topology v6e-8 --model sdxl --image 4096x4096 --dtype bfloat16   # an image model
    vaeserve plan --topology v6e-8 --model ltx2 --video 1280x704x121 --dtype bfloat16 --tp 8   # LTX-2 (F = 1 + 8k)

The candidates are tp = 1, 2, 4, 8 up to the first that fits, or every tp that ``--tp`` names.
Each candidate mesh the package's table of compiled plans holds (``sharding/plans``: the common
videos of Wan 2.1 and HunyuanVideo on v5e-8, v6e-8, v5p-8, H100 and H200 hosts, batch 1, uint8
frames) is answered at once from it, saying which compiler made it and whether this checkout
lowers another program for it (a *stale* row); the others are compiled here for the slice's
abstract devices (see ``sharding.planner``), each announced with the compile time the table
suggests (minutes each on a small host) and printed as it finishes; Ctrl-C stops a compile at
once. ``--compile`` compiles every mesh. Per-device memory, fit, FLOPs, traffic, collectives,
compile time and a roofline lower bound, then the smallest tp that fits. ``--json`` prints one
JSON document.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from vaeserve.models.registry import DEFAULT_MODEL, embedded_names_text


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="per-chip memory of a decode on a TPU slice or GPU host, compiled without one",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topology", required=True,
                   help="TPU slice: a topology (v5e:2x4, v6e:2x4, v5p:2x2x1, v4:2x2x1) or a single-host slice "
                        "(v6e-8); or a GPU host: h100-N or h200-N, N in 1, 2, 4, 8 (needs the `cuda` extra)")
    shape = p.add_mutually_exclusive_group(required=True)
    shape.add_argument("--video", metavar="WxHxF", help="decoded video, e.g. 1280x720x81 (F = 1 + 4k)")
    shape.add_argument("--image", metavar="WxH", help="an image model's decoded image, e.g. 4096x4096")
    shape.add_argument("--shape", metavar="CxTxHxW", help="latents, e.g. 16x21x90x160 (an image model's CxHxW, "
                       "e.g. 4x512x512)")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"an embedded model: {embedded_names_text()}; or a model path as `serve --model` takes; only "
                        "its config is read")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--tp", default=None, help="candidate tp sizes, comma-separated, each planned (default: 1, 2, "
                   "4, 8 up to the first that fits)")
    p.add_argument("--dp", type=int, default=1, help="data-parallel replicas of each candidate mesh")
    p.add_argument("--batch", type=int, default=1, help="latents per dp replica")
    p.add_argument("--output", choices=["uint8", "float"], default="uint8", help="decoded frames as served")
    p.add_argument("--headroom", type=float, default=None,
                   help="share of HBM kept free (default 0.1 on a TPU; 0.25 on a GPU, where JAX takes 75%% of "
                        "the memory unless XLA_PYTHON_CLIENT_MEM_FRACTION says otherwise): a mesh fits when its "
                        "bytes ≤ (1 − headroom) · HBM")
    p.add_argument("--inner-frames", type=int, default=None, metavar="N",
                   help="frames per inner step of the stages after each temporal upsampler (default: automatic, "
                        "as a server runs: 1 once a full-resolution frame per device holds ≥ 4 MB; 4: whole steps)")
    p.add_argument("--compile", action="store_true",
                   help="compile every candidate mesh here, also those the table of compiled plans holds")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout instead of the table")


DEFAULT_TPS = (1, 2, 4, 8)  # without --tp: in this order, up to the first that fits


def _tps(text: str | None) -> list[int]:
    if text is None:
        return list(DEFAULT_TPS)
    try:
        tps = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        tps = []
    if not tps or min(tps) < 1:
        raise SystemExit(f"vaeserve plan: --tp must be positive integers separated by commas; received {text!r}")
    return tps


def _inner_frames(value: int | None) -> int | None:
    if value is not None and value < 1:
        raise SystemExit(f"vaeserve plan: --inner-frames must be ≥ 1 (or left out: automatic); received {value}")
    return value


def _gb(n: float) -> str:
    return f"{n / 1e9:,.2f}"


TABLE_HEAD = ("| tp | dp | split | args GB | out GB | temp GB | code GB | total GB | fits | TFLOP | "
              "bytes accessed GB (scan body once) | halo MB | collectives | compile s | bound s | from |")


def header(plan: dict[str, Any]) -> str:
    """What the plan is of, and the table's head (``plan``: ``SlicePlan.to_dict()`` less its meshes)."""
    video, chip = plan["video"], plan["chip"]
    return "\n".join([
        f"{plan['topology']}: {plan['devices']} x {chip['name']} devices "
        f"({_gb(chip['hbm_bytes'] / plan['devices_per_chip'])} GB HBM each); "
        f"{video['width']}x{video['height']}x{video['frames']} from latents {plan['latents']} per replica, "
        f"{plan['dtype']}, {plan['output']} out, inner frames {plan.get('inner_frames') or 'automatic'}; "
        f"fits = total ≤ {1 - plan['headroom']:.0%} of HBM",
        "", TABLE_HEAD, "|" + "---|" * TABLE_HEAD.count(" | ") + "---|"])


def _source(m: dict[str, Any]) -> str:
    if m["source"] != "table":
        return "compiled now"
    return "table, STALE" if m["stale"] else "table, unchecked" if m["unchecked"] else "table"


def mesh_line(m: dict[str, Any]) -> str:
    """One candidate mesh as a row of the table (``m``: ``dataclasses.asdict(MeshPlan)``)."""
    if m["refused"]:
        return (f"| {m['tp']} | {m['dp']} | {m['split']} | — | — | ≥ {_gb(m['temp_bytes'])} | — "
                f"| ≥ {_gb(m['total_bytes'])} | NO | {m['flops'] / 1e12:,.1f} | — | — | — "
                f"| {m['compile_s']:.1f} | refused by the compiler: {m['refused']} | {_source(m)} |")
    found = ", ".join(f"{c['count']} {op}" for op, c in sorted(m["collectives"].items()))
    halo = "—" if m["halo_bytes"] is None else f"{m['halo_bytes'] / 1e6:,.1f}"
    return (f"| {m['tp']} | {m['dp']} | {m['split']} | {_gb(m['argument_bytes'])} | {_gb(m['output_bytes'])} "
            f"| {_gb(m['temp_bytes'])} | {_gb(m['code_bytes'])} | {_gb(m['total_bytes'])} "
            f"| {'yes' if m['fits'] else 'NO'} | {m['flops'] / 1e12:,.1f} | {_gb(m['bytes_accessed'])} "
            f"| {halo} | {found or ('—' if m['source'] == 'table' else 'none')} | {m['compile_s']:.1f} "
            f"| ≥ {m['bound_s']:.3f} | {_source(m)} |")


def footer(plan: dict[str, Any]) -> str:
    """The meshes skipped, the recommendation, where the table's rows came from, and the notes."""
    skipped: dict[tuple[int, str], list[str]] = {}  # tps skipped for one reason share a line
    for s in plan["skipped"]:
        skipped.setdefault((s["dp"], s["reason"]), []).append(str(s["tp"]))
    lines = [f"| {', '.join(tps)} | {dp} | — | skipped: {reason} |" for (dp, reason), tps in skipped.items()]
    lines += ["", f"recommendation: {plan['recommendation']['reason']}", ""]
    table = [m for m in plan["meshes"] if m["source"] == "table"]

    def made_by(m: dict[str, Any]) -> tuple[str, str]:
        return _compiler_text(m["compiler"]), m["program"] or "unrecorded"

    for compiler, program in sorted({made_by(m) for m in table}):
        tps = ", ".join(str(m["tp"]) for m in table if made_by(m) == (compiler, program))
        lines.append(f"* table (tp = {tps}): compiled by {compiler} from program {program}")
    for reason in sorted({m["stale"] for m in table if m["stale"]}):
        tps = ", ".join(str(m["tp"]) for m in table if m["stale"] == reason)
        lines.append(f"* STALE (tp = {tps}): {reason}. The bytes may differ from what this checkout compiles; "
                     "`--compile` compiles them here")
    for reason in sorted({m["unchecked"] for m in table if m["unchecked"] and not m["stale"]}):
        tps = ", ".join(str(m["tp"]) for m in table if m["unchecked"] == reason and not m["stale"])
        lines.append(f"* unchecked (tp = {tps}): {reason}")
    lines += [f"* {name}: {text}" for name, text in plan["notes"].items()]
    return "\n".join(lines)


def format_table(plan: dict[str, Any]) -> str:
    """The plan as a Markdown table with a header and the recommendation."""
    return "\n".join([header(plan), *map(mesh_line, plan["meshes"]), footer(plan)])


def _compiler_text(versions: dict[str, str] | None) -> str:
    from vaeserve.sharding.plan_table import compiler_text

    return compiler_text({"compiler": versions} if versions else {})


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _say(text: str) -> None:
    """Progress, on stderr: ``--json`` stays one document on stdout."""
    print(f"vaeserve plan: {text}", file=sys.stderr, flush=True)


def _latents(args: argparse.Namespace, config: Any) -> tuple[int, ...]:
    """Latents ``(C, T, H, W)`` (an image model's ``(C, H, W)``) from ``--video``, ``--image`` or
    ``--shape`` (``PlanError`` for sizes the model does not decode, naming the nearest that it does)."""
    from vaeserve.models.shapes import parse_shape_text
    from vaeserve.sharding.planner import PlanError, latent_shape_for_video

    def dims(text: str, count: int, what: str) -> tuple[int, ...]:
        try:
            return parse_shape_text(text, count, what)
        except ValueError as error:
            raise PlanError(str(error)) from None

    if args.video:
        return latent_shape_for_video(config, *dims(args.video, 3, "--video WxHxF"))
    if args.image:
        width, height = dims(args.image, 2, "--image WxH")
        return latent_shape_for_video(config, width, height, 1)
    latents = dims(args.shape, 3, "--shape CxHxW") if config.is_image else dims(args.shape, 4, "--shape CxTxHxW")
    if latents[0] != config.z_dim:
        raise PlanError(f"latent channels: expected {config.z_dim}, received {latents[0]}")
    return latents


def _announce(args: argparse.Namespace, config: Any, latents: tuple[int, ...], tps: list[int], *,
              first_fit: bool) -> None:
    """Before any compile: how many meshes will be compiled, and about how long each takes (the
    table's nearest row of the same model, dtype and tp)."""
    from vaeserve.sharding.chips import slice_facts
    from vaeserve.sharding.plan_table import estimate_compile_s
    from vaeserve.sharding.planner import table_model, video_for_latents

    facts, model = slice_facts(args.topology), table_model(config)
    video = "x".join(map(str, video_for_latents(config, latents)))
    parts = []
    for tp in tps:
        estimate = estimate_compile_s(model, video, facts[1], args.dtype, tp) if model and facts else None
        parts.append(f"tp={tp} about {_minutes(estimate[0])} of CPU ({estimate[1]} took that long for the table, "
                     "on a 2-core host)" if estimate else f"tp={tp} (no estimate: the table has no row of this model)")
    count = f"up to {len(tps)} mesh(es) (until one fits)" if first_fit and len(tps) > 1 else f"{len(tps)} mesh(es)"
    _say(f"{count} to compile here: " + "; ".join(parts))


def meshes_to_compile(tps: list[int], known: dict[int, Any], *, first_fit: bool, devices: int | None,
                      dp: int) -> list[int]:
    """The candidate tps a plan will compile: those the table does not answer (``known``) and that
    fit the slice's ``devices`` (None: not known yet), and with ``first_fit`` none past a tp the
    table says fits."""
    known_fit = min((tp for tp, mesh in known.items() if mesh.fits), default=None) if first_fit else None
    return [tp for tp in sorted(set(tps)) if tp not in known and (devices is None or tp * dp <= devices)
            and (known_fit is None or tp < known_fit)]


def interruptible(work: Callable[[], int]) -> int:
    """``work()``, run in a worker thread while this one waits in short slices: XLA compiles in C++,
    where Python's SIGINT handler does not run until the compile returns (minutes). Ctrl-C here
    leaves at once (exit status 130), without waiting for the compile to end."""
    outcome: list[Any] = []

    def target() -> None:
        try:
            outcome.append(work())
        except BaseException as error:  # noqa: BLE001 - raised again in the waiting thread
            outcome.append(error)

    worker = threading.Thread(target=target, name="vaeserve-plan", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.1)
    except KeyboardInterrupt:
        sys.stdout.flush()
        print("vaeserve plan: interrupted", file=sys.stderr, flush=True)
        os._exit(130)  # a normal exit would wait for the compile (the interpreter's shutdown, JAX's atexit)
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def _meta(args: argparse.Namespace, where: Any, config: Any, latents: tuple[int, ...]) -> dict[str, Any]:
    """What the table's header needs, before any mesh is answered (``SlicePlan.to_dict``'s fields)."""
    from vaeserve.sharding.planner import video_for_latents

    return {"topology": args.topology, "devices": where.devices, "devices_per_chip": where.devices_per_chip,
            "chip": {"name": where.chip.name, "hbm_bytes": where.chip.hbm_bytes},
            "video": dict(zip(("width", "height", "frames"), video_for_latents(config, latents), strict=True)),
            "latents": [args.batch, *latents], "dtype": args.dtype, "output": args.output,
            "inner_frames": args.inner_frames, "headroom": where.chip.headroom if args.headroom is None
            else args.headroom}


def run(args: argparse.Namespace) -> int:
    # Planning runs nothing on the host; keep JAX off any local accelerator (and off libtpu's
    # hardware probe: the TPU devices planned for are compile-only descriptions).
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    return interruptible(lambda: _plan(args))


def _plan(args: argparse.Namespace) -> int:
    from vaeserve import models, sharding
    from vaeserve.sharding.chips import TopologyError, slice_facts, topology_devices
    from vaeserve.sharding.planner import PlanError, describe_slice, plan_decode, table_meshes

    def printed(mesh: Any) -> None:
        if not args.json:
            print(mesh_line(dataclasses.asdict(mesh)), flush=True)

    try:
        config = models.load_config(args.model)
        latents = _latents(args, config)
        tps, inner_frames, first_fit = _tps(args.tp), _inner_frames(args.inner_frames), args.tp is None
        vae = models.abstract_vae(config, dtype=args.dtype)
        as_in_table = args.dp == args.batch == 1 and args.output == "uint8" and inner_frames is None
        known = {} if args.compile or not as_in_table else table_meshes(
            vae, latents, args.topology, tps, headroom=args.headroom, first_fit=first_fit)
        facts = slice_facts(args.topology)
        to_compile = meshes_to_compile(tps, known, first_fit=first_fit, devices=facts[2] if facts else None,
                                       dp=args.dp)
        devices = topology_devices(args.topology) if to_compile or facts is None else None
        if to_compile:
            _announce(args, config, latents, to_compile, first_fit=first_fit)
        if not args.json:
            print(header(_meta(args, describe_slice(args.topology, devices), config, latents)), flush=True)
        plan = plan_decode(vae, latents, devices, topology=args.topology, tps=tps, dp=args.dp, batch=args.batch,
                           output=args.output, headroom=args.headroom, inner_frames=inner_frames,
                           first_fit=first_fit, known=known, on_mesh=printed,
                           before_compile=lambda tp: _say(f"compiling tp={tp} dp={args.dp} …"))
    except (PlanError, TopologyError, models.ConfigError, FileNotFoundError, sharding.SplitError) as e:
        print(f"vaeserve plan: error: {e}", file=sys.stderr)
        return 2
    document = plan.to_dict()
    print(json.dumps(document, indent=2) if args.json else footer(document))
    return 0
