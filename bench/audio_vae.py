"""Audio VAE speed and exactness: ours vs diffusers' ``AutoencoderKLMiniMaxH3Audio`` (the release's
architecture, 151 M parameters) on the same random weights (CPU).

    .venv/bin/python -m bench.audio_vae                      # 1 s of stereo sound, decode and encode
    .venv/bin/python -m bench.audio_vae --seconds 5 --runs 5 --part decode

Decode: latents ``(2, 32, 40·seconds)`` (the two stereo channels as the batch, as the pipeline
decodes them) → the waveform ``(2, 1, 32000·seconds)``. Encode: that waveform → the posterior's
mean. Prints min and median seconds over ``--runs`` timed runs after one warm-up (which includes our
compile), the ratio ours/diffusers from the same run (the two run in turn within each round), and
the max abs difference against diffusers, with the share of samples the decoder's clip to [-1, 1]
left alone (diffusers' initial weights: a clipped sample hides a difference).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bench.common import ratio, timed
from vaeserve.models.families.minimax_h3_audio.config import MiniMaxH3AudioConfig
from vaeserve.models.families.minimax_h3_audio.weights import load_h3_audio_decoder, load_h3_audio_encoder

STEREO = 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=1, help="length of the sound (40 latent frames a second)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--part", default="both", choices=["decode", "encode", "both"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()

    import torch
    from diffusers import AutoencoderKLMiniMaxH3Audio

    config = MiniMaxH3AudioConfig()
    frames = args.seconds * config.sampling_rate // config.hop_length
    latents = np.random.default_rng(0).standard_normal((STEREO, config.latent_channels, frames), np.float32)
    torch.manual_seed(0)
    reference: Any = AutoencoderKLMiniMaxH3Audio()
    reference.eval()
    with tempfile.TemporaryDirectory() as folder:
        reference.save_pretrained(folder)
        decoder = load_h3_audio_decoder(folder, dtype=args.dtype)
        encoder = load_h3_audio_encoder(folder, dtype=args.dtype)
    with torch.no_grad():
        waveform = reference.decode(torch.from_numpy(latents)).sample.numpy()

    contenders: dict[str, tuple] = {}
    if args.part in ("decode", "both"):
        decode = jax.jit(lambda m, z: m(z))
        contenders["decode"] = (lambda: reference.decode(torch.from_numpy(latents)).sample.numpy(),
                                lambda: np.asarray(jax.block_until_ready(decode(decoder, jnp.asarray(latents)))))
    if args.part in ("encode", "both"):
        encode = jax.jit(lambda m, x: m(x))
        contenders["encode"] = (lambda: reference.encode(torch.from_numpy(waveform)).latent_dist.mode().numpy(),
                                lambda: np.asarray(jax.block_until_ready(encode(encoder, jnp.asarray(waveform)))))

    print(f"MiniMax-H3 audio VAE (release architecture, diffusers' initial weights), {args.seconds} s stereo: "
          f"latents {latents.shape} <-> waveform {waveform.shape}; {torch.get_num_threads()} torch threads, "
          f"JAX {jax.default_backend()} {args.dtype}")
    print(f"{'part':7s} {'implementation':10s} {'min s':>8s} {'median s':>9s}")
    for part, (theirs, ours) in contenders.items():
        with torch.no_grad():
            results = timed({"diffusers": theirs, "vaeserve": ours}, args.runs)
        for name, (times, _) in results.items():
            print(f"{part:7s} {name:10s} {min(times):8.2f} {statistics.median(times):9.2f}")
        (their_times, expected), (our_times, got) = results["diffusers"], results["vaeserve"]
        unclipped = f"; {(np.abs(expected) < 1).mean():.0%} of samples unclipped" if part == "decode" else ""
        print(f"{part:7s} ratio ours/diffusers: {ratio(our_times, their_times)}; "
              f"max abs diff {np.abs(got - expected).max():.2e} (max abs {np.abs(expected).max():.2f}){unclipped}")


if __name__ == "__main__":
    main()
