"""Decode speed: ours vs diffusers' AutoencoderKLWan on the same weights and latents.

    .venv/bin/python bench/decode.py                       # real Wan 2.1 config, latents (1,16,3,16,16)
    .venv/bin/python bench/decode.py --model wan2.2        # real Wan 2.2 config, latents (1,48,3,8,8)
    .venv/bin/python bench/decode.py --shape 1,16,21,60,104 --dtype bfloat16 --skip-diffusers   # 480x832x81
    .venv/bin/python bench/decode.py --skip-diffusers --inner-frames 4,1 --runs 5   # whole steps vs frame by frame

Prints min and median seconds over ``--runs`` timed runs after one warm-up (which includes our
compile), the ratio ours/diffusers, achieved GFLOP/s on the nominal FLOPs (bench/flops.py), and
the max abs difference between the two outputs as a sanity check. With several ``--inner-frames``
settings, ours runs once per setting in turn within each round (the same machine load for all)
and each is compared with the first setting: ratio and max abs difference.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import jax  # noqa: E402
import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

import models  # noqa: E402
from models.flops import decode_flops  # noqa: E402


def timed(fns: dict[str, Callable[[], np.ndarray]], runs: int) -> dict[str, tuple[list[float], np.ndarray]]:
    """Warm each up (compile / allocator and oneDNN primitive caches), then ``runs`` rounds that
    time each once in turn, so that every one sees the same machine load."""
    results = {name: fn() for name, fn in fns.items()}
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in tqdm(range(runs), desc=" vs ".join(fns), unit="round", leave=False):
        for name, fn in fns.items():
            start = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - start)
    return {name: (times[name], results[name]) for name in fns}


def parse_inner_frames(text: str) -> list[int | None]:
    """``"4,1"`` → ``[4, 1]``; ``auto`` → None (the automatic choice)."""
    return [None if part.strip() == "auto" else int(part) for part in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="wan2.1", choices=sorted(models.MODEL_NAMES),
                        help="the real architecture to time (random weights)")
    parser.add_argument("--shape", help="latents B,C,T,H,W (default: 9 frames of 128x128)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--chunk", type=int, default=1, help="latent frames per scan step")
    parser.add_argument("--inner-frames", type=parse_inner_frames, default=[None],
                        help="frames per inner step after each temporal upsampler, comma-separated settings to "
                             "compare in one run (auto: the automatic choice; 4: whole steps); default auto")
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

            ((times, reference_out),) = timed({"diffusers": run_reference}, args.runs).values()
            rows.append(("diffusers (PyTorch CPU, float32)", times))
            vae = models.load_vae(folder, dtype=args.dtype)
        else:
            vae = models.init_vae(config, dtype=args.dtype)

        def run_ours(inner_frames):
            return lambda: np.asarray(jax.block_until_ready(vae.decode(latents, chunk=args.chunk,
                                                                       inner_frames=inner_frames)))

        ours = timed({f"inner_frames={f or 'auto'}": run_ours(f) for f in args.inner_frames}, args.runs)
        for name, (times, _) in ours.items():
            rows.append((f"vaeserve (JAX {jax.default_backend()}, {args.dtype}) {name}", times))

    outputs = [out for _, out in ours.values()]
    print(f"{args.model}: latents {shape} -> frames {outputs[0].shape}; nominal {flops / 1e9:.0f} GFLOP; "
          f"devices: {jax.devices()[0].device_kind} x{jax.device_count()}")
    print(f"{'implementation':56s} {'min s':>8s} {'median s':>9s} {'GFLOP/s':>8s}")
    for name, times in rows:
        print(f"{name:56s} {min(times):8.2f} {statistics.median(times):9.2f} {flops / min(times) / 1e9:8.1f}")
    first, *others = list(ours.items())
    for name, (times, out) in others:
        print(f"ratio {name} / {first[0]}: min {min(times) / min(first[1][0]):.3f}, "
              f"median {statistics.median(times) / statistics.median(first[1][0]):.3f}; "
              f"max abs diff {np.abs(out - first[1][1]).max():.2e}")
    if reference_out is not None:
        ref_t = rows[0][1]
        for name, (our_t, out) in ours.items():
            print(f"ratio ours ({name}) / diffusers: min {min(our_t) / min(ref_t):.2f}, "
                  f"median {statistics.median(our_t) / statistics.median(ref_t):.2f}; "
                  f"max abs diff {np.abs(out - reference_out).max():.2e}")


if __name__ == "__main__":
    main()
