"""Every failure leaves the service as ``application/problem+json`` (RFC 9457).

A problem body always has ``type``, ``title``, ``status``, ``detail`` and ``instance``, plus the
extension members ``request_id`` and, where the client sent something wrong, ``expected`` and
``received`` so the caller can fix the request without reading server logs.

The engine raises its own errors (``service.engine.errors``); :func:`engine_problem` is the one
place that says which HTTP status and problem type each of them is.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..engine.errors import (
    DeadlineExceeded,
    DeviceFailed,
    EngineError,
    ModelNotNamed,
    ModelNotServed,
    NoEncoder,
    NonFiniteOutput,
    OutOfMemory,
    QueueFull,
    ShapeNotServed,
    SlowReader,
    TooLargeForMemory,
    Unavailable,
)
from ..problem import Problem, deadline_problem

log = logging.getLogger("vaeserve")

PROBLEM_CONTENT_TYPE = "application/problem+json"
CLIENT_GONE = 499  # the client closed the connection before the answer (nginx's code)


class ClientGone(Exception):
    """The client closed the connection before the answer (reported as status 499)."""


def retry_after(seconds: int) -> dict[str, str]:
    return {"Retry-After": str(seconds)}


def engine_problem(error: EngineError, *, retry_after_s: int, request_id: str | None = None,
                   scaling: str | None = None) -> Problem:
    """The problem an engine error is answered with. ``scaling`` describes how the request's
    latents were scaled (named when the decode came out non-finite)."""
    if isinstance(error, QueueFull):
        return Problem(429, "queue-full", str(error), expected=f"fewer than {error.limit} waiting",
                       received=error.waiting, headers=retry_after(retry_after_s))
    if isinstance(error, Unavailable):
        return Problem(503, "unavailable", str(error), headers=retry_after(retry_after_s))
    if isinstance(error, DeadlineExceeded):
        return deadline_problem(str(error))
    if isinstance(error, SlowReader):
        return Problem(408, "slow-reader", str(error), expected=f"frames taken as they come (behind for less than "
                       f"{error.seconds:g} s while others wait)", received=f"{error.behind_bytes} bytes not taken")
    if isinstance(error, ModelNotServed):
        return Problem(404, "model-not-found", str(error), expected=error.served, received=error.received)
    if isinstance(error, ModelNotNamed):
        return Problem(422, "model-not-named", str(error), expected=error.served, received="no model named")
    if isinstance(error, ShapeNotServed):
        return Problem(422, "shape-not-allowed", str(error), expected=error.allowed, received=error.received)
    if isinstance(error, TooLargeForMemory):
        # 422, not 5xx: it is this request on this server, refused the same way every time (a
        # client or proxy that retries 5xx would only get the same answer again), and not 413:
        # the body is not too large, what it decodes to is.
        return Problem(422, "too-large-for-memory", str(error),
                       expected={"bytes": f"<= {error.available}", "would_fit": error.would_fit},
                       received={"input": error.received, "bytes": error.needed})
    if isinstance(error, OutOfMemory):
        return Problem(503, "out-of-memory", f"{error}; request id {request_id}", headers=retry_after(retry_after_s))
    if isinstance(error, NoEncoder):
        return Problem(501, "no-encoder", str(error), expected="a full VAE checkpoint", received="decoder only")
    if isinstance(error, NonFiniteOutput):
        detail = f"{error}: the latents overflow the model in float arithmetic"
        return Problem(422, "non-finite-output", f"{detail} ({scaling})" if scaling else detail,
                       expected="latents (after scaling_factor, shift_factor and denormalize) the model decodes "
                       "to finite frames", received=f"{error.count} NaN/Inf values in the decoded frames")
    if isinstance(error, DeviceFailed):
        return Problem(500, "device-error", f"{error}; request id {request_id}")
    return Problem(500, "internal-error", f"{type(error).__name__}: {error}; request id {request_id}")


def render_problem(problem: Problem, path: str | None, request_id: str | None) -> JSONResponse:
    headers = dict(problem.headers)
    if request_id:
        headers["X-Request-Id"] = request_id
    return JSONResponse(problem.body(path, request_id), status_code=problem.status, headers=headers,
                        media_type=PROBLEM_CONTENT_TYPE)


def problem_response(problem: Problem, request: Request) -> JSONResponse:
    return render_problem(problem, request.url.path, getattr(request.state, "request_id", None))


def _http_slug(status: int) -> str:
    return {
        400: "bad-request",
        401: "unauthorized",
        404: "not-found",
        405: "method-not-allowed",
        413: "payload-too-large",
        415: "unsupported-media-type",
        429: "queue-full",
        503: "unavailable",
    }.get(status, f"http-{status}")


async def _on_problem(request: Request, exc: Problem) -> JSONResponse:
    return problem_response(exc, request)


async def _on_client_gone(request: Request, exc: ClientGone) -> Response:
    """The client left before its answer: nobody reads this one (counted as 499)."""
    log.info("request %s: %s", getattr(request.state, "request_id", None), exc)
    return Response(status_code=CLIENT_GONE)


async def _on_engine_error(request: Request, exc: EngineError) -> JSONResponse:
    settings = request.app.state.service.settings
    problem = engine_problem(exc, retry_after_s=settings.retry_after_s,
                             request_id=getattr(request.state, "request_id", None))
    return problem_response(problem, request)


async def _on_http_exception(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    problem = Problem(
        exc.status_code, _http_slug(exc.status_code), str(exc.detail), headers=dict(exc.headers or {})
    )
    return problem_response(problem, request)


# pydantic's bounds (an error's ``ctx``), said as our problems say them: ``timestep <= 1.0``.
_BOUNDS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


def _expected(error: Any) -> str:
    """What a parameter must be, in words: its bounds, else pydantic's message."""
    name = str((error.get("loc") or ("",))[-1])
    context = error.get("ctx") or {}
    bounds = [f"{name} {op} {_jsonable(context[key])}" for key, op in _BOUNDS.items() if key in context]
    return " and ".join(bounds) or f"{name}: {error.get('msg', 'valid')}"


async def _on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """pydantic's validation errors as every other problem: what the first parameter must be in
    ``expected`` (text, naming it), what arrived in ``received``; every error in ``detail``."""
    errors = exc.errors()
    first = errors[0] if errors else {}
    detail = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', 'invalid')}" for e in errors)
    problem = Problem(
        422,
        "invalid-parameter",
        detail or "invalid request",
        expected=_expected(first) if first else None,
        received=_jsonable(first.get("input")),
    )
    return problem_response(problem, request)


def internal_error(exc: BaseException, request_id: str | None) -> Problem:
    return Problem(500, "internal-error", f"internal error ({type(exc).__name__}); request id {request_id}")


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return repr(value)


def install_error_handlers(app: FastAPI) -> None:
    """Client errors and the engine's. Unexpected exceptions are answered by
    ``service.http.middleware.RequestContext``: a handler for ``Exception`` would run in
    Starlette's ServerErrorMiddleware, which re-raises after answering, and uvicorn then drops the
    keep-alive connection without saying so."""
    app.add_exception_handler(Problem, _on_problem)  # type: ignore[arg-type]
    app.add_exception_handler(ClientGone, _on_client_gone)  # type: ignore[arg-type]
    app.add_exception_handler(EngineError, _on_engine_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _on_http_exception)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _on_validation_error)  # type: ignore[arg-type]
