"""``vaeserve plan``: will this decode fit that TPU slice or GPU host? Answered with the real
compiler (libtpu, or XLA's CUDA compiler), no TPU and no GPU.

    vaeserve plan --topology v5e:2x4 --video 1280x720x81 --dtype bfloat16
    vaeserve plan --topology v6e-8 --shape 16x21x90x160 --tp 4,8 --json
    vaeserve plan --topology h100-8 --video 1920x1080x81 --dtype bfloat16   # needs the `cuda` extra
    vaeserve plan --topology v6e-8 --model sdxl --image 4096x4096 --dtype bfloat16   # an image model

Compiles the sharded decode for each candidate mesh over the slice's abstract devices (see
``sharding.planner``) and prints per-device memory, fit, FLOPs, traffic, collectives, compile time
and a roofline lower bound, then the smallest tp that fits. ``--json`` prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any


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
    p.add_argument("--model", default="wan2.1",
                   help="wan2.1 (default), wan2.2, hunyuan1.0, hunyuan1.5, sd, sdxl, flux1, flux2, qwen-image, or a "
                        "model path as `serve --model` takes; only its config is read")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--tp", default="1,2,4,8", help="candidate tp sizes, comma-separated (default 1,2,4,8)")
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
    p.add_argument("--json", action="store_true", help="one JSON document on stdout instead of the table")


def _tps(text: str) -> list[int]:
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


def format_table(plan: dict[str, Any]) -> str:
    """The plan as a Markdown table with a header and the recommendation."""
    video, chip = plan["video"], plan["chip"]
    lines = [
        f"{plan['topology']}: {plan['devices']} x {chip['name']} devices "
        f"({_gb(chip['hbm_bytes'] / plan['devices_per_chip'])} GB HBM each); "
        f"{video['width']}x{video['height']}x{video['frames']} from latents {plan['latents']} per replica, "
        f"{plan['dtype']}, {plan['output']} out, inner frames {plan.get('inner_frames') or 'automatic'}; fits = total ≤ {1 - plan['headroom']:.0%} of HBM",
        "",
        "| tp | dp | split | args GB | out GB | temp GB | code GB | total GB | fits | TFLOP | "
        "bytes accessed GB (scan body once) | halo MB | collectives | compile s | bound s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in plan["meshes"]:
        if m["refused"]:
            lines.append(f"| {m['tp']} | {m['dp']} | {m['split']} | — | — | ≥ {_gb(m['temp_bytes'])} | — "
                         f"| ≥ {_gb(m['total_bytes'])} | NO | {m['flops'] / 1e12:,.1f} | — | — | — "
                         f"| {m['compile_s']:.1f} | refused by the compiler: {m['refused']} |")
            continue
        found = ", ".join(f"{n} {op}" for op, n in ((op, c["count"]) for op, c in sorted(m["collectives"].items())))
        lines.append(
            f"| {m['tp']} | {m['dp']} | {m['split']} | {_gb(m['argument_bytes'])} | {_gb(m['output_bytes'])} "
            f"| {_gb(m['temp_bytes'])} | {_gb(m['code_bytes'])} | {_gb(m['total_bytes'])} "
            f"| {'yes' if m['fits'] else 'NO'} | {m['flops'] / 1e12:,.1f} | {_gb(m['bytes_accessed'])} "
            f"| {m['halo_bytes'] / 1e6:,.1f} | {found or 'none'} | {m['compile_s']:.1f} | ≥ {m['bound_s']:.3f} |"
        )
    for s in plan["skipped"]:
        lines.append(f"| {s['tp']} | {s['dp']} | — | skipped: {s['reason']} |")
    rec = plan["recommendation"]
    lines += ["", f"recommendation: {rec['reason']}", "",
              *(f"* {name}: {text}" for name, text in plan["notes"].items())]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    # Planning runs nothing on the host; keep JAX off any local accelerator (and off libtpu's
    # hardware probe: the TPU devices planned for are compile-only descriptions).
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import models
    import sharding
    from models.shapes import parse_shape_text
    from sharding.chips import TopologyError, topology_devices
    from sharding.planner import PlanError, latent_shape_for_video, plan_decode

    def dims(text: str, count: int, what: str) -> tuple[int, ...]:
        try:
            return parse_shape_text(text, count, what)
        except ValueError as error:
            raise PlanError(str(error)) from None

    try:
        config = models.load_config(args.model)
        latents: tuple[int, ...]
        if args.video or args.image:
            width, height, frames = dims(args.video, 3, "--video WxHxF") if args.video else \
                (*dims(args.image, 2, "--image WxH"), 1)
            latents = latent_shape_for_video(config, width, height, frames)
        else:
            latents = dims(args.shape, 3 if config.is_image else 4, "--shape CxHxW" if config.is_image else
                           "--shape CxTxHxW")
            if latents[0] != config.z_dim:
                raise PlanError(f"latent channels: expected {config.z_dim}, received {latents[0]}")
        devices = topology_devices(args.topology)
        vae = models.abstract_vae(config, dtype=args.dtype)
        plan = plan_decode(vae, latents, devices, topology=args.topology, tps=_tps(args.tp), dp=args.dp,
                           batch=args.batch, output=args.output,
                           headroom=args.headroom,
                           inner_frames=_inner_frames(args.inner_frames), progress=True)
    except (PlanError, TopologyError, models.ConfigError, FileNotFoundError, sharding.SplitError) as e:
        print(f"vaeserve plan: error: {e}", file=sys.stderr)
        return 2
    document = plan.to_dict()
    print(json.dumps(document, indent=2) if args.json else format_table(document))
    return 0
