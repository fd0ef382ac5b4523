"""Frames out: H.264 MP4 and PNG. Frames are ``(F, H, W, 3)`` uint8 for one video.

``Mp4Writer`` takes a video's frames as they come (a decode step at a time) and gives back the
bytes that are ready: nothing until the end for a *faststart* file (the index goes first, so it
is written last), or an init segment and then a fragment per frame for a *fragmented* one (what a
browser plays while the decode runs). The two trade differently: the file is encoded for size
(libx264 ``veryfast`` with its look-ahead and B-frames, which hold about a dozen frames back), the
stream for latency (``tune=zerolatency``: no look-ahead, no B-frames, each frame's fragment out as
soon as it is encoded — larger at the same ``crf``). ``mp4_bytes`` is a file writer fed the whole
video at once.
"""

from __future__ import annotations

import io
import struct
import tempfile
import zlib
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from PIL import Image

from .audio import AacPacket, Sound, aac_fragments, aac_packets, add_aac_track
from .fmp4 import SoundTrack, fragment, init_segment, sound_fragment

# libx264's options: the file's (quality per byte), and the stream's (the first frame out first).
FILE_OPTIONS = {"preset": "veryfast"}
STREAM_OPTIONS = {"preset": "veryfast", "tune": "zerolatency"}
STREAM_TICKS_PER_FRAME = 1000  # the stream's timescale is fps · 1000: one frame lasts 1000 ticks


class Mp4Writer:
    """H.264 (libx264, yuv420p) in MP4, written incrementally.

    ``write(frames)`` takes ``(f, H, W, 3)`` uint8 frames and returns the bytes ready so far;
    ``close()`` flushes the encoder and returns the rest. ``sound``: an AAC track beside the video
    (a file's: ``service.codecs.audio``). ``fragmented=False``: a faststart file
    (the ``moov`` index before the media, so a player starts before the whole file has arrived)
    — every byte comes from ``close()``, because FFmpeg moves the index in a second pass that
    reopens the output by name (a private temporary file). ``fragmented=True``: ``ftyp`` + an
    empty ``moov`` (the init segment) with the first frame, then a ``moof`` + ``mdat`` per frame
    from the ``write`` that encoded it (``service.codecs.fmp4``). H and W must be even (yuv420p);
    ours are multiples of 8. One writer is used by one thread at a time.
    """

    def __init__(self, height: int, width: int, *, fps: int, crf: int, fragmented: bool = False,
                 sound: Sound | None = None):
        self.fragmented = fragmented
        self._folder: tempfile.TemporaryDirectory | None = None
        self._container: av.container.OutputContainer | None = None
        self._encoder: av.VideoCodecContext | av.video.stream.VideoStream
        self._stream_codec: av.VideoCodecContext | None = None  # the fragmented stream's encoder
        self._size = (width, height)
        self._fps = fps
        if fragmented:
            encoder = av.VideoCodecContext.create("libx264", "w")
            encoder.time_base, encoder.framerate = Fraction(1, fps), Fraction(fps, 1)
            encoder.flags |= av.codec.context.Flags.global_header  # SPS/PPS in extradata, for the init segment
            self._encoder = self._stream_codec = encoder
        else:
            self._folder = tempfile.TemporaryDirectory(prefix="vaeserve-mp4-")
            self._path = Path(self._folder.name) / "video.mp4"
            self._container = av.open(str(self._path), mode="w", format="mp4", options={"movflags": "+faststart"})
            self._encoder = self._container.add_stream("libx264", rate=fps)
        self._encoder.width, self._encoder.height = width, height
        self._encoder.pix_fmt = "yuv420p"
        self._encoder.options = {"crf": str(crf), **(STREAM_OPTIONS if fragmented else FILE_OPTIONS)}
        if sound is not None and self._container is not None:
            # The whole sound is known first: its packets go in now (the first mux opens every
            # stream, so the video's is set up before), and the muxer interleaves them with the frames.
            audio = add_aac_track(self._container, sound)
            for packet in aac_packets(audio, sound):
                self._container.mux(packet)
        # The frames the encoder holds, by pts, until their packet comes out (the file's encoder
        # holds about a dozen: ``veryfast`` has 10 of look-ahead, and B-frames; the stream's none).
        # At very small sizes libx264's output differs between runs of the same frames, less often
        # when they are held (64x64 x17, PyAV 19: 126 of 300 runs differ from the commonest file
        # released at once, 67 held; at 256x256 none of 80 differ either way). The pictures are
        # equally good; tests that compare encodes use lossless ones (crf=0).
        self._held: dict[int, av.VideoFrame] = {}
        self._ready: list[bytes] = []
        self._packets = 0
        self._fragments = 0  # moof boxes written (their sequence numbers count from 1)
        self.frames = 0
        # A fragmented stream's sound: encoded whole now, its packets written after the frames they
        # accompany (``_sound_until``).
        self._sound: tuple[SoundTrack, list[AacPacket]] | None = None
        self._sound_written = 0
        if sound is not None and fragmented:
            self._sound = aac_fragments(sound)

    def write(self, frames: np.ndarray) -> bytes:
        for frame in frames:
            image = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24").reformat(format="yuv420p")
            image.pts = self.frames
            self._held[self.frames] = image
            self.frames += 1
            self._mux(self._encoder.encode(image))
        return self._take()

    def close(self) -> bytes:
        """Flush the encoder and finish the file: the remaining bytes (faststart: the whole file)."""
        try:
            self._mux(self._encoder.encode(None))
            if self._container is None:
                if self._sound is not None:  # what is left of the sound (it may outlast the last frame)
                    self._ready.append(self._sound_until(None))
                return self._take()
            self._container.close()
            return self._path.read_bytes()
        finally:
            self.discard()

    def discard(self) -> None:
        """Give up the file (a request that ended early); safe to call twice, or after ``close``."""
        if self._container is not None:
            self._container.close()  # PyAV: a no-op once closed
        self._held.clear()
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None

    def _mux(self, packets: list[av.Packet]) -> None:
        for packet in packets:
            if packet.pts is not None:
                self._held.pop(packet.pts, None)
            if self._container is not None:
                self._container.mux(packet)
            else:
                self._ready.append(self._fragment(packet))

    def _fragment(self, packet: av.Packet) -> bytes:
        """One packet as a fragment, after the init segment when it is the first. Packets come in
        presentation order (no B-frames), one frame each."""
        index, self._packets = self._packets, self._packets + 1
        head = b""
        if index == 0:
            assert self._stream_codec is not None
            width, height = self._size
            head = init_segment(width, height, timescale=self._fps * STREAM_TICKS_PER_FRAME,
                                parameter_sets=self._stream_codec.extradata or b"",
                                sound=None if self._sound is None else self._sound[0])
        self._fragments += 1
        video = fragment(self._fragments, index * STREAM_TICKS_PER_FRAME, STREAM_TICKS_PER_FRAME, bytes(packet),
                         keyframe=packet.is_keyframe)
        return head + video + self._sound_until(Fraction(index + 1, self._fps))

    def _sound_until(self, end: Fraction | None) -> bytes:
        """The sound's packets not yet written that start before ``end`` seconds (None: all), as
        one fragment (nothing without sound, or when none is due)."""
        if self._sound is None:
            return b""
        track, packets = self._sound
        first = self._sound_written
        last = first
        while last < len(packets) and (end is None or packets[last].pts < end * track.sample_rate):
            last += 1
        if last == first:
            return b""
        self._sound_written, self._fragments = last, self._fragments + 1
        return sound_fragment(self._fragments, packets[first].pts + track.priming,
                              [(p.data, p.duration) for p in packets[first:last]])

    def _take(self) -> bytes:
        out, self._ready = b"".join(self._ready), []
        return out


