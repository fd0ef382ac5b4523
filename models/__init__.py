"""The Wan video VAE decoder in Flax nnx, its configuration, weight loading and compiled programs."""

from .config import ConfigError, WanVAEConfig
from .decode import OUTPUTS, Output, denormalize_latents, to_uint8
from .programs import ProgramCache
from .loading import WeightsError, convert_wan_pth, load_vae, save_vae
from .vae import LatentsError, WanVAE, init_vae

__all__ = [
    "ConfigError",
    "LatentsError",
    "OUTPUTS",
    "Output",
    "ProgramCache",
    "WanVAE",
    "WanVAEConfig",
    "WeightsError",
    "convert_wan_pth",
    "denormalize_latents",
    "init_vae",
    "load_vae",
    "save_vae",
    "to_uint8",
]
