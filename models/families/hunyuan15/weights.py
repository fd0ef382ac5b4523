"""HunyuanVideo 1.5's checkpoint names: the original release's ↔ diffusers'.
"""

from __future__ import annotations

import re
from typing import Any

from .config import HunyuanVideo15Config

# HunyuanVideo 1.0's original VAE (``hunyuan-video-t2v-720p/vae/pytorch_model.pt``) already uses
# diffusers' names (diffusers' conversion script renames nothing), sometimes under a ``vae.`` prefix.
# HunyuanVideo 1.5's (``vae/diffusion_pytorch_model.safetensors`` of tencent/HunyuanVideo-1.5) names
# its blocks like the original latent-diffusion VAE:
#   {encoder,decoder}.{down,up}.{i}.block.{j}.*   → {…}.{down,up}_blocks.{i}.resnets.{j}.*
#   {encoder,decoder}.{down,up}.{i}.{down,up}sample.* → {…}.{down,up}_blocks.{i}.{down,up}samplers.0.*
#   {…}.mid.block_{1,2}.*                         → {…}.mid_block.resnets.{0,1}.*
#   {…}.mid.attn_1.{q,k,v}.*                      → {…}.mid_block.attentions.0.to_{q,k,v}.*
#   {…}.mid.attn_1.{norm,proj_out}.*              → {…}.mid_block.attentions.0.{norm,proj_out}.*
_HUNYUAN15_RENAMES = (
    (r"^(encoder|decoder)\.(down|up)\.(\d+)\.block\.(\d+)\.", r"\1.\2_blocks.\3.resnets.\4."),
    (r"^(encoder|decoder)\.(down|up)\.(\d+)\.(down|up)sample\.", r"\1.\2_blocks.\3.\4samplers.0."),
    (r"^(encoder|decoder)\.mid\.block_1\.", r"\1.mid_block.resnets.0."),
    (r"^(encoder|decoder)\.mid\.block_2\.", r"\1.mid_block.resnets.1."),
    (r"^(encoder|decoder)\.mid\.attn_1\.([qkv])\.", r"\1.mid_block.attentions.0.to_\2."),
    (r"^(encoder|decoder)\.mid\.attn_1\.", r"\1.mid_block.attentions.0."),
)
_HUNYUAN15_BACK = (
    (r"^(encoder|decoder)\.(down|up)_blocks\.(\d+)\.resnets\.(\d+)\.", r"\1.\2.\3.block.\4."),
    (r"^(encoder|decoder)\.(down|up)_blocks\.(\d+)\.(down|up)samplers\.0\.", r"\1.\2.\3.\4sample."),
    (r"^(encoder|decoder)\.mid_block\.resnets\.0\.", r"\1.mid.block_1."),
    (r"^(encoder|decoder)\.mid_block\.resnets\.1\.", r"\1.mid.block_2."),
    (r"^(encoder|decoder)\.mid_block\.attentions\.0\.to_([qkv])\.", r"\1.mid.attn_1.\2."),
    (r"^(encoder|decoder)\.mid_block\.attentions\.0\.", r"\1.mid.attn_1."),
)


def _first_rename(key: str, table: tuple[tuple[str, str], ...]) -> str:
    for pattern, replacement in table:
        renamed, count = re.subn(pattern, replacement, key)
        if count:
            return renamed
    return key


def hunyuan15_original_to_diffusers(key: str) -> str:
    """Rename one key of the original HunyuanVideo 1.5 VAE to its diffusers name."""
    return _first_rename(key, _HUNYUAN15_RENAMES)


def hunyuan15_diffusers_to_original(key: str) -> str:
    """Inverse of ``hunyuan15_original_to_diffusers`` (to write original-format test checkpoints)."""
    return _first_rename(key, _HUNYUAN15_BACK)


def is_release_naming(names) -> bool:
    """Original HunyuanVideo 1.5 names (``decoder.mid.block_1.*``, ``decoder.up.0.block.0.*``, RMS
    ``gamma``s: latent diffusion's names of an AutoencoderKL are alike, with GroupNorm ``weight``s)."""
    names = list(names)
    return (any(n.startswith(("decoder.mid.", "decoder.up.", "encoder.down.", "encoder.mid.")) for n in names)
            and not any(n.endswith("decoder.mid.block_1.norm1.weight") for n in names))


def release_config(names) -> HunyuanVideo15Config | None:
    return HunyuanVideo15Config() if is_release_naming(names) else None


def diffusers_config(names) -> HunyuanVideo15Config | None:
    """diffusers' names: a wrapped ``conv_in.conv`` without HunyuanVideo 1.0's GroupNorm
    ``conv_norm_out`` or LTX's ``latents_mean``."""
    names = {n.removeprefix("vae.") for n in names}
    if "decoder.conv_in.conv.weight" in names and not {"decoder.conv_norm_out.weight", "latents_mean"} & names:
        return HunyuanVideo15Config()
    return None


def to_diffusers_names(tensors: dict[str, Any], config: HunyuanVideo15Config) -> dict[str, Any] | None:
    del config
    if not is_release_naming(tensors):
        return None
    return {hunyuan15_original_to_diffusers(n): t for n, t in tensors.items()}
