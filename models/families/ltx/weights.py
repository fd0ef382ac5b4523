"""LTX-Video's and LTX-2's checkpoint names: Lightricks' single files ↔ diffusers'.
"""

from __future__ import annotations

import re
from typing import Any

from vaeserve.models.config import VAEConfig

from .config import LTX2VideoConfig, LTXVideoConfig

LTXConfig = LTXVideoConfig | LTX2VideoConfig


# Lightricks' checkpoints hold the VAE under ``vae.`` (beside the transformer, and for LTX-2 the audio
# VAE), its blocks in one flat list per side: ``decoder.up_blocks.{k}`` is the mid block (k = 0), then
# each up block's parts in order — its width-changing resnet (``conv_in``), its upsampler, its
# resnets — and ``encoder.down_blocks.{k}`` each down block's resnets, downsampler and ``conv_out``,
# then the mid block. A resnet list is ``res_blocks``; the decoder's last time embedding and table are
# ``last_time_embedder`` / ``last_scale_shift_table``; the latents' statistics are
# ``per_channel_statistics.{mean,std}-of-means``. LTX-Video's width-changing resnets hold their
# LayerNorm under ``norm3.norm`` and their shortcut conv unwrapped (diffusers: ``conv_shortcut.conv``).
LTX_PREFIX = "vae."
_LTX_STATISTICS = {"per_channel_statistics.mean-of-means": "latents_mean",
                   "per_channel_statistics.std-of-means": "latents_std"}
_LTX_DROPPED = ("per_channel_statistics.channel", "per_channel_statistics.mean-of-stds")
_LTX_LAST = {"decoder.last_time_embedder.": "decoder.time_embedder.",
             "decoder.last_scale_shift_table": "decoder.scale_shift_table"}


def ltx_block_prefixes(decoder_plan, encoder_plan) -> dict[str, list[str]]:
    """Each flat original block's diffusers prefix, per side (``"decoder"``, ``"encoder"``)."""
    decoder = ["mid_block"]
    for i, block in enumerate(decoder_plan.up_blocks):
        decoder += ([f"up_blocks.{i}.conv_in"] if block.cin != block.cout else [])
        decoder += ([f"up_blocks.{i}.upsamplers.0"] if block.stride else []) + [f"up_blocks.{i}"]
    encoder = []
    for i, block in enumerate(encoder_plan.down_blocks):
        encoder += [f"down_blocks.{i}"] + ([f"down_blocks.{i}.downsamplers.0"] if block.kind else [])
        encoder += [f"down_blocks.{i}.conv_out"] if block.kind in ("conv", None) and block.cin != block.cout else []
    return {"decoder": decoder, "encoder": [*encoder, "mid_block"]}


def _ltx_rename_parts(rest: str, table: tuple[tuple[str, str], ...]) -> str:
    for old, new in table:
        rest = rest.replace(old, new)
    return rest


def _ltx_parts(wrapped_shortcut: bool) -> tuple[tuple[str, str], ...]:
    parts: tuple[tuple[str, str], ...] = (("res_blocks.", "resnets."), ("norm3.norm.", "norm3."))
    return parts + ((("conv_shortcut.", "conv_shortcut.conv."),) if wrapped_shortcut else ())


def ltx_original_to_diffusers(key: str, prefixes: dict[str, list[str]], *, wrapped_shortcut: bool) -> str | None:
    """One key of a Lightricks checkpoint's VAE (``vae.`` already removed) under its diffusers name,
    or None for a tensor diffusers does not keep (the other statistics)."""
    if key.startswith(_LTX_DROPPED):
        return None
    if key in _LTX_STATISTICS:
        return _LTX_STATISTICS[key]
    for old, new in _LTX_LAST.items():
        if key.startswith(old):
            return new + key[len(old):]
    match = re.fullmatch(r"(decoder|encoder)\.(up|down)_blocks\.(\d+)\.(.*)", key)
    if match and int(match.group(3)) < len(prefixes[match.group(1)]):
        side, index, rest = match.group(1), int(match.group(3)), match.group(4)
        key = f"{side}.{prefixes[side][index]}.{rest}"
    return _ltx_rename_parts(key, _ltx_parts(wrapped_shortcut))


