"""The VAEs in Flax nnx: configuration, shape rules, weight loading and compiled programs. Each
family lives in a folder of ``models/families/``; ``models.registry`` lists them (``FAMILIES``).

``models.config``, ``models.shapes``, ``models.registry`` (and this package itself) import without
JAX, so a caller that only checks request shapes against a model's rules (the HTTP layer) never
starts it. The names below that need JAX load on first use (PEP 562 ``__getattr__``).
"""

from __future__ import annotations

if __name__ != "vaeserve.models":  # the checkout's folder imported by its own name would load every module twice
    raise ImportError(f"this is the package vaeserve.models: import it as `vaeserve.models`, not `{__name__}`")

import ast
import importlib
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import ConfigError as ConfigError, VAEConfig as VAEConfig
from .registry import config_from_dict as config_from_dict, read_config as read_config
from .shapes import (
    OUTPUTS as OUTPUTS,
    FramesError as FramesError,
    LatentsError as LatentsError,
    NoEncoderError as NoEncoderError,
    Output as Output,
    ShapeError as ShapeError,
)

# The names that need JAX (and the families' config classes, whose folders the registry imports on
# first use), each declared once: in this block, which type checkers read. At run time the same
# block is the table of what ``__getattr__`` imports on first use (``_lazy_names``).
if TYPE_CHECKING:
    from .decode import (
        denormalize_latents as denormalize_latents,
        to_uint8 as to_uint8,
    )
    from .encode import (
        latent_frames as latent_frames,
        normalize_latents as normalize_latents,
    )
    from .families.hunyuan.config import HunyuanVideoConfig as HunyuanVideoConfig
    from .families.hunyuan15.config import HunyuanVideo15Config as HunyuanVideo15Config
    from .families.kl.config import (
        AutoencoderKLConfig as AutoencoderKLConfig,
        AutoencoderKLFlux2Config as AutoencoderKLFlux2Config,
    )
    from .families.ltx.config import (
        LTX2VideoConfig as LTX2VideoConfig,
        LTXVideoConfig as LTXVideoConfig,
    )
    from .families.qwen_image.config import QwenImageConfig as QwenImageConfig
    from .families.wan.config import WanVAEConfig as WanVAEConfig
    from .loading import (
        MODEL_NAMES as MODEL_NAMES,
        WeightsError as WeightsError,
        convert_checkpoint as convert_checkpoint,
        load_config as load_config,
        load_vae as load_vae,
        save_vae as save_vae,
    )
    from .programs import (
        ProgramCache as ProgramCache,
        ProgramKey as ProgramKey,
        program_key as program_key,
    )
    from .vae import (
        VAE as VAE,
        abstract_vae as abstract_vae,
        init_vae as init_vae,
    )


def _lazy_names() -> dict[str, str]:
    """name -> submodule, read from the ``if TYPE_CHECKING:`` block of this file."""
    tree = ast.parse(Path(__file__).read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    return {alias.name: node.module or "" for node in block.body if isinstance(node, ast.ImportFrom)
            for alias in node.names}


_LAZY = _lazy_names()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    elif importlib.util.find_spec(f".{name}", __name__) is not None:  # ``models.loading.X`` without importing it first
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value
