#!/usr/bin/env python
"""MiniMax-H3's released (tiled) decode on this CPU: ours against diffusers' ``AutoencoderKLMiniMaxH3``
(tiling on, as it ships), and the tile-parallel decode over 1, 2, 4 and 8 CPU devices.

    python -m bench.minimax_h3                              # both parts → docs/minimax-h3/bench.json, scaling.png
    python -m bench.minimax_h3 --parts speed --runs 3       # ours vs diffusers only
    python -m bench.minimax_h3 --parts scaling --devices 1,2,4,8

Speed: the tiny config (16-pixel tiles, 4 of overlap: ``AutoencoderKLMiniMaxH3Config.tiny``) and the
real width (2048, 32 heads of 64) with 2 of its 36 ViT blocks, at 256x384 (one chunk of 7 latent
frames, two 256-pixel tiles of 1,797 tokens). The same seeded weights in both (diffusers' saved
folder, loaded here); each decode warmed up (our compile), then ``--runs`` rounds that time each
once in turn (``bench.common.timed``): min and median of each, and their ratio from the same run.
The frames are compared too (float32, in the service's [-1, 1]), so the figures are of one decode.

Scaling: each device count decodes the same tiny latents in a subprocess of its own
(``XLA_FLAGS=--xla_force_host_platform_device_count=N``, set before JAX loads) with the program a
server runs on an N-device mesh (``sharding.compile_decode``: every tile of every chunk one batch,
spread over the devices). It records the tiles the decode runs and each device's share of them
(``ceil(tiles / N)``, the padding included) and checks the frames equal one device's. Forced CPU
devices share the host's cores: on a 2-core host the time cannot fall with N, only each device's
share of the tiles does.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import latent_shape, ratio, timed  # no JAX yet: a child sets XLA_FLAGS first

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "minimax-h3"
# (name, config overrides, latents): the tiny config, and the real width with 2 of 36 ViT blocks.
SPEED_CASES = (("tiny", None, (1, 4, 7, 12, 16)), ("real width, 2 of 36 blocks", {"decoder_num_layers": 2},
                                                    (1, 24, 7, 16, 24)))
SCALING_LATENTS = (1, 4, 12, 12, 16)  # tiny: 2 chunks of 4x5 tiles of 16 px over 48x64 pixels


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=["speed", "scaling"], default=["speed", "scaling"])
    parser.add_argument("--runs", type=int, default=3, help="timed rounds after the warm-up")
    parser.add_argument("--devices", default="1,2,4,8", help="CPU device counts of the scaling part")
    parser.add_argument("--scaling-latents", type=latent_shape, default=SCALING_LATENTS,
                        help="tiny latents BxCxTxHxW the scaling part decodes")
    parser.add_argument("--json", type=Path, default=RESULTS / "bench.json")
    parser.add_argument("--png", type=Path, default=RESULTS / "scaling.png")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)  # a scaling subprocess: its device count
    parser.add_argument("--frames-out", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _config(overrides: dict[str, Any] | None):
    from vaeserve.models.families.minimax_h3.config import AutoencoderKLMiniMaxH3Config

    return AutoencoderKLMiniMaxH3Config.tiny() if overrides is None else AutoencoderKLMiniMaxH3Config(**overrides)


def _served(imagenet_frames) -> Any:
    """diffusers' frames (ImageNet-normalised, NCTHW) as the service gives them: [0, 1] clamped, then [-1, 1]."""
    import numpy as np

    from vaeserve.models.families.minimax_h3.config import IMAGENET_MEAN, IMAGENET_STD

    mean, std = (np.asarray(v, np.float32)[:, None, None, None] for v in (IMAGENET_MEAN, IMAGENET_STD))
    return 2 * np.clip(imagenet_frames * std + mean, 0, 1) - 1


def speed_case(name: str, overrides: dict[str, Any] | None, latents_shape: tuple[int, ...], runs: int) -> dict:
    """Ours vs diffusers' tiled decode of one config, timed in turn."""
    import numpy as np
    import torch

    from bench.common import diffusers_reference
    from vaeserve import models
    from vaeserve.models.families.minimax_h3.config import TILING_FIELDS

    config = _config(overrides)
    with tempfile.TemporaryDirectory() as folder:
        reference = diffusers_reference(config, folder, encoder=False)
        reference.enable_tiling(*(getattr(config, field) for field in TILING_FIELDS))
        vae = models.load_vae(folder)
    vae.config = config  # config.json holds no tiles (diffusers keeps them on the model): as a server sets them
    latents = np.random.default_rng(0).standard_normal(latents_shape).astype(np.float32)

    def diffusers_decode() -> np.ndarray:
        with torch.no_grad():
            return reference.decode(torch.from_numpy(latents)).sample.numpy()

    results = timed({"ours": lambda: np.asarray(vae.decode(latents)), "diffusers": diffusers_decode}, runs)
    (ours, frames), (theirs, expected) = results["ours"], results["diffusers"]
    return {"case": name, "latents": list(latents_shape), "frames": list(frames.shape), "runs": runs,
            "ours_s": {"min": min(ours), "median": statistics.median(ours), "all": ours},
            "diffusers_s": {"min": min(theirs), "median": statistics.median(theirs), "all": theirs},
            "ours_over_diffusers": ratio(ours, theirs),
            "max_abs_diff": float(np.abs(frames - _served(expected)).max()),
            "decoder_parameters": vae.metadata["parameters"]}


