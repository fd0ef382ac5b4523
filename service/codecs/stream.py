"""The frame stream of ``stream=true`` (``application/x-vaeserve-stream``).

A sequence of messages, each ``u32 little-endian N | N bytes of JSON header | payload``. The
header says how long the payload is (``nbytes``), so a reader never guesses. Headers have
``type``: ``"frames"`` (payload: raw uint8 of ``shape``, C order), ``"end"`` (the last message) or
``"error"`` (``problem``: an RFC 9457 body; once the status line is sent, errors travel in-band).
"""

from __future__ import annotations

import json
import struct

STREAM_MEDIA_TYPE = "application/x-vaeserve-stream"


def stream_message(header: dict, payload: bytes = b"") -> bytes:
    header = {**header, "nbytes": len(payload)}
    encoded = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<I", len(encoded)) + encoded + payload
