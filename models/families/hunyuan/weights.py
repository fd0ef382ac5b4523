"""HunyuanVideo 1.0's checkpoint names: its original VAE (``hunyuan-video-t2v-720p/vae/pytorch_model.pt``)
already uses diffusers' names (diffusers' conversion script renames nothing), sometimes under a
``vae.`` prefix (with whatever else its checkpoint holds).
"""

from __future__ import annotations

from typing import Any

from .config import HunyuanVideoConfig


def release_config(names) -> None:
    del names  # diffusers' names: see diffusers_config


def diffusers_config(names) -> HunyuanVideoConfig | None:
    """A GroupNorm ``conv_norm_out`` and a wrapped ``conv_in.conv`` (maybe under ``vae.``)."""
    names = {n.removeprefix("vae.") for n in names}
    return HunyuanVideoConfig() if {"decoder.conv_norm_out.weight", "decoder.conv_in.conv.weight"} <= names else None


def to_diffusers_names(tensors: dict[str, Any], config: HunyuanVideoConfig) -> dict[str, Any] | None:
    del tensors, config
    return None  # diffusers' names; a ``vae.`` prefix is dropped by models.loading
