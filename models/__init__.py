"""The video VAEs (Wan 2.1 / 2.2, HunyuanVideo 1.0 / 1.5) in Flax nnx: configuration, shape rules,
weight loading and compiled programs.

``models.config`` and ``models.shapes`` (and this package itself) import without JAX, so a caller
that only checks request shapes against a model's rules (the HTTP layer) never starts it. The
names below that need JAX load on first use (PEP 562 ``__getattr__``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .config import (
    ConfigError,
    HunyuanVideo15Config,
    HunyuanVideoConfig,
    VAEConfig,
    WanVAEConfig,
    config_from_dict,
    read_config,
)
from .shapes import OUTPUTS, FramesError, LatentsError, NoEncoderError, Output, ShapeError

# name -> the submodule that defines it (imported, with JAX, when the name is first used).
_LAZY = {
    "denormalize_latents": "decode", "to_uint8": "decode",
    "latent_frames": "encode", "normalize_latents": "encode",
    "MODEL_NAMES": "loading", "WeightsError": "loading", "convert_checkpoint": "loading", "load_config": "loading",
    "load_vae": "loading", "save_vae": "loading",
    "ProgramCache": "programs", "ProgramKey": "programs", "program_key": "programs",
    "VAE": "vae", "abstract_vae": "vae", "init_vae": "vae",
}

if TYPE_CHECKING:
    from .decode import denormalize_latents, to_uint8
    from .encode import latent_frames, normalize_latents
    from .loading import (
        MODEL_NAMES,
        WeightsError,
        convert_checkpoint,
        load_config,
        load_vae,
        save_vae,
    )
    from .programs import ProgramCache, ProgramKey, program_key
    from .vae import VAE, abstract_vae, init_vae


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    elif name in ("conv", "decode", "decoder", "encode", "encoder", "families", "flops", "hunyuan", "hunyuan15",
                  "keys", "layers", "loading", "programs", "spatial", "vae"):  # ``models.loading.X`` without importing the submodule first
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


__all__ = [
    "ConfigError",
    "FramesError",
    "HunyuanVideo15Config",
    "HunyuanVideoConfig",
    "LatentsError",
    "MODEL_NAMES",
    "NoEncoderError",
    "OUTPUTS",
    "Output",
    "ProgramCache",
    "ProgramKey",
    "ShapeError",
    "VAE",
    "VAEConfig",
    "WanVAEConfig",
    "WeightsError",
    "abstract_vae",
    "config_from_dict",
    "convert_checkpoint",
    "denormalize_latents",
    "init_vae",
    "latent_frames",
    "load_config",
    "load_vae",
    "normalize_latents",
    "program_key",
    "read_config",
    "save_vae",
    "to_uint8",
]
