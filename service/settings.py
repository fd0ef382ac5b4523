"""Every knob of the service, in one pydantic-settings class.

Build it inside the app factory or the CLI (``Settings()``), never at import time, so tests and
embedders can make their own. Environment variables use the prefix ``VAESERVE_`` (for example
``VAESERVE_MAX_QUEUE=64``); lists such as ``warmup`` are given as JSON in the environment
(``VAESERVE_WARMUP='["16x21x60x104"]'``) or repeated on the command line.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

LatentShape = tuple[int, int, int, int]  # (C, T, H, W) of one latent, without the batch dim

_SHAPE_RE = re.compile(r"^\s*(\d+)\s*[x,]\s*(\d+)\s*[x,]\s*(\d+)\s*[x,]\s*(\d+)\s*$")


def parse_latent_shape(text: str | tuple | list) -> LatentShape:
    """``"16x21x60x104"`` (or ``"16,21,60,104"``, or a 4-sequence) -> ``(16, 21, 60, 104)``."""
    if isinstance(text, (tuple, list)):
        values = tuple(int(v) for v in text)
    else:
        match = _SHAPE_RE.match(text)
        if match is None:
            raise ValueError(f"latent shape must look like CxTxHxW (e.g. 16x21x60x104), got {text!r}")
        values = tuple(int(v) for v in match.groups())
    if len(values) != 4 or min(values) < 1:
        raise ValueError(f"latent shape needs 4 positive sizes (C, T, H, W), got {text!r}")
    return values  # type: ignore[return-value]


class Settings(BaseSettings):
    """Service configuration. Defaults suit one host with a handful of accelerators."""

    model_config = SettingsConfigDict(env_prefix="VAESERVE_", extra="ignore", protected_namespaces=())

    # --- model and mesh -------------------------------------------------------------------
    model: str | None = Field(None, description="diffusers-format VAE folder; None = embedded default")
    dtype: Literal["float32", "bfloat16"] = "float32"
    tp: int = Field(1, ge=1, description="devices per frame (horizontal bands)")
    dp: int = Field(1, ge=1, description="data-parallel replicas; batches are padded to a multiple")
    cpu_devices: int | None = Field(
        None, ge=1, description="fake this many CPU devices (testing tp/dp without accelerators)"
    )
    warmup: list[LatentShape] = Field(
        default_factory=list, description="latent shapes (C, T, H, W) compiled before /readyz is 200"
    )
    compile_cache: str | None = Field(None, description="JAX persistent compilation cache directory")

    # --- network --------------------------------------------------------------------------
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_key: SecretStr | None = Field(None, description="if set, require 'Authorization: Bearer KEY'")
    log_level: str = "info"

    # --- scheduling -----------------------------------------------------------------------
    max_queue: int = Field(16, ge=1, description="requests waiting for the device; more -> 429")
    max_batch: int = Field(4, ge=1, description="latents decoded together (also the per-request B limit)")
    request_timeout_s: float = Field(300.0, gt=0, description="deadline from arrival; past it -> 504")
    retry_after_s: int = Field(1, ge=0, description="Retry-After sent with 429 and 503")
    drain_timeout_s: float = Field(60.0, ge=0, description="SIGTERM: time to finish queued work")

    # --- input limits (checked before any device work) ------------------------------------
    max_body_bytes: int = Field(64 * 2**20, ge=1, description="Content-Length above this -> 413")
    max_frames: int = Field(129, ge=1, description="output frames per video, 1 + 4 (T - 1)")
    max_height: int = Field(1280, ge=8, description="output height in pixels, 8 H")
    max_width: int = Field(1280, ge=8, description="output width in pixels, 8 W")

    # --- output defaults ------------------------------------------------------------------
    default_fps: int = Field(16, ge=1, le=240)
    default_crf: int = Field(18, ge=0, le=51)

    # --- testing ----------------------------------------------------------------------------
    fault_injection: bool = Field(
        False, description="honour 'X-Vaeserve-Fault: device' (tests of the 500 path only)"
    )

    @field_validator("warmup", mode="before")
    @classmethod
    def _parse_warmup(cls, value):
        if isinstance(value, str):
            value = [part for part in value.split(";") if part.strip()]
        return [parse_latent_shape(v) for v in value]
