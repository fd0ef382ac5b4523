"""``vaeserve``: serve | decode | encode | convert | plan | loadtest."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from . import plan_cli

if TYPE_CHECKING:
    from .frames import BodyFormat


def _serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="run the HTTP decoding service")
    p.add_argument("--model", help="diffusers-format VAE folder, Wan2.x_VAE.pth, or an embedded model: wan2.1 "
                   "(the default) or wan2.2, both with random weights")
    p.add_argument("--tp", type=int, help="devices per frame (horizontal bands)")
    p.add_argument("--dp", type=int, help="data-parallel replicas")
    p.add_argument("--dtype", choices=["float32", "bfloat16"])
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--max-queue", type=int)
    p.add_argument("--max-batch", type=int)
    p.add_argument("--encode-warmup", action="append", metavar="3xFxHxW",
                   help="frame shape whose encode is compiled before ready (repeatable), e.g. 3x81x480x832")
    p.add_argument("--warmup", action="append", metavar="CxTxHxW[:OUTPUTS]",
                   help="latent shape to compile before ready (repeatable), e.g. 16x21x60x104, or "
                   "16x21x60x104:uint8,stream to compile only those outputs (uint8, float, stream; default all)")
    p.add_argument("--compile-cache", metavar="DIR", help="JAX persistent compilation cache")
    p.add_argument("--shapes", action="append", metavar="CxTxHxW|warmed|any",
                   help="serve only these latent shapes (repeatable), or only the warmed shapes and outputs; "
                   "others get 422 (default: any)")
    p.add_argument("--max-programs", type=int, help="compiled programs kept, least recently used dropped (0: all)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' (or VAESERVE_API_KEY)")
    p.add_argument("--cpu-devices", type=int, help="fake N CPU devices (tp/dp without accelerators)")
    p.add_argument("--device-memory-bytes", type=int,
                   help="per-device memory the warm-up programs must fit (default: the device's bytes_limit)")
    p.add_argument("--request-timeout-s", type=float)
    p.add_argument("--drain-timeout-s", type=float)
    p.add_argument("--read-timeout-s", type=float, help="time to receive the headers, and again the body (408)")
    p.add_argument("--keepalive-timeout-s", type=int, help="idle keep-alive connections are closed after this")
    p.add_argument("--max-connections", type=int, help="open connections before uvicorn answers 503")
    p.add_argument("--max-body-bytes", type=int)
    p.add_argument("--max-reading-bytes", type=int, help="bytes of request bodies read at once (429 past it)")
    p.add_argument("--max-frames", type=int)
    p.add_argument("--max-height", type=int)
    p.add_argument("--max-width", type=int)
    p.add_argument("--log-level")
    slice_ = p.add_argument_group("multi-host slice (one process per host; process 0 serves requests)")
    slice_.add_argument("--distributed", choices=["off", "auto"],
                        help="auto: join a slice, JAX detecting what is not given (TPU VMs, GKE TPU pods)")
    slice_.add_argument("--coordinator-address", metavar="HOST:PORT", help="process 0's coordinator, on every process")
    slice_.add_argument("--num-processes", type=int, help="processes in the slice")
    slice_.add_argument("--process-id", type=int, help="this process's rank (0 serves requests)")
    slice_.add_argument("--heartbeat-timeout-s", type=int, help="a process silent this long is dead")
    slice_.add_argument("--call-timeout-s", type=float, help="a device call unfinished after this fails the slice")
    slice_.add_argument("--failure-grace-s", type=float, help="503s before process 0 exits after a failure")


def _decode_parser(sub) -> None:
    p = sub.add_parser("decode", help="decode a latents file offline on the local devices")
    p.add_argument("input", help=".npy or .safetensors latents (B,C,T,H,W) or (C,T,H,W); C = 16 (Wan 2.1), 48 (2.2)")
    p.add_argument("-o", "--output", required=True, help=".mp4 (first video) or .npy (uint8 frames)")
    p.add_argument("--model")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--denormalize", action="store_true", help="z * latents_std + latents_mean first")
    p.add_argument("--fps", type=int, default=16)
    p.add_argument("--crf", type=int, default=18)
    p.add_argument("--cpu-devices", type=int)


def _encode_parser(sub) -> None:
    p = sub.add_parser("encode", help="encode an image, video or frames file offline on the local devices")
    p.add_argument("input", help=".mp4, .png, .jpg/.jpeg (pixels -> [-1, 1]), or .npy/.safetensors frames "
                   "(B,3,F,H,W) or (B,3,H,W) in [-1, 1]")
    p.add_argument("-o", "--output", required=True,
                   help=".safetensors (tensor 'latents') or .npy: float32 (B,z,T,H/s,W/s), "
                        "z, s = 16, 8 (Wan 2.1) or 48, 16 (Wan 2.2)")
    p.add_argument("--model")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--normalize", action="store_true", help="(z - latents_mean) / latents_std after (as pipelines do)")
    p.add_argument("--sample", action="store_true", help="draw from the posterior instead of taking its mean")
    p.add_argument("--seed", type=int, help="noise seed for --sample")
    p.add_argument("--cpu-devices", type=int)


def _convert_parser(sub) -> None:
    p = sub.add_parser("convert", help="original Wan2.1_VAE.pth / Wan2.2_VAE.pth -> diffusers-format folder")
    p.add_argument("input")
    p.add_argument("out_dir")
    p.add_argument("--config", help="diffusers config.json of the checkpoint (default: the real Wan 2.1 or 2.2 "
                   "config, whichever release the key names belong to)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vaeserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    _decode_parser(sub)
    _encode_parser(sub)
    _convert_parser(sub)
    plan_cli.add_parser(sub)
    sub.add_parser("loadtest", help="httpx load test (see vaeserve loadtest --help)", add_help=False)
    return parser


def serve(args: argparse.Namespace) -> int:
    from .app import create_app
    from .server import serve as run_server
    from .settings import Settings

    overrides = {k: v for k, v in vars(args).items() if k != "command" and v is not None}
    settings = Settings(**overrides)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    code = run_server(create_app(settings), settings)
    if settings.multi_process:
        from .distributed import exit_process

        exit_process(code)
    return code


def _load_latents(path: Path):
    import numpy as np

    from . import codec

    data = path.read_bytes()
    if path.suffix == ".npy":
        array = codec.parse_npy(data)
    elif path.suffix == ".safetensors":
        array = codec.parse_safetensors(data)
    else:
        raise SystemExit(f"unsupported input {path.name}: use .npy or .safetensors")
    array = np.asarray(array, np.float32)
    return array if array.ndim == 5 else array[None]


def decode(args: argparse.Namespace) -> int:
    import jax
    import numpy as np
    from tqdm import tqdm

    if args.cpu_devices:
        jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    import models
    import sharding

    from . import codec
    from .runner import pad_batch

    latents = _load_latents(Path(args.input))
    vae = models.load_vae(args.model, dtype=args.dtype)
    mesh = sharding.make_mesh(args.tp, dp=args.dp)
    padded = pad_batch(latents, -(-latents.shape[0] // args.dp) * args.dp)  # the batch must split over dp
    total = vae.config.num_output_frames(latents.shape[2])
    chunks = []
    with tqdm(total=total, unit="frame", desc="decode") as bar:
        for chunk in sharding.sharded_decode_stream(vae, padded, mesh, denormalize=args.denormalize):
            chunks.append(np.asarray(chunk)[: latents.shape[0]])
            bar.update(chunk.shape[1])
    frames = np.concatenate(chunks, axis=1)
    out = Path(args.output)
    if out.suffix == ".mp4":
        out.write_bytes(codec.encode_mp4(frames[0], fps=args.fps, crf=args.crf))
    elif out.suffix == ".npy":
        out.write_bytes(codec.encode_npy(frames))
    else:
        raise SystemExit(f"unsupported output {out.name}: use .mp4 or .npy")
    print(f"wrote {out} ({frames.shape[1]} frames {frames.shape[2]}x{frames.shape[3]}, batch {frames.shape[0]})")
    return 0


_FRAME_SUFFIXES: dict[str, BodyFormat] = {".mp4": "mp4", ".png": "png", ".jpg": "jpeg", ".jpeg": "jpeg", ".npy": "npy",
                   ".safetensors": "safetensors"}


def _load_frames(path: Path, config):
    """A file → checked frames ``(B, 3, F, H, W)`` float32 (no size limits offline)."""
    from . import codec, frames

    kind = _FRAME_SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise SystemExit(f"unsupported input {path.name}: use {', '.join(_FRAME_SUFFIXES)}")
    body = path.read_bytes()
    unlimited = codec.Limits(channels=3, max_batch=2**31, max_frames=2**31, max_height=2**31, max_width=2**31)
    if kind in ("png", "jpeg"):
        video = frames.parse_image(body, unlimited)
    elif kind == "mp4":
        video = frames.parse_mp4(body, unlimited)
    else:
        video = frames.parse_tensor(body, kind, None, None)
    frames.check_frames(video, config, unlimited)
    return video


def encode(args: argparse.Namespace) -> int:
    import jax
    import numpy as np
    from tqdm import tqdm

    if args.cpu_devices:
        jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    import models
    import sharding

    from . import frames
    from .errors import Problem
    from .runner import pad_batch

    out = Path(args.output)
    if out.suffix not in (".safetensors", ".npy"):
        raise SystemExit(f"unsupported output {out.name}: use .safetensors or .npy")
    with tqdm(total=4, desc="encode", unit="step") as bar:
        bar.set_postfix_str("loading the model")
        vae = models.load_vae(args.model, dtype=args.dtype)
        try:
            vae.require_encoder()
        except models.NoEncoderError as error:
            raise SystemExit(str(error)) from None
        bar.update()
        bar.set_postfix_str(f"reading {Path(args.input).name}")
        try:
            video = _load_frames(Path(args.input), vae.config)
        except Problem as problem:
            detail = problem.detail
            if "expected" not in detail:  # shape problems already name both values in the detail
                detail += f" (expected {problem.expected}, received {problem.received})"
            raise SystemExit(f"{args.input}: {detail}") from None
        mesh = sharding.make_mesh(args.tp, dp=args.dp)
        padded = pad_batch(video, -(-video.shape[0] // args.dp) * args.dp)  # the batch must split over dp
        bar.update()
        bar.set_postfix_str(f"compiling and encoding {tuple(video.shape)}")
        latents = np.asarray(sharding.sharded_encode(vae, padded, mesh, sample=args.sample, seed=args.seed,
                                                     normalize=args.normalize))[: video.shape[0]]
        bar.update()
        bar.set_postfix_str(f"writing {out.name}")
        body, _ = frames.encode_latents(latents, "safetensors" if out.suffix == ".safetensors" else "npy")
        out.write_bytes(body)
        bar.update()
    print(f"wrote {out} (latents {tuple(latents.shape)} from frames {tuple(video.shape)})")
    return 0


def convert(args: argparse.Namespace) -> int:
    import models

    config = models.WanVAEConfig.from_json(args.config) if args.config else None
    out = models.convert_wan_pth(args.input, args.out_dir, config=config)
    print(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "loadtest":  # its own parser, shared with bench/loadtest.py
        from .loadtest import main as loadtest_main

        return loadtest_main(argv[1:])
    args = build_parser().parse_args(argv)
    handler = {"serve": serve, "decode": decode, "encode": encode, "convert": convert,
               "plan": plan_cli.run}[args.command]
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
