"""What a request holds on the host, counted against the host account (``host_memory_bytes``)
before it holds it: each formula here is an upper bound of what one answer path allocates.

A decode holds its latents (parsed, then scaled: two copies), then by answer:

* streamed (raw frames, fragmented MP4, and an ordinary MP4, which is written as the decode
  runs): at most ``stream_buffer_bytes`` of frames not yet taken plus one decode step; an MP4
  answer also holds its file, counted at the size of its raw frames (H.264 at any crf the service
  takes writes less). A model that decodes the whole clip in one step (HunyuanVideo 1.0) holds
  the whole clip's frames until the last piece is taken;
* whole (npy, png, ``pt``): the decoded frames kept until they are written, and the body written
  from them (npy: the file, written through a buffer: twice; ``pt``: float16 values and their
  bytes, or the uint8 bytes).

An encode holds its frames decoded into float32 twice (the array, and its copy padded or batched
for the devices) and its latents twice (the array and the body).
"""

from __future__ import annotations

import math

from vaeserve.models.shapes import clip_shape, latents_for_frames

from ..codecs.frames import FramesHeader
from ..limits import Limits
from .schemas import DecodeParams


def decode_host_bytes(shape: tuple[int, ...], params: DecodeParams, limits: Limits, *, stream_buffer_bytes: int,
                      causal: bool) -> int:
    """Host bytes a decode of latents ``shape`` ``(B, C, T, H, W)`` (an image's ``(B, C, H, W)``)
    answered as ``params`` asks holds at most."""
    b, _, t, h, w = clip_shape(shape)
    s = limits.spatial_scale
    frame = 3 * (s * h) * (s * w)  # uint8 bytes of one frame
    frames = b * limits.output_frames(t) * frame
    latents = 2 * 4 * math.prod(shape)
    if params.stream or params.output_type == "mp4":
        step = b * limits.temporal_scale * frame
        window = min(frames, stream_buffer_bytes + step) if causal else frames
        mp4_file = frames if params.output_type == "mp4" else 0
        return latents + window + mp4_file
    if params.image_file is not None:  # png, jpeg: the frames, and one file of one frame
        return latents + frames + frame
    if params.output_type == "npy":
        return latents + 3 * frames
    if params.output == "float":  # float32 kept, then float16 values and their bytes
        return latents + 4 * frames + 2 * frames + 2 * frames
    return latents + 2 * frames  # pt uint8: the frames and their bytes


def encode_host_bytes(header: FramesHeader, limits: Limits) -> int:
    """Host bytes an encode of the frames ``header`` describes (``(B, 3, F, H, W)``, an image's
    ``(B, 3, H, W)``) holds at most."""
    b, _, f, h, w = clip_shape(header.shape)
    s = limits.spatial_scale
    latents = 4 * b * limits.channels * latents_for_frames(f, limits.temporal_scale) * (h // s) * (w // s)
    return 2 * header.nbytes + 2 * latents
