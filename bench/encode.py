"""Encode speed: ours vs diffusers' AutoencoderKLWan on the same weights and frames (CPU).

    .venv/bin/python -m bench.encode                          # real config, frames (1,3,9,128,128)
    .venv/bin/python -m bench.encode --shape 1,3,17,256,256 --runs 3
    .venv/bin/python -m bench.encode --model wan2.2           # real Wan 2.2 config (150 M encoder parameters)

Prints min and median seconds over ``--runs`` timed runs after one warm-up (which includes our
compile), the ratio ours/diffusers from the same run (the two run in turn within each round), achieved GFLOP/s on the nominal FLOPs
(models/flops.py), and the max abs difference of the posterior means as a sanity check.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import jax
import numpy as np

from bench.common import diffusers_reference, ratio, timed
from vaeserve import models
from vaeserve.models.flops import encode_flops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="wan2.1", choices=sorted(models.MODEL_NAMES),
                        help="the real architecture to time (random weights)")
    parser.add_argument("--shape", default="1,3,9,128,128",
                        help="frames B,3,F,H,W (F = 1 + 4k, H and W multiples of 8; 16 for wan2.2)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--skip-diffusers", action="store_true", help="time ours only (no torch needed)")
    args = parser.parse_args()
    shape = tuple(int(s) for s in args.shape.split(","))
    config = models.MODEL_NAMES[args.model]()
    frames = np.random.default_rng(0).uniform(-1, 1, shape).astype(np.float32)
    flops = encode_flops(config, shape)
    fns, names = {}, {}

    with tempfile.TemporaryDirectory() as folder:
        if not args.skip_diffusers:
            import torch

            reference = diffusers_reference(config, folder)
            x = torch.from_numpy(frames)

            def run_reference():
                with torch.no_grad():
                    return reference.encode(x).latent_dist.mode().numpy()

            fns["diffusers"], names["diffusers"] = run_reference, "diffusers (PyTorch CPU, float32)"
            vae = models.load_vae(folder, dtype=args.dtype)
        else:
            vae = models.init_vae(config, dtype=args.dtype)

    fns["vaeserve"] = lambda: np.asarray(jax.block_until_ready(vae.encode(frames)))
    names["vaeserve"] = f"vaeserve (JAX {jax.default_backend()}, {args.dtype})"
    results = timed(fns, args.runs)  # diffusers and ours in turn within each round

    print(f"frames {shape} -> latents {results['vaeserve'][1].shape}; nominal {flops / 1e9:.0f} GFLOP; "
          f"devices: {jax.devices()[0].device_kind} x{jax.device_count()}")
    print(f"{'implementation':36s} {'min s':>8s} {'median s':>9s} {'GFLOP/s':>8s}")
    for name, (times, _) in results.items():
        print(f"{names[name]:36s} {min(times):8.2f} {statistics.median(times):9.2f} {flops / min(times) / 1e9:8.1f}")
    if "diffusers" in results:
        (reference_times, reference_out), (our_times, our_out) = results["diffusers"], results["vaeserve"]
        print(f"ratio ours/diffusers: {ratio(our_times, reference_times)}")
        print(f"max abs diff vs diffusers (posterior mean): {np.abs(our_out - reference_out).max():.2e}")


if __name__ == "__main__":
    main()
