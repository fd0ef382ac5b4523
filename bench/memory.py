"""Memory: the default server's peak RSS against the estimate and the host's memory, as requests grow.

    .venv/bin/python -m bench.memory                                   # the sizes below, bench/results/memory-rss.png
    .venv/bin/python -m bench.memory --sizes 256x256 480x832 1280x1280 --frames 5 --png docs/memory/rss.png
    .venv/bin/python -m bench.memory --table                           # docs/serving.md's table
    .venv/bin/python -m bench.memory --compare                         # the estimate vs memory_analysis()
    .venv/bin/python -m bench.memory --fit ltx2 ltx-video              # least-squares and minimax coefficients
    .venv/bin/python -m bench.memory --fit wan2.1 --cpu-convs matmul --real --fix attention=1 --rows rows.json

Default run: ``vaeserve serve`` with its defaults (the embedded Wan 2.1, random weights, float32,
``--shapes any``) in a process of its own; each size is sent once as a decode (npy), then as an
encode (raw float32 frames), growing; the server's RSS is sampled every 20 ms from /proc. For
each request: the answer (200, or the refusal and its ``type``), the peak RSS, and the estimate
of its largest program (``models.estimate``). The PNG plots peak RSS and estimate against the
video's pixels, with the host's memory and the per-device memory the server shares out.
Extra server flags pass through ``--serve`` (e.g. ``--serve --device-memory-bytes 8000000000``
on a host other processes share).

``--table`` prints, without a server, the estimate per size for a model on CPU; ``--compare``
compiles programs of the tiny configs (and, with ``--real``, of the real video ones;
``--families``: only those) and prints the estimate against their ``memory_analysis()`` per
family; ``--fit`` compiles the tiny configs' programs of the families named and prints the
``Coefficients`` of their temp for ``models.estimate.FAMILIES`` (non-negative least squares and
minimax, on the ratio estimate / compiled). Each compiles, and estimates, the CPU convs as
``--cpu-convs`` says (default ``onednn``, the server's).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
SIZES = ("128x128", "256x256", "480x832", "720x1280", "1280x1280")


def rss(pid: int) -> int:
    """Resident bytes of a process, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


class Peak:
    """The most RSS of ``pid`` while the ``with`` block runs (sampled every 20 ms)."""

    def __init__(self, pid: int):
        self.pid, self.peak = pid, 0
        self._stop = threading.Event()

    def __enter__(self) -> Peak:
        self.peak = rss(self.pid)
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss(self.pid))
            time.sleep(0.02)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def size(text: str) -> tuple[int, int]:
    height, width = (int(v) for v in text.lower().split("x"))
    return height, width


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    from vaeserve.service.engine.memory import machine_memory

    host = machine_memory()
    return f"{os.cpu_count()} cores ({cpu}), {host.bytes / 1e9:.1f} GB ({host.source})"


def start(port: int, extra: list[str]) -> subprocess.Popen:
    command = ["nice", "-n", "10", sys.executable, "-m", "vaeserve", "serve", "--port", str(port), *extra]
    process = subprocess.Popen(command, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}")
        time.sleep(0.5)
    process.kill()
    raise RuntimeError("the server was not ready in 600 s")


def estimator_of(info: dict):
    """The server's model's estimate (its config, dtype, weights, mesh and conv path)."""
    from vaeserve import models
    from vaeserve.models.estimate import estimator

    config = models.config_from_dict(info["config"])
    return config, estimator(config, dtype=info["dtype"], decoder_parameters=info["metadata"]["parameters"],
                             encoder_parameters=info["metadata"].get("encoder_parameters", 0),
                             tp=info["mesh"]["tp"], dp=info["mesh"]["dp"], convs=info["mesh"]["convs"])


def raw_params(shape: tuple[int, ...]) -> dict[str, str]:
    return {"shape": ",".join(map(str, shape)), "dtype": "float32"}


