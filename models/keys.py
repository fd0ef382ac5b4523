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

Each family's checkpoint names (an original release's, latent diffusion's) are renamed to
diffusers' in the ``weights`` module of its folder.
"""

from __future__ import annotations

import numpy as np

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
