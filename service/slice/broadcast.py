"""Device calls on a multi-host slice: process 0 sends each call to every process, all make it.

A *call* is an operation name (a key of the handler table, e.g. ``"decode"``), at most one host
array and JSON-able keyword options. Every process holds the same handler table (the same runner
methods), so every process makes the same device call with the same inputs, and the collectives
inside it meet. A call travels in three steps:

1. **Doorbell.** Process 0 sets ``vaeserve/call/{seq}`` in the coordination service. Followers wait
   for it in short bounded waits, so an idle follower holds no device collective open (no
   accelerator runtime promises to wait forever) and notices signals between waits.
2. **Header.** ``HEADER_BYTES`` of uint8 — a little-endian u32 length, then UTF-8 JSON (protocol
   version, seq, op, dtype, shape, options, payload sizes) — over
   ``multihost_utils.broadcast_one_to_all``, which needs the same shape on every process.
3. **Payload.** The array's bytes, zero-padded to a size bucket (quarter octaves from 64 KiB) so
   the broadcast program compiles once per bucket, not once per shape.

After the call, every follower reports its outcome (``"ok"`` or the exception's type) and process
0 checks that all agree: the same error everywhere (a shape that does not compile, say) leaves
the slice usable; a disagreement means the processes may have diverged, and the slice fails.
Outputs come back to process 0 inside the handlers (``sharding.to_host`` all-gathers
process-spanning arrays); followers drop theirs.
"""

from __future__ import annotations

import json
import logging
import struct
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .control import SliceControl, SliceMonitor

log = logging.getLogger("vaeserve")

PROTOCOL_VERSION = 1
HEADER_BYTES = 4096
MIN_PAYLOAD_BYTES = 1 << 16
STOP = "__stop__"  # the op that ends the followers' loop
OK = "ok"

Handler = Callable[..., Any]  # handler(array_or_None, **options) -> host array(s) or an iterator of them


class ProtocolError(ValueError):
    """A call that cannot be sent, or a header that cannot be read."""


@dataclass(frozen=True)
class Call:
    """One device call: ``handlers[op](array, **options)`` on every process."""

    op: str
    array: np.ndarray | None = None
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Header:
    seq: int
    op: str
    dtype: str | None
    shape: tuple[int, ...] | None
    nbytes: int
    padded: int
    options: dict[str, Any]


# -- the wire format (pure functions) -----------------------------------------------------------
def payload_bucket(nbytes: int) -> int:
    """Padded payload size: 0 for no payload, else the smallest of 64 KiB · 2^k · {1, 1.25, 1.5,
    1.75} that holds ``nbytes`` (at most 25% padding; four broadcast programs per octave)."""
    if nbytes <= 0:
        return 0
    octave = MIN_PAYLOAD_BYTES
    while True:
        for quarter in (4, 5, 6, 7):
            size = octave * quarter // 4
            if size >= nbytes:
                return size
        octave *= 2


def _dtype_name(dtype: np.dtype) -> str:
    import jax.numpy as jnp

    if jnp.dtype(dtype.name) != dtype or dtype.hasobject:
        raise ProtocolError(f"cannot send arrays of dtype {dtype}")
    return dtype.name


def pack_header(call: Call, seq: int) -> np.ndarray:
    """The fixed-size header of ``call`` as ``(HEADER_BYTES,)`` uint8."""
    array = call.array
    nbytes = 0 if array is None else int(array.nbytes)
    fields = {
        "version": PROTOCOL_VERSION, "seq": seq, "op": call.op,
        "dtype": None if array is None else _dtype_name(array.dtype),
        "shape": None if array is None else list(array.shape),
        "nbytes": nbytes, "padded": payload_bucket(nbytes), "options": dict(call.options),
    }
    try:
        text = json.dumps(fields, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as error:
        raise ProtocolError(f"call options must be JSON values: {error}") from error
    if len(text) > HEADER_BYTES - 4:
        raise ProtocolError(f"call header of {len(text)} bytes exceeds {HEADER_BYTES - 4}")
    header = np.zeros(HEADER_BYTES, np.uint8)
    header[:4] = np.frombuffer(struct.pack("<I", len(text)), np.uint8)
    header[4:4 + len(text)] = np.frombuffer(text, np.uint8)
    return header


def unpack_header(header: np.ndarray) -> Header:
    """Read a header made by ``pack_header``; ``ProtocolError`` if it is not one."""
    raw = np.asarray(header, np.uint8).tobytes()
    if len(raw) != HEADER_BYTES:
        raise ProtocolError(f"header must be {HEADER_BYTES} bytes; received {len(raw)}")
    (length,) = struct.unpack("<I", raw[:4])
    if not 0 < length <= HEADER_BYTES - 4:
        raise ProtocolError(f"header length field {length} is out of range")
    try:
        fields = json.loads(raw[4:4 + length])
    except ValueError as error:
        raise ProtocolError(f"header is not JSON: {error}") from error
    if fields.get("version") != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {fields.get('version')!r}; this process speaks {PROTOCOL_VERSION}")
    shape = None if fields["shape"] is None else tuple(fields["shape"])
    return Header(seq=fields["seq"], op=fields["op"], dtype=fields["dtype"], shape=shape, nbytes=fields["nbytes"],
                  padded=fields["padded"], options=fields["options"])


def pack_payload(array: np.ndarray) -> np.ndarray:
    """The C-order bytes of ``array`` as uint8, zero-padded to ``payload_bucket``."""
    flat = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    padded = np.zeros(payload_bucket(flat.size), np.uint8)
    padded[:flat.size] = flat
    return padded


def unpack_payload(payload: np.ndarray, header: Header) -> np.ndarray:
    """The array a padded payload carries (a copy, C-order)."""
    import jax.numpy as jnp

    assert header.dtype is not None and header.shape is not None
    return np.asarray(payload[:header.nbytes]).view(jnp.dtype(header.dtype)).reshape(header.shape).copy()


# -- moving calls -------------------------------------------------------------------------------
def _broadcast(array: np.ndarray) -> np.ndarray:
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.broadcast_one_to_all(array))


