"""The call protocol's wire format and start-up checks, in one process (no slice needed)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from vaeserve.service.slice.broadcast import (
    HEADER_BYTES,
    MIN_PAYLOAD_BYTES,
    Call,
    ProtocolError,
    pack_header,
    pack_payload,
    payload_bucket,
    unpack_header,
    unpack_payload,
)
from vaeserve.service.slice.control import DistributedError, initialize


@pytest.mark.parametrize("dtype", [np.float32, np.uint8, jnp.bfloat16, np.float16])
def test_a_call_survives_header_and_payload(dtype):
    array = (np.random.default_rng(0).standard_normal((2, 16, 3, 5, 7)) * 3).astype(dtype)
    call = Call("decode", array, {"output": "uint8", "chunk": 2, "denormalize": False})
    header = pack_header(call, seq=41)
    assert header.shape == (HEADER_BYTES,) and header.dtype == np.uint8
    read = unpack_header(header)
    assert (read.seq, read.op, read.shape, read.options) == (41, "decode", array.shape, dict(call.options))
    payload = pack_payload(array)
    assert payload.size == read.padded == payload_bucket(array.nbytes) >= array.nbytes
    assert not payload[array.nbytes:].any()  # zero padding
    back = unpack_payload(payload, read)
    assert back.dtype == array.dtype and back.tobytes() == array.tobytes()


def test_a_call_without_an_array_has_no_payload():
    read = unpack_header(pack_header(Call("compile", None, {"shape": [2, 16, 3, 5, 7]}), seq=1))
    assert (read.shape, read.dtype, read.nbytes, read.padded) == (None, None, 0, 0)


def test_payload_buckets_are_quarter_octaves_from_64_kib():
    assert payload_bucket(0) == 0
    assert payload_bucket(1) == MIN_PAYLOAD_BYTES
    assert payload_bucket(MIN_PAYLOAD_BYTES + 1) == MIN_PAYLOAD_BYTES * 5 // 4
    lengths = np.unique(np.geomspace(MIN_PAYLOAD_BYTES, 2**30, 5000).astype(int))
    sizes = np.array([payload_bucket(int(n)) for n in lengths])
    assert np.all(sizes >= lengths) and np.all(sizes < 1.25 * lengths)  # at most 25% padding
    assert len(set(sizes)) == 4 * 14 + 1  # 64 KiB .. 1 GiB: four programs per octave, not one per size


def test_bad_calls_and_headers_are_refused():
    with pytest.raises(ProtocolError, match="JSON"):
        pack_header(Call("decode", None, {"output": object()}), seq=1)
    with pytest.raises(ProtocolError, match="exceeds"):
        pack_header(Call("decode", None, {"note": "x" * HEADER_BYTES}), seq=1)
    header = pack_header(Call("decode", None, {}), seq=1)
    corrupted = header.copy()
    corrupted[4:20] = ord("#")
    with pytest.raises(ProtocolError, match="not JSON"):
        unpack_header(corrupted)
    with pytest.raises(ProtocolError, match="out of range"):
        unpack_header(np.zeros(HEADER_BYTES, np.uint8))
    newer = pack_header(Call("decode", None, {}), seq=1).tobytes().replace(b'"version":1', b'"version":9')
    with pytest.raises(ProtocolError, match="protocol version 9"):
        unpack_header(np.frombuffer(newer, np.uint8))


def test_initialize_names_what_is_missing():
    with pytest.raises(DistributedError, match="missing: num_processes, process_id"):
        initialize(coordinator_address="127.0.0.1:1234")
    with pytest.raises(DistributedError, match=r"process_id must be in \[0, 2\)"):
        initialize(coordinator_address="127.0.0.1:1234", num_processes=2, process_id=2)