def mp4_bytes(frames: np.ndarray, *, fps: int, crf: int, sound: Sound | None = None) -> bytes:
    """A whole video as a faststart MP4 (``Mp4Writer`` fed every frame at once), with its ``sound``."""
    writer = Mp4Writer(int(frames.shape[1]), int(frames.shape[2]), fps=fps, crf=crf, sound=sound)
    writer.write(frames)
    return writer.close()


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


def png_bytes(frame: np.ndarray) -> bytes:
    """One (H, W, 3) uint8 frame as PNG (8-bit RGB, no filtering); stdlib only."""
    height, width, _ = frame.shape
    rows = np.concatenate([np.zeros((height, 1), np.uint8), frame.reshape(height, width * 3)], axis=1)

    def chunk(tag: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + tag + payload + struct.pack(">I", zlib.crc32(tag + payload))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows.tobytes(), 6))
            + chunk(b"IEND", b""))


# JPEG answers: quality 95 with full-resolution colour (4:4:4) keeps a decode's detail (Pillow's
# defaults, 75 and 4:2:0, blur it visibly) in a fraction of the PNG's bytes.
JPEG_QUALITY = 95


def jpeg_bytes(frame: np.ndarray, quality: int = JPEG_QUALITY) -> bytes:
    """One (H, W, 3) uint8 frame as a baseline JPEG, 4:4:4 (Pillow's encoder)."""
    buffer = io.BytesIO()
    Image.fromarray(frame, "RGB").save(buffer, format="JPEG", quality=quality, subsampling=0)
    return buffer.getvalue()