def child(devices: int, latents_shape: tuple[int, ...], runs: int, frames_out: Path) -> dict:
    """One device count's decode (``XLA_FLAGS`` set by the parent): timed, its frames saved."""
    import time

    import numpy as np

    from vaeserve import models, sharding
    from vaeserve.models.families.minimax_h3.programs import work_pieces

    config = _config(None)
    vae = models.init_vae(config, seed=0)
    latents = np.random.default_rng(0).standard_normal(latents_shape).astype(np.float32)
    mesh = sharding.make_mesh(devices)
    compiled = sharding.compile_decode(vae, latents_shape, mesh, output="float")
    state, placed = sharding.replicated_state(vae, mesh), sharding.put_latents(latents, mesh)
    frames = np.asarray(compiled(state, placed)[0])  # warm-up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        frames = np.asarray(compiled(state, placed)[0])
        times.append(time.perf_counter() - start)
    np.save(frames_out, frames)
    tiles = work_pieces(latents_shape, config)
    return {"devices": devices, "tiles": tiles, "tiles_per_device": -(-tiles // devices),
            "padding_tiles": -(-tiles // devices) * devices - tiles, "min_s": min(times),
            "median_s": statistics.median(times), "all_s": times}


def scaling(device_counts: list[int], latents_shape: tuple[int, ...], runs: int) -> list[dict]:
    """Every device count in a subprocess of its own; the frames compared with one device's."""
    import numpy as np
    from tqdm import tqdm

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for devices in tqdm(device_counts, desc="devices", unit="count"):
            out = Path(folder) / f"{devices}.npy"
            env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
                   "JAX_PLATFORMS": "cpu"}
            done = subprocess.run([sys.executable, "-m", "bench.minimax_h3", "--child", str(devices), "--runs", str(runs),
                                   "--scaling-latents", "x".join(map(str, latents_shape)), "--frames-out", str(out)],
                                  env=env, cwd=REPO, capture_output=True, text=True, check=True)
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        first = np.load(Path(folder) / f"{device_counts[0]}.npy")
        for row in rows:
            row["max_abs_diff_vs_first"] = float(np.abs(np.load(Path(folder) / f"{row['devices']}.npy") - first).max())
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    devices = [r["devices"] for r in rows]
    fig, left = plt.subplots(figsize=(6, 3.6))
    left.plot(devices, [r["median_s"] for r in rows], "o-", label="decode time (median)")
    left.set_xlabel("CPU devices (forced; they share the host's 2 cores)")
    left.set_ylabel("seconds")
    left.set_xscale("log", base=2)
    left.set_xticks(devices, [str(d) for d in devices])
    left.set_ylim(bottom=0)
    right = left.twinx()
    right.plot(devices, [r["tiles_per_device"] for r in rows], "s--", color="tab:orange", label="tiles per device")
    right.set_ylabel("tiles per device")
    right.set_ylim(bottom=0)
    fig.legend(loc="center right", bbox_to_anchor=(0.86, 0.55), fontsize=8)
    left.set_title(f"MiniMax-H3 tiny, {rows[0]['tiles']} tiles: tile-parallel decode on CPU devices", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def _cpu_model() -> str:
    """The CPU's model name (Linux), else what ``platform`` says."""
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
             if line.startswith("model name")] if cpuinfo.exists() else []
    return names[0] if names else platform.processor()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args.child, args.scaling_latents, args.runs, args.frames_out)))
        return
    from tqdm import tqdm

    document: dict[str, Any] = {"host": {"machine": platform.machine(), "processor": _cpu_model(),
                                         "cores": os.cpu_count(), "load_average": os.getloadavg()},
                                "command": " ".join(["python -m bench.minimax_h3", *(argv or sys.argv[1:])])}
    if "speed" in args.parts:
        document["speed"] = [speed_case(name, overrides, shape, args.runs)
                             for name, overrides, shape in tqdm(SPEED_CASES, desc="speed", unit="config")]
        for row in document["speed"]:
            print(f"{row['case']}: ours {row['ours_s']['min']:.3f}/{row['ours_s']['median']:.3f} s, diffusers "
                  f"{row['diffusers_s']['min']:.3f}/{row['diffusers_s']['median']:.3f} s (min/median); ours / "
                  f"diffusers {row['ours_over_diffusers']}; max |diff| {row['max_abs_diff']:.1e}")
    if "scaling" in args.parts:
        rows = scaling([int(d) for d in args.devices.split(",")], args.scaling_latents, args.runs)
        document["scaling"] = {"latents": list(args.scaling_latents), "rows": rows}
        for row in rows:
            print(f"{row['devices']} devices: {row['tiles_per_device']} of {row['tiles']} tiles each "
                  f"({row['padding_tiles']} padding), {row['min_s']:.3f}/{row['median_s']:.3f} s (min/median), "
                  f"max |diff| vs {rows[0]['devices']} device(s) {row['max_abs_diff_vs_first']:.1e}")
        plot(rows, args.png)
    document["host"]["load_average_after"] = os.getloadavg()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(document, indent=2) + "\n")
    print(f"→ {args.json}")


if __name__ == "__main__":
    main()
