"""diffusers' MiniMax-H3 VAE with seeded weights, shared by the parity tests and the served
ones: its residual scales and register tokens (zeros at init) drawn too, so that every block
changes the output, and tiling on at the config's tiles."""

from __future__ import annotations

from typing import Any

from vaeserve.models.families.minimax_h3.config import TILING_FIELDS, AutoencoderKLMiniMaxH3Config


def seeded_reference(config: AutoencoderKLMiniMaxH3Config) -> Any:
    import diffusers
    import torch

    torch.manual_seed(0)
    model: Any = diffusers.AutoencoderKLMiniMaxH3(**{k: v for k, v in config.to_dict().items() if k != "_class_name"})
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(("scale1", "scale2", "register_tokens")):
                parameter.normal_(0, 0.5)
    model.enable_tiling(*(getattr(config, name) for name in TILING_FIELDS))
    return model.eval()
