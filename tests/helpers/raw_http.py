"""HTTP/1.1 on raw sockets, for clients that misbehave: one that stops reading (a receive buffer
as small as the OS allows), one that reads at a set pace, and the answer parsed afterwards with
h11, which says whether it was complete (a body cut off has no last chunk)."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from urllib.parse import urlencode

import h11


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    complete: bool  # the body ended as HTTP says it must (its length, or the last chunk)


def send_request(address: tuple[str, int], path: str, body: bytes = b"", *, params: dict | None = None,
                 headers: dict[str, str] | None = None, receive_buffer: int | None = 4096) -> socket.socket:
    """POST ``body`` to ``path`` on a new connection and return the socket unread. With
    ``receive_buffer`` the socket's receive buffer is made that small before it connects, so a
    client that does not read holds little in its kernel."""
    sock = socket.socket()
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.connect(address)
    target = path + ("?" + urlencode(params) if params else "")
    head = {"Host": "test", "Content-Length": str(len(body)), "Content-Type": "application/octet-stream",
            **(headers or {})}
    sock.sendall(f"POST {target} HTTP/1.1\r\n".encode() + "".join(f"{k}: {v}\r\n" for k, v in head.items()).encode()
                 + b"\r\n" + body)
    return sock


def read_head(sock: socket.socket, timeout: float = 120) -> bytes:
    """Read until the status line and headers have arrived (the body may have begun); returns what was read."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        part = sock.recv(65536)
        if not part:
            break
        data += part
    return data


def read_all(sock: socket.socket, already: bytes = b"", *, rate: float | None = None, piece: int = 4096,
             timeout: float = 60) -> Answer:
    """Read to the end of the connection (``rate`` bytes a second at most, in ``piece``-byte reads)
    and parse the answer. The server closing (EOF or reset) ends the reading."""
    sock.settimeout(timeout)
    data = bytearray(already)
    start, taken = time.monotonic(), 0
    try:
        while part := sock.recv(piece if rate else 2**20):
            data += part
            taken += len(part)
            if rate:
                ahead = taken / rate - (time.monotonic() - start)
                if ahead > 0:
                    time.sleep(ahead)
    except ConnectionResetError:
        pass
    return parse_answer(bytes(data))


def parse_answer(data: bytes) -> Answer:
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="POST", target="/", headers=[("Host", "test"), ("Content-Length", "0")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(data)
    conn.receive_data(b"")
    status, headers, body, complete = 0, {}, bytearray(), False
    try:
        while (event := conn.next_event()) not in (h11.NEED_DATA, h11.PAUSED):
            if isinstance(event, h11.Response):
                status = event.status_code
                headers = {k.decode().lower(): v.decode() for k, v in event.headers}
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                complete = True
                break
            elif isinstance(event, h11.ConnectionClosed):
                break
    except h11.RemoteProtocolError:  # the connection closed in the middle of the body
        pass
    return Answer(status, headers, bytes(body), complete)
