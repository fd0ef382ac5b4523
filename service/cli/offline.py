"""The offline commands: ``vaeserve decode``, ``vaeserve encode`` and ``vaeserve convert``.

They run on this machine's devices (``--tp``/``--dp`` meshes as the server builds them), read and
write files with the server's codecs, and show progress; no size limits (the user's own files).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from tqdm import tqdm

from vaeserve.models.shapes import clip_shape

from ..codecs.frames import BodyFormat, read_frames_header
from ..codecs.latents import check_latent_dims, model_layout, serialize_latents
from ..codecs.mp4 import ALL_CODECS
from ..codecs.tensors import npy_bytes, parse_npy, parse_safetensors
from ..codecs.video import jpeg_bytes, mp4_bytes, png_bytes
from ..engine.batches import pad_batch
from ..limits import Limits
from ..problem import Problem
from ..settings import add_argument


def add_parsers(sub) -> None:
    _decode_parser(sub)
    _encode_parser(sub)
    _convert_parser(sub)


def _decode_parser(sub) -> None:
    p = sub.add_parser("decode", help="decode a latents file offline on the local devices")
    p.add_argument("input", help=".npy or .safetensors latents (B,C,T,H,W) or (C,T,H,W); C = 16 (Wan 2.1, "
                   "HunyuanVideo), 48 (Wan 2.2), 32 (HunyuanVideo 1.5); an image model's (B,C,H,W) or (C,H,W)")
    p.add_argument("-o", "--output", required=True, help=".mp4 (first video) or .npy (uint8 frames); an image "
                   "model's .png or .jpg (first image) or .npy (uint8 images)")
    _model_arguments(p)
    p.add_argument("--denormalize", action="store_true", help="z * latents_std + latents_mean first")
    p.add_argument("--framewise", action="store_true",
                   help="HunyuanVideo 1.0: decode as diffusers does by default (tiles of 16 frames, blended), not the whole clip")
    add_argument(p, "default_fps", "--fps")
    add_argument(p, "default_crf", "--crf")


def _encode_parser(sub) -> None:
    p = sub.add_parser("encode", help="encode an image, video or frames file offline on the local devices")
    p.add_argument("input", help=".mp4/.mov, .png, .jpg/.jpeg (pixels -> [-1, 1]), or .npy/.safetensors frames "
                   "(B,3,F,H,W) or (B,3,H,W) in [-1, 1]")
    p.add_argument("-o", "--output", required=True,
                   help=".safetensors (tensor 'latents') or .npy: float32 (B,z,T,H/s,W/s) (an image model's "
                        "(B,z,H/s,W/s)), z, s = 16, 8 (Wan 2.1, HunyuanVideo), 48, 16 (Wan 2.2) or 32, 16 "
                        "(HunyuanVideo 1.5)")
    _model_arguments(p)
    p.add_argument("--normalize", action="store_true", help="(z - latents_mean) / latents_std after (as pipelines do)")
    p.add_argument("--sample", action="store_true", help="draw from the posterior instead of taking its mean")
    p.add_argument("--seed", type=int, help="noise seed for --sample")


def _model_arguments(parser: argparse.ArgumentParser) -> None:
    """The model and mesh, as ``vaeserve serve`` takes them (declared once, in ``Settings``)."""
    for name in ("model", "dtype", "tp", "dp", "cpu_devices"):
        add_argument(parser, name)


def _convert_parser(sub) -> None:
    p = sub.add_parser("convert", help="an original release's VAE checkpoint (Wan2.1_VAE.pth, Wan2.2_VAE.pth, "
                       "HunyuanVideo's vae/pytorch_model.pt, HunyuanVideo 1.5's vae/diffusion_pytorch_model.safetensors)"
                       " -> diffusers-format folder")
    p.add_argument("input")
    p.add_argument("out_dir")
    p.add_argument("--config", help="diffusers config.json of the checkpoint (default: the real config of the release "
                   "the key names belong to)")


def _load_latents(path: Path, config) -> np.ndarray:
    """A latents file → float32 latents in the model's batched layout (``model_layout``)."""
    data = path.read_bytes()
    if path.suffix == ".npy":
        array = parse_npy(data, check=check_latent_dims)
    elif path.suffix == ".safetensors":
        array = parse_safetensors(data, check=check_latent_dims)
    else:
        raise SystemExit(f"unsupported input {path.name}: use .npy or .safetensors")
    batched, _ = model_layout(np.asarray(array, np.float32), config)
    return batched


