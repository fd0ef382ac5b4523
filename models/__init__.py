"""The Wan 2.1 / 2.2 video VAE decoders in Flax nnx, their configuration, weight loading and compiled programs."""

from .config import ConfigError, WanVAEConfig
from .decode import OUTPUTS, Output, denormalize_latents, to_uint8
from .programs import ProgramCache
from .loading import MODEL_NAMES, WeightsError, convert_wan_pth, load_config, load_vae, save_vae
from .vae import LatentsError, WanVAE, abstract_vae, init_vae

__all__ = [
    "ConfigError",
    "LatentsError",
    "MODEL_NAMES",
    "OUTPUTS",
    "Output",
    "ProgramCache",
    "WanVAE",
    "WanVAEConfig",
    "WeightsError",
    "abstract_vae",
    "convert_wan_pth",
    "denormalize_latents",
    "init_vae",
    "load_config",
    "load_vae",
    "save_vae",
    "to_uint8",
]
