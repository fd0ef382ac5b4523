"""Start-up of the cpu image as an operator sees it: the image's own command with a warm-up shape,
on a new cache volume (cold) and again on the same volume (warm); for each, the seconds from the
container's start to ``/readyz`` 200 and the latency of the first decode (an MP4 of the warm-up
shape; then a second one, for comparison). Min and median over ``--runs`` pairs, with the ratio warm / cold,
for each CPU conv path (``--cpu-convs``): a warm start finds ``matmul``'s programs on the volume, while
``onednn``'s (the default) are compiled again at every start (XLA cannot save them).

    python -m bench.container_startup --runs 3                          # builds the image first
    python -m bench.container_startup --image localhost/vaeserve:cpu --warmup 16x2x16x16 --runs 3

Builds and runs with buildah like the image tests (root; .ci/install-image-tools.sh; the stand-in
base of .ci/stand-in-base.sh where no registry answers). The model is the image's default (the
embedded Wan 2.1 with random weights) unless ``--model`` names a folder to mount.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from tests.helpers.image_helpers import (
    Image,
    build_image,
    container,
    new_volume,
    remove_image,
    stand_in_base,
    wait_ready,
)
from vaeserve.service.client import decode
from vaeserve.service.settings import parse_latent_shape


def one_start(image: Image, volume: Path, mount: str, args: argparse.Namespace, convs: str,
              log_path: Path) -> dict[str, float]:
    volumes = {str(volume): mount}
    env = {"VAESERVE_WARMUP": json.dumps([f"{args.warmup}:uint8"]), "VAESERVE_MAX_BATCH": "1",
           "VAESERVE_CPU_CONVS": convs}
    if args.model:
        volumes[str(Path(args.model).resolve())] = "/models/bench:ro"
        env["VAESERVE_MODEL"] = "/models/bench"
    latents = np.random.default_rng(0).standard_normal((1, *parse_latent_shape(args.warmup))).astype(np.float32)
    with container(image, volumes=volumes) as box:
        running, url = box.start_server(log_path, **env)
        try:
            ready = wait_ready(url, running, timeout=1800)
            seconds = []
            for _ in range(2):  # the first decode, then one more: what the first pays beyond it
                start = time.perf_counter()
                video = decode(url, latents, output_type="mp4")
                seconds.append(time.perf_counter() - start)
                assert video[4:8] == b"ftyp"
        finally:
            code = running.stop()
    if code != 0:
        raise RuntimeError(f"the server exited {code} on SIGTERM:\n{running.log()[-4000:]}")
    return {"ready_s": ready, "first_decode_s": seconds[0], "second_decode_s": seconds[1]}


def summary(values: list[float]) -> str:
    return f"{min(values):7.1f} {statistics.median(values):7.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image", help="an image already built (default: build the cpu flavour now)")
    parser.add_argument("--warmup", default="16x2x16x16", help="latent shape CxTxHxW compiled before ready")
    parser.add_argument("--model", help="a diffusers-format model folder to mount (default: the image's own)")
    parser.add_argument("--runs", type=int, default=3, help="cold/warm pairs per conv path, each on a new volume")
    parser.add_argument("--cpu-convs", default="onednn,matmul", help="the conv paths started (comma-separated)")
    parser.add_argument("--json", type=Path, help="write every measurement here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="container-startup-") as tmp:
        work = Path(tmp)
        if args.image:
            image = Image(args.image, 0.0)
        else:
            base = stand_in_base(work / "stand-in-base.log")
            image = build_image("cpu", "localhost/vaeserve-bench:cpu", base, work / "build.log")
            print(f"built {image.name} in {image.build_seconds:.0f} s")
        paths = args.cpu_convs.split(",")
        runs: dict[str, list[dict[str, dict[str, float]]]] = {convs: [] for convs in paths}
        pairs = [(run, convs) for run in range(args.runs) for convs in paths]  # the paths alternate
        for run, convs in tqdm(pairs, desc="cold + warm starts", unit="pair"):
            volume = work / f"volume-{convs}-{run}"
            mount, _ = new_volume(image, volume)
            runs[convs].append({start: one_start(image, volume, mount, args, convs, work / f"{start}-{convs}-{run}.log")
                                for start in ("cold", "warm")})
        size = image.size()
        if not args.image:
            remove_image(image.name)  # the build is the bench's own; vfs keeps its layers whole

    print(f"\n{image.name} ({size}), model {args.model or 'the image default'}, warm-up {args.warmup}:uint8, "
          f"{args.runs} runs")
    for convs, pairs_run in runs.items():
        print(f"\n--cpu-convs {convs}\n{'':26} {'min':>7} {'median':>7}  (seconds)")
        for start in ("cold", "warm"):
            for key, label in (("ready_s", "start to ready"), ("first_decode_s", "first decode (mp4)"),
                               ("second_decode_s", "second decode (mp4)")):
                print(f"{start + ' ' + label:26} {summary([r[start][key] for r in pairs_run])}")
        ratios = [r["warm"]["ready_s"] / r["cold"]["ready_s"] for r in pairs_run]
        print(f"{'warm / cold ready':26} {min(ratios):7.2f} {statistics.median(ratios):7.2f}")
    if args.json:
        args.json.write_text(json.dumps({"image": image.name, "size": size, "warmup": args.warmup,
                                         "model": args.model, "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
