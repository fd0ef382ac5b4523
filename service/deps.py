"""FastAPI dependencies: settings and worker from ``app.state``, auth, body limits, query params."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, Header, Query, Request

from .codec import check_content_type, parse_shape
from .errors import Problem
from .metrics import Metrics
from .protocol import DecodeParams, OutputType
from .settings import Settings
from .worker import Worker


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_worker(request: Request) -> Worker:
    return request.app.state.worker


def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


SettingsDep = Annotated[Settings, Depends(get_settings)]
WorkerDep = Annotated[Worker, Depends(get_worker)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]


def require_api_key(settings: SettingsDep, authorization: Annotated[str | None, Header()] = None) -> None:
    """``Authorization: Bearer KEY`` when an API key is configured; constant-time comparison."""
    if settings.api_key is None:
        return
    scheme, _, token = (authorization or "").partition(" ")
    expected = settings.api_key.get_secret_value()
    if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), expected.encode()):
        raise Problem(401, "unauthorized", "missing or wrong bearer token",
                      expected="Authorization: Bearer <key>",
                      received="no Authorization header" if authorization is None else "a different token",
                      headers={"WWW-Authenticate": 'Bearer realm="vaeserve"'})


def check_body_headers(request: Request, settings: SettingsDep) -> str:
    """415 and 413 from the headers alone, before a byte of the body is read."""
    kind = check_content_type(request.headers.get("content-type"))
    length = request.headers.get("content-length")
    if length is not None:
        try:
            size = int(length)
        except ValueError:
            raise Problem(400, "bad-content-length", "Content-Length is not an integer", received=length) from None
        if size > settings.max_body_bytes:
            raise Problem(413, "payload-too-large", f"body of {size} bytes is over the limit",
                          expected=f"<= {settings.max_body_bytes} bytes", received=size)
    return kind


async def read_body(request: Request, limit: int) -> bytes:
    """The body, enforcing the limit while streaming (chunked uploads carry no Content-Length)."""
    parts, total = [], 0
    async for part in request.stream():
        total += len(part)
        if total > limit:
            raise Problem(413, "payload-too-large", "body is over the limit",
                          expected=f"<= {limit} bytes", received=f"> {limit} bytes (chunked)")
        parts.append(part)
    return b"".join(parts)


def decode_params(
    settings: SettingsDep,
    output_type: OutputType = "mp4",
    denormalize: Annotated[bool | None, Query(description="z * latents_std + latents_mean first")] = None,
    do_scaling: Annotated[bool | None, Query(description="diffusers' name for denormalize")] = None,
    partial_postprocess: Annotated[bool, Query(description="pt: uint8 frames instead of float16")] = False,
    stream: Annotated[bool, Query(description="stream raw uint8 frames chunk by chunk")] = False,
    fps: Annotated[int | None, Query(ge=1, le=240)] = None,
    crf: Annotated[int | None, Query(ge=0, le=51)] = None,
    frame: Annotated[int, Query(ge=0, description="png: which output frame")] = 0,
    shape: Annotated[list[str] | None, Query(description="raw bodies: B,C,T,H,W or C,T,H,W")] = None,
    dtype: Annotated[str | None, Query(description="raw bodies: float32 | float16 | bfloat16")] = None,
    scaling_factor: Annotated[float | None, Query(gt=0)] = None,
    shift_factor: float | None = None,
    timeout_s: Annotated[float | None, Query(gt=0, description="deadline, capped by the server's")] = None,
) -> DecodeParams:
    if denormalize is None:
        denormalize = bool(do_scaling)
    cap = settings.request_timeout_s
    return DecodeParams(
        output_type=output_type, denormalize=denormalize, partial_postprocess=partial_postprocess,
        stream=stream, fps=fps or settings.default_fps, crf=settings.default_crf if crf is None else crf,
        frame=frame, shape=parse_shape(shape), dtype=dtype, scaling_factor=scaling_factor,
        shift_factor=shift_factor, timeout_s=min(timeout_s or cap, cap),
    )


DecodeParamsDep = Annotated[DecodeParams, Depends(decode_params)]
BodyKindDep = Annotated[str, Depends(check_body_headers)]
ApiKeyDep = Depends(require_api_key)