def ltx_diffusers_to_original(key: str, prefixes: dict[str, list[str]], *, wrapped_shortcut: bool) -> str:
    """Inverse of ``ltx_original_to_diffusers`` (to write original-format test checkpoints), with
    ``vae.`` in front."""
    back = {v: k for k, v in _LTX_STATISTICS.items()}
    if key in back:
        return LTX_PREFIX + back[key]
    for old, new in _LTX_LAST.items():
        if key.startswith(new):
            return LTX_PREFIX + old + key[len(new):]
    key = _ltx_rename_parts(key, tuple((new, old) for old, new in _ltx_parts(wrapped_shortcut)))
    side, _, rest = key.partition(".")
    for index, prefix in sorted(enumerate(prefixes.get(side, [])), key=lambda p: -len(p[1])):
        if rest.startswith(prefix + "."):
            return f"{LTX_PREFIX}{side}.{'up' if side == 'decoder' else 'down'}_blocks.{index}.{rest[len(prefix) + 1:]}"
    return LTX_PREFIX + key


def is_release_naming(names) -> bool:
    """Lightricks' LTX-Video / LTX-2 names (``vae.decoder.up_blocks.0.res_blocks.0.*``)."""
    return any(n.startswith("vae.") and ".res_blocks." in n for n in names)


def release_naming_config(names) -> VAEConfig:
    """The real config of the LTX release whose (original) tensor names these are: LTX-Video 0.9.0
    (ten decoder blocks), 0.9.1 (a timestep embedding, strided-conv encoder), 0.9.5 – 0.9.8 (a
    timestep embedding, space-to-depth encoder), LTX-2.3 / 2.5 (nine decoder blocks) or LTX-2."""
    names = {n.removeprefix("vae.") for n in names}
    if "decoder.up_blocks.9.res_blocks.0.conv1.conv.weight" in names:
        return LTXVideoConfig()
    if "decoder.last_time_embedder.timestep_embedder.linear_1.weight" in names:
        return LTXVideoConfig.v095() if "encoder.down_blocks.1.conv.conv.weight" in names else LTXVideoConfig.v091()
    if any(n.startswith("decoder.up_blocks.8.") for n in names):
        return LTX2VideoConfig.ltx23()
    return LTX2VideoConfig.ltx2()


def diffusers_release_config(names: set[str]) -> VAEConfig:
    """``release_naming_config`` for diffusers' names: four up blocks are LTX-Video 0.9.0 (strided-conv
    encoder) or LTX-2.3; a decoder time embedding LTX-Video 0.9.1 (strided-conv encoder) or 0.9.5."""
    strided = "encoder.down_blocks.0.downsamplers.0.conv.weight" in names
    if "decoder.time_embedder.timestep_embedder.linear_1.weight" in names:
        return LTXVideoConfig.v091() if strided else LTXVideoConfig.v095()
    if any(n.startswith("decoder.up_blocks.3.") for n in names):
        return LTXVideoConfig() if strided else LTX2VideoConfig.ltx23()
    return LTX2VideoConfig.ltx2()


def ltx_to_diffusers_names(tensors: dict[str, Any], config: LTXConfig) -> dict[str, Any]:
    """A Lightricks checkpoint's ``vae.*`` tensors under diffusers' names (``ltx_original_to_diffusers``);
    the transformer's, the audio VAE's and the statistics diffusers does not keep are left out."""
    prefixes = ltx_block_prefixes(config.decoder_plan(), config.encoder_plan())
    wrapped = config.decoder_plan().conv_shortcut_wrapped
    renamed = {}
    for name, tensor in tensors.items():
        if name.startswith(LTX_PREFIX):
            new = ltx_original_to_diffusers(name[len(LTX_PREFIX):], prefixes, wrapped_shortcut=wrapped)
            if new is not None:
                renamed[new] = tensor
    return renamed


def release_config(names) -> VAEConfig | None:
    return release_naming_config(names) if is_release_naming(names) else None


def diffusers_config(names) -> VAEConfig | None:
    """diffusers' names: the ``latents_mean`` buffer beside a wrapped ``conv_in.conv`` (maybe under ``vae.``)."""
    names = {n.removeprefix("vae.") for n in names}
    return diffusers_release_config(names) if {"latents_mean", "decoder.conv_in.conv.weight"} <= names else None


def to_diffusers_names(tensors: dict[str, Any], config: LTXConfig) -> dict[str, Any] | None:
    return ltx_to_diffusers_names(tensors, config) if is_release_naming(tensors) else None
