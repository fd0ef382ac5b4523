"""Every failure leaves the service as ``application/problem+json`` (RFC 9457).

A problem body always has ``type``, ``title``, ``status``, ``detail`` and ``instance``, plus the
extension members ``request_id`` and, where the client sent something wrong, ``expected`` and
``received`` so the caller can fix the request without reading server logs.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

PROBLEM_CONTENT_TYPE = "application/problem+json"
PROBLEM_BASE = "https://vaeserve.dev/problems/"


class ClientGone(Exception):
    """The client closed the connection before the answer (reported as status 499, nginx's code)."""


CLIENT_GONE = 499


class Problem(Exception):
    """An error the service reports to the client; raised anywhere, rendered by one handler."""

    def __init__(
        self,
        status: int,
        slug: str,
        detail: str,
        *,
        title: str | None = None,
        expected: Any = None,
        received: Any = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(detail)
        self.status = status
        self.slug = slug
        self.title = title or slug.replace("-", " ").capitalize()
        self.detail = detail
        self.expected = expected
        self.received = received
        self.headers = headers or {}

    def body(self, instance: str, request_id: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": PROBLEM_BASE + self.slug,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            "instance": instance,
            "request_id": request_id,
        }
        if self.expected is not None:
            body["expected"] = self.expected
        if self.received is not None:
            body["received"] = self.received
        return body


def render_problem(problem: Problem, path: str, request_id: str | None) -> JSONResponse:
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


async def _on_http_exception(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    problem = Problem(
        exc.status_code, _http_slug(exc.status_code), str(exc.detail), headers=dict(exc.headers or {})
    )
    return problem_response(problem, request)


async def _on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    first = errors[0] if errors else {}
    where = ".".join(str(part) for part in first.get("loc", ()))
    problem = Problem(
        422,
        "invalid-parameter",
        f"{where}: {first.get('msg', 'invalid')}" if where else "invalid request",
        expected=[{"loc": list(e.get("loc", ())), "msg": e.get("msg")} for e in errors],
        received=[_jsonable(e.get("input")) for e in errors],
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
    """Client errors. Unexpected exceptions are answered by ``service.middleware.RequestContext``:
    a handler for ``Exception`` would run in Starlette's ServerErrorMiddleware, which re-raises
    after answering, and uvicorn then drops the keep-alive connection without saying so."""
    app.add_exception_handler(Problem, _on_problem)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _on_http_exception)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _on_validation_error)  # type: ignore[arg-type]
