"""One convolution on CPU, float32, each CPU path side by side in one run: the nine-tap matmul
(``cpu_convs="matmul"``), oneDNN's (``"onednn"``, compiled with ``models.conv.compiler_options_for``)
and PyTorch's ``conv3d`` (oneDNN too) where there is one to compare.

    .venv/bin/python -m bench.conv             # causal 3x3x3 convs, a kernel-bound one, an upsampler
    .venv/bin/python -m bench.conv --runs 9

Prints min and median seconds per path and GFLOP/s on the conv's multiply-adds (x2). The kernel-bound
conv (1024 → 4096 channels at 4x4) is also timed on oneDNN by forcing it there (``native=True``:
``onednn`` alone keeps it on the im2col path), and the upsampler's phase convs against oneDNN's conv of the phase kernel:
the two places ``onednn`` leaves to the matmul path.
"""

from __future__ import annotations

import argparse
import statistics

import jax
import numpy as np

from bench.common import timed
from vaeserve.models.conv import causal_conv3x3x3, compiler_options_for, upsample2x_causal_conv3x3x3

ONEDNN = compiler_options_for("cpu", "onednn")


def _compiled(fn, *args, options=None):
    args = tuple(jax.device_put(a) for a in args)  # on the device once, not copied at every call
    compiled = jax.jit(fn, compiler_options=options or {}).lower(*args).compile()
    return lambda: np.asarray(jax.block_until_ready(compiled(*args)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    import torch

    rng = np.random.default_rng(0)
    cases = [("causal", 17, 32, 128, 128), ("causal", 17, 64, 128, 128), ("causal, kernel-bound", 3, 4, 1024, 4096),
             ("upsampler", 4, 64, 128, 128)]
    print(f"{'conv':46s} {'path':22s} {'min s':>7s} {'median s':>9s} {'GFLOP/s':>8s}")
    for kind, frames, side, cin, cout in cases:
        x = rng.standard_normal((1, frames, side + 2, side + 2, cin), np.float32)
        past = rng.standard_normal((1, 2, side + 2, side + 2, cin), np.float32)
        kernel = (0.01 * rng.standard_normal((3, 3, 3, cin, cout))).astype(np.float32)
        bias = np.zeros(cout, np.float32)
        pixels = frames * side * side * (4 if kind == "upsampler" else 1)
        flops = 2 * 27 * cin * cout * pixels
        if kind == "upsampler":
            fns = {"matmul (phase convs)": _compiled(
                       lambda *a: upsample2x_causal_conv3x3x3(*a, native=False), past, x, kernel, bias),
                   "onednn (phase kernel)": _compiled(
                       lambda *a: upsample2x_causal_conv3x3x3(*a, native=True), past, x, kernel, bias, options=ONEDNN)}
        else:
            tx = torch.from_numpy(np.concatenate([past, x], axis=1)).permute(0, 4, 1, 2, 3).contiguous()
            tk = torch.from_numpy(kernel).permute(4, 3, 0, 1, 2).contiguous()

            def torch_conv(tx=tx, tk=tk):
                with torch.no_grad():
                    return torch.nn.functional.conv3d(tx, tk).numpy()

            fns = {"matmul": _compiled(lambda *a: causal_conv3x3x3(*a, native=False), past, x, kernel, bias),
                   "onednn": _compiled(lambda *a: causal_conv3x3x3(*a, native=False, onednn=True), past, x, kernel,
                                       bias, options=ONEDNN),
                   "onednn, forced": _compiled(lambda *a: causal_conv3x3x3(*a, native=True), past, x, kernel, bias,
                                               options=ONEDNN),
                   "pytorch conv3d": torch_conv}
            if kind == "causal":
                del fns["onednn, forced"]  # the same program as onednn
        shape = f"{kind}: {frames} x {side}x{side}, {cin} → {cout}"
        for name, (times, _) in timed(fns, args.runs).items():
            print(f"{shape:46s} {name:22s} {min(times):7.3f} {statistics.median(times):9.3f} "
                  f"{flops / min(times) / 1e9:8.0f}", flush=True)


if __name__ == "__main__":
    main()
