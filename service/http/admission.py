"""Reading request bodies without letting clients hold memory or time: a byte budget shared by
every body being read, a deadline on each read, and a client that leaves mid-upload reported as
such (499) rather than as a server error.

Everything here runs on the event loop (one thread), so the budget needs no lock.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.requests import ClientDisconnect, Request

from ..problem import Problem
from .problems import ClientGone

# The body is unread (or half read) when these go out: the connection cannot be reused.
_CLOSE = {"Connection": "close"}


class ByteBudget:
    """At most ``limit`` bytes of request bodies in memory at once, counted from the moment a
    request starts reading until its latents are parsed."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0

    def take(self, size: int, retry_after_s: int) -> None:
        if self.used + size > self.limit:
            raise Problem(429, "busy-reading", f"{self.used} bytes of request bodies are being read already",
                          expected=f"at most {self.limit} bytes at once", received=self.used + size,
                          headers={"Retry-After": str(retry_after_s), **_CLOSE})
        self.used += size

    def give(self, size: int) -> None:
        self.used -= size


def declared_length(request: Request) -> int | None:
    """``Content-Length`` (already checked to be an integer by the body-header dependency)."""
    length = request.headers.get("content-length")
    return int(length) if length is not None else None


@asynccontextmanager
async def read_body(request: Request, *, max_bytes: int, budget: ByteBudget, timeout_s: float,
                    retry_after_s: int) -> AsyncIterator[bytes]:
    """The body, held against ``budget`` for as long as the ``async with`` block runs.

    413 past ``max_bytes`` (chunked bodies carry no Content-Length, so it is enforced while
    reading), 429 when the budget is spent, 408 when the body has not arrived within
    ``timeout_s``, :class:`ClientGone` when the client hangs up.
    """
    held = declared_length(request) or 0
    budget.take(held, retry_after_s)
    try:
        parts: list[bytes] = []
        total = 0
        try:
            async with asyncio.timeout(timeout_s):
                async for part in request.stream():
                    total += len(part)
                    if total > max_bytes:
                        raise Problem(413, "payload-too-large", "body is over the limit",
                                      expected=f"<= {max_bytes} bytes", received=f"> {max_bytes} bytes (chunked)",
                                      headers=_CLOSE)
                    if total > held:  # chunked: take the budget as the bytes come
                        budget.take(total - held, retry_after_s)
                        held = total
                    parts.append(part)
        except TimeoutError:
            raise Problem(408, "request-timeout", f"the body did not arrive within {timeout_s:g} s",
                          expected=f"the whole body within {timeout_s:g} s", received=f"{total} bytes",
                          headers=_CLOSE) from None
        except ClientDisconnect:
            raise ClientGone(f"client left after {total} bytes of the body") from None
        body = b"".join(parts)
        del parts
        yield body
    finally:
        budget.give(held)
