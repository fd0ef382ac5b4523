"""uvicorn, configured so that slow or idle clients cannot hold the server.

* ``limit_concurrency`` = ``max_connections``: past it uvicorn answers 503 at once;
* ``timeout_keep_alive`` = ``keepalive_timeout_s``: idle keep-alive connections are closed;
* a read deadline uvicorn lacks (:class:`DeadlineProtocol`): the request headers must arrive
  within ``read_timeout_s`` of the connection opening or of their first byte, else 408 and close;
  a body the app did not read (an early 4xx) must finish arriving in that time too, else close.
  The app bounds the body it reads itself (``service.http.admission.read_body``).
* a write deadline uvicorn lacks too, which measures progress: while the server has bytes for a
  client that the socket does not take (the transport paused), the bytes the client has taken are
  watched (:func:`unsent_bytes`: the transport's buffer plus what the kernel holds unacknowledged);
  any taken restart the clock, and a client that takes none for ``write_timeout_s`` is dropped:
  the connection is aborted, which frees what was buffered for it, and the app sees the client
  gone (a stream stops, counted as 499). A slow but steady reader is never dropped, whatever the
  sizes of the pieces written and of the kernel's buffers.
* SIGTERM or SIGINT (Ctrl-C): the app turns draining at once (``/readyz`` 503, new work 503) and the service's drain
  begins (``ServiceState.drain``: queued and running work finishes up to ``drain_timeout_s``, then
  whatever is left is answered 503 ``unavailable``) while uvicorn closes the listening socket and
  the idle connections and waits for the answers to be written. uvicorn's own graceful timeout
  (:func:`graceful_timeout_s`) is longer than the drain, so it never cuts the drain short: it only
  ends answers still being written past it (a reader taking its answer slowly). The lifespan
  shutdown then awaits the same drain. The process exits 0, even when a device call (a compile, a
  long decode) is still running: its requests were answered, and the interpreter's exit would
  tear the device thread down from under XLA (SIGABRT).
* A second SIGTERM or SIGINT ends the drain at once: what it still waits for is answered 503 as
  at its timeout, and the shutdown goes on as above (uvicorn's own answer to a second Ctrl-C, a
  forced exit, would cancel the requests in flight: plain-text 500s, and a traceback).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import signal
import struct
import sys
import termios
from typing import Any

import h11
import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..problem import Problem
from ..settings import Settings
from .problems import PROBLEM_CONTENT_TYPE
from .state import ServiceState

log = logging.getLogger("vaeserve")


def _timeout_response(timeout_s: float) -> bytes:
    """408 for headers that did not arrive in time, written to the socket before it is closed
    (there is no request, so no app to answer it)."""
    problem = Problem(408, "request-timeout", f"the request headers did not arrive within {timeout_s:g} s",
                      expected=f"headers within {timeout_s:g} s", received="an incomplete request")
    body = json.dumps(problem.body(None, None)).encode()
    head = (f"HTTP/1.1 408 Request Timeout\r\ncontent-type: {PROBLEM_CONTENT_TYPE}\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
    return head + body


class DeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol plus two timers: a read deadline, armed while the server waits for
    request bytes that nobody else is waiting for (headers; the unread rest of a body after an
    early answer), and a write deadline, armed while the client takes none of what is written."""

    read_timeout_s: float = 30.0
    write_timeout_s: float = 30.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._deadline: asyncio.TimerHandle | None = None
        self._write_deadline: asyncio.TimerHandle | None = None
        self._arm()

    def pause_writing(self) -> None:
        """The transport holds more than its high-water mark: watch what the client takes."""
        super().pause_writing()
        if self._write_deadline is None:
            self._unsent = unsent_bytes(self.transport)
            self._taken_at = self.loop.time()
            self._write_deadline = self.loop.call_later(self._write_check_s, self._check_writing)

    def resume_writing(self) -> None:
        super().resume_writing()  # the client took enough for the transport to drain
        self._stop_write_deadline()

    @property
    def _write_check_s(self) -> float:
        return min(1.0, self.write_timeout_s / 4)

    def _check_writing(self) -> None:
        """Every ``_write_check_s`` while paused (nothing new is written then: uvicorn waits for the
        transport to drain): fewer bytes unsent is the client taking some."""
        now, unsent = self.loop.time(), unsent_bytes(self.transport)
        if unsent < self._unsent:
            self._unsent, self._taken_at = unsent, now
        idle = now - self._taken_at
        if idle >= self.write_timeout_s:
            self._write_deadline = None
            log.info("%s took none of its answer for %g s: dropped", _peer(self.client), self.write_timeout_s)
            self.transport.abort()  # close() would wait for the buffer to be read first
            return
        self._write_deadline = self.loop.call_later(min(self._write_check_s, self.write_timeout_s - idle),
                                                    self._check_writing)

    def _stop_write_deadline(self) -> None:
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._update()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._update()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._stop_write_deadline()
        super().connection_lost(exc)

    def _update(self) -> None:
        their_state = self.conn.their_state
        app_reading = self.cycle is not None and not self.cycle.response_complete
        idle = their_state is h11.IDLE and not self.conn.trailing_data[0]
        if app_reading or their_state not in (h11.IDLE, h11.SEND_BODY):
            self._disarm()
        elif idle and self.timeout_keep_alive_task is not None:
            self._disarm()  # between requests: uvicorn's keep-alive timer decides
        else:
            self._arm()

    def _arm(self) -> None:
        if self._deadline is None:
            self._deadline = self.loop.call_later(self.read_timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        awaiting_headers = self.conn.their_state is h11.IDLE and self.conn.our_state is h11.IDLE
        if awaiting_headers and self.conn.trailing_data[0]:  # part of a request arrived: say why
            self.transport.write(_timeout_response(self.read_timeout_s))
        self.transport.close()


def unsent_bytes(transport: asyncio.BaseTransport) -> int:
    """Bytes written for a client that it has not taken yet: the transport's buffer plus, on
    Linux, the socket's send queue that the client has not acknowledged (``SIOCOUTQ``; its kernel
    acknowledges only what fits its receive buffer, which frees as the client reads). Elsewhere,
    the transport's buffer alone."""
    buffered = transport.get_write_buffer_size()  # type: ignore[attr-defined]
    sock = transport.get_extra_info("socket")
    if sock is None or not hasattr(termios, "TIOCOUTQ"):
        return buffered
    try:
        queued = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
    except OSError:
        return buffered
    return buffered + queued


def _peer(client: tuple[str, int] | None) -> str:
    return f"client {client[0]}:{client[1]}" if client else "a client"


def protocol_for(settings: Settings) -> type[H11Protocol]:
    return type("DeadlineProtocol", (DeadlineProtocol,), {"read_timeout_s": settings.read_timeout_s,
                                                          "write_timeout_s": settings.write_timeout_s})


def graceful_timeout_s(settings: Settings) -> float:
    """How long uvicorn waits for the requests in progress at SIGTERM before it cancels them: the
    drain, then the time the last of them may still need — an upload under way finishing (or its
    408), and its answer taken by a reader that keeps taking it (one that stops is dropped at the
    write deadline)."""
    return settings.drain_timeout_s + settings.read_timeout_s + settings.write_timeout_s


def uvicorn_config(app: FastAPI, settings: Settings, **overrides: Any) -> uvicorn.Config:
    options: dict[str, Any] = dict(
        host=settings.host, port=settings.port, log_level=settings.log_level, lifespan="on",
        http=protocol_for(settings), limit_concurrency=settings.max_connections,
        timeout_keep_alive=settings.keepalive_timeout_s, timeout_graceful_shutdown=graceful_timeout_s(settings))
    return uvicorn.Config(app, **{**options, **overrides})


class DrainingServer(uvicorn.Server):
    """Marks the app draining the moment the signal lands, before uvicorn starts shutting down;
    a second signal (SIGINT or SIGTERM) ends the drain at once instead of uvicorn's forced exit,
    which would cancel every request in flight (plain-text 500s); shuts down when start-up was
    refused (a warm-up program that cannot fit the device)."""

    async def serve(self, sockets: list[Any] | None = None) -> None:
        self._loop = asyncio.get_running_loop()  # where a signal's work is handed (signal handlers must not do it)
        await super().serve(sockets)

    async def on_tick(self, counter: int) -> bool:
        should_exit = await super().on_tick(counter)
        return should_exit or _refused(self.config.app) is not None

    def handle_exit(self, sig: int, frame: Any) -> None:
        service = _service(self.config.app)
        if self.should_exit:  # a second signal
            if service is not None:
                self._loop.call_soon_threadsafe(service.end_drain, f"signal {signal.Signals(sig).name} again")
            return
        if service is not None:
            service.set_draining()
            models = service.models
            if models is not None and models.cluster is not None and not models.cluster.is_leader:
                models.cluster.request_stop(f"signal {signal.Signals(sig).name}")  # process 0 stops the slice
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[Any] | None = None) -> None:
        """uvicorn's shutdown, with the service's drain running beside it from its first step."""
        service = _service(self.config.app)
        if service is not None:
            service.drain()
        await super().shutdown(sockets)

    def stop(self) -> None:
        """Stop as on SIGTERM (from any thread: uvicorn's main loop polls ``should_exit``); what the
        slice asks for when process 0 stops it, or a follower asks process 0 to stop it. Asked
        again, it changes nothing (unlike a second signal)."""
        if not self.should_exit:
            self.handle_exit(signal.SIGTERM, None)


