"""Wan's checkpoint names: the original releases' (``Wan2.1_VAE.pth``, ``Wan2.2_VAE.pth``) ↔ diffusers'.

Original Wan release (``Wan2.1_VAE.pth``) → diffusers, decoder side, with R = num_res_blocks:
  conv2.*                          → post_quant_conv.*        (conv1.* → quant_conv.*)
  decoder.conv1.*                  → decoder.conv_in.*
  decoder.middle.{0,2}.residual.{0.gamma,2.*,3.gamma,6.*}
                                   → decoder.mid_block.resnets.{0,1}.{norm1.gamma,conv1.*,norm2.gamma,conv2.*}
  decoder.middle.1.*               → decoder.mid_block.attentions.0.*
  decoder.upsamples.{k}.residual.* → decoder.up_blocks.{k // (R+2)}.resnets.{k % (R+2)}.*   (k % (R+2) ≤ R)
  decoder.upsamples.{k}.shortcut.* → decoder.up_blocks.{k // (R+2)}.resnets.{k % (R+2)}.conv_shortcut.*
  decoder.upsamples.{k}.{resample.1,time_conv}.* (k % (R+2) = R+1)
                                   → decoder.up_blocks.{k // (R+2)}.upsamplers.0.{resample.1,time_conv}.*
  decoder.head.0.gamma / head.2.*  → decoder.norm_out.gamma / decoder.conv_out.*
  The encoder follows the same residual renames with a flat ``downsamples.k`` → ``down_blocks.k``.

Original Wan 2.2 (``Wan2.2_VAE.pth``): blocks nest their layers, so no index arithmetic is needed.
  decoder.upsamples.{i}.upsamples.{j}.residual.* / .shortcut.*   (j ≤ R)
                                   → decoder.up_blocks.{i}.resnets.{j}.* / .conv_shortcut.*
  decoder.upsamples.{i}.upsamples.{R+1}.{resample.1,time_conv}.*
                                   → decoder.up_blocks.{i}.upsampler.*     (``avg_shortcut``: no weights)
  encoder.downsamples.{i}.downsamples.{j}.* (j < R) → encoder.down_blocks.{i}.resnets.{j}.*
  encoder.downsamples.{i}.downsamples.{R}.*         → encoder.down_blocks.{i}.downsampler.*
  conv1/conv2, {encoder,decoder}.conv1, middle.*, head.* as for Wan 2.1.
"""

from __future__ import annotations

import re
from typing import Any

from .config import WanVAEConfig

_RESIDUAL = {"residual.0.gamma": "norm1.gamma", "residual.2": "conv1", "residual.3.gamma": "norm2.gamma",
             "residual.6": "conv2", "shortcut": "conv_shortcut"}
_RESIDUAL_BACK = {v: k for k, v in _RESIDUAL.items()}


def _rename_residual(rest: str, table: dict[str, str]) -> str:
    for old, new in table.items():
        if rest == old or rest.startswith(old + "."):
            return new + rest[len(old):]
    return rest


def original_to_diffusers(key: str, num_res_blocks: int) -> str:
    """Rename one key of the original Wan 2.1 VAE state dict to its diffusers name."""
    group = num_res_blocks + 2
    if key.startswith("conv1."):
        return "quant_conv." + key[len("conv1."):]
    if key.startswith("conv2."):
        return "post_quant_conv." + key[len("conv2."):]
    match = re.fullmatch(r"(encoder|decoder)\.(.*)", key)
    if not match:
        return key
    side, rest = match.groups()
    if rest.startswith("conv1."):
        return f"{side}.conv_in.{rest[len('conv1.'):]}"
    if rest.startswith("head.0."):
        return f"{side}.norm_out.{rest[len('head.0.'):]}"
    if rest.startswith("head.2."):
        return f"{side}.conv_out.{rest[len('head.2.'):]}"
    middle = re.fullmatch(r"middle\.(\d+)\.(.*)", rest)
    if middle:
        index, tail = int(middle.group(1)), middle.group(2)
        if index == 1:
            return f"{side}.mid_block.attentions.0.{tail}"
        return f"{side}.mid_block.resnets.{index // 2}.{_rename_residual(tail, _RESIDUAL)}"
    nested = re.fullmatch(r"(downsamples|upsamples)\.(\d+)\.(downsamples|upsamples)\.(\d+)\.(.*)", rest)
    if nested:  # Wan 2.2: residual down/up blocks
        block, layer, tail = nested.group(2), nested.group(4), nested.group(5)
        blocks, resampler = ("down_blocks", "downsampler") if side == "encoder" else ("up_blocks", "upsampler")
        if tail.startswith(("resample.", "time_conv.")):
            return f"{side}.{blocks}.{block}.{resampler}.{tail}"
        return f"{side}.{blocks}.{block}.resnets.{layer}.{_rename_residual(tail, _RESIDUAL)}"
    stage = re.fullmatch(r"(downsamples|upsamples)\.(\d+)\.(.*)", rest)
    if stage and side == "encoder":
        return f"encoder.down_blocks.{stage.group(2)}.{_rename_residual(stage.group(3), _RESIDUAL)}"
    if stage:
        block, position = divmod(int(stage.group(2)), group)
        tail = stage.group(3)
        if position == num_res_blocks + 1:
            return f"decoder.up_blocks.{block}.upsamplers.0.{tail}"
        return f"decoder.up_blocks.{block}.resnets.{position}.{_rename_residual(tail, _RESIDUAL)}"
    return key


