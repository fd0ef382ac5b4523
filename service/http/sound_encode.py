"""A sound encoded (docs/audio.md): a WAV or FLAC body, or an MP4's sound track, read and checked
against the model's sound encoder — its sample rate and channel count as they are (no resampling,
no up- or down-mixing: a converted sound is not the one sent), the longest sound
(``max_audio_seconds``) — into the waveform its program takes, ``(1, channels, samples)`` float32.

16-bit PCM reads as ``x / 32767`` (the inverse of the decode's ``round(x · 32767)``), 32-bit PCM
as ``x / 2³¹``, AAC's float samples as they decode.
"""

from __future__ import annotations

import io

import av
import numpy as np

from vaeserve.models.sound import SoundInfo

from ..codecs.audio import PCM16_SCALE, read_sound
from ..codecs.tensors import check_finite
from ..engine.model import ModelState
from ..problem import Problem
from .schemas import EncodeParams
from .sound import sound_of

# The bodies that are a sound: their Content-Type, and what a detail calls them.
SOUND_CONTENT_TYPES = {"audio/wav": "WAV", "audio/x-wav": "WAV", "audio/wave": "WAV", "audio/flac": "FLAC",
                       "audio/x-flac": "FLAC"}
INTEGER_SCALES = {np.dtype(np.int16): PCM16_SCALE, np.dtype(np.int32): 2**31}


def encodes_sound(media_type: str, params: EncodeParams) -> bool:
    """The body's sound is encoded: a WAV or FLAC body, or any body with ``audio=true`` (an MP4's track)."""
    return media_type in SOUND_CONTENT_TYPES or params.audio


def sound_encoder_of(model: ModelState, params: EncodeParams) -> SoundInfo:
    """The model's sound, which must encode; 422 for a parameter a sound encode does not take
    (it gives the posterior's mean, as the pipelines do; its body is a file, never raw samples)."""
    info = sound_of(model)
    if not info.encodes:
        raise Problem(422, "no-sound-encoder", f"the {info.title} of the model {model.name} decodes but does not "
                      "encode sound", expected="a model whose sound encodes (/v1/models: sound.encodes)",
                      received=model.name)
    if params.sample or params.shape is not None:
        received = "sample=true" if params.sample else "shape"
        raise Problem(422, "invalid-parameter", "a sound encodes to its posterior's mean, from a WAV, FLAC or MP4 "
                      "file: sample and shape do not apply", expected="neither sample=true nor shape",
                      received=received)
    return info


def read_waveform(body: bytes, media_type: str, info: SoundInfo, max_seconds: float) -> np.ndarray:
    """The body's first sound track → ``(1, channels, samples)`` float32 at ``info.sample_rate``;
    422 for a body that holds none, another rate or channel count, nothing or more than
    ``max_seconds`` of it, or values not finite. The header is checked before a sample is decoded."""
    what = SOUND_CONTENT_TYPES.get(media_type, "an MP4's sound")
    try:
        with av.open(io.BytesIO(body), mode="r") as container:
            tracks = container.streams.audio
            if not tracks:
                raise Problem(422, "no-sound-track", "the body has no sound track to encode",
                              expected="a WAV, FLAC or MP4 with a sound track", received="no sound track")
            track = tracks[0]
            declared = None if track.duration is None else float(track.duration * track.time_base)
            _check_header(track.rate, track.channels, declared, info, max_seconds)
        samples, rate = read_sound(body)
    except av.error.FFmpegError as error:
        raise Problem(422, "invalid-sound", f"the body is not a readable {what} file: {error}",
                      expected=f"a {what} file" if what != "an MP4's sound" else "an MP4 with a sound track",
                      received=f"{len(body)} bytes that do not parse") from None
    _check_length(samples.shape[1], rate, max_seconds)
    scale = INTEGER_SCALES.get(samples.dtype, 1)
    waveform = (samples.astype(np.float32) / np.float32(scale))[None]
    check_finite(waveform, "samples")  # a float WAV may hold NaN or Inf
    return waveform


def _check_header(rate: int, channels: int, seconds: float | None, info: SoundInfo, max_seconds: float) -> None:
    if rate != info.sample_rate:
        raise Problem(422, "invalid-sample-rate", f"the sound is at {rate} Hz; the {info.title} takes "
                      f"{info.sample_rate} Hz (resample it first, e.g. ffmpeg -ar {info.sample_rate})",
                      expected=info.sample_rate, received=rate)
    if channels != info.channels:
        raise Problem(422, "invalid-channels", f"the sound has {channels} channels; the {info.title} takes "
                      f"{info.channels} (e.g. ffmpeg -ac {info.channels})", expected=info.channels, received=channels)
    if seconds is not None:  # the track's declared length, where it gives one: refused before decoding
        _check_length(round(seconds * rate), rate, max_seconds)


def _check_length(samples: int, rate: int, max_seconds: float) -> None:
    most = int(max_seconds * rate)
    if not 0 < samples <= most:
        raise Problem(422, "audio-too-long" if samples else "invalid-sound",
                      f"{samples} samples are {samples / rate:g} s of sound; this server encodes from one sample "
                      f"up to {max_seconds:g} s", expected=f"1 to {most} samples", received=samples)


def sound_encode_host_bytes(shape: tuple[int, ...], info: SoundInfo) -> int:
    """Host bytes of the encode of waveforms ``shape`` ``(B, channels, samples)``: the float32
    waveform and its latents (fewer values: one per ``samples_per_latent_frame`` per latent channel)."""
    frames = -(-shape[2] // info.samples_per_latent_frame)
    return 4 * int(np.prod(shape)) + 4 * shape[0] * int(np.prod(info.latent_shape(frames)))
