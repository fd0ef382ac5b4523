"""The Wan 2.1 video VAE decoder in Flax nnx, its configuration and weight loading."""

from .config import ConfigError, WanVAEConfig
from .decode import denormalize_latents, to_uint8
from .loading import WeightsError, convert_wan_pth, load_vae, save_vae
from .vae import LatentsError, WanVAE, init_vae

__all__ = [
    "ConfigError",
    "LatentsError",
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
