"""Request and response models of the HTTP API (what /docs shows)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

OutputType = Literal["mp4", "pt", "npy", "png"]


@dataclass(frozen=True)
class DecodeParams:
    """Query parameters of ``POST /v1/decode`` after defaults and aliases are resolved."""

    output_type: OutputType
    denormalize: bool
    partial_postprocess: bool
    stream: bool
    fps: int
    crf: int
    frame: int
    shape: tuple[int, ...] | None
    dtype: str | None
    scaling_factor: float | None
    shift_factor: float | None
    timeout_s: float


class Health(BaseModel):
    status: Literal["ok", "failed"]


class Ready(BaseModel):
    status: str
    ready: bool
    detail: str | None = None


class MeshInfo(BaseModel):
    dp: int
    tp: int
    devices: list[str]


class ModelInfo(BaseModel):
    id: str
    source: str | None
    random_weights: bool | None
    dtype: str
    config: dict[str, Any]
    metadata: dict[str, Any]
    mesh: MeshInfo
    batch_buckets: list[int]
    warmed_shapes: list[list[int]]
    compiled: list[list[Any]]


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelInfo]


class Problem(BaseModel):
    """RFC 9457 problem details (``application/problem+json``)."""

    type: str
    title: str
    status: int
    detail: str
    instance: str
    request_id: str | None = None
    expected: Any = None
    received: Any = None
