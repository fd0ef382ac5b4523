#!/usr/bin/env python
"""Why the halo matters: seams of split decodes against the full single-device decode.

Same weights (a diffusers VAE — ``AutoencoderKLWan``, ``AutoencoderKLHunyuanVideo``,
``AutoencoderKLHunyuanVideo15``, ``AutoencoderKLLTXVideo``, ``AutoencoderKLLTX2Video`` or, for images, ``AutoencoderKL`` as SD, SDXL or Flux.1 — with
perturbed random weights, written with ``save_pretrained`` and read back with ``models.load_vae``)
and the same latents, decoded by:

  (a) our sharded decode: ``tp`` horizontal bands with one-row halos (``sharding.sharded_decode``);
  (b) diffusers' tiled decode (``enable_tiling()``), tiles small enough to split the frame
      (height only, so that its seams are rows like ours);
  (c) the same shard_map decode with no halo (each band padded alone);
  (d) HunyuanVideo 1.0 and the image models: the sharded decode with each band's own GroupNorm
      statistics (no sum over the bands);
  (e) HunyuanVideo and LTX-2 only: the sharded decode with zeros at the image's edges where the
      model repeats (HunyuanVideo) or reflects (LTX-2) its edge rows;
  (-) diffusers' full decode, as a check that the reference is the reference.

Each is compared with the full single-device JAX decode: max abs error, PSNR (peak-to-peak 2 for
[-1, 1] frames) and the mean abs error on *seam rows* (the two rows at each band cut for a/c; the
blend rows of each tile for b) vs *interior rows* (≥ 8 rows from any cut or blend of that method).
An image model's tiles (b) are square, ``enable_tiling()``'s own (the config's ``sample_size``,
overlap 1/4): their seams are the blend rows and columns, and the interior is ≥ 8 pixels from both.

    python -m bench.seams                       # real Wan 2.1 architecture, 128x128, 5 frames, tp=4
    python -m bench.seams --model wan2.2 --height 8 --width 8   # real Wan 2.2, 128x128, 5 frames, tp=4
    python -m bench.seams --model hunyuan1.0    # real HunyuanVideo, 128x128, 5 frames, tp=4
    python -m bench.seams --model hunyuan1.5 --height 8 --width 8   # real HunyuanVideo 1.5, 128x128
    python -m bench.seams --model ltx2 --height 8 --width 8   # real LTX-2, 256x256, 9 frames, tp=4
    python -m bench.seams --model ltx-video --height 8 --width 8   # real LTX-Video 0.9.5 (timestep 0.05)
    python -m bench.seams --config tiny --height 32 --width 32
    python -m bench.seams --model sd --height 128 --width 128   # real SD VAE, one 1024x1024 image, tp=4
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable, Sequence

MODELS = ("wan2.1", "wan2.2", "hunyuan1.0", "hunyuan1.5", "ltx-video", "ltx2", "sd", "sdxl", "flux1")
IMAGE_MODELS = ("sd", "sdxl", "flux1")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=MODELS, default="wan2.1")
    parser.add_argument("--config", choices=("real", "tiny"), default="real",
                        help="real: the model's architecture (Wan 2.1: 73 M decoder parameters, Wan 2.2: 555 M); "
                             "tiny: the tests' small configs (Wan: decoder width 8)")
    parser.add_argument("--frames", type=int, default=2, help="latent frames T (output 1+4(T-1), LTX 1+8(T-1)); "
                        "image models: none")
    parser.add_argument("--height", type=int, default=16, help="latent height (frame height / 8, or / 16 for wan2.2, "
                        "/ 32 for LTX)")
    parser.add_argument("--width", type=int, default=16, help="latent width")
    parser.add_argument("--tp", type=int, default=4, help="bands for (a) and (c)")
    parser.add_argument("--tile", type=int, default=None, help="diffusers tile height in pixels (default 64, "
                        "LTX 128: 4 latent rows; image models: enable_tiling()'s own square tiles, sample_size)")
    parser.add_argument("--stride", type=int, default=None, help="diffusers tile stride in pixels (overlap = tile - "
                        "stride; default 3/4 of the tile)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--platform", default="cpu", help="JAX platform (cpu forces --tp host devices)")
    parser.add_argument("--skip-full", action="store_true", help="leave out diffusers' full decode (the check row): "
                        "it holds the whole image's activations, and its attention's scores, at once")
    return parser.parse_args(argv)


ARGS = parse_args() if __name__ == "__main__" else None
if ARGS is not None:  # before JAX starts: enough host devices for the mesh
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={max(ARGS.tp, 1)}").strip()
    os.environ["JAX_PLATFORMS"] = ARGS.platform

import numpy as np
from tqdm import tqdm

# The perturbed diffusers references are the parity tests' own, so bench and tests decode the same model.
from tests.helpers import hunyuan_reference, ltx_reference
from tests.helpers.wan_reference import perturbed_diffusers_vae

INTERIOR_MARGIN = 8  # frame rows


def psnr(error: np.ndarray) -> float:
    mse = float(np.mean(np.square(error, dtype=np.float64)))
    return float("inf") if mse == 0 else 10 * np.log10(4.0 / mse)


def band_seams(height_px: int, tp: int, latent_height: int, scale: int) -> list[int]:
    """Frame rows that touch a band cut: the last row of each band and the first of the next."""
    band = -(-latent_height // tp) * scale
    return [r for cut in range(band, height_px, band) for r in (cut - 1, cut)]


def tile_seams(height_px: int, tile: int, stride: int, latent_height: int, scale: int) -> list[int]:
    # (also the columns of an image model's square tiles: width for height)
    """Frame rows of diffusers' tiled decode that are blends of two tiles (or, without overlap, cuts)."""
    blend = tile - stride
    rows = []
    for start_latent in range(stride // scale, latent_height, stride // scale):
        start = start_latent * scale
        rows += list(range(start, start + blend)) if blend > 0 else [start - 1, start]
    return [r for r in rows if r < height_px]


def near(size: int, lines: list[int]) -> np.ndarray:
    """Per index of an axis of ``size``: whether it is within ``INTERIOR_MARGIN`` of one of ``lines``."""
    index = np.arange(size)[:, None]
    return (np.abs(index - np.asarray(lines)[None]) < INTERIOR_MARGIN).any(axis=1) if lines else np.zeros(size, bool)


def row_errors(frames: np.ndarray, reference: np.ndarray, seams: list[int], seam_columns: Sequence[int] = ()) -> dict:
    """Errors of float ``(B, 3, F, H, W)`` frames (or images ``(B, 3, H, W)``) against the reference:
    on the seam rows (and ``seam_columns``) and on the pixels at least ``INTERIOR_MARGIN`` from all."""
    error = frames.astype(np.float64) - reference.astype(np.float64)
    per_pixel = np.abs(error).mean(axis=tuple(range(error.ndim - 2)))  # (H, W)
    height, width = per_pixel.shape
    seam = np.zeros((height, width), bool)
    seam[seams, :] = True
    seam[:, list(seam_columns)] = True
    inner = ~near(height, seams)[:, None] & ~near(width, list(seam_columns))[None, :]
    return {
        "max": float(np.abs(error).max()),
        "psnr": psnr(error),
        "seam": float(per_pixel[seam].mean()) if seam.any() else float("nan"),
        "interior": float(per_pixel[inner].mean()) if inner.any() else float("nan"),
    }


def model_config(name: str, size: str):
    """The model's config object: the real architecture or the tests' small one."""
    from vaeserve import models

    if name in IMAGE_MODELS:
        from tests.helpers.image_reference import FLUX1_TINY, SD_TINY

        return (FLUX1_TINY if name == "flux1" else SD_TINY) if size == "tiny" else models.MODEL_NAMES[name]()
    if name.startswith("hunyuan"):
        tiny = {"hunyuan1.0": hunyuan_reference.HY10_TINY, "hunyuan1.5": hunyuan_reference.HY15_TINY}[name]
        return tiny if size == "tiny" else models.MODEL_NAMES[name]()
    if name.startswith("ltx"):  # tiny: the parity tests' LTX-Video 0.9.5, the sharding tests' LTX-2
        tiny = {"ltx-video": ltx_reference.LTX095, "ltx2": ltx_reference.LTX2_SHARD}[name]
        return tiny if size == "tiny" else models.MODEL_NAMES[name]()
    config = models.MODEL_NAMES[name]().to_dict()
    del config["_class_name"]
    if size == "tiny":
        config.update(base_dim=8, decoder_base_dim=8, num_res_blocks=1)
    return models.WanVAEConfig(**config)


def reference_vae(config, seed: int):
    """diffusers' model of ``config`` with the parity tests' perturbed random weights."""
    if config.family == "wan":
        return perturbed_diffusers_vae({k: v for k, v in config.to_dict().items() if k != "_class_name"}, seed)
    reference = ltx_reference if config.family.startswith("ltx") else hunyuan_reference
    return reference.reference_model(config, reference.seeded_weights(config, seed))


def tiling_options(config, tile: int, stride: int, width_px: int, width: int) -> dict:
    """``enable_tiling`` arguments for tiles of ``tile`` rows every ``stride`` rows, as wide as the
    frame (HunyuanVideo 1.5 names its tiles in latent rows and an overlap factor); an image model's
    square tiles of ``tile`` pixels every ``stride`` (``AutoencoderKL`` takes them as attributes)."""
    if config.is_image:
        return dict(tile_sample_min_size=tile, tile_latent_min_size=tile // config.spatial_scale,
                    tile_overlap_factor=(tile - stride) / tile)
    if config.family == "hunyuan1.5":
        return dict(tile_sample_min_height=tile, tile_latent_min_height=tile // config.spatial_scale,
                    tile_overlap_factor=(tile - stride) / tile, tile_sample_min_width=width_px,
                    tile_latent_min_width=width)
    return dict(tile_sample_min_height=tile, tile_sample_stride_height=stride,
                tile_sample_min_width=width_px, tile_sample_stride_width=width_px)


def diffusers_decode(model, latents: np.ndarray, *, tiling: dict | None, timestep: float | None = None) -> np.ndarray:
    """diffusers' decode, tiled or whole, clamped to [-1, 1]; ``timestep``: a timestep-conditioned LTX decoder's."""
    import torch

    if hasattr(model, "use_framewise_decoding"):  # HunyuanVideo 1.0: the whole clip, as the model
        model.use_framewise_decoding = False
    if tiling and "tile_sample_min_size" in tiling:  # AutoencoderKL: enable_tiling() takes no sizes
        model.enable_tiling()
        for name, value in tiling.items():
            setattr(model, name, value)
    elif tiling:
        model.enable_tiling(**tiling)
    else:
        model.disable_tiling()
    with torch.no_grad():
        temb = () if timestep is None else (torch.full((latents.shape[0],), timestep),)
        return model.decode(torch.from_numpy(latents), *temb).sample.clamp(-1, 1).numpy()


def main(args: argparse.Namespace) -> None:
    import torch

    from vaeserve import models, sharding
    from vaeserve.sharding._controls import decode_with

    torch.set_num_threads(os.cpu_count() or 1)
    config = model_config(args.model, args.config)
    scale, images = config.spatial_scale, config.is_image
    time_axis = () if images else (args.frames,)
    latents = np.random.default_rng(args.seed).standard_normal(
        (1, config.z_dim, *time_axis, args.height, args.width)).astype(np.float32)
    height_px, width_px = args.height * scale, args.width * scale
    # diffusers' own tiles for an image model (enable_tiling(): sample_size, overlap 1/4); rows for a video
    tile = args.tile or (config.sample_size if images else max(64, 4 * scale))
    stride = args.stride or tile * 3 // 4
    out = f"image (1, 3, {height_px}, {width_px})" if images else \
        f"frames (1, 3, {1 + config.temporal_scale * (args.frames - 1)}, {height_px}, {width_px})"
    print(f"{args.model}: latents {latents.shape} → {out}; config {args.config}; tp={args.tp}; "
          f"tiles {tile}px stride {stride}px (overlap {tile - stride}px{', square' if images else ''}); "
          f"JAX on {args.platform}")

    reference_model = reference_vae(config, args.seed)
    with tempfile.TemporaryDirectory() as folder:
        reference_model.save_pretrained(folder, safe_serialization=True)
        vae = models.load_vae(folder)

    # Each family's extra negative controls (sharding._controls), as the table's rows name them.
    statistics = {"(d) per-band GroupNorm stats": "band-statistics"}
    # LTX: RMS norms per pixel (no statistics across bands); LTX-2's decoder reflects at the edges.
    zero_edge = {"(e) zero image edges": "zero-edge"}
    controls = {"wan": {}, "hunyuan1.5": zero_edge, "hunyuan1.0": {**statistics, **zero_edge}, "ltx-video": {},
                "ltx2": zero_edge if getattr(config, "decoder_spatial_padding_mode", "") == "reflect" else {}
                }.get(config.family, statistics)
    # A timestep-conditioned LTX decoder (LTX-Video 0.9.5): the same timestep everywhere, no noise.
    timestep = ltx_reference.DECODE_TIMESTEP if config.decode_conditions else None
    conditions = ltx_reference.decode_kwargs(config)
    timings: dict[str, float] = {}
    progress = tqdm(total=5 + len(controls) - args.skip_full, desc="decodes", unit="decode", leave=False)

    def timed(name, fn):
        progress.set_postfix_str(name)
        start = time.perf_counter()
        out = fn()
        timings[name] = time.perf_counter() - start
        progress.update()
        return out

    full = timed("full", lambda: np.asarray(vae.decode(latents, **conditions)))
    mesh = sharding.make_mesh(args.tp)
    seams = band_seams(height_px, args.tp, args.height, scale)
    tiling = tiling_options(config, tile, stride, width_px, args.width)
    tile_rows = tile_seams(height_px, tile, stride, args.height, scale)
    tile_columns = tile_seams(width_px, tile, stride, args.width, scale) if images else []
    def with_control(control: str) -> Callable[[], np.ndarray]:
        return lambda: np.asarray(decode_with(control, vae, latents, mesh, split="height", **conditions))

    runs = {
        "(a) sharded, 1-row halos": (lambda: np.asarray(sharding.sharded_decode(vae, latents, mesh, split="height",
                                                                                 **conditions)), seams, []),
        "(b) diffusers enable_tiling()": (lambda: diffusers_decode(reference_model, latents, tiling=tiling,
                                                                   timestep=timestep), tile_rows, tile_columns),
        "(c) shard_map, no halo": (with_control("none"), seams, []),
        **{name: (with_control(control), seams, []) for name, control in controls.items()},
        **({} if args.skip_full else {
            "(-) diffusers full decode": (lambda: diffusers_decode(reference_model, latents, tiling=None,
                                                                   timestep=timestep), [], [])}),
    }
    results = {name: (timed(name, run), (rows, columns)) for name, (run, rows, columns) in runs.items()}

    progress.close()
    print(f"\nreference: full single-device JAX decode ({timings['full']:.1f} s incl. compile)")
    blends = "blend rows and columns" if images else "blend rows"
    print(f"seam rows: the 2 rows at each band cut (a, c: {len(seams)} rows) or each tile's {blends} (b); "
          f"interior: ≥ {INTERIOR_MARGIN} rows (columns) from any of them\n")
    header = f"| {'method':<30} | {'max abs err':>11} | {'PSNR dB':>7} | {'mean err seam rows':>18} | {'mean err interior':>17} | {'time s':>6} |"
    print(header)
    print("|" + "|".join("-" * (len(cell)) for cell in header.split("|")[1:-1]) + "|")
    for name, (frames, lines) in results.items():
        e = row_errors(frames, full, *lines)
        seam = f"{e['seam']:.2e}" if any(lines) else "—"
        print(f"| {name:<30} | {e['max']:>11.2e} | {e['psnr']:>7.1f} | {seam:>18} | {e['interior']:>17.2e} | {timings[name]:>6.1f} |")
    print("\ntimes include compilation for the JAX rows; the forced CPU devices share this machine's cores.")


if __name__ == "__main__":
    assert ARGS is not None  # parsed at import, before JAX starts
    main(ARGS)