def _service(app: Any) -> ServiceState | None:
    service = getattr(getattr(app, "state", None), "service", None)
    return service if isinstance(service, ServiceState) else None


def _refused(app: Any) -> str | None:
    """The refusal message if start-up refused to serve, else None."""
    service = _service(app)
    return service.error if service is not None and service.refused else None


def serve(app: FastAPI, settings: Settings) -> int:
    server = DrainingServer(uvicorn_config(app, settings))
    service = _service(app)
    if service is not None:
        service.stop_server = server.stop
    # uvicorn re-raises the signals it caught once it has shut down, so that their default action
    # (death by SIGTERM, KeyboardInterrupt and its traceback for SIGINT) still happens. A drained
    # shutdown is a success: exit 0 instead.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: None)
    server.run()
    refusal = _refused(app)
    if refusal is not None:
        print(f"vaeserve serve: {refusal}", file=sys.stderr)
        return 3
    code = 0 if server.started else 1
    # (A multi-host slice's processes leave by their own exit: service.slice.member.)
    if service is not None and service.worker is not None and service.worker.alive and not settings.multi_process:
        _exit_now(code)
    return code


def _exit_now(code: int) -> None:
    """End the process without the interpreter's teardown: the device thread is still inside a
    device call the drain did not wait for (its requests were answered 503). Python's exit would
    unwind that thread from under XLA's C++ frames, which aborts the process (SIGABRT, "terminate
    called after throwing an instance of ''")."""
    log.warning("exiting while a device call is still running (its requests were answered)")
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
