"""MP4 (and QuickTime MOV) in, for ``POST /v1/encode``: the container's header read and checked
before a frame is decoded, then the frames decoded one by one into an array allocated once.

FFmpeg's MP4 demuxer is the only one used (never its format probe: a playlist, an MPEG-TS or a
raw stream sent as video/mp4 is not opened at all), and only the decoders of the codecs the
service promises (``--video-codecs``) run. The header gives the frame count (the sample table;
counted from the packets, which carry no pixels, when a fragmented MP4 leaves it empty), the
frame size and the pixel format; the decode then stops at the first frame that differs from it
— a frame past the count, a frame of another size, a deeper pixel format — with a 422 that says
which, and ``max_pixels`` keeps the decoder itself from allocating for a larger frame first.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import get_args

import av
import numpy as np

from ..problem import Problem, deadline_problem
from ..settings import VideoCodec

# The FFmpeg decoders each promised codec may run, and the name a person knows it by.
DECODERS: dict[VideoCodec, tuple[str, ...]] = {"h264": ("h264",), "hevc": ("hevc",), "mpeg4": ("mpeg4",),
                                               "av1": ("libdav1d", "av1"), "vp9": ("vp9", "libvpx-vp9")}
CODEC_NAMES: dict[VideoCodec, str] = {"h264": "H.264/AVC", "hevc": "H.265/HEVC", "mpeg4": "MPEG-4 Part 2",
                                      "av1": "AV1", "vp9": "VP9"}
ALL_CODECS: tuple[VideoCodec, ...] = get_args(VideoCodec)
# A decoder may round the coded frame up to its block size (H.264: 16; HEVC, VP9, AV1: 8), and
# the MPEG-4 Part 2 decoder allocates a scratch image of up to 53,760 pixels whatever the frame.
_CODED_MARGIN = 16
_MIN_MAX_PIXELS = 1 << 16


@dataclass(frozen=True)
class VideoHeader:
    frames: int
    height: int
    width: int
    codec: VideoCodec


def _invalid(detail: str, received: object) -> Problem:
    return Problem(422, "invalid-video", detail, expected="an MP4 whose frames match its header", received=received)


def _open(body: bytes) -> av.container.InputContainer:
    try:
        return av.open(io.BytesIO(body), mode="r", format="mp4")
    except Exception as exc:  # PyAV's FFmpegError family, and whatever a corrupt header triggers
        raise _invalid(f"not a readable MP4: {exc}", f"{len(body)} bytes") from None


def _codec(decoder: str, codecs: tuple[VideoCodec, ...]) -> VideoCodec:
    for codec in codecs:
        if decoder in DECODERS[codec]:
            return codec
    raise Problem(415, "unsupported-video-codec", f"MP4 video in {decoder} is not read here",
                  expected=[CODEC_NAMES[codec] for codec in codecs], received=decoder)


def _bits(video_format: av.VideoFormat | None) -> int:
    return max((component.bits for component in video_format.components), default=0) if video_format else 0


def _check_depth(video_format: av.VideoFormat | None) -> None:
    if _bits(video_format) > 8:
        name = video_format.name if video_format else "?"
        raise Problem(422, "unsupported-bit-depth", f"{_bits(video_format)}-bit video ({name}) is not read: "
                      "convert to 8 bits per channel first", expected="8 bits per channel (yuv420p, ...)",
                      received=name)


def _count_packets(container: av.container.InputContainer, stream: av.VideoStream, cap: int) -> int:
    """Frames of a stream whose header does not count them (fragmented MP4), from its packets —
    demuxed, not decoded; 422 past ``cap``, without reading further."""
    count = 0
    for packet in container.demux(stream):
        count += packet.size > 0  # the demuxer ends with an empty flush packet
        if count > cap:
            raise Problem(422, "too-many-frames", f"the video has more than {cap} frames, the limit",
                          expected=f"frames <= {cap}", received=f"more than {cap}")
    return count


def mp4_header(body: bytes, codecs: tuple[VideoCodec, ...], max_frames: int) -> VideoHeader:
    """Frame count, size and codec of the first video stream, without decoding a frame: 415 for a
    codec outside ``codecs``, 422 for a pixel format deeper than 8 bits or an unreadable header."""
    with _open(body) as container:
        if not container.streams.video:
            raise _invalid("the MP4 has no video stream", "no video stream")
        stream = container.streams.video[0]
        context = stream.codec_context
        if context is None:  # FFmpeg knows no decoder for what the sample description names
            raise Problem(415, "unsupported-video-codec", "the MP4's video codec is unknown (or its header damaged)",
                          expected=[CODEC_NAMES[codec] for codec in codecs], received="an unknown codec")
        codec = _codec(context.name, codecs)
        _check_depth(context.format)
        frames = stream.frames or _count_packets(container, stream, max_frames)
        return VideoHeader(frames=frames, height=context.height, width=context.width, codec=codec)


def _declared(header: VideoHeader) -> str:
    return f"the MP4 declares {header.frames} frames of {header.width}x{header.height}"


def decode_mp4(body: bytes, header: VideoHeader, put: Callable[[int, np.ndarray], None],
               deadline: float | None = None) -> None:
    """Decode the frames ``mp4_header`` counted, calling ``put(index, rgb)`` with each one's
    ``(H, W, 3)`` uint8 pixels. 422 at the first frame off the header (past its count, another
    size, more than 8 bits) or when fewer frames arrive (a truncated stream); 504 past
    ``deadline`` (``time.monotonic()``)."""
    index = 0
    with _open(body) as container:
        stream = container.streams.video[0]
        # The decoder refuses a coded frame larger than this before allocating for it.
        max_pixels = max((header.height + _CODED_MARGIN) * (header.width + _CODED_MARGIN), _MIN_MAX_PIXELS)
        stream.codec_context.options = {"max_pixels": str(max_pixels)}
        try:
            for frame in container.decode(stream):
                if index >= header.frames:
                    raise _invalid(f"frame {index} is past the count: {_declared(header)}",
                                   f"more than {header.frames} frames")
                if (frame.width, frame.height) != (header.width, header.height):
                    raise _invalid(f"frame {index} is {frame.width}x{frame.height} (the frame size changes): "
                                   f"{_declared(header)}", f"{frame.width}x{frame.height}")
                _check_depth(frame.format)
                if deadline is not None and time.monotonic() > deadline:
                    raise deadline_problem(f"the deadline passed while decoding frame {index} of {header.frames}")
                put(index, frame.to_ndarray(format="rgb24"))
                index += 1
        except Problem:
            raise
        except Exception as exc:  # FFmpeg's errors for damaged data, or a frame over max_pixels
            raise _invalid(f"the video does not decode after {index} of {header.frames} frames ({exc}): truncated "
                           f"or damaged data, or a frame larger than declared; {_declared(header)}",
                           f"{index} of {header.frames} frames decoded") from None
    if index < header.frames:
        raise _invalid(f"the video ends after {index} of {header.frames} frames (a truncated or damaged stream): "
                       f"{_declared(header)}", f"{index} of {header.frames} frames decoded")
