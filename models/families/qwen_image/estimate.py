"""Qwen-Image's VAE as the memory estimate sees it: Wan 2.1's layers on its config
(``QwenImageConfig.wan()``), with coefficients of its own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vaeserve.models.estimate import FamilyEstimate, coefficients
from vaeserve.models.families.wan.estimate import (
    wan21_frame_encode_unused,
    wan_decoder,
    wan_encoder,
    wan_first_step_unused,
)

from .config import QwenImageConfig


def on_wan(function: Callable[..., Any]) -> Callable[..., Any]:
    """A Wan 2.1 function of this module, on Qwen-Image's config: its VAE is Wan 2.1's
    (``QwenImageConfig.wan()``)."""
    def on_qwen(config: QwenImageConfig, *args: Any, **kwargs: Any) -> Any:
        return function(config.wan(), *args, **kwargs)
    return on_qwen


QWEN_IMAGE = FamilyEstimate(on_wan(wan_decoder), on_wan(wan_encoder),
    matmul={"decode": coefficients(0.175, 0.0, 0.0, 1.756, 0.0, 0.130), "encode": coefficients(0.0, 0.0, 0.0, 2.003, 0.0, 3.350)},
    onednn={"decode": coefficients(0.0, 0.0, 0.0, 0.309, 1.876, 0.326),
    "encode": coefficients(0.0, 1.701, 0.0, 0.011, 1.606, 0.371)},
    first_step_unused=on_wan(wan_first_step_unused),
    frame_encode_unused=on_wan(wan21_frame_encode_unused))


def family_estimate(config: QwenImageConfig) -> FamilyEstimate:
    del config
    return QWEN_IMAGE
