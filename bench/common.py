"""What the bench scripts share: shape and config arguments, the diffusers reference, and timing
that interleaves the contenders so that each sees the same machine load.

Nothing here imports JAX at module level: some scripts set ``XLA_FLAGS`` after parsing arguments."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from vaeserve import models

T = TypeVar("T")
CONFIGS = ("real", "tiny")
# The real 832x480x81 video in the shared folder beside the checkout (CI clones next to it too).
SAMPLE_VIDEO = Path(__file__).resolve().parents[2] / "shared" / "data" / "sample-832x480x81.mp4"


def latent_shape(text: str) -> tuple[int, ...]:
    """argparse type: ``"1x16x3x60x104"`` → ``(1, 16, 3, 60, 104)`` (B, C, T, H, W)."""
    from vaeserve.models.shapes import parse_shape_text

    try:
        return parse_shape_text(text, 5, "latents BxCxTxHxW")
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def bench_config(name: str) -> models.WanVAEConfig:
    """``real``: the Wan 2.1 architecture; ``tiny``: a few-channel one that compiles in seconds."""
    from vaeserve import models

    return models.WanVAEConfig() if name == "real" else models.WanVAEConfig(base_dim=8, num_res_blocks=1)


def diffusers_reference(config: models.VAEConfig, folder: str | Path, *, encoder: bool = True) -> Any:
    """diffusers' model of ``config``'s family (``AutoencoderKLWan``, ``AutoencoderKLHunyuanVideo``,
    ``AutoencoderKLHunyuanVideo15``, ``AutoencoderKLLTXVideo``, ``AutoencoderKLLTX2Video``) with seeded
    random weights, saved to ``folder`` (so that ``models.load_vae(folder)`` holds the same weights).
    HunyuanVideo's is set to decode whole clips (``use_framewise_decoding=False``): the model, not
    diffusers' default tiling of long clips. Without ``encoder`` the encoder (and ``quant_conv``) is
    dropped before saving: a decode-only checkpoint, which spares a decode bench both copies of it
    (LTX-2's encoder alone is larger than its decoder)."""
    import diffusers
    import torch

    torch.manual_seed(0)
    model_class = getattr(diffusers, config.class_name)
    reference = model_class(**{k: v for k, v in config.to_dict().items() if k != "_class_name"}).eval()
    reference.use_framewise_decoding = reference.use_framewise_encoding = False
    dropped = {}
    if not encoder:
        for name in ("encoder", "quant_conv"):
            if getattr(reference, name, None) is not None:
                dropped[name] = getattr(reference, name)
                setattr(reference, name, None)
    reference.save_pretrained(folder)
    if config.class_name == "AutoencoderKLQwenImage":
        # Its decode counts the encoder's convs (clear_cache): the checkpoint stays decode-only,
        # the model in memory gets its encoder back.
        for name, module in dropped.items():
            setattr(reference, name, module)
    return reference


def timed(fns: dict[str, Callable[[], T]], runs: int) -> dict[str, tuple[list[float], T]]:
    """Warm each up (our compile; torch's allocator and oneDNN primitive caches), then ``runs``
    rounds that time each once in turn, so that every one sees the same machine load."""
    from tqdm import tqdm

    results = {name: fn() for name, fn in tqdm(fns.items(), desc="warm-up", unit="fn", leave=False)}
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in tqdm(range(runs), desc=" vs ".join(fns), unit="round", leave=False):
        for name, fn in fns.items():
            start = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - start)
    return {name: (times[name], results[name]) for name in fns}


def ratio(times: list[float], reference: list[float], digits: int = 2) -> str:
    """``"min 0.74, median 0.71"``: the ratio of two timed series from the same run."""
    return (f"min {min(times) / min(reference):.{digits}f}, "
            f"median {statistics.median(times) / statistics.median(reference):.{digits}f}")
