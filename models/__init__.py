"""The Wan 2.1 / 2.2 video VAE (decoder and encoder) in Flax nnx, its configuration, weight loading and
compiled programs."""

from .config import ConfigError, WanVAEConfig
from .decode import OUTPUTS, Output, denormalize_latents, to_uint8
from .encode import latent_frames, normalize_latents
from .loading import MODEL_NAMES, WeightsError, convert_wan_pth, load_config, load_vae, save_vae
from .programs import ProgramCache, ProgramKey, program_key
from .vae import FramesError, LatentsError, NoEncoderError, ShapeError, WanVAE, abstract_vae, init_vae

__all__ = [
    "ConfigError",
    "FramesError",
    "LatentsError",
    "MODEL_NAMES",
    "NoEncoderError",
    "OUTPUTS",
    "Output",
    "ProgramCache",
    "ProgramKey",
    "ShapeError",
    "WanVAE",
    "WanVAEConfig",
    "WeightsError",
    "abstract_vae",
    "convert_wan_pth",
    "denormalize_latents",
    "init_vae",
    "latent_frames",
    "load_config",
    "load_vae",
    "normalize_latents",
    "program_key",
    "save_vae",
    "to_uint8",
]
