"""``Problem``: a request the service refuses, said so that the caller can fix it.

Raised by the codecs (a body that does not parse or does not fit), the HTTP layer (headers,
deadlines) and, mapped from the engine's own errors (``service.engine.errors``), by the routes.
The HTTP layer renders it as ``application/problem+json`` (RFC 9457: ``service.http.problems``);
the command-line tools print its detail. Nothing here depends on HTTP machinery.
"""

from __future__ import annotations

from typing import Any

PROBLEM_BASE = "https://vaeserve.dev/problems/"


class Problem(Exception):
    """An error reported to the client: an HTTP status, a slug (the problem type), a detail, and
    where the client sent something wrong, what was ``expected`` and what was ``received``."""

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

    def body(self, instance: str | None, request_id: str | None) -> dict[str, Any]:
        """The RFC 9457 document: ``type``, ``title``, ``status``, ``detail``, ``instance``,
        ``request_id`` and, when known, ``expected`` and ``received``."""
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



def deadline_problem(detail: str) -> Problem:
    """504: the request's deadline (``request_timeout_s``, or its ``timeout_s``) passed first."""
    return Problem(504, "deadline-exceeded", detail, expected="an answer before the request's deadline",
                   received="deadline passed")
