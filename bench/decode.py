"""Decode speed: ours vs diffusers (AutoencoderKLWan, AutoencoderKLHunyuanVideo, AutoencoderKLHunyuanVideo15,
AutoencoderKLLTXVideo, AutoencoderKLLTX2Video, and the image VAEs: AutoencoderKL as SD/SDXL/Flux.1,
AutoencoderKLFlux2, AutoencoderKLQwenImage) on the same weights and latents.

    .venv/bin/python -m bench.decode                       # real Wan 2.1 config, latents (1,16,3,16,16)
    .venv/bin/python -m bench.decode --model wan2.2        # real Wan 2.2 config, latents (1,48,3,8,8)
    .venv/bin/python -m bench.decode --model hunyuan1.0    # real HunyuanVideo config, latents (1,16,3,16,16)
    .venv/bin/python -m bench.decode --model hunyuan1.5    # real HunyuanVideo 1.5 config, latents (1,32,3,8,8)
    .venv/bin/python -m bench.decode --model ltx2          # real LTX-2 config, latents (1,128,3,4,4): 17 x 128x128
    .venv/bin/python -m bench.decode --model ltx-video     # real LTX-Video 0.9.5 config (timestep 0.05), as ltx2
    .venv/bin/python -m bench.decode --model sdxl          # real SDXL VAE, latents (1,4,32,32): one 256x256 image
    .venv/bin/python -m bench.decode --model flux1 --shape 1,16,64,64   # real Flux.1 VAE, one 512x512 image
    .venv/bin/python -m bench.decode --shape 1,16,21,60,104 --dtype bfloat16 --skip-diffusers   # 480x832x81
    .venv/bin/python -m bench.decode --skip-diffusers --inner-frames 4,1 --runs 5   # whole steps vs frame by frame
    .venv/bin/python -m bench.decode --model ltx-video --cpu-convs onednn,matmul    # both CPU conv paths

Prints min and median seconds over ``--runs`` timed runs after one warm-up (which includes our
compile), the ratio ours/diffusers, achieved GFLOP/s on the nominal FLOPs (bench/flops.py), and
the max abs difference between the two outputs as a sanity check. A timestep-conditioned decoder
(LTX-Video 0.9.5) decodes at ``DECODE_TIMESTEP`` in both, with no noise mixed into the latents. diffusers'
model is saved without its encoder (a decode-only checkpoint: one copy of the decoder each). With several
``--inner-frames`` (or ``--cpu-convs``) settings, each is compared with the first setting: ratio and max abs difference.
diffusers and every setting of ours run once each in turn within each round, so that all see the same machine load.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import jax
import numpy as np

from bench.common import diffusers_reference, ratio, timed
from vaeserve import models
from vaeserve.models.conditions import DEFAULT_DECODE_TIMESTEP as DECODE_TIMESTEP  # the pipelines'
from vaeserve.models.flops import decode_flops


def parse_inner_frames(text: str) -> list[int | None]:
    """``"4,1"`` → ``[4, 1]``; ``auto`` → None (the automatic choice)."""
    return [None if part.strip() == "auto" else int(part) for part in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="wan2.1", choices=sorted(models.MODEL_NAMES),
                        help="the real architecture to time (random weights)")
    parser.add_argument("--shape", help="latents B,C,T,H,W, an image model's B,C,H,W (default: 3 latent frames "
                        "of 128x128, 9 frames, 17 for LTX; one 256x256 image)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--chunk", type=int, default=1, help="latent frames per scan step")
    parser.add_argument("--inner-frames", type=parse_inner_frames, default=[None],
                        help="frames per inner step after each temporal upsampler, comma-separated settings to "
                             "compare in one run (auto: the automatic choice; 4: whole steps); default auto")
    parser.add_argument("--cpu-convs", type=lambda text: text.split(","), default=["onednn"],
                        help="how a CPU runs the convolutions (VAE.cpu_convs), comma-separated settings to compare "
                             "in one run: onednn, matmul; default onednn (the server's)")
    parser.add_argument("--skip-diffusers", action="store_true", help="time ours only (no torch needed)")
    args = parser.parse_args()
    config = models.MODEL_NAMES[args.model]()
    side = (256 if config.is_image else 128) // config.spatial_scale
    default = (1, config.z_dim, side, side) if config.is_image else (1, config.z_dim, 3, side, side)
    shape = tuple(int(s) for s in args.shape.split(",")) if args.shape else default
    latents = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    flops = decode_flops(config, shape)
    fns, names = {}, {}
    conditioned = config.decode_conditions  # LTX-Video 0.9.5's timestep: the same in both, no noise
    conditions = {"timestep": DECODE_TIMESTEP, "noise_scale": 0.0, "seed": 0} if conditioned else {}

    with tempfile.TemporaryDirectory() as folder:
        if not args.skip_diffusers:
            import torch

            reference = diffusers_reference(config, folder, encoder=False)
            # diffusers' Qwen-Image class takes one-frame clips (B, C, 1, H, W) only
            clips = config.takes_one_frame_clips and latents.ndim == 4
            z = torch.from_numpy(latents[:, :, None] if clips else latents)
            temb = (torch.full((shape[0],), DECODE_TIMESTEP),) if conditioned else ()

            def run_reference():
                with torch.no_grad():  # clamped as ours (diffusers' Wan clamps, its HunyuanVideo does not)
                    frames = reference.decode(z, *temb).sample.clamp(-1, 1).numpy()
                return frames[:, :, 0] if clips else frames

            fns["diffusers"] = run_reference
            names["diffusers"] = "diffusers (PyTorch CPU, float32)"
        vaes: dict[str, models.VAE] = {}
        for kind in args.cpu_convs:  # one model each: a model's programs keep the path they were compiled with
            vaes[kind] = (models.load_vae(folder, dtype=args.dtype) if not args.skip_diffusers
                          else models.init_vae(config, dtype=args.dtype))
            vaes[kind].cpu_convs = kind

    def run_ours(vae, inner_frames):
        return lambda: np.asarray(jax.block_until_ready(vae.decode(latents, chunk=args.chunk,
                                                                   inner_frames=inner_frames, **conditions)))

    for kind, vae in vaes.items():
        for inner_frames in args.inner_frames:
            name = f"inner_frames={inner_frames or 'auto'}" + (f" cpu_convs={kind}" if len(vaes) > 1 else "")
            fns[name] = run_ours(vae, inner_frames)
            names[name] = f"vaeserve (JAX {jax.default_backend()}, {args.dtype}) {name}"
    results = timed(fns, args.runs)  # diffusers and ours in turn within each round
    reference_result = results.pop("diffusers", None)

    outputs = [out for _, out in results.values()]
    print(f"{args.model}: latents {shape} -> frames {outputs[0].shape}; nominal {flops / 1e9:.0f} GFLOP; "
          f"devices: {jax.devices()[0].device_kind} x{jax.device_count()}")
    print(f"{'implementation':56s} {'min s':>8s} {'median s':>9s} {'GFLOP/s':>8s}")
    for name, (times, _) in ([("diffusers", reference_result)] if reference_result else []) + list(results.items()):
        print(f"{names[name]:56s} {min(times):8.2f} {statistics.median(times):9.2f} {flops / min(times) / 1e9:8.1f}")
    (first, (first_times, first_out)), *others = list(results.items())
    for name, (times, out) in others:
        print(f"ratio {name} / {first}: {ratio(times, first_times, digits=3)}; "
              f"max abs diff {np.abs(out - first_out).max():.2e}")
    if reference_result is not None:
        reference_times, reference_out = reference_result
        for name, (times, out) in results.items():
            print(f"ratio ours ({name}) / diffusers: {ratio(times, reference_times)}; "
                  f"max abs diff {np.abs(out - reference_out).max():.2e}")


if __name__ == "__main__":
    main()