def _devices(cpu_devices: int | None):
    """JAX, with ``--cpu-devices`` fake CPU devices if asked (before its backends start). Imported
    here, when a command that runs a model starts, not by ``vaeserve serve`` or ``vaeserve plan``."""
    import jax

    from ..engine.startup import choose_platforms

    choose_platforms()
    if cpu_devices:
        jax.config.update("jax_num_cpu_devices", cpu_devices)
    return jax


def _pad_to_dp(batch: np.ndarray, dp: int) -> np.ndarray:
    """Pad the batch with zeros to a multiple of ``dp`` (it must split over the replicas)."""
    return pad_batch(batch, -(-batch.shape[0] // dp) * dp)


def decode(args: argparse.Namespace) -> int:
    _devices(args.cpu_devices)
    from vaeserve import models, sharding

    vae = models.load_vae(args.model, dtype=args.dtype)
    latents = _load_latents(Path(args.input), vae.config)
    mesh = sharding.make_mesh(args.tp, dp=args.dp)
    padded = _pad_to_dp(latents, args.dp)
    total = vae.config.num_output_frames(clip_shape(latents.shape)[2])
    chunks, nonfinite = [], 0
    with tqdm(total=total, unit="frame", desc="decode") as bar:
        for step in sharding.sharded_decode_stream(vae, padded, mesh, denormalize=args.denormalize,
                                                   framewise=args.framewise):
            chunks.append(step.frames[: latents.shape[0]])
            nonfinite += int(step.nonfinite[: latents.shape[0]].sum())
            bar.update(step.frames.shape[1])
    if nonfinite:
        raise SystemExit(f"{args.input}: the decode produced {nonfinite} NaN/Inf values: the latents overflow the "
                         "model (check their scale; --denormalize?)")
    frames = np.concatenate(chunks, axis=1)
    out = Path(args.output)
    images = vae.config.is_image
    writers = {".png": png_bytes, ".jpg": jpeg_bytes, ".jpeg": jpeg_bytes} if images else \
        {".mp4": lambda video: mp4_bytes(video, fps=args.default_fps, crf=args.default_crf)}
    if out.suffix in writers:
        out.write_bytes(writers[out.suffix](frames[0, 0] if images else frames[0]))
    elif out.suffix == ".npy":
        out.write_bytes(npy_bytes(frames[:, 0] if images else frames))
    else:
        raise SystemExit(f"unsupported output {out.name}: use {', '.join(writers)} or .npy")
    what = "images" if images else f"{frames.shape[1]} frames"
    print(f"wrote {out} ({what} {frames.shape[2]}x{frames.shape[3]}, batch {frames.shape[0]})")
    return 0


_FRAME_SUFFIXES: dict[str, BodyFormat] = {".mp4": "mp4", ".mov": "mp4", ".png": "png", ".jpg": "jpeg",
                                          ".jpeg": "jpeg", ".npy": "npy", ".safetensors": "safetensors"}


def _load_frames(path: Path, config) -> np.ndarray:
    """A file → checked frames ``(B, 3, F, H, W)`` float32 (offline: the user's own files, so no size
    limits and every video codec the server can read)."""
    kind = _FRAME_SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise SystemExit(f"unsupported input {path.name}: use {', '.join(_FRAME_SUFFIXES)}")
    return read_frames_header(path.read_bytes(), kind, None, None, config, Limits.unlimited(), codecs=ALL_CODECS).read()


def encode(args: argparse.Namespace) -> int:
    _devices(args.cpu_devices)
    from vaeserve import models, sharding

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
        padded = _pad_to_dp(video, args.dp)
        bar.update()
        bar.set_postfix_str(f"compiling and encoding {tuple(video.shape)}")
        latents = np.asarray(sharding.sharded_encode(vae, padded, mesh, sample=args.sample, seed=args.seed,
                                                     normalize=args.normalize))[: video.shape[0]]
        bar.update()
        bar.set_postfix_str(f"writing {out.name}")
        body, _ = serialize_latents(latents, "safetensors" if out.suffix == ".safetensors" else "npy")
        out.write_bytes(body)
        bar.update()
    print(f"wrote {out} (latents {tuple(latents.shape)} from frames {tuple(video.shape)})")
    return 0


def convert(args: argparse.Namespace) -> int:
    from vaeserve import models

    config = models.read_config(args.config) if args.config else None
    out = models.convert_checkpoint(args.input, args.out_dir, config=config)
    print(f"wrote {out}")
    return 0
