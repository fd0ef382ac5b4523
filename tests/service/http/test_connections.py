"""Connections against a real uvicorn server (in a thread, configured as ``vaeserve serve`` does):
errors leave keep-alive connections usable, slow and idle clients are cut off, the number of
connections is bounded, and full queues or reading budgets answer before the body is read."""

from __future__ import annotations

import json
import logging
import socket
import time

import httpx
import pytest

from tests.helpers.raw_http import read_head
from tests.helpers.service_helpers import (
    GarbageRunner,
    GatedRunner,
    gated_warm_up,
    latents,
    marked,
    post_in_thread,
    thread_server,
    wait_until,
)

PROBLEM = "application/problem+json"
SHORT = (1, 16, 2, 4, 4)  # two decode steps


def request_head(content_length: int, *, path: str = "/v1/decode?shape=1,16,2,4,4&dtype=float32") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: tensor/binary\r\n"
            f"Content-Length: {content_length}\r\n\r\n").encode()


# The read and keep-alive timeouts below are the product's promise (a slow or idle client is cut
# off); the tests allow this much more for a loaded machine, and assert no lower bound.
SLACK_S = 10.0


def read_reply(sock: socket.socket, timeout: float = 10 + SLACK_S) -> tuple[str, dict, bytes, bool]:
    """(status line, headers, body, closed) of one response; ``closed``: the server hung up after it."""
    head, _, body = read_head(sock, timeout).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(body) < int(headers.get("content-length", 0)):
        part = sock.recv(65536)
        if not part:
            break
        body += part
    try:
        closed = sock.recv(1) == b""
    except ConnectionResetError:  # closed with bytes of ours unread: a reset is a close too
        closed = True
    except TimeoutError:
        closed = False
    return lines[0], headers, body, closed


def assert_closed_within(sock: socket.socket, seconds: float) -> float:
    """The server closes ``sock`` within its promised ``seconds`` (plus ``SLACK_S``)."""
    start = time.monotonic()
    sock.settimeout(seconds + SLACK_S + 5)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    elapsed = time.monotonic() - start
    assert elapsed < seconds + SLACK_S, elapsed
    return elapsed


# ---- errors keep the connection usable --------------------------------------------------------


def test_pooled_connection_survives_internal_errors(tiny_vae):
    # The hostile run: after an internal 500 the server dropped the keep-alive connection without
    # saying so, and 18 of 20 next requests on a pooled httpx client failed.
    x = latents()
    params = {"shape": "1,16,2,4,4", "dtype": "float32"}
    with thread_server(tiny_vae, runner_factory=GarbageRunner) as srv, \
            httpx.Client(base_url=srv.url, limits=httpx.Limits(max_connections=1), timeout=30) as client:
        statuses = []
        for _ in range(10):
            for output_type in ("mp4", "npy"):
                r = client.post("/v1/decode", content=x.tobytes(), params={**params, "output_type": output_type},
                                headers={"Content-Type": "tensor/binary"})
                statuses.append(r.status_code)
                assert "connection" not in r.headers
        assert statuses == [500, 200] * 10
        assert r.headers["content-type"] != PROBLEM
        assert srv.metric("vaeserve_requests_total", route="/v1/decode", status="500") == 10


def test_client_leaving_mid_upload_is_499_and_one_line(tiny_vae, caplog):
    # The hostile run: counted as status 500 and logged as two ERROR tracebacks each.
    with thread_server(tiny_vae) as srv:
        caplog.set_level(logging.INFO)
        with socket.create_connection(srv.address) as sock:
            sock.sendall(request_head(2048) + b"\0" * 100)
            wait_until(lambda: srv.metric("vaeserve_uploads") == 1, "the upload started")
        wait_until(lambda: srv.metric("vaeserve_requests_total", route="/v1/decode", status="499") == 1,
                   "the 499 counted")
        assert srv.metric("vaeserve_requests_total", route="/v1/decode", status="500") == 0
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    gone = [r for r in caplog.records if r.name == "vaeserve" and "client left" in r.getMessage()]
    assert errors == [] and len(gone) == 1, [r.getMessage() for r in caplog.records]


# ---- slow and idle clients -------------------------------------------------------------------------


READ_TIMEOUT_S = KEEPALIVE_S = 1


@pytest.fixture(scope="module")
def timed_server(tiny_vae):
    with thread_server(tiny_vae, read_timeout_s=READ_TIMEOUT_S, keepalive_timeout_s=KEEPALIVE_S) as srv:
        yield srv


