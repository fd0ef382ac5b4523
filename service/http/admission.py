"""Admitting request bodies without letting clients hold memory or time: a byte budget shared by
every body being read, a deadline on each read, a client that leaves mid-upload reported as such
(499) rather than as a server error; and the host account for what requests hold on the host
(decoded frames, answers, stream buffers), which a request waits for, in turn, up to its deadline.

Everything here runs on the event loop (one thread), so the budgets need no lock.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive

from ..engine.errors import TooLargeForMemory
from ..problem import Problem
from .problems import ClientGone

# The body is unread (or half read) when these go out: the connection cannot be reused.
_CLOSE = {"Connection": "close"}
T = TypeVar("T")


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
async def read_body(request: Request, *, max_bytes: int, budget: ByteBudget, timeout_s: float, stall_s: float,
                    retry_after_s: int) -> AsyncIterator[bytes]:
    """The body, held against ``budget`` for as long as the ``async with`` block runs.

    413 past ``max_bytes`` (chunked bodies carry no Content-Length, so it is enforced while
    reading), 429 when the budget is spent, 408 when the body has not arrived within
    ``timeout_s`` or no byte of it arrived for ``stall_s``, :class:`ClientGone` when the client
    hangs up.
    """
    held = declared_length(request) or 0
    budget.take(held, retry_after_s)
    try:
        parts: list[bytes] = []
        total = 0
        try:
            async with asyncio.timeout(timeout_s):
                parts_in = request.stream()
                while (part := await _next_part(parts_in, stall_s)) is not None:
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
        except UploadStalled:
            raise Problem(408, "upload-stalled", f"no byte of the body arrived for {stall_s:g} s",
                          expected=f"a byte at least every {stall_s:g} s", received=f"{total} bytes, then nothing",
                          headers=_CLOSE) from None
        except ClientDisconnect:
            raise ClientGone(f"client left after {total} bytes of the body") from None
        body = b"".join(parts)
        del parts
        yield body
    finally:
        budget.give(held)


class UploadStalled(Exception):
    """No part of a body arrived within the stall deadline."""


async def _next_part(parts: AsyncIterator[bytes], stall_s: float) -> bytes | None:
    """The next part of a body (``None`` at its end), which must arrive within ``stall_s`` (else ``UploadStalled``)."""
    try:
        async with asyncio.timeout(stall_s):
            return await anext(parts)
    except StopAsyncIteration:
        return None
    except TimeoutError:
        raise UploadStalled from None


async def unless_client_leaves(receive: Receive, work: Awaitable[T], *, deadline: float | None = None,
                               on_give_up: Callable[[str], None] | None = None) -> T:
    """The result of ``work``, raced against the client leaving and ``deadline``
    (``time.monotonic()``): :class:`ClientGone` if the client disconnects first, ``TimeoutError``
    once the deadline passes. Giving up, ``on_give_up("client-gone" | "deadline")`` is called
    first, then ``work`` is cancelled. The request body must be read already (the next ASGI
    message can then only be ``http.disconnect``)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
    try:
        done, _ = await asyncio.wait({task, watcher}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # cancelled from outside: nothing may outlive the request
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    reason = "client-gone" if watcher in done else "deadline"
    if on_give_up is not None:
        on_give_up(reason)
    task.cancel()
    if reason == "client-gone":
        raise ClientGone("the client left")
    raise TimeoutError


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class MemoryBudget:
    """At most ``limit`` bytes held at once on the host by the requests in flight (the host account:
    ``service.http.host_memory`` says what each holds), from the moment their headers say how large
    they will be until their answer is sent.

    A request that does not fit waits; waiters are served first come, first served, so a large
    request is not passed over forever by small ones. ``in_use`` reports the bytes held. A request
    larger than the whole account is refused at once (``TooLargeForMemory``)."""

    def __init__(self, limit: int, in_use: Callable[[int], None] = lambda used: None):
        self.limit = limit
        self.used = 0
        self._waiting: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()
        self._report = in_use

    def _grant(self) -> None:
        while self._waiting:
            size, granted = self._waiting[0]
            if granted.done():  # cancelled: the request gave up waiting
                self._waiting.popleft()
                continue
            if self.used + size > self.limit:
                break
            self._waiting.popleft()
            self.used += size
            granted.set_result(None)
        self._report(self.used)

    def release(self, size: int) -> None:
        self.used -= size
        self._grant()

    async def acquire(self, size: int, *, deadline: float, retry_after_s: int, receive: Receive) -> None:
        """Hold ``size`` bytes: at once when they fit and nobody waits, else in turn. 503 (with
        ``Retry-After``) if the turn has not come by ``deadline`` (``time.monotonic()``),
        :class:`ClientGone` if the client leaves while it waits."""
        if size > self.limit:
            raise TooLargeForMemory(f"this request holds {size} bytes on the host, more than the {self.limit} this "
                                    "server holds for all requests (host-memory-bytes)", needed=size,
                                    available=self.limit, received=f"{size} bytes on the host",
                                    would_fit=["a smaller video, or fewer frames", "a stream (stream=true) for a "
                                               "decode: it holds a few steps of frames, not all of them"])
        if not self._waiting and self.used + size <= self.limit:
            self.used += size
            self._report(self.used)
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((size, granted))
        try:
            await unless_client_leaves(receive, granted, deadline=deadline)
        except ClientGone:
            self._give_up(granted, size)
            raise ClientGone("client left while its request waited for decoding memory") from None
        except TimeoutError:
            self._give_up(granted, size)
            raise Problem(503, "busy-host-memory", f"{self.used} of the {self.limit} bytes of host memory for "
                          f"requests are in use; this request's {size} bytes did not fit before its deadline",
                          expected=f"{size} bytes free of {self.limit}", received=f"{self.limit - self.used} bytes free",
                          headers={"Retry-After": str(retry_after_s)}) from None
        except BaseException:  # cancelled from outside: hand back what may have been granted
            self._give_up(granted, size)
            raise

    def _give_up(self, granted: asyncio.Future[None], size: int) -> None:
        if granted.done() and not granted.cancelled():
            self.release(size)
        else:
            granted.cancel()
            self._grant()  # the waiters behind this one may fit now

    @asynccontextmanager
    async def hold(self, size: int, *, deadline: float, retry_after_s: int, receive: Receive) -> AsyncIterator[None]:
        await self.acquire(size, deadline=deadline, retry_after_s=retry_after_s, receive=receive)
        try:
            yield
        finally:
            self.release(size)
