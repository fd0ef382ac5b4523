"""``vaeserve``: serve | decode | convert | loadtest."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path


def _serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="run the HTTP decoding service")
    p.add_argument("--model", help="diffusers-format VAE folder (default: embedded Wan 2.1, random weights)")
    p.add_argument("--tp", type=int, help="devices per frame (horizontal bands)")
    p.add_argument("--dp", type=int, help="data-parallel replicas")
    p.add_argument("--dtype", choices=["float32", "bfloat16"])
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--max-queue", type=int)
    p.add_argument("--max-batch", type=int)
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


def _decode_parser(sub) -> None:
    p = sub.add_parser("decode", help="decode a latents file offline on the local devices")
    p.add_argument("input", help=".npy or .safetensors latents (B,16,T,H,W) or (16,T,H,W)")
    p.add_argument("-o", "--output", required=True, help=".mp4 (first video) or .npy (uint8 frames)")
    p.add_argument("--model")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--denormalize", action="store_true", help="z * latents_std + latents_mean first")
    p.add_argument("--fps", type=int, default=16)
    p.add_argument("--crf", type=int, default=18)
    p.add_argument("--cpu-devices", type=int)


def _convert_parser(sub) -> None:
    p = sub.add_parser("convert", help="original Wan2.1_VAE.pth -> diffusers-format folder")
    p.add_argument("input")
    p.add_argument("out_dir")
    p.add_argument("--config", help="diffusers config.json of the checkpoint (default: the Wan 2.1 VAE)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vaeserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    _decode_parser(sub)
    _convert_parser(sub)
    sub.add_parser("loadtest", help="httpx load test (see vaeserve loadtest --help)", add_help=False)
    return parser


def serve(args: argparse.Namespace) -> int:
    from .app import create_app
    from .server import serve as run_server
    from .settings import Settings

    overrides = {k: v for k, v in vars(args).items() if k != "command" and v is not None}
    settings = Settings(**overrides)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run_server(create_app(settings), settings)


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
    handler = {"serve": serve, "decode": decode, "convert": convert}[args.command]
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
