"""The AutoencoderKL family's checkpoint names: latent diffusion's (SD/SDXL single files, their VAE
files, Flux's ``ae.safetensors``) ↔ diffusers'.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from .config import AutoencoderKLConfig, AutoencoderKLFlux2Config

KLConfig = AutoencoderKLConfig | AutoencoderKLFlux2Config
# Where a whole latent-diffusion checkpoint (SD, SDXL) holds its VAE, in latent diffusion's names.
LDM_PREFIXES = ("first_stage_model.", "vae.")


# The single-file checkpoints of SD/SDXL (``first_stage_model.*`` inside the whole model), their
# stand-alone VAE files and Flux's ``ae.safetensors`` name the VAE as latent-diffusion did, with
# n = len(block_out_channels):
#   {encoder,decoder}.norm_out.*                → {…}.conv_norm_out.*       (conv_in, conv_out: the same)
#   encoder.down.{i}.block.{j}.*                → encoder.down_blocks.{i}.resnets.{j}.*
#   encoder.down.{i}.downsample.conv.*          → encoder.down_blocks.{i}.downsamplers.0.conv.*
#   decoder.up.{i}.block.{j}.*                  → decoder.up_blocks.{n-1-i}.resnets.{j}.*   (LDM counts up
#   decoder.up.{i}.upsample.conv.*              → decoder.up_blocks.{n-1-i}.upsamplers.0.conv.*  from the image)
#   {…}.mid.block_{1,2}.*                       → {…}.mid_block.resnets.{0,1}.*
#   {…}.mid.attn_1.{norm,q,k,v,proj_out}.*      → {…}.mid_block.attentions.0.{group_norm,to_q,to_k,to_v,to_out.0}.*
#   ….nin_shortcut.*                            → ….conv_shortcut.*
# quant_conv, post_quant_conv and Flux.2's bn keep their names. The attention's q/k/v/proj_out are
# 1x1 convs there, ``(O, I, 1, 1)``: diffusers' linear layers take them as ``(O, I)`` (``from_ldm_names``).
_LDM_ATTENTION = {"norm": "group_norm", "q": "to_q", "k": "to_k", "v": "to_v", "proj_out": "to_out.0"}
_LDM_ATTENTION_BACK = {v: k for k, v in _LDM_ATTENTION.items()}


def ldm_to_diffusers(key: str, blocks: int) -> str:
    """Rename one key of an LDM-named AutoencoderKL (``blocks`` = len(block_out_channels)) to diffusers'."""
    key = key.replace(".nin_shortcut.", ".conv_shortcut.")
    if match := re.fullmatch(r"(encoder|decoder)\.norm_out\.(.*)", key):
        return f"{match[1]}.conv_norm_out.{match[2]}"
    if match := re.fullmatch(r"encoder\.down\.(\d+)\.block\.(\d+)\.(.*)", key):
        return f"encoder.down_blocks.{match[1]}.resnets.{match[2]}.{match[3]}"
    if match := re.fullmatch(r"encoder\.down\.(\d+)\.downsample\.(.*)", key):
        return f"encoder.down_blocks.{match[1]}.downsamplers.0.{match[2]}"
    if match := re.fullmatch(r"decoder\.up\.(\d+)\.block\.(\d+)\.(.*)", key):
        return f"decoder.up_blocks.{blocks - 1 - int(match[1])}.resnets.{match[2]}.{match[3]}"
    if match := re.fullmatch(r"decoder\.up\.(\d+)\.upsample\.(.*)", key):
        return f"decoder.up_blocks.{blocks - 1 - int(match[1])}.upsamplers.0.{match[2]}"
    if match := re.fullmatch(r"(encoder|decoder)\.mid\.block_([12])\.(.*)", key):
        return f"{match[1]}.mid_block.resnets.{int(match[2]) - 1}.{match[3]}"
    if match := re.fullmatch(r"(encoder|decoder)\.mid\.attn_1\.(norm|q|k|v|proj_out)\.(.*)", key):
        return f"{match[1]}.mid_block.attentions.0.{_LDM_ATTENTION[match[2]]}.{match[3]}"
    return key


