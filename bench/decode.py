"""Decode speed: ours vs diffusers' AutoencoderKLWan on the same weights and latents.

    .venv/bin/python bench/decode.py                       # real Wan 2.1 config, latents (1,16,3,16,16)
    .venv/bin/python bench/decode.py --model wan2.2        # real Wan 2.2 config, latents (1,48,3,8,8)
    .venv/bin/python bench/decode.py --shape 1,16,21,60,104 --dtype bfloat16 --skip-diffusers   # 480x832x81

Prints min and median seconds over ``--runs`` timed runs after one warm-up (which includes our
compile), the ratio ours/diffusers, achieved GFLOP/s on the nominal FLOPs (bench/flops.py), and
the max abs difference between the two outputs as a sanity check.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import jax  # noqa: E402
import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

import models  # noqa: E402
from models.flops import decode_flops  # noqa: E402

T = TypeVar("T")


def timed(fn: Callable[[], T], runs: int, name: str) -> tuple[list[float], T]:
    result = fn()  # warm-up: compile (ours) / allocator and oneDNN primitive caches (torch)
    times = []
    for _ in tqdm(range(runs), desc=name, unit="run", leave=False):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return times, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="wan2.1", choices=sorted(models.MODEL_NAMES),
                        help="the real architecture to time (random weights)")
    parser.add_argument("--shape", help="latents B,C,T,H,W (default: 9 frames of 128x128)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--chunk", type=int, default=1, help="latent frames per scan step")
    parser.add_argument("--skip-diffusers", action="store_true", help="time ours only (no torch needed)")
    args = parser.parse_args()
    config = models.MODEL_NAMES[args.model]()
    side = 128 // config.spatial_scale
    shape = tuple(int(s) for s in args.shape.split(",")) if args.shape else (1, config.z_dim, 3, side, side)
    latents = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    flops = decode_flops(config, shape)
    rows = []

    with tempfile.TemporaryDirectory() as folder:
        reference_out = None
        if not args.skip_diffusers:
            import torch
            from diffusers.models.autoencoders.autoencoder_kl_wan import AutoencoderKLWan

            torch.manual_seed(0)
            reference = AutoencoderKLWan(**{k: v for k, v in config.to_dict().items() if k != "_class_name"}).eval()
            reference.save_pretrained(folder)
            z = torch.from_numpy(latents)

            def run_reference():
                with torch.no_grad():
                    return reference.decode(z).sample.numpy()

            times, reference_out = timed(run_reference, args.runs, "diffusers")
            rows.append(("diffusers (PyTorch CPU, float32)", times))
            vae = models.load_vae(folder, dtype=args.dtype)
        else:
            vae = models.init_vae(config, dtype=args.dtype)

        def run_ours():
            return np.asarray(jax.block_until_ready(vae.decode(latents, chunk=args.chunk)))

        times, ours_out = timed(run_ours, args.runs, "vaeserve")
        rows.append((f"vaeserve (JAX {jax.default_backend()}, {args.dtype})", times))

    print(f"{args.model}: latents {shape} -> frames {ours_out.shape}; nominal {flops / 1e9:.0f} GFLOP; "
          f"devices: {jax.devices()[0].device_kind} x{jax.device_count()}")
    print(f"{'implementation':36s} {'min s':>8s} {'median s':>9s} {'GFLOP/s':>8s}")
    for name, times in rows:
        print(f"{name:36s} {min(times):8.2f} {statistics.median(times):9.2f} {flops / min(times) / 1e9:8.1f}")
    if len(rows) == 2:
        (_, ref_t), (_, our_t) = rows
        print(f"ratio ours/diffusers: min {min(our_t) / min(ref_t):.2f}, "
              f"median {statistics.median(our_t) / statistics.median(ref_t):.2f}")
        print(f"max abs diff vs diffusers: {np.abs(ours_out - reference_out).max():.2e}")


if __name__ == "__main__":
    main()