def diffusers_to_original(key: str, num_res_blocks: int, *, residual: bool = False) -> str:
    """Inverse of ``original_to_diffusers`` (used to write original-format test checkpoints).

    ``residual``: the Wan 2.2 layout (``config.is_residual``), whose blocks nest their layers.
    """
    group = num_res_blocks + 2
    simple = {"quant_conv.": "conv1.", "post_quant_conv.": "conv2."}
    for new, old in simple.items():
        if key.startswith(new):
            return old + key[len(new):]
    match = re.fullmatch(r"(encoder|decoder)\.(.*)", key)
    if not match:
        return key
    side, rest = match.groups()
    for new, old in (("conv_in.", "conv1."), ("norm_out.", "head.0."), ("conv_out.", "head.2.")):
        if rest.startswith(new):
            return f"{side}.{old}{rest[len(new):]}"
    if rest.startswith("mid_block.attentions.0."):
        return f"{side}.middle.1.{rest[len('mid_block.attentions.0.'):]}"
    mid = re.fullmatch(r"mid_block\.resnets\.(\d+)\.(.*)", rest)
    if mid:
        return f"{side}.middle.{2 * int(mid.group(1))}.{_rename_residual(mid.group(2), _RESIDUAL_BACK)}"
    if residual:
        nested = _residual_to_original(side, rest, num_res_blocks)
        if nested is not None:
            return nested
    down = re.fullmatch(r"down_blocks\.(\d+)\.(.*)", rest)
    if down:
        return f"encoder.downsamples.{down.group(1)}.{_rename_residual(down.group(2), _RESIDUAL_BACK)}"
    up = re.fullmatch(r"up_blocks\.(\d+)\.(resnets\.(\d+)|upsamplers\.0)\.(.*)", rest)
    if up:
        block, tail = int(up.group(1)), up.group(4)
        if up.group(3) is None:
            return f"decoder.upsamples.{block * group + num_res_blocks + 1}.{tail}"
        return f"decoder.upsamples.{block * group + int(up.group(3))}.{_rename_residual(tail, _RESIDUAL_BACK)}"
    return key


def _residual_to_original(side: str, rest: str, num_res_blocks: int) -> str | None:
    """Wan 2.2 block keys (after ``{side}.``) in the original nesting; None for other keys."""
    stage = "downsamples" if side == "encoder" else "upsamples"  # the block list and its layers' list
    resampler_index = num_res_blocks if side == "encoder" else num_res_blocks + 1
    match = re.fullmatch(r"(?:down|up)_blocks\.(\d+)\.(resnets\.(\d+)|downsampler|upsampler)\.(.*)", rest)
    if not match:
        return None
    block, layer, tail = match.group(1), match.group(3), match.group(4)
    if layer is None:
        return f"{side}.{stage}.{block}.{stage}.{resampler_index}.{tail}"
    return f"{side}.{stage}.{block}.{stage}.{layer}.{_rename_residual(tail, _RESIDUAL_BACK)}"


def is_release_naming(names) -> bool:
    """Original Wan release names (``decoder.middle.*``, ``decoder.upsamples.*``, ``conv2.*``)."""
    return any(n.startswith(("decoder.middle.", "decoder.upsamples.", "conv2.")) for n in names)


def release_naming_config(names) -> WanVAEConfig:
    """The real config of the original Wan release whose key names these are: Wan 2.2's blocks nest
    their layers (``decoder.upsamples.0.upsamples.0.*``), Wan 2.1's are flat."""
    nested = re.compile(r"decoder\.upsamples\.\d+\.upsamples\.")
    return WanVAEConfig.wan22() if any(nested.match(n) for n in names) else WanVAEConfig()


def release_config(names) -> WanVAEConfig | None:
    """The real config of the original Wan release whose names these are, or None."""
    return release_naming_config(names) if is_release_naming(names) else None


def diffusers_config(names) -> None:
    """Wan's diffusers names are the default (``models.loading.config_for_names``): never claimed here."""
    del names


def to_diffusers_names(tensors: dict[str, Any], config: WanVAEConfig) -> dict[str, Any] | None:
    """An original Wan checkpoint's tensors under diffusers' names (None: not in the original naming)."""
    if not is_release_naming(tensors):
        return None
    return {original_to_diffusers(n, config.num_res_blocks): t for n, t in tensors.items()}