def diffusers_to_ldm(key: str, blocks: int) -> str:
    """Inverse of ``ldm_to_diffusers`` (to write LDM-named test checkpoints)."""
    key = key.replace(".conv_shortcut.", ".nin_shortcut.")
    if match := re.fullmatch(r"(encoder|decoder)\.conv_norm_out\.(.*)", key):
        return f"{match[1]}.norm_out.{match[2]}"
    if match := re.fullmatch(r"encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\.(.*)", key):
        return f"encoder.down.{match[1]}.block.{match[2]}.{match[3]}"
    if match := re.fullmatch(r"encoder\.down_blocks\.(\d+)\.downsamplers\.0\.(.*)", key):
        return f"encoder.down.{match[1]}.downsample.{match[2]}"
    if match := re.fullmatch(r"decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.(.*)", key):
        return f"decoder.up.{blocks - 1 - int(match[1])}.block.{match[2]}.{match[3]}"
    if match := re.fullmatch(r"decoder\.up_blocks\.(\d+)\.upsamplers\.0\.(.*)", key):
        return f"decoder.up.{blocks - 1 - int(match[1])}.upsample.{match[2]}"
    if match := re.fullmatch(r"(encoder|decoder)\.mid_block\.resnets\.([01])\.(.*)", key):
        return f"{match[1]}.mid.block_{int(match[2]) + 1}.{match[3]}"
    attention = r"(encoder|decoder)\.mid_block\.attentions\.0\.(group_norm|to_q|to_k|to_v|to_out\.0)\.(.*)"
    if match := re.fullmatch(attention, key):
        return f"{match[1]}.mid.attn_1.{_LDM_ATTENTION_BACK[match[2]]}.{match[3]}"
    return key


def ldm_prefix(names) -> str | None:
    """The prefix under which a checkpoint holds an AutoencoderKL in latent diffusion's names (``""``
    for a VAE file, ``"first_stage_model."`` in a whole SD/SDXL checkpoint), or None."""
    names = set(names)
    return next((p for p in ("", *LDM_PREFIXES) if f"{p}decoder.mid.block_1.norm1.weight" in names), None)


def kl_config_for_names(names, prefix: str = "") -> KLConfig:
    """The real config of an AutoencoderKL checkpoint (its tensors under ``prefix``, in latent
    diffusion's names or diffusers'): Flux.2 (BatchNorm statistics ``bn.*``), Flux.1 (no
    ``post_quant_conv``), SDXL (a whole checkpoint with SDXL's ``conditioner.*`` text encoders) or
    SD. A stand-alone SDXL VAE file reads as SD: the two differ only in ``scaling_factor`` (what
    ``denormalize`` uses); a config.json beside it says which."""
    names = list(names)
    if f"{prefix}bn.running_mean" in names:
        return AutoencoderKLFlux2Config()
    if f"{prefix}post_quant_conv.weight" not in names:
        return AutoencoderKLConfig.flux1()
    if any(n.startswith("conditioner.") for n in names):
        return AutoencoderKLConfig.sdxl()
    return AutoencoderKLConfig.sd()


def from_ldm_names(tensors: dict[str, Any], config: KLConfig) -> dict[str, Any]:
    """An AutoencoderKL's tensors in latent diffusion's names (under their prefix; the rest of a
    whole checkpoint passed over) in diffusers' names and layouts: the attention's 1x1 conv
    weights ``(O, I, 1, 1)`` become the linear layers' ``(O, I)``."""
    prefix = ldm_prefix(tensors) or ""
    renamed = {ldm_to_diffusers(n.removeprefix(prefix), len(config.block_out_channels)): t
               for n, t in tensors.items() if n.startswith(prefix)}
    attention = re.compile(r"(encoder|decoder)\.mid_block\.attentions\.0\.to_(q|k|v|out\.0)\.weight")
    return {n: t[:, :, 0, 0] if attention.fullmatch(n) and np.ndim(t) == 4 else t for n, t in renamed.items()}


def release_config(names) -> KLConfig | None:
    """Latent diffusion's names (under their prefix in a whole checkpoint): the real config they belong to."""
    names = list(names)
    prefix = ldm_prefix(names)
    return None if prefix is None else kl_config_for_names(names, prefix)


def diffusers_config(names) -> KLConfig | None:
    """diffusers' names: a GroupNorm ``conv_norm_out`` and a plain ``conv_in``."""
    names = list(names)
    return kl_config_for_names(names) if {"decoder.conv_norm_out.weight", "decoder.conv_in.weight"} <= set(names) else None


def to_diffusers_names(tensors: dict[str, Any], config: KLConfig) -> dict[str, Any] | None:
    return from_ldm_names(tensors, config) if ldm_prefix(tensors) is not None else None
