"""Qwen-Image's checkpoint names: Wan's (its VAE is Wan 2.1's), so an original-named file renames as
Wan's; its config comes from the config.json beside it.
"""

from __future__ import annotations

from typing import Any

from vaeserve.models.families.wan import weights as wan

from .config import QwenImageConfig


def release_config(names) -> None:
    del names  # Wan's names: a Qwen-Image file needs its config.json beside it


def diffusers_config(names) -> None:
    del names


def to_diffusers_names(tensors: dict[str, Any], config: QwenImageConfig) -> dict[str, Any] | None:
    return wan.to_diffusers_names(tensors, config.wan())
