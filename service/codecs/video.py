"""Frames out: H.264 MP4 and PNG. Frames are ``(F, H, W, 3)`` uint8 for one video."""

from __future__ import annotations

import io
import struct
import tempfile
import zlib
from pathlib import Path

import av
import numpy as np


def encode_mp4(frames: np.ndarray, *, fps: int, crf: int) -> bytes:
    """H.264 (libx264, yuv420p) in MP4 with the ``moov`` index before the media (faststart), so a
    player or browser starts before the whole file has arrived. H and W are multiples of 8 here,
    so even (yuv420p needs it).

    FFmpeg's faststart moves the index in a second pass that reopens the output by name, which a
    BytesIO does not have: the video goes through a private temporary file."""
    with tempfile.TemporaryDirectory(prefix="vaeserve-mp4-") as folder:
        path = Path(folder) / "video.mp4"
        with av.open(str(path), mode="w", format="mp4", options={"movflags": "+faststart"}) as container:
            stream = container.add_stream("libx264", rate=fps)
            stream.width, stream.height = int(frames.shape[2]), int(frames.shape[1])
            stream.pix_fmt = "yuv420p"
            stream.options = {"crf": str(crf), "preset": "veryfast"}
            for frame in frames:
                for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
        return path.read_bytes()


def mp4_boxes(data: bytes) -> list[str]:
    """The top-level box types of an MP4, in file order (``["ftyp", "moov", "free", "mdat"]``)."""
    boxes, offset = [], 0
    while offset + 8 <= len(data):
        size, box = struct.unpack(">I4s", data[offset : offset + 8])
        if size == 1:  # a 64-bit size follows the type
            (size,) = struct.unpack(">Q", data[offset + 8 : offset + 16])
        boxes.append(box.decode("latin-1"))
        if size < 8:  # 0: the box runs to the end of the file
            break
        offset += size
    return boxes


def read_mp4(data: bytes) -> np.ndarray:
    """MP4 bytes -> (F, H, W, 3) uint8, every frame of the first video stream (tests, benches)."""
    with av.open(io.BytesIO(data), mode="r") as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def encode_png(frame: np.ndarray) -> bytes:
    """One (H, W, 3) uint8 frame as PNG (8-bit RGB, no filtering); stdlib only."""
    height, width, _ = frame.shape
    rows = np.concatenate([np.zeros((height, 1), np.uint8), frame.reshape(height, width * 3)], axis=1)

    def chunk(tag: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + tag + payload + struct.pack(">I", zlib.crc32(tag + payload))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows.tobytes(), 6))
            + chunk(b"IEND", b""))
