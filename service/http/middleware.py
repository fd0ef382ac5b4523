"""``RequestContext``: the ASGI middleware around every request.

* a request id on every request and response (``X-Request-Id``; the client's if it is sane);
* the ``vaeserve_requests_total{route,status}`` counter, by the path of the route that matched
  (``scope["route"]``, set by the router; ``other`` when none did) (499 when the
  client left first, also mid-answer: a stream cut off because its reader left or stopped
  reading; a stream the app cut off for an error counts that error's status);
* ``vaeserve_request_seconds``: a decode or encode request's arrival (``request.state.arrived``,
  set when it is admitted: ``service.http.lifecycle``) to the last byte of its successful answer,
  streams included;
* ``Connection: close`` on any answer sent before the request body was read to its end (the
  client may still be sending it; keeping the connection would mean reading it for nothing);
* the security headers, declared here once: ``X-Content-Type-Options: nosniff`` on every answer;
  on every HTML answer ``X-Frame-Options: DENY`` and a Content-Security-Policy, ``PAGE_POLICY``
  (this origin's scripts, styles and media only; no inline script or style; no frames around it)
  unless the route names another (``REDOC_POLICY``);
* a request that says where its body ends twice (``Content-Length`` and ``Transfer-Encoding``)
  is answered 400 ``ambiguous-framing`` and its connection closed, before any route sees it: a
  proxy in front may have read the body's end from the other header, so whatever follows on the
  connection may be another request smuggled inside this body (RFC 9112 §6.3);
* unexpected exceptions become one logged traceback and a 500 problem on a connection that stays
  usable. (Starlette's own handler re-raises after answering, and uvicorn then closes the
  keep-alive connection without ``Connection: close``, so a pooled client's next request fails.)

Pure ASGI rather than BaseHTTPMiddleware so streaming bodies and disconnects pass through.
"""

from __future__ import annotations

import logging
import re
import time
import uuid

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..metrics import Metrics
from ..problem import Problem
from .problems import CLIENT_GONE, internal_error, render_problem

log = logging.getLogger("vaeserve")

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")

CONTENT_SECURITY_POLICY = "Content-Security-Policy"
# Every page the service serves (/ui, /docs): scripts and styles from files of this origin only,
# video from the page's own MediaSource (blob:), calls to this origin only, never in a frame.
PAGE_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
               "media-src 'self' blob:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
               "form-action 'self'; frame-ancestors 'none'")
# Redoc makes its styles as it renders (styled-components inserts <style> elements, which no hash
# can name in advance) and runs its search in a worker it builds from a blob: those two, no more.
REDOC_POLICY = PAGE_POLICY.replace("style-src 'self'", "style-src 'self' 'unsafe-inline'") + "; worker-src blob:"


def _has_body(headers: Headers) -> bool:
    return headers.get("content-length", "0") not in ("", "0") or "transfer-encoding" in headers


def framing_problem(headers: Headers) -> Problem | None:
    """400 for a request with both ``Content-Length`` and ``Transfer-Encoding`` (the connection is
    closed after it: ``Connection: close``); None for any other."""
    if "content-length" not in headers or "transfer-encoding" not in headers:
        return None
    return Problem(400, "ambiguous-framing", "the request gives both Content-Length and Transfer-Encoding, so "
                   "where its body ends is ambiguous (RFC 9112 section 6.3): the connection is closed",
                   expected="Content-Length or Transfer-Encoding", received="both", headers={"Connection": "close"})


class _Exchange:
    """What one request/response exchange has done so far."""

    def __init__(self, scope: Scope):
        headers = Headers(scope=scope)
        given = headers.get("x-request-id", "")
        self.request_id = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
        self.body_done = not _has_body(headers)
        self.client_gone = False
        self.status: int | None = None
        self.complete = False  # the last body message was sent


def _secure(headers: MutableHeaders) -> None:
    headers.setdefault("X-Content-Type-Options", "nosniff")
    if headers.get("content-type", "").startswith("text/html"):
        headers.setdefault(CONTENT_SECURITY_POLICY, PAGE_POLICY)
        headers.setdefault("X-Frame-Options", "DENY")


class RequestContext:
    def __init__(self, app: ASGIApp, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        exchange = _Exchange(scope)
        scope.setdefault("state", {})["request_id"] = exchange.request_id

        async def receive_tracked() -> Message:
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                exchange.body_done = True
            elif message["type"] == "http.disconnect":
                exchange.client_gone = True
            return message

        async def send_with_context(message: Message) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                exchange.complete = True
            if message["type"] == "http.response.start":
                exchange.status = message["status"]
                headers = MutableHeaders(scope=message)
                if "x-request-id" not in headers:
                    headers.append("X-Request-Id", exchange.request_id)
                if not exchange.body_done and "connection" not in headers:
                    headers.append("Connection", "close")
                _secure(headers)
            await send(message)

        try:
            framing = framing_problem(Headers(scope=scope))
            if framing is not None:
                response = render_problem(framing, scope["path"], exchange.request_id)
                return await response(scope, receive_tracked, send_with_context)
            await self.app(scope, receive_tracked, send_with_context)
        except Exception as exc:
            if exchange.status is not None:
                raise  # mid-response: only closing the connection can tell the client
            log.exception("unhandled error in request %s", exchange.request_id)
            response = render_problem(internal_error(exc, exchange.request_id), scope["path"], exchange.request_id)
            await response(scope, receive_tracked, send_with_context)
        finally:
            self._count(scope, exchange)

    def _count(self, scope: Scope, exchange: _Exchange) -> None:
        route = getattr(scope.get("route"), "path", None) or "other"
        status = exchange.status
        if status is None:  # nothing was sent: the client left, or the app never answered
            status = CLIENT_GONE if exchange.client_gone else 500
        elif not exchange.complete:  # cut off mid-answer: by the app for an error, or the client left
            status = scope.get("state", {}).get("cut_status") or (CLIENT_GONE if exchange.client_gone else 500)
        self.metrics.requests.labels(route, str(status)).inc()
        arrived = scope.get("state", {}).get("arrived")
        if arrived is not None and exchange.complete and 200 <= status < 300:
            self.metrics.total_seconds.observe(time.monotonic() - arrived)
