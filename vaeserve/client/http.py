"""A small Python client (httpx and numpy) for ``POST /v1/decode`` (including the frame stream),
``POST /v1/encode`` and ``GET /v1/models``.

    from vaeserve_client import decode, decode_stream, encode      # or: from vaeserve.client import ...
    video = decode("http://127.0.0.1:8000", latents, output_type="mp4")          # bytes
    for chunk in decode_stream("http://127.0.0.1:8000", latents):                # (B, f, H, W, 3) uint8
        ...
    latents = encode("http://127.0.0.1:8000", frames)                            # (B, z, T, H/s, W/s) float32
    latents = encode("http://127.0.0.1:8000", Path("first_frame.png").read_bytes(), normalize=True)
    video = decode("http://127.0.0.1:8000", latents, model="ltx2")   # a server of several models: name one

Stream framing (``application/x-vaeserve-stream``): a sequence of messages, each
``u32 little-endian N`` + ``N bytes of JSON header`` + ``header["nbytes"]`` bytes of payload.
Headers have ``type``: ``"frames"`` (payload = raw uint8 of ``shape``, C order), ``"end"``
(``chunks``, ``frames``; last message) or ``"error"`` (``problem``, an RFC 9457 body).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import numpy as np


class DecodeError(RuntimeError):
    """The server answered with a problem (``problem`` holds the RFC 9457 body); raised by
    ``encode`` too."""

    def __init__(self, problem: dict):
        super().__init__(f"{problem.get('status')} {problem.get('title')}: {problem.get('detail')}")
        self.problem = problem


def _request_args(latents: np.ndarray, api_key: str | None, params: dict) -> dict:
    # float16 goes as it is (the server takes it: half the bytes); anything else as float32.
    dtype = "float16" if np.asarray(latents).dtype == np.float16 else "float32"
    array = np.ascontiguousarray(latents, dtype="<f2" if dtype == "float16" else "<f4")
    query = {"shape": ",".join(map(str, array.shape)), "dtype": dtype}
    query.update({k: (str(v).lower() if isinstance(v, bool) else v) for k, v in params.items() if v is not None})
    headers = {"Content-Type": "application/octet-stream"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return {"content": array.tobytes(), "params": query, "headers": headers}


def _endpoint(url: str, route: str = "/v1/decode") -> str:
    return url if url.rstrip("/").endswith(route) else url.rstrip("/") + route


def _model_endpoint(url: str, operation: str, model: str | None) -> str:
    """``POST /v1/{operation}``, or with a ``model`` (its id in ``GET /v1/models``; any characters)
    ``/v1/models/{model}/{operation}``."""
    if model is None:
        return _endpoint(url, f"/v1/{operation}")
    return url.rstrip("/") + f"/v1/models/{quote(model, safe='')}/{operation}"


def _raise_for_problem(response: httpx.Response) -> None:
    if response.status_code != 200:
        response.read()
        try:
            problem = response.json()
        except ValueError:
            problem = {"status": response.status_code, "title": "error", "detail": response.text}
        raise DecodeError(problem)


def decode(url: str, latents: np.ndarray, *, output_type: str = "mp4", api_key: str | None = None,
           timeout: float = 600.0, model: str | None = None, **params):
    """One request (to ``model``: needed of a server of several). Returns MP4/PNG bytes, or a numpy
    array for ``npy`` and ``pt``."""
    args = _request_args(latents, api_key, {"output_type": output_type, **params})
    response = httpx.post(_model_endpoint(url, "decode", model), timeout=timeout, **args)
    _raise_for_problem(response)
    if output_type == "npy":
        import io

        return np.load(io.BytesIO(response.content), allow_pickle=False)
    if output_type == "pt":
        dtype = {"uint8": np.uint8, "float16": np.float16}[response.headers["dtype"]]
        return np.frombuffer(response.content, dtype).reshape(json.loads(response.headers["shape"]))
    return response.content


def served_models(url: str, *, api_key: str | None = None, timeout: float = 60.0) -> list[dict]:
    """``GET /v1/models``'s ``data``: one entry per model served (``id``, ``config``, ``latents``, …)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    response = httpx.get(_endpoint(url, "/v1/models"), headers=headers, timeout=timeout)
    _raise_for_problem(response)
    return response.json()["data"]


