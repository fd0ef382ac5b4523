"""Weight names and layouts: our nnx parameters ↔ diffusers ↔ the original releases.

Our parameter paths mirror diffusers' module names (``AutoencoderKLWan``,
``AutoencoderKLHunyuanVideo``, ``AutoencoderKLHunyuanVideo15``, ``AutoencoderKL``,
``AutoencoderKLFlux2``; ``AutoencoderKLQwenImage`` is Wan's), so a diffusers key is the path
joined by dots, with three renames (``kernel`` → ``weight``; an upsampler's
``resample_kernel``/``resample_bias`` → ``resample.1.weight``/``.bias``;
``time_kernel``/``time_bias`` → ``time_conv.weight``/``.bias``).

Each parameter declares its PyTorch layout where it is made (``nnx.Param(..., torch_layout=...)``,
``TORCH_LAYOUTS``): the same path can hold different layouts in different families (Wan's
attention ``norm.gamma`` is ``(C, 1, 1)``, HunyuanVideo 1.5's ``(C, 1, 1, 1)``). PyTorch → ours,
channels-last:
  conv3d       Conv3d 3x3x3   (O, I, 3, 3, 3) → (3, 3, 3, I, O)
  conv2d       Conv2d 3x3     (O, I, 3, 3)    → (3, 3, I, O)
  timeconv     Conv3d 3x1x1   (O, I, 3, 1, 1) → (3, I, O)
  pointwise3d  Conv3d 1x1x1   (O, I, 1, 1, 1) → (I, O)
  pointwise2d  Conv2d 1x1     (O, I, 1, 1)    → (I, O)
  linear       Linear         (O, I)          → (I, O)
  vector       bias, GroupNorm weight (C,)   → (C,)
  gamma2d / gamma3d  RMS gamma (C, 1, 1) / (C, 1, 1, 1) → (C,)  (also LTX's per-channel noise scales)
  table        LTX's scale/shift tables (4 or 2, C) → the same
  scalar       LTX's timestep multiplier ()          → ()

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

import numpy as np

_RESIDUAL = {"residual.0.gamma": "norm1.gamma", "residual.2": "conv1", "residual.3.gamma": "norm2.gamma",
             "residual.6": "conv2", "shortcut": "conv_shortcut"}
_RESIDUAL_BACK = {v: k for k, v in _RESIDUAL.items()}
_PARAM_RENAMES = {"kernel": "weight", "resample_kernel": "resample.1.weight", "resample_bias": "resample.1.bias",
                  "time_kernel": "time_conv.weight", "time_bias": "time_conv.bias"}
TORCH_LAYOUTS = ("conv3d", "conv2d", "timeconv", "pointwise3d", "pointwise2d", "linear", "vector", "gamma2d",
                 "gamma3d", "table", "scalar")


# -- ours ↔ diffusers ----------------------------------------------------------------------------
def diffusers_key(path: tuple) -> str:
    *modules, leaf = (str(p) for p in path)
    return ".".join([*modules, _PARAM_RENAMES.get(leaf, leaf)])


def layout(var) -> str:
    """The PyTorch layout a parameter declared (``torch_layout=`` on its ``nnx.Param``)."""
    found = getattr(var, "torch_layout", None)
    if found not in TORCH_LAYOUTS:
        raise ValueError(f"parameter of shape {tuple(var.shape)} declares no known torch_layout: {found!r}")
    return found


def torch_shape(var) -> tuple[int, ...]:
    """The diffusers tensor shape of our parameter ``var`` (a variable: its shape and layout)."""
    kind, shape = layout(var), tuple(var.shape)
    if kind in ("gamma2d", "gamma3d"):
        return (shape[0],) + (1,) * (2 if kind == "gamma2d" else 3)
    if kind in ("vector", "table", "scalar"):
        return shape
    if kind == "conv2d":
        return (shape[3], shape[2], shape[0], shape[1])
    if kind == "timeconv":
        return (shape[2], shape[1], shape[0], 1, 1)
    if kind in ("pointwise3d", "pointwise2d", "linear"):
        return (shape[1], shape[0]) + (1,) * {"pointwise3d": 3, "pointwise2d": 2, "linear": 0}[kind]
    return (shape[4], shape[3], shape[0], shape[1], shape[2])


def from_torch(var, array: np.ndarray) -> np.ndarray:
    """A diffusers tensor (already checked to be ``torch_shape(var)``) in our layout."""
    kind = layout(var)
    if kind in ("gamma2d", "gamma3d", "vector", "table", "scalar"):
        return array.reshape(var.shape)
    if kind == "conv2d":
        return array.transpose(2, 3, 1, 0)
    if kind == "timeconv":
        return array[:, :, :, 0, 0].transpose(2, 1, 0)
    if kind in ("pointwise3d", "pointwise2d", "linear"):
        return array.reshape(array.shape[:2]).T
    return array.transpose(2, 3, 4, 1, 0)


def to_torch(var, array: np.ndarray) -> np.ndarray:
    """Our parameter ``var``'s value ``array`` in the diffusers layout (inverse of ``from_torch``)."""
    kind = layout(var)
    target = torch_shape(var)
    if kind in ("gamma2d", "gamma3d", "vector", "table", "scalar"):
        return array.reshape(target)
    if kind == "conv2d":
        return array.transpose(3, 2, 0, 1)
    if kind == "timeconv":
        return array.transpose(2, 1, 0).reshape(target)
    if kind in ("pointwise3d", "pointwise2d", "linear"):
        return array.T.reshape(target)
    return array.transpose(4, 3, 0, 1, 2)


# -- original Wan ↔ diffusers --------------------------------------------------------------------
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


# -- original HunyuanVideo ↔ diffusers -------------------------------------------------------------
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


# -- LDM (original Stable Diffusion, SDXL, Flux) ↔ diffusers: AutoencoderKL --------------------------
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
# 1x1 convs there, ``(O, I, 1, 1)``: diffusers' linear layers take them as ``(O, I)`` (``loading``).
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
# -- original LTX-Video / LTX-2 (Lightricks' single files) ↔ diffusers -----------------------------------
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
