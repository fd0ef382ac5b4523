"""Qwen-Image's nominal FLOPs: Wan 2.1's, on its config (``QwenImageConfig.wan()``)."""

from __future__ import annotations

from vaeserve.models.families.wan import flops as wan

from .config import QwenImageConfig


def decode_flops(config: QwenImageConfig, t: int, h: int, w: int) -> float:
    return wan.decode_flops(config.wan(), t, h, w)


def encode_flops(config: QwenImageConfig, f: int, h: int, w: int) -> float:
    return wan.encode_flops(config.wan(), f, h, w)
