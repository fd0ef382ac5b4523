#!/usr/bin/env python
"""Temp bytes of the decoder's last stage on one full-resolution frame, from the real TPU compiler.

A proxy for what each inner step of frame-level streaming keeps alive at full resolution: up block
3 (three residual blocks, six causal convs) + RMS norm + conv_out of the real Wan 2.1 decoder on
one frame with its causal caches, compiled for one abstract TPU chip (no TPU, no weights). It
compiles in minutes where the whole decode takes ≈ 8 CPU-minutes, so changes to the full-resolution
convolutions can be compared here first, then confirmed on the whole decode (``bench/plan_table.py``).

    python -m bench.tpu_stage                        # the causal conv as it is
    python -m bench.tpu_stage --variant taps         # one frame: a 2-D conv per time tap, no concatenation

``--variant taps`` is an experiment that was measured and not kept: the one-frame causal conv as
three 2-D convs (one per time tap) summed in float32, instead of concatenating the two cached
frames and the new one into a 3-frame copy first. Here it lowers the stage's temp (2.31 → 1.71 GB
at 720p bfloat16 on v5e), and the whole 720p decode at tp = 1 (10.50 → 9.83 GB), but it raised the
1080p decode at tp = 2 from 13.38 to 15.76 GB (docs/planning.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # nothing runs here; the TPU device is compile-only


def per_tap_causal_conv(past, x_padded, kernel, bias, *, native, start="zero", block_bytes=None, method=None,
                        rounded_sums=False, onednn=False):
    """The experiment: one frame after its past as a 2-D conv per time tap, summed in float32."""
    import jax.numpy as jnp
    from jax import lax

    from vaeserve.models.conv import CPU_BLOCK_BYTES, causal_conv3x3x3
    from vaeserve.models.spatial import matmul_precision

    if not native or x_padded.shape[1] != 1 or past is None:
        return causal_conv3x3x3(past, x_padded, kernel, bias, native=native, start=start,
                                block_bytes=block_bytes or CPU_BLOCK_BYTES, rounded_sums=rounded_sums)
    frames = (past[:, 0], past[:, 1], x_padded[:, 0])
    y = sum(lax.conv_general_dilated(frame, kernel[i], (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                     precision=matmul_precision(x_padded.dtype), preferred_element_type=jnp.float32)
            for i, frame in enumerate(frames))
    return (y + bias).astype(x_padded.dtype)[:, None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", choices=["current", "taps"], default="current")
    parser.add_argument("--video", default="1280x720", help="frame size WxH (default 1280x720)")
    parser.add_argument("--frames", type=int, default=1, help="frames per inner step (default 1)")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--topology", default="v5e:2x4")
    args = parser.parse_args()

    import jax
    from flax import nnx

    from vaeserve import models
    from vaeserve.models import layers
    from vaeserve.models.families.wan.decoder import WanDecoder
    from vaeserve.models.spatial import SingleDeviceContext
    from vaeserve.sharding.chips import topology_devices

    if args.variant == "taps":
        layers.causal_conv3x3x3 = per_tap_causal_conv
    width, height = (int(v) for v in args.video.lower().split("x"))
    config = models.WanVAEConfig()
    dtype = models.vae.DTYPES[args.dtype]
    decoder = nnx.eval_shape(lambda: WanDecoder(config, rngs=nnx.Rngs(0), dtype=dtype)).decoder
    graphdef, state = nnx.split(nnx.Dict({"block": decoder.up_blocks[-1], "norm": decoder.norm_out,
                                          "conv": decoder.conv_out}))
    placement = jax.sharding.SingleDeviceSharding(topology_devices(args.topology)[0])
    channels = config.decoder_dims[-1]
    x = jax.ShapeDtypeStruct((1, args.frames, height, width, channels), dtype, sharding=placement)
    cache = jax.ShapeDtypeStruct((1, 2, height + 2, width + 2, channels), dtype, sharding=placement)
    caches = (tuple((cache, cache) for _ in decoder.up_blocks[-1].resnets), cache)

    def stage(state, x, caches):
        parts, ctx = nnx.merge(graphdef, state), SingleDeviceContext(native_conv=True)
        y, block_caches = parts["block"](x, caches[0], ctx, first_chunk=False)
        y, conv_out_cache = parts["conv"](jax.nn.silu(parts["norm"](y)), caches[1], ctx)
        return y, (block_caches, conv_out_cache)

    avals = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=placement), state)
    print(f"compiling the last stage on {args.frames} frame(s) of {width}x{height}, {args.dtype}, variant "
          f"{args.variant}, for {args.topology} (minutes)…", file=sys.stderr, flush=True)
    start, cpu = time.perf_counter(), time.process_time()
    memory = jax.jit(stage).lower(avals, x, caches).compile().memory_analysis()
    if memory is None:
        raise SystemExit("this compiler gives no memory_analysis()")
    print(json.dumps({"variant": args.variant, "video": args.video, "frames": args.frames, "dtype": args.dtype,
                      "temp_bytes": memory.temp_size_in_bytes, "argument_bytes": memory.argument_size_in_bytes,
                      "output_bytes": memory.output_size_in_bytes, "compile_s": round(time.perf_counter() - start, 1),
                      "compile_cpu_s": round(time.process_time() - cpu, 1)}))


if __name__ == "__main__":
    main()
