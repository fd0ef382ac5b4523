#!/usr/bin/env python
"""The whole-file MP4 against the fragmented stream: when the first playable bytes exist, how
large each is, and how close to the source, for real content (the sample video), fed to the
writer as a decode hands it over (latent frame 0 gives 1 frame, every later one 4).

The file (libx264 ``veryfast``, look-ahead and B-frames) gives every byte at the end: the index
goes first, so it is written last. The stream (``tune=zerolatency``) gives an init segment and a
fragment per frame from the write that encoded it. "First bytes after step" counts decode steps:
on an accelerator a step takes ``device time / steps``, so that column, not the host's encode
seconds, is what a viewer waits for.

    python -m bench.mp4_stream                       # 832x480 x 81 frames, crf 18
    python -m bench.mp4_stream --frames 21 --crf 18 23 28 --runs 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from bench.common import SAMPLE_VIDEO
from vaeserve.service.codecs.video import Mp4Writer, mp4_boxes, read_mp4


def sample_frames(frames: int) -> np.ndarray:
    """(frames, H, W, 3) uint8: the sample video's first ``frames`` frames (looped if it has fewer)."""
    import av

    with av.open(str(SAMPLE_VIDEO)) as container:
        decoded = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    return np.stack([decoded[i % len(decoded)] for i in range(frames)])


def decode_steps(frames: np.ndarray) -> list[np.ndarray]:
    """The frames in the pieces a causal decode hands over: 1, then 4 at a time."""
    return [frames[:1], *(frames[start:start + 4] for start in range(1, len(frames), 4))]


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 10 * np.log10(255.0**2 / mse) if mse else float("inf")


def run_once(frames: np.ndarray, *, crf: int, fragmented: bool, fps: int) -> dict:
    """One video through one writer: the step after which its first bytes existed, the encode
    seconds up to then and in all, its size and PSNR against the source."""
    writer = Mp4Writer(frames.shape[1], frames.shape[2], fps=fps, crf=crf, fragmented=fragmented)
    parts, first_step, first_s, encode_s = [], None, None, 0.0
    steps = decode_steps(frames)
    for index, step in enumerate([*steps, None]):
        start = time.process_time()
        data = writer.close() if step is None else writer.write(step)
        encode_s += time.process_time() - start
        if data and first_step is None:
            first_step, first_s = index + 1, encode_s  # step len(steps) + 1: only at the close
        parts.append(data)
    video = b"".join(parts)
    assert ("moof" in mp4_boxes(video)) == fragmented
    return {"first_step": first_step, "steps": len(steps), "first_encode_s": first_s, "encode_s": encode_s,
            "bytes": len(video), "psnr": psnr(read_mp4(video), frames)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=81, help="frames of the sample video (1 + 4k; default 81)")
    parser.add_argument("--crf", type=int, nargs="+", default=[18], help="x264 quality (default 18, the server's)")
    parser.add_argument("--fps", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3, help="runs of each; the median encode seconds is shown")
    args = parser.parse_args(argv)
    frames = sample_frames(args.frames)
    _, height, width, _ = frames.shape
    print(f"{width}x{height} x {len(frames)} frames of {SAMPLE_VIDEO.name}, {len(decode_steps(frames))} decode "
          f"steps, {args.runs} runs (encode CPU-s: median)\n")
    print("| MP4 | crf | first bytes after decode step | encode CPU-s to them | encode CPU-s, all | size KB "
          "| PSNR dB |")
    print("|---|---|---|---|---|---|---|")
    for crf in args.crf:
        for fragmented, name in ((False, "whole file (veryfast)"), (True, "fragmented stream (zerolatency)")):
            runs = [run_once(frames, crf=crf, fragmented=fragmented, fps=args.fps) for _ in range(args.runs)]
            first = runs[0]
            when = (f"{first['first_step']} of {first['steps']}" if first["first_step"] <= first["steps"]
                    else f"the end (after all {first['steps']})")
            print(f"| {name} | {crf} | {when} | {statistics.median(r['first_encode_s'] for r in runs):.2f} "
                  f"| {statistics.median(r['encode_s'] for r in runs):.2f} | {first['bytes'] / 1e3:,.0f} "
                  f"| {first['psnr']:.2f} |")


if __name__ == "__main__":
    main()
