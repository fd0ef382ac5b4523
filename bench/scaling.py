#!/usr/bin/env python
"""Per-device memory, halo traffic and decode time of the sharded decode vs ``tp``.

Two shapes, because this machine cannot *run* a production shape in a few minutes:

  * memory (compile only): per-device ``memory_analysis()`` of the sharded program for the real
    Wan 2.1 config at ``--memory-shape`` (default 480x832, 9 frames), and the halo bytes one
    decode step exchanges there (traced, not measured);
  * time (compiled and run): ``--time-shape`` (default 128x128, 5 frames), median of
    ``--repeats`` decodes after one warm-up call.

On CPU the ``tp`` devices are *forced host devices that share this machine's cores*: the times
show the overhead of splitting, not a speed-up. Run it on a machine with ``tp`` accelerators
(``--platform gpu``/``tpu``) for real scaling numbers.

    python -m bench.scaling
    python -m bench.scaling --memory-shape 1x16x21x90x160 --tps 1,8    # 720p, 81 frames (compile only)
"""

from __future__ import annotations

import argparse
import os
import time

from bench.common import CONFIGS, bench_config, latent_shape  # no JAX yet: XLA_FLAGS are set below


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tps", default="1,2,4,8", help="comma-separated tp sizes")
    parser.add_argument("--memory-shape", type=latent_shape, default=(1, 16, 3, 60, 104),
                        help="latents BxCxTxHxW for the compile-only memory/halo table (default 480x832, 9 frames)")
    parser.add_argument("--time-shape", type=latent_shape, default=(1, 16, 2, 16, 16),
                        help="latents BxCxTxHxW that are actually decoded and timed (default 128x128, 5 frames)")
    parser.add_argument("--repeats", type=int, default=2, help="timed decodes per tp after one warm-up")
    parser.add_argument("--config", choices=CONFIGS, default="real")
    parser.add_argument("--platform", default="cpu", help="JAX platform (cpu: forces max(tps) host devices)")
    return parser.parse_args(argv)


ARGS = parse_args() if __name__ == "__main__" else None
if ARGS is not None:  # before JAX starts
    _max_tp = max(int(tp) for tp in ARGS.tps.split(","))
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={_max_tp}").strip()
    os.environ["JAX_PLATFORMS"] = ARGS.platform
import numpy as np

MB = 1e6


def _frames(shape) -> str:
    b, _, t, h, w = shape
    return f"{b}x{1 + 4 * (t - 1)} frames of {8 * h}x{8 * w}"


def time_decode(vae, latents, mesh, repeats: int) -> tuple[float, float]:
    """(first call incl. compile, median of ``repeats`` later calls), seconds."""
    from vaeserve import sharding

    start = time.perf_counter()
    sharding.sharded_decode(vae, latents, mesh).block_until_ready()
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        sharding.sharded_decode(vae, latents, mesh).block_until_ready()
        times.append(time.perf_counter() - start)
    return first, float(np.median(times))


def main(args: argparse.Namespace) -> None:
    import jax

    from vaeserve import models, sharding

    tps = [int(tp) for tp in args.tps.split(",")]
    devices = jax.devices()
    tps = [tp for tp in tps if tp <= len(devices)] or [1]
    vae = models.init_vae(bench_config(args.config), seed=0)
    print(f"{len(devices)} x {devices[0].platform} devices ({devices[0].device_kind}) on {os.cpu_count()} CPU cores; "
          f"config {args.config} ({vae.metadata['parameters'] / 1e6:.1f} M decoder parameters, float32)")

    mem_shape = args.memory_shape
    print(f"\n## Per-device memory and halo traffic — latents {mem_shape} → {_frames(mem_shape)} (compiled, not run)\n")
    print("| tp | split | band (latent) | temp MB / device | temp vs tp=1 | weights MB | output MB / device "
          "| halo KB / device, step 0 | halo KB / device, later step | halo MB / mesh, whole decode |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    base = None
    for tp in tps:
        mesh = sharding.make_mesh(tp)
        plan = sharding.band_layout(mem_shape[3], mem_shape[4], tp)
        stats = sharding.memory_stats(vae, mem_shape, mesh)
        halo = sharding.halo_bytes(vae, mem_shape, tp, split=plan.split)
        base = base or stats["temp_bytes"]
        whole = halo["first_total"] + (mem_shape[2] - 1) * halo["next_total"]
        size = mem_shape[3] if plan.split == "height" else mem_shape[4]
        print(f"| {tp} | {plan.split} | {plan.band} of {size}{f' (+{plan.pad} pad)' if plan.pad else ''} "
              f"| {stats['temp_bytes'] / MB:,.0f} | {stats['temp_bytes'] / base:.3f} | {stats['argument_bytes'] / MB:,.0f} "
              f"| {stats['output_bytes'] / MB:,.1f} | {halo['first_per_device'] / 1e3:,.0f} | {halo['next_per_device'] / 1e3:,.0f} "
              f"| {whole / MB:,.1f} |")

    time_shape = args.time_shape
    latents = np.random.default_rng(0).standard_normal(time_shape).astype(np.float32)
    print(f"\n## Decode time — latents {time_shape} → {_frames(time_shape)} (run; median of {args.repeats})\n")
    print("| tp | split | first call s (incl. compile) | decode s | output px / s |")
    print("|---|---|---|---|---|")
    pixels = time_shape[0] * (1 + 4 * (time_shape[2] - 1)) * 64 * time_shape[3] * time_shape[4]
    for tp in tps:
        mesh = sharding.make_mesh(tp)
        first, median = time_decode(vae, latents, mesh, args.repeats)
        split = sharding.band_layout(time_shape[3], time_shape[4], tp).split
        print(f"| {tp} | {split} | {first:.1f} | {median:.2f} | {pixels / median:,.0f} |")
    if devices[0].platform == "cpu":
        print(f"\nThe {len(devices)} CPU devices are forced host devices sharing {os.cpu_count()} cores: "
              "tp > 1 cannot be faster here; the time column shows the cost of the halo exchange and of smaller ops.")


if __name__ == "__main__":
    assert ARGS is not None  # parsed at import, before JAX starts
    main(ARGS)