def test_headers_that_never_finish_get_408_and_close(timed_server):
    with socket.create_connection(timed_server.address) as sock:
        sock.sendall(b"POST /v1/decode HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        start = time.monotonic()
        status, headers, body, closed = read_reply(sock)
    assert time.monotonic() - start < READ_TIMEOUT_S + SLACK_S
    assert status.startswith("HTTP/1.1 408") and headers["content-type"] == PROBLEM and closed
    assert json.loads(body)["type"].endswith("/request-timeout")


def test_body_that_never_finishes_gets_408_problem_and_close(timed_server):
    before = timed_server.metric("vaeserve_requests_total", route="/v1/decode", status="408")
    with socket.create_connection(timed_server.address) as sock:
        sock.sendall(request_head(2048) + b"\0" * 100)
        start = time.monotonic()
        status, headers, body, closed = read_reply(sock)
    assert time.monotonic() - start < READ_TIMEOUT_S + SLACK_S
    assert status.startswith("HTTP/1.1 408") and headers["connection"] == "close" and closed
    problem = json.loads(body)
    assert problem["type"].endswith("/request-timeout") and problem["received"] == "100 bytes"
    assert timed_server.metric("vaeserve_requests_total", route="/v1/decode", status="408") == before + 1


def test_silent_and_idle_connections_are_closed(timed_server):
    with socket.create_connection(timed_server.address) as silent:
        assert_closed_within(silent, READ_TIMEOUT_S)  # opened, never sent a byte
    with socket.create_connection(timed_server.address) as idle:
        idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        start = time.monotonic()
        status, _, _, closed = read_reply(idle)  # the reply, then keep-alive until the server closes
        assert status.startswith("HTTP/1.1 200") and closed
        assert time.monotonic() - start < KEEPALIVE_S + SLACK_S


def test_unread_body_after_an_early_answer_must_still_arrive_in_time(timed_server):
    # 415 from the headers: the server says Connection: close and does not wait for the body.
    with socket.create_connection(timed_server.address) as sock:
        sock.sendall(request_head(10_000).replace(b"tensor/binary", b"text/plain") + b"\0" * 10)
        start = time.monotonic()
        status, headers, _, closed = read_reply(sock)  # the reply, then the close
        assert status.startswith("HTTP/1.1 415") and headers["connection"] == "close" and closed
        assert time.monotonic() - start < READ_TIMEOUT_S + SLACK_S


def read_until_closed(sock: socket.socket, timeout: float = KEEPALIVE_S + SLACK_S) -> bytes:
    """Everything the server sends until it closes the connection (keep-alive ends it at the latest)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while part := sock.recv(65536):
            data += part
    except ConnectionResetError:
        pass
    return data


# ---- HTTP framing ----------------------------------------------------------------------------------


SMUGGLED = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


def framed_post(*framing: bytes) -> bytes:
    """A decode whose chunked body is empty ("0" chunk) and, by its Content-Length, runs on over a
    second request: a proxy that reads the Content-Length forwards both as one."""
    body = b"0\r\n\r\n" + SMUGGLED
    headers = {b"content-length": b"Content-Length: %d\r\n" % len(body), b"transfer-encoding": b"Transfer-Encoding: chunked\r\n"}
    return (b"POST /v1/decode?shape=1,16,2,4,4&dtype=float32 HTTP/1.1\r\nHost: x\r\nContent-Type: tensor/binary\r\n"
            + b"".join(headers[name] for name in framing) + b"\r\n" + body)


def test_content_length_with_transfer_encoding_is_400_and_what_follows_is_never_answered(timed_server):
    # RFC 9112 section 6.3: the server must close the connection. It answered the smuggled request.
    with socket.create_connection(timed_server.address) as sock:
        sock.sendall(framed_post(b"content-length", b"transfer-encoding"))
        data = read_until_closed(sock)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"connection: close" in head.lower(), data
    assert b"content-type: application/problem+json" in head.lower()
    problem = json.loads(body)
    assert problem["type"].endswith("/ambiguous-framing") and problem["received"] == "both"
    assert data.count(b"HTTP/1.1 ") == 1, data  # the smuggled GET was never answered
    # Negative control: the same bytes framed by Transfer-Encoding alone are two requests, both answered.
    with socket.create_connection(timed_server.address) as sock:
        sock.sendall(framed_post(b"transfer-encoding"))
        data = read_until_closed(sock)
    assert data.startswith(b"HTTP/1.1 422") and data.count(b"HTTP/1.1 200 ") == 1, data


def test_head_on_the_probes_answers_as_get_without_a_body(timed_server):
    for path in ("/healthz", "/readyz"):
        get = httpx.get(timed_server.url + path)
        with socket.create_connection(timed_server.address) as sock:
            # HEAD, then GET on the same connection: the GET's answer must follow the HEAD's headers at once.
            sock.sendall(f"HEAD {path} HTTP/1.1\r\nHost: x\r\n\r\nGET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            data = read_until_closed(sock)
        head, _, rest = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), data
        assert f"content-length: {len(get.content)}".encode() in head.lower()  # the GET's length, no body
        assert rest.startswith(b"HTTP/1.1 200") and rest.endswith(get.content), data


def test_connections_beyond_the_limit_get_503(tiny_vae):
    with thread_server(tiny_vae, max_connections=3) as srv:
        held = [socket.create_connection(srv.address) for _ in range(3)]
        try:  # once uvicorn has accepted the three, a fourth is answered 503
            wait_until(lambda: httpx.get(srv.url + "/healthz").status_code == 503, "503 past 3 connections")
        finally:
            for sock in held:
                sock.close()
        wait_until(lambda: httpx.get(srv.url + "/healthz").status_code == 200, "200 once they closed")


# ---- admission before the body --------------------------------------------------------------------


def test_full_queue_answers_429_before_reading_the_body(tiny_vae):
    # The hostile run: bodies were read (16 x 52 MiB, +1.2 GB RSS) before the queue limit applied.
    GatedRunner.reset()
    with thread_server(tiny_vae, runner_factory=GatedRunner, max_batch=1, max_queue=1) as srv:
        gated_warm_up(srv.url, SHORT)
        started = srv.metric("vaeserve_queue_seconds_count")  # observed as a batch starts on the device
        on_device: list = []
        queued: list = []
        post_in_thread(srv.url, marked(latents(SHORT, seed=1), "A"), on_device)  # held on the device
        wait_until(lambda: srv.metric("vaeserve_queue_seconds_count") > started, "A on the device")
        post_in_thread(srv.url, marked(latents(SHORT, seed=2), "B"), queued)  # the one queue place
        wait_until(lambda: srv.metric("vaeserve_queue_depth") == 1, "B queued")
        with socket.create_connection(srv.address) as refused:
            refused.sendall(request_head(2048))  # headers only: the answer must not wait for a body
            status, headers, body, _ = read_reply(refused)
        for _ in range(2 * SHORT[2]):
            GatedRunner.permits.release()
        wait_until(lambda: bool(on_device and queued), "A and B answered")
    assert status.startswith("HTTP/1.1 429") and headers["retry-after"] == "1" and headers["connection"] == "close"
    problem = json.loads(body)
    assert problem["type"].endswith("/queue-full") and problem["received"] == 1
    assert [on_device[0].status_code, queued[0].status_code] == [200, 200]


def test_stalled_uploads_hold_no_queue_place_and_are_cut(tiny_vae):
    # The hostile run: sixteen chunked uploads that sent 5 bytes and stopped held every queue place;
    # everyone else got 429 queue-full for 30 s.
    stall_s = 3.0
    with thread_server(tiny_vae, max_queue=2, upload_stall_s=stall_s, read_timeout_s=60) as srv:
        stalled = [socket.create_connection(srv.address) for _ in range(4)]
        try:
            for sock in stalled:
                sock.sendall(b"POST /v1/decode?shape=1,16,2,4,4&dtype=float32 HTTP/1.1\r\nHost: x\r\n"
                             b"Content-Type: tensor/binary\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n\0\0\0\0\0\r\n")
            wait_until(lambda: srv.metric("vaeserve_uploads") == 4, "four uploads under way")
            assert srv.metric("vaeserve_queue_depth") == 0
            x = latents()
            served = httpx.post(srv.url + "/v1/decode", content=x.tobytes(), headers={"Content-Type": "tensor/binary"},
                                params={"shape": "1,16,2,4,4", "dtype": "float32", "output_type": "npy"}, timeout=120)
            replies = [read_reply(sock, timeout=stall_s + SLACK_S + 60) for sock in stalled]
        finally:
            for sock in stalled:
                sock.close()
        assert served.status_code == 200
        for status, _, body, closed in replies:
            problem = json.loads(body)
            assert status.startswith("HTTP/1.1 408") and closed, status
            assert problem["type"].endswith("/upload-stalled") and problem["received"] == "5 bytes, then nothing"
        wait_until(lambda: srv.metric("vaeserve_uploads") == 0, "the cut uploads let go")


def test_bytes_being_read_are_capped(tiny_vae):
    with thread_server(tiny_vae, max_body_bytes=4096, max_reading_bytes=6000, read_timeout_s=30) as srv:
        with socket.create_connection(srv.address) as reading:
            reading.sendall(request_head(4096) + b"\0" * 100)  # 4096 bytes held for this upload
            # Its ticket and its bytes are taken in one step of the event loop.
            wait_until(lambda: srv.metric("vaeserve_uploads") == 1, "the upload holds its bytes")
            with socket.create_connection(srv.address) as refused:
                refused.sendall(request_head(2048))
                status, headers, body, _ = read_reply(refused)
            reading.sendall(b"\0" * 3996)
            read_reply(reading)  # a 422 (wrong length), after which the budget is free again
        problem = json.loads(body)
        assert status.startswith("HTTP/1.1 429") and problem["type"].endswith("/busy-reading")
        assert problem["received"] == 4096 + 2048 and problem["expected"] == "at most 6000 bytes at once"
        x = latents()
        r = httpx.post(srv.url + "/v1/decode", content=x.tobytes(), headers={"Content-Type": "tensor/binary"},
                       params={"shape": "1,16,2,4,4", "dtype": "float32", "output_type": "npy"}, timeout=60)
        assert r.status_code == 200
