"""The frame stream's framing (``service.codecs.stream``) as the Python client reads it."""

from __future__ import annotations

from vaeserve.service.client import read_stream
from vaeserve.service.codecs.stream import stream_message


def test_stream_framing_survives_any_chunking():
    payloads = [bytes(range(7)), b"", b"\x01" * 100]
    stream = b"".join(stream_message({"type": "frames", "i": i}, p) for i, p in enumerate(payloads))
    for size in (1, 3, 64, len(stream)):
        parts = iter([stream[i : i + size] for i in range(0, len(stream), size)])
        got = list(read_stream(parts))
        assert [p for _, p in got] == payloads and [h["i"] for h, _ in got] == [0, 1, 2]
