"""MiniMax-H3's checkpoint names: diffusers' (the ViT's ``decoder.register_tokens`` tells them apart)."""

from __future__ import annotations

from typing import Any

from .config import AutoencoderKLMiniMaxH3Config


def release_config(names) -> None:
    """No release naming of its own is read here: the published VAE folder is diffusers'."""
    del names


def diffusers_config(names) -> AutoencoderKLMiniMaxH3Config | None:
    """The released config for diffusers' names of an H3 VAE (a file without its config.json)."""
    return AutoencoderKLMiniMaxH3Config() if "decoder.register_tokens" in set(names) else None


def to_diffusers_names(tensors: dict[str, Any], config: AutoencoderKLMiniMaxH3Config) -> None:
    del tensors, config  # already diffusers' names