class Channel:
    """Sends calls from process 0 (``send``) and receives them on followers (``receive``)."""

    def __init__(self, control: SliceControl, *, poll_s: float = 0.5):
        self.control = control
        self.poll_s = poll_s
        self.seq = 0
        self.last_send_s = 0.0  # how long the last ``send`` took (doorbell, header and payload)

    def send(self, call: Call) -> int:
        """Process 0: deliver ``call`` to every process; returns its sequence number."""
        start = time.perf_counter()
        header = pack_header(call, self.seq + 1)
        self.seq += 1
        self.control.ring(self.seq)
        _broadcast(header)
        if call.array is not None:
            _broadcast(pack_payload(call.array))
        self.last_send_s = time.perf_counter() - start
        return self.seq

    def receive(self) -> tuple[int, Call]:
        """A follower: wait for the next call (between bounded waits, signal handlers run and a
        failure of the slice ends the wait)."""
        seq = self.seq + 1
        while not self.control.wait_ring(seq, self.poll_s):
            self.control.raise_if_failed()
        header = unpack_header(_broadcast(np.zeros(HEADER_BYTES, np.uint8)))
        if header.seq != seq:
            raise ProtocolError(f"expected call {seq}, received call {header.seq}")
        array = None
        if header.shape is not None:
            array = unpack_payload(_broadcast(np.zeros(header.padded, np.uint8)), header)
        self.seq = seq
        return seq, Call(header.op, array, header.options)


def describe(error: BaseException) -> str:
    """An outcome that processes can compare: the exception's type (messages may name devices)."""
    return f"error: {type(error).__name__}"


class Leader:
    """Process 0's side: ``call`` and ``stream`` send every call to the slice, then make it here.

    ``handlers`` must be the same table the followers ``follow``. Use from one thread.
    """

    def __init__(self, channel: Channel, monitor: SliceMonitor, handlers: Mapping[str, Handler]):
        self.channel = channel
        self.control = channel.control
        self.monitor = monitor
        self.handlers = dict(handlers)

    def _send(self, op: str, array: np.ndarray | None, options: dict[str, Any]) -> int:
        self.control.raise_if_failed()
        if op not in self.handlers:
            raise ProtocolError(f"unknown operation {op!r}; known: {sorted(self.handlers)}")
        try:
            return self.channel.send(Call(op, None if array is None else np.asarray(array), options))
        except Exception as error:
            # A broadcast is a collective of every process: once one fails the slice cannot go on.
            # Its error names the symptom (a closed connection); the liveness thread names the
            # cause (which process died), so give it the time it needs to notice first.
            self.control.failed_within(self.monitor.detection_s)
            raise self.control.fail(f"sending call {op!r} to the slice failed: {error}") from error

    def _agree(self, seq: int, op: str, mine: str) -> None:
        outcomes = self.control.collect_outcomes(seq, self.monitor.call_timeout_s)
        differing = {pid: outcome for pid, outcome in outcomes.items() if outcome != mine}
        if differing:
            raise self.control.fail(f"call {seq} ({op}) diverged: process 0 {mine}, " +
                                    ", ".join(f"process {pid} {outcome}" for pid, outcome in differing.items()))

    def call(self, op: str, array: np.ndarray | None = None, **options: Any) -> Any:
        """``handlers[op](array, **options)`` on every process; returns process 0's result."""
        seq = self._send(op, array, options)
        with self.monitor.call(seq, op):
            try:
                result = self.handlers[op](array, **options)
            except Exception as error:
                self._agree(seq, op, describe(error))
                raise
            self._agree(seq, op, OK)
        return result

    def stream(self, op: str, array: np.ndarray | None = None, **options: Any) -> Generator[Any, None, None]:
        """Like ``call`` for a handler that yields; yields process 0's items.

        If the consumer stops early (its client went away), the remaining steps still run here:
        the followers run every step, and their collectives need this process in each one.
        """
        seq = self._send(op, array, options)
        outcome = OK
        with self.monitor.call(seq, op):
            try:
                consumer_gone = False
                for item in self.handlers[op](array, **options):
                    if not consumer_gone:
                        try:
                            yield item
                        except GeneratorExit:
                            consumer_gone = True
            except Exception as error:
                outcome = describe(error)
                raise
            finally:
                self._agree(seq, op, outcome)

    def stop(self) -> None:
        """End the followers' loops (after draining: no call may follow)."""
        self.control.raise_if_failed()
        self.channel.send(Call(STOP))


def follow(channel: Channel, handlers: Mapping[str, Handler]) -> None:
    """A follower's loop: receive each call, make it with the same handler as process 0, report
    the outcome; return when process 0 sends STOP. Raises ``SliceFailed`` once the slice failed."""
    while True:
        seq, call = channel.receive()
        if call.op == STOP:
            log.info("process %d: stop after %d calls", channel.control.process_id, seq - 1)
            return
        outcome = OK
        try:
            result = handlers[call.op](call.array, **call.options)
            if isinstance(result, Iterator):
                for _ in result:
                    pass
        except Exception as error:
            outcome = describe(error)
            log.warning("process %d: call %d (%s) raised %s: %s", channel.control.process_id, seq, call.op,
                        type(error).__name__, error)
        channel.control.report_outcome(seq, outcome)