def encode_body(shape: tuple[int, ...]) -> tuple[bytes, dict[str, str], str]:
    """An encode's body: raw float32 frames, or, past the default body limit, the same mid-grey
    frames as an H.264 MP4 (what a client sends at large sizes: a few KiB)."""
    from vaeserve.service.settings import Settings

    if 4 * math.prod(shape) <= Settings.model_fields["max_body_bytes"].default:
        return np.zeros(shape, np.float32).tobytes(), raw_params(shape), "application/octet-stream"
    from vaeserve.service.codecs.video import mp4_bytes

    _, _, frames, height, width = shape
    return mp4_bytes(np.full((frames, height, width, 3), 128, np.uint8), fps=16, crf=18), {}, "video/mp4"


def run(args: argparse.Namespace) -> list[dict]:
    port = 8700 + os.getpid() % 200
    process = start(port, args.serve)
    url = f"http://127.0.0.1:{port}"
    rows = []
    try:
        info = httpx.get(url + "/v1/models").json()["data"][0]
        config, estimate = estimator_of(info)
        memory = info["memory"]
        print(f"# {machine()}; per device {memory['device_bytes'] / 1e9:.1f} GB, host account "
              f"{memory['host_bytes'] / 1e9:.1f} GB; idle RSS {rss(process.pid) / 1e9:.2f} GB", flush=True)
        s, t = config.spatial_scale, config.temporal_scale
        latent_frames = 1 + (args.frames - 1) // t
        for text in args.sizes:
            height, width = size(text)
            for operation in args.operations:
                if operation == "decode":
                    shape = (1, config.z_dim, latent_frames, height // s, width // s)
                    body = np.random.default_rng(0).standard_normal(shape).astype(np.float32).tobytes()
                    bytes_estimated = estimate.decode(shape).total
                    params = {"output_type": "npy", **raw_params(shape)}
                    content_type = "application/octet-stream"
                else:
                    shape = (1, 3, args.frames, height, width)
                    bytes_estimated = estimate.encode(shape).total
                    body, params, content_type = encode_body(shape)
                start_s = time.monotonic()
                with Peak(process.pid) as peak:
                    answer = httpx.post(f"{url}/v1/{operation}", content=body, timeout=args.timeout + 60,
                                        params={"timeout_s": args.timeout, **params},
                                        headers={"Content-Type": content_type})
                kind = "" if answer.status_code == 200 else json.loads(answer.text).get("type", "").rsplit("/", 1)[-1]
                row = {"operation": operation, "size": text, "frames": args.frames, "pixels": height * width,
                       "status": answer.status_code, "type": kind, "peak_rss": peak.peak, "estimate": bytes_estimated,
                       "seconds": round(time.monotonic() - start_s, 1)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        process.terminate()
        process.wait(60)
    rows.append({"memory": memory, "machine": machine()})
    return rows


def plot(rows: list[dict], path: Path, command: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    meta = rows[-1]
    figure, ax = plt.subplots(figsize=(8, 5))
    gb = 1e9
    for operation, marker in (("decode", "o"), ("encode", "s")):
        points = [r for r in rows[:-1] if r["operation"] == operation]
        if not points:
            continue
        xs = [r["pixels"] for r in points]
        ax.plot(xs, [r["estimate"] / gb for r in points], marker=marker, linestyle="--",
                label=f"{operation}: estimate of its largest program")
        ax.plot(xs, [r["peak_rss"] / gb for r in points], marker=marker, label=f"{operation}: server peak RSS")
        for r in points:
            if r["status"] != 200:
                # beside the estimate, which refused it (the RSS of refusals sits where it was: labels overlap)
                ax.annotate(f"{r['status']} {r['type']}", (r["pixels"], r["estimate"] / gb), fontsize=7,
                            xytext=(4, -10), textcoords="offset points")
    memory = meta["memory"]
    ax.axhline(memory["machine_bytes"] / gb, color="k", linewidth=1, label="the host's memory")
    ax.axhline(memory["device_bytes"] / gb, color="grey", linestyle=":", label="memory per device (programs)")
    ax.axhline(1.5 * memory["device_bytes"] / gb, color="grey", linestyle="-.",
               label="refused before compiling above")
    ax.set_xscale("log")
    ax.set_xlabel(f"pixels per frame ({rows[0]['frames']} frames)")
    ax.set_ylabel("GB")
    ax.set_title(f"{meta['machine']}\n{command}", fontsize=8)
    ax.legend(fontsize=7)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    print(f"wrote {path}")


def table(args: argparse.Namespace) -> None:
    """Markdown: per size, the estimate of the decode's largest step and of the encode (CPU, the
    model's real config), and what an npy / MP4 answer and an encode hold in the host account."""
    import jax
    from flax import nnx

    from vaeserve import models
    from vaeserve.models.estimate import estimator
    from vaeserve.models.family_modules import family_modules as family_of
    from vaeserve.models.vae import abstract_module
    from vaeserve.service.http.host_memory import decode_host_bytes, encode_host_bytes
    from vaeserve.service.http.schemas import DecodeParams
    from vaeserve.service.limits import Limits

    config = models.load_config(args.model) if args.model else models.WanVAEConfig()
    family = family_of(config)

    def parameters(module) -> int:
        return sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(nnx.state(abstract_module(
            module, config, jax.numpy.float32))))

    model = estimator(config, dtype=args.dtype, decoder_parameters=parameters(family.decoder),
                      encoder_parameters=parameters(family.encoder), convs=args.cpu_convs)
    assert model is not None, f"no estimate for the {config.family} family"
    s, t = config.spatial_scale, config.temporal_scale
    limits = Limits(channels=config.z_dim, max_batch=1, max_frames=10**6, max_height=10**6, max_width=10**6,
                    temporal_scale=t, spatial_scale=s)

    def answer(output_type: str) -> DecodeParams:
        return DecodeParams(output_type=output_type, denormalize=False, partial_postprocess=False, stream=False,  # type: ignore[arg-type]
                            mp4_stream=False, fps=16, crf=18, frame=0, shape=None, dtype=None, scaling_factor=None,
                            shift_factor=None, timeout_s=300)

    class Header:  # what encode_host_bytes reads of a FramesHeader
        def __init__(self, shape):
            self.shape, self.nbytes = shape, int(np.prod(shape)) * 4

    print("| video | decode step (estimate) | npy answer (host account) | MP4 answer (host account) | "
          "encode (estimate) | encode (host account) |")
    print("|---|---|---|---|---|---|")
    for text in args.sizes:
        height, width = size(text)
        for frames in args.table_frames:
            latents = (1, config.z_dim, 1 + (frames - 1) // t, height // s, width // s)
            frames_shape = (1, 3, frames, height, width)
            cells = [model.decode(latents).total,
                     decode_host_bytes(latents, answer("npy"), limits, stream_buffer_bytes=64 * 2**20, causal=config.causal),
                     decode_host_bytes(latents, answer("mp4"), limits, stream_buffer_bytes=64 * 2**20, causal=config.causal),
                     model.encode(frames_shape).total, encode_host_bytes(Header(frames_shape), limits)]  # type: ignore[arg-type]
            print(f"| {width}x{height}x{frames} | " + " | ".join(f"{c / 1e9:.2f} GB" for c in cells) + " |")


class Tiny(NamedTuple):
    """A tiny config and the shapes its coefficients are fitted to (decode latents, encode frames),
    then the larger ones held out of the fit to check it on."""

    config: Any
    decodes: list[tuple[int, ...]]
    encodes: list[tuple[int, ...]]
    held_decodes: list[tuple[int, ...]]
    held_encodes: list[tuple[int, ...]]


def tiny_configs() -> dict[str, list[Tiny]]:
    """``{family: [Tiny]}``: the tiny configs the estimate's coefficients are fitted to (for the
    families ``--fit`` has fitted)."""
    from vaeserve import models
    from vaeserve.models.families.kl.config import KL_BLOCKS
    from vaeserve.models.families.minimax_h3.config import AutoencoderKLMiniMaxH3Config

    kl: dict[str, Any] = dict(down_block_types=(KL_BLOCKS[0],) * 3, up_block_types=(KL_BLOCKS[1],) * 3,
                              norm_num_groups=4)
    ltx: dict[str, Any] = dict(latent_channels=8, layers_per_block=(1, 1, 1, 1, 1), patch_size=1)
    # Compiling costs about the same at any size: the largest shapes reach the CPU convs' block
    # budget (their nine-tap buffers stop growing) and the attention's query blocks.
    images: dict[str, list[tuple[int, ...]]] = dict(
        decodes=[(1, 0, 8, 8), (2, 0, 12, 16), (1, 0, 32, 48), (1, 0, 96, 96)],
        encodes=[(1, 3, 32, 32), (2, 3, 48, 64), (1, 3, 128, 192), (1, 3, 768, 768)],
        held_decodes=[(1, 0, 64, 80)], held_encodes=[(1, 3, 512, 640)])

    def image(config: Any, **shapes: list[tuple[int, ...]]) -> Tiny:
        table = {**images, **shapes}
        decodes = {k: [(s[0], config.z_dim, *s[2:]) if s[1] == 0 else s for s in table[k]]
                   for k in ("decodes", "held_decodes")}
        return Tiny(config, decodes["decodes"], table["encodes"], decodes["held_decodes"], table["held_encodes"])

    videos: dict[str, list[tuple[int, ...]]] = dict(
        decodes=[(1, 8, 3, 4, 4), (2, 8, 3, 6, 8)], encodes=[(1, 3, 9, 64, 64), (2, 3, 9, 64, 96)],
        held_decodes=[(1, 8, 5, 12, 16)], held_encodes=[(1, 3, 17, 128, 128)])
    return {
        "wan2.1": [Tiny(models.WanVAEConfig(base_dim=8, num_res_blocks=1), [(1, 16, 3, 8, 8), (2, 16, 3, 12, 12)],
                        [(1, 3, 5, 32, 32), (2, 3, 9, 48, 64)], [(1, 16, 5, 24, 24)], [(1, 3, 9, 128, 128)])],
        "wan2.2": [Tiny(models.WanVAEConfig.wan22(base_dim=8, decoder_base_dim=8, num_res_blocks=1, dim_mult=(1, 2, 2),
                                                  temperal_downsample=(False, True), scale_factor_spatial=8,
                                                  scale_factor_temporal=2),
                        [(1, 48, 3, 8, 8), (2, 48, 3, 8, 12)], [(1, 3, 5, 32, 32), (2, 3, 9, 48, 64)],
                        [(1, 48, 5, 16, 16)], [(1, 3, 9, 128, 128)])],
        "hunyuan1.0": [Tiny(models.HunyuanVideoConfig(block_out_channels=(8, 16, 16, 16), norm_num_groups=4,
                                                      layers_per_block=1),
                            [(1, 16, 3, 8, 8), (2, 16, 2, 8, 12)], [(1, 3, 5, 32, 32), (2, 3, 9, 48, 64)],
                            [(1, 16, 5, 16, 16)], [(1, 3, 9, 128, 128)])],
        "hunyuan1.5": [Tiny(models.HunyuanVideo15Config(block_out_channels=(8, 16, 16, 32, 64), layers_per_block=1,
                                                        latent_channels=16),
                            [(1, 16, 3, 4, 4), (2, 16, 3, 4, 6)], [(1, 3, 5, 64, 64), (2, 3, 9, 64, 96)],
                            [(1, 16, 5, 8, 8)], [(1, 3, 9, 128, 128)])],
        "autoencoder-kl": [image(models.AutoencoderKLConfig(block_out_channels=(8, 16, 16), latent_channels=4, **kl))],
        "flux2": [image(models.AutoencoderKLFlux2Config(block_out_channels=(8, 16, 16),
                                                        decoder_block_out_channels=(8, 16, 32), layers_per_block=1,
                                                        latent_channels=8, **kl))],
        "qwen-image": [image(models.QwenImageConfig(base_dim=8, num_res_blocks=1),
                             decodes=[(1, 0, 8, 8), (2, 16, 1, 12, 16), (1, 0, 32, 48), (1, 16, 1, 96, 96)],
                             encodes=[(1, 3, 64, 64), (2, 3, 1, 96, 128), (1, 3, 768, 768)],
                             held_decodes=[(1, 0, 64, 80)], held_encodes=[(1, 3, 512, 640)])],
        "ltx-video": [Tiny(models.LTXVideoConfig.v095(block_out_channels=(8, 8, 16, 16, 32),
                                                      decoder_block_out_channels=(16, 32, 64),
                                                      decoder_layers_per_block=(1, 1, 1, 1),
                                                      decoder_inject_noise=(False, True, True, False),
                                                      spatial_compression_ratio=None, temporal_compression_ratio=None,
                                                      **ltx), **videos)],
        "ltx2": [Tiny(models.LTX2VideoConfig.ltx23(block_out_channels=(8, 8, 16, 16), decoder_block_out_channels=(8, 16, 16, 32),
                                                   decoder_layers_per_block=(1, 1, 1, 1, 1), spatial_compression_ratio=None,
                                                   temporal_compression_ratio=None, **{**ltx, "patch_size": 2}),
                      videos["decodes"], [(1, 3, 9, 128, 128), (2, 3, 9, 128, 192)], videos["held_decodes"],
                      [(1, 3, 17, 256, 256)]),
                 Tiny(models.LTX2VideoConfig(block_out_channels=(8, 8, 8, 8), decoder_block_out_channels=(16, 32, 64),
                                             decoder_layers_per_block=(1, 1, 1, 1), **ltx),
                      [(1, 8, 3, 4, 4), (2, 8, 3, 6, 8)], [], [(1, 8, 5, 12, 16)], [])],
        # One chunk of one tile up to 2 chunks of 4x4 tiles; one frame and clips of 17 + 5 frames.
        "minimax-h3": [Tiny(AutoencoderKLMiniMaxH3Config.tiny(), [(1, 4, 3, 4, 4), (1, 4, 8, 6, 8), (2, 4, 8, 8, 12)],
                            [(1, 3, 1, 16, 16), (1, 3, 22, 24, 32), (1, 3, 39, 48, 48)], [(1, 4, 13, 16, 16)],
                            [(1, 3, 22, 64, 64)])],
    }


def real_configs() -> dict[str, tuple[Any, list[tuple[int, ...]], list[tuple[int, ...]]]]:
    """``{family: (config, decode latent shapes, encode frame shapes)}``: the real video configs
    from small sizes to 480p or 720p (``--real``; compiling needs no weights, seconds to a minute
    each with oneDNN's convs, minutes with the nine-tap ones)."""
    from vaeserve import models
    from vaeserve.models.families.minimax_h3.config import AutoencoderKLMiniMaxH3Config

    return {"wan2.1": (models.WanVAEConfig(), [(1, 16, 2, 16, 16), (1, 16, 2, 60, 104), (1, 16, 2, 90, 160)],
                       [(1, 3, 9, 128, 128), (1, 3, 5, 480, 832), (1, 3, 81, 720, 1280)]),
            "wan2.2": (models.WanVAEConfig.wan22(), [(1, 48, 2, 8, 8), (1, 48, 2, 30, 52)],
                       [(1, 3, 5, 256, 256), (1, 3, 5, 480, 832)]),
            "hunyuan1.0": (models.HunyuanVideoConfig(), [(1, 16, 3, 16, 16), (1, 16, 5, 32, 32), (1, 16, 5, 48, 48)],
                           [(1, 3, 5, 128, 128), (1, 3, 9, 256, 256)]),
            "hunyuan1.5": (models.HunyuanVideo15Config(), [(1, 32, 2, 8, 8), (1, 32, 2, 30, 52)],
                           [(1, 3, 5, 256, 256), (1, 3, 5, 480, 832)]),
            # MiniMax-H3 at its real width (2048) with 2 of its 36 ViT blocks: the blocks run one
            # after another, so more of them add weights (arguments), not working memory. 256x384:
            # one chunk of two 256-px tiles.
            "minimax-h3": (AutoencoderKLMiniMaxH3Config(decoder_num_layers=2),
                           [(1, 24, 3, 16, 24), (1, 24, 7, 16, 24)], [])}


def programs_of(vae: Any, decodes: list[tuple[int, ...]], encodes: list[tuple[int, ...]]):
    """``(program, shape, step, estimate, features, memory_analysis())`` of ``vae``'s decode steps of
    each latent shape and its encode of each frame shape, compiled on one CPU device with the
    model's conv path and estimated for it."""
    from vaeserve import sharding
    from vaeserve.models.conv import convs_for
    from vaeserve.models.estimate import estimator
    from vaeserve.sharding.introspect import program_memory

    model = estimator(vae.config, dtype="float32", decoder_parameters=vae.metadata["parameters"],
                      encoder_parameters=vae.metadata["encoder_parameters"], convs=convs_for("cpu", vae.cpu_convs))
    assert model is not None, vae.config.family
    mesh = sharding.make_mesh(1)
    for shape in decodes:
        compiled = sharding.compile_decode_stream(vae, shape, mesh)
        programs = list(model.decode_steps(shape))
        if len(compiled) > len(programs) == 1:  # a stream of chunks (MiniMax-H3): the estimate is the whole decode's
            compiled = (sharding.compile_decode(vae, shape, mesh, output="uint8"),)
        assert len(programs) == len(compiled), (vae.config.family, shape, len(programs), len(compiled))
        for program, step in zip(programs, compiled, strict=True):
            yield "decode", shape, program.name, program.estimate, program.estimate.weighed, program_memory(step)
    for shape in encodes:
        estimate = model.encode(shape)
        yield "encode", shape, "encode", estimate, estimate.weighed, program_memory(sharding.compile_encode(vae, shape, mesh))


def real_measurements(family: str, *, cpu_convs: Any):
    """As ``measurements``, for the decodes and encodes of the family's real config
    (``real_configs``; none for a family without one), its weights abstract (compiled, never run)."""
    from vaeserve import models

    if family not in real_configs():
        return
    config, decodes, encodes = real_configs()[family]
    vae = models.abstract_vae(config, encoder=True)
    vae.cpu_convs = cpu_convs
    yield from programs_of(vae, decodes, encodes)


def saved_rows(path: Path | None, key: str, measure: Any) -> list:
    """The rows of ``measure()``, kept in the JSON file ``path`` under ``key`` (compiled once: a refit
    with other features or fixed coefficients reads them back)."""
    from vaeserve.models.estimate import Estimate, Features

    saved = json.loads(path.read_text()) if path is not None and path.exists() else {}
    if key not in saved:
        saved[key] = [{"program": program, "shape": list(shape), "step": step,
                       "estimate": {k: getattr(estimate, k) for k in ("argument", "output", "alias", "temp")},
                       "features": dataclasses.asdict(feats), "memory": memory}
                      for program, shape, step, estimate, feats, memory in measure()]
        if path is not None:
            path.write_text(json.dumps(saved))
    return [(r["program"], tuple(r["shape"]), r["step"], Estimate(**r["estimate"]), Features(**r["features"]),
             r["memory"]) for r in saved[key]]


def measurements(family: str, *, cpu_convs: Any, held: bool = False):
    """``(program, shape, step, estimate, features, memory_analysis())`` of every program of the
    family's tiny configs (``"decode"``: every step; ``"encode"``) at the fitted shapes (``held``:
    the held-out ones), compiled on one CPU device with ``cpu_convs``; the features are those the
    estimate weighed."""
    from vaeserve import models

    for tiny in tiny_configs()[family]:
        vae = models.init_vae(tiny.config)
        vae.cpu_convs = cpu_convs
        yield from programs_of(vae, tiny.held_decodes if held else tiny.decodes,
                               tiny.held_encodes if held else tiny.encodes)


def fit(args: argparse.Namespace) -> None:
    """Each program's temp coefficients per family named (an encode's caches held at 0, as every
    family's; ``--features``: only those), two ways: non-negative least squares on the ratio
    (estimate / compiled total − 1) at the fitted shapes, with the ratios of the larger shapes held
    out; then the minimax fit (the least largest |ratio − 1|, non-negative) over every shape, held
    out ones included — what ``models.estimate.FAMILIES`` holds for the image and LTX families."""
    import numpy as np
    from scipy.optimize import nnls  # type: ignore[import-untyped]

    from vaeserve.sharding.fits import program_total_bytes

    names = ("caches", "activation", "outputs", "taps", "attention", "weights")

    def system(rows: list) -> tuple[np.ndarray, np.ndarray]:
        a, b = [], []
        for _, _, _, estimate, feats, memory in rows:
            total = program_total_bytes(memory)
            exact = estimate.argument + estimate.output - estimate.alias
            a.append([v / total for v in (4 * feats.caches, 4 * feats.activation, 4 * feats.outputs, 4 * feats.taps,
                                          4 * feats.attention, feats.weights)])
            b.append(1 - exact / total)
        return np.asarray(a), np.asarray(b)

    def show(rows: list, solution: np.ndarray, what: str) -> None:
        a, b = system(rows)
        for (_, shape, name, estimate, _, memory), row, target in zip(rows, a, b, strict=True):
            ratio = 1 - target + float(solution @ row)
            print(f"    {what} {'x'.join(map(str, shape))} {name}: ratio {ratio:.2f} (compiled "
                  f"{program_total_bytes(memory) / 1e6:.2f} MB; arguments {memory['argument_bytes']} (estimated "
                  f"{estimate.argument}), outputs {memory['output_bytes']} ({estimate.output}), alias "
                  f"{memory['alias_bytes']} ({estimate.alias}), temp {memory['temp_bytes']})", flush=True)

    def minimax(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Non-negative coefficients with the least largest |ratio − 1| (a linear program)."""
        from scipy.optimize import linprog

        n, ones = a.shape[1], np.ones((len(b), 1))
        result = linprog(np.r_[np.zeros(n), 1.0], A_ub=np.r_[np.c_[a, -ones], np.c_[-a, -ones]], b_ub=np.r_[b, -b],
                         bounds=[(0, None)] * (n + 1))
        return result.x[:n]

    keep = [name in (args.features or names) for name in names]
    fixed = {name: float(value) for name, value in (item.split("=") for item in args.fix or [])}
    unknown = set(fixed) - set(names)
    assert not unknown, f"--fix: unknown {unknown}; the features are {names}"
    for family in args.fit:
        key, convs = f"{family} {args.cpu_convs}", args.cpu_convs
        rows = saved_rows(args.rows, key, partial(measurements, family, cpu_convs=convs))
        held = saved_rows(args.rows, f"{key} held", partial(measurements, family, held=True, cpu_convs=convs))
        if args.real:  # the real config's programs: fitted by the minimax fit, held out of least squares
            held += saved_rows(args.rows, f"{key} real", partial(real_measurements, family, cpu_convs=convs))
        for program in ("decode", "encode"):
            chosen = [r for r in rows if r[0] == program]
            if not chosen:
                continue
            others = [r for r in held if r[0] == program]
            for how, fitted in (("least squares", chosen), ("minimax, every shape", chosen + others)):
                a, b = system(fitted)
                for i, name in enumerate(names):  # a fixed coefficient's share is taken off the target
                    if name in fixed:
                        b = b - fixed[name] * a[:, i]
                a[:, [not k or name in fixed for k, name in zip(keep, names, strict=True)]] = 0
                if program == "encode":
                    a[:, 0] = 0
                solution = nnls(a, b)[0] if how == "least squares" else minimax(a, b)
                for i, name in enumerate(names):
                    solution[i] = fixed.get(name, solution[i])
                coefficients = dict(zip(names, (round(float(v), 3) for v in solution), strict=True))
                print(f"{family} {program} ({how}, {args.cpu_convs}): {coefficients}", flush=True)
                show(fitted if how == "least squares" else chosen, solution, "fitted")
                show(others, solution, "held out" if how == "least squares" else "fitted")


def compare(args: argparse.Namespace) -> None:
    """The estimate against memory_analysis() of compiled programs, per family: the tiny configs
    (``tiny_configs``: decodes and encodes, at the shapes fitted and those held out), and with
    ``--real`` the real video configs' decodes and encodes (``real_configs``); every program
    compiled with ``--cpu-convs``."""
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    from vaeserve.sharding.fits import program_total_bytes

    def row(name: str, which: str, shape: tuple[int, ...], program: str, estimate: Any, measured: int) -> None:
        print(f"| {name} | {which} | {'x'.join(map(str, shape))} | {program} | {estimate.total / 1e6:.1f} MB | "
              f"{measured / 1e6:.1f} MB | {estimate.total / measured:.2f} |", flush=True)

    print(f"CPU convs: {args.cpu_convs}")
    print("| family | config | latents | program | estimate | memory_analysis() | ratio |")
    print("|---|---|---|---|---|---|---|")
    for name in args.families or tiny_configs():
        for held in (False, True):
            for _, shape, program_name, estimate, _, memory in measurements(name, held=held, cpu_convs=args.cpu_convs):
                row(name, "tiny (held out)" if held else "tiny", shape, program_name, estimate,
                    program_total_bytes(memory))
    for name in real_configs() if args.real else ():
        if args.families and name not in args.families:
            continue
        for _, shape, program_name, estimate, _, memory in real_measurements(name, cpu_convs=args.cpu_convs):
            row(name, "real", shape, program_name, estimate, program_total_bytes(memory))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), help="HEIGHTxWIDTH, growing")
    parser.add_argument("--frames", type=int, default=5, help="frames per video (1 + 4k)")
    parser.add_argument("--operations", nargs="+", default=["decode", "encode"], choices=["decode", "encode"])
    parser.add_argument("--timeout", type=float, default=1800, help="each request's timeout_s")
    parser.add_argument("--png", type=Path, default=REPO / "bench" / "results" / "memory-rss.png",
                        help="where the plot goes (docs/memory/rss.png is the docs' figure: name it to refresh it)")
    parser.add_argument("--serve", nargs=argparse.REMAINDER, default=[], help="flags for vaeserve serve")
    parser.add_argument("--table", action="store_true", help="print the estimate per size (no server)")
    parser.add_argument("--table-frames", type=int, nargs="+", default=[81, 129])
    parser.add_argument("--model", help="--table: a model (default: the embedded Wan 2.1)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--compare", action="store_true", help="the estimate vs compiled programs")
    parser.add_argument("--real", action="store_true", help="--compare, --fit: the real video configs too (slow)")
    parser.add_argument("--families", nargs="+", help="--compare: only these families")
    parser.add_argument("--cpu-convs", default="onednn", choices=["onednn", "matmul"],
                        help="--table, --compare, --fit: the CPU convs compiled and estimated (models.conv.CPU_CONVS)")
    parser.add_argument("--fit", nargs="+", metavar="FAMILY", help="fit these families' coefficients (tiny configs)")
    parser.add_argument("--features", nargs="+", help="--fit: only these features (caches, activation, outputs, "
                        "taps, attention, weights)")
    parser.add_argument("--fix", nargs="+", metavar="FEATURE=VALUE", help="--fit: hold these coefficients")
    parser.add_argument("--rows", type=Path, help="--fit: a JSON file that keeps the compiled programs' figures "
                        "(written on the first fit, read by the next)")
    args = parser.parse_args()
    if args.table:
        table(args)
    elif args.compare:
        compare(args)
    elif args.fit:
        fit(args)
    else:
        rows = run(args)
        command = "python -m bench.memory " + shlex.join(sys.argv[1:])
        plot(rows, args.png, command)


if __name__ == "__main__":
    main()