def _read_exact(chunks: Iterator[bytes], buffer: bytearray, n: int) -> bytes | None:
    while len(buffer) < n:
        try:
            buffer.extend(next(chunks))
        except StopIteration:
            return None
    out = bytes(buffer[:n])
    del buffer[:n]
    return out


def read_stream(byte_chunks: Iterator[bytes]) -> Iterator[tuple[dict, bytes]]:
    """Split a stream body (any chunking) into ``(header, payload)`` messages."""
    buffer = bytearray()
    while True:
        prefix = _read_exact(byte_chunks, buffer, 4)
        if prefix is None:
            if buffer:
                raise DecodeError({"status": 502, "title": "truncated stream", "detail": "partial message"})
            return
        (length,) = struct.unpack("<I", prefix)
        header = json.loads(_read_exact(byte_chunks, buffer, length) or b"{}")
        payload = _read_exact(byte_chunks, buffer, header.get("nbytes", 0)) if header.get("nbytes") else b""
        if payload is None:
            raise DecodeError({"status": 502, "title": "truncated stream", "detail": "partial payload"})
        yield header, payload


def decode_stream(url: str, latents: np.ndarray, *, api_key: str | None = None, timeout: float = 600.0,
                  model: str | None = None, **params) -> Iterator[np.ndarray]:
    """Yield uint8 frame chunks ``(B, f, H, W, 3)`` (``(f, H, W, 3)`` for unbatched latents) as the
    server (its ``model``) decodes them. Raises DecodeError for an error before or during the stream."""
    args = _request_args(latents, api_key, {"stream": True, **params})
    with httpx.stream("POST", _model_endpoint(url, "decode", model), timeout=timeout, **args) as response:
        _raise_for_problem(response)
        ended = False
        for header, payload in read_stream(response.iter_bytes()):
            if header["type"] == "frames":
                yield np.frombuffer(payload, np.uint8).reshape(header["shape"])
            elif header["type"] == "error":
                raise DecodeError(header["problem"])
            elif header["type"] == "end":
                ended = True
        if not ended:
            raise DecodeError({"status": 502, "title": "truncated stream", "detail": "no end message"})


def encode(url: str, frames: np.ndarray | bytes, *, normalize: bool = False, sample: bool = False,
           seed: int | None = None, api_key: str | None = None, timeout: float = 600.0, model: str | None = None,
           **params) -> np.ndarray:
    """Encode frames ``(B, 3, F, H, W)`` / ``(B, 3, H, W)`` in [-1, 1] (sent as raw float32), or the
    bytes of a PNG, JPEG or MP4 file (sent as they are; the server recognizes them). Returns float32
    latents ``(B, z, T, H/s, W/s)`` (``s`` the spatial scale: 8, or 16 for Wan 2.2). ``params``:
    ``scaling_factor``, ``shift_factor``, ``timeout_s``; ``model``: as ``decode``."""
    query = {"normalize": normalize, "sample": sample, "seed": seed, "output_type": "pt", **params}
    if isinstance(frames, bytes):
        content: bytes = frames
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        query = {k: (str(v).lower() if isinstance(v, bool) else v) for k, v in query.items() if v is not None}
    else:
        args = _request_args(frames, api_key, query)
        content, query, headers = args["content"], args["params"], args["headers"]
    response = httpx.post(_model_endpoint(url, "encode", model), content=content, params=query, headers=headers,
                          timeout=timeout)
    _raise_for_problem(response)
    return np.frombuffer(response.content, "<f4").reshape(json.loads(response.headers["shape"]))
