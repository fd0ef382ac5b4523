"""Qwen-Image's VAE (diffusers' ``AutoencoderKLQwenImage``): the Wan 2.1 decoder and encoder, built
from a Qwen-Image config (``QwenImageConfig.wan()``), with Qwen-Image's weights.

diffusers' class is a copy of ``AutoencoderKLWan``'s Wan 2.1 path under other config keys
(``input_channels`` for ``in_channels``/``out_channels``, no Wan 2.2 options); the layers and
weight names are the same, so these are the Wan modules themselves. Qwen-Image decodes images:
one latent frame, which the Wan decoder turns into one frame (its upsamplers' time convs only run
on later latent frames).
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from vaeserve.models.families.wan.decoder import WanDecoder
from vaeserve.models.families.wan.encoder import WanEncoder, check_encoder_config as check_wan_encoder

from .config import QwenImageConfig


class QwenImageDecoder(WanDecoder):
    """``WanDecoder`` of ``config.wan()``."""

    def __init__(self, config: QwenImageConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        super().__init__(config.wan(), rngs=rngs, dtype=dtype)


class QwenImageEncoder(WanEncoder):
    """``WanEncoder`` of ``config.wan()``."""

    def __init__(self, config: QwenImageConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        super().__init__(config.wan(), rngs=rngs, dtype=dtype)


def check_encoder_config(config: QwenImageConfig) -> None:
    """Raise ``ConfigError`` for a config whose decoder runs but whose encoder does not (Wan's rules)."""
    check_wan_encoder(config.wan())
