"""Sound out: a waveform ``(channels, samples)`` float32 in [-1, 1] as 16-bit PCM (WAV), FLAC, or
an AAC track beside an MP4's video (``service.codecs.video.Mp4Writer``).

WAV and FLAC hold exactly ``pcm16(waveform)``: FLAC is lossless, so a client that decodes it gets
those integers back. AAC is lossy; its encoder's priming samples are trimmed by the MP4's edit
list, so a player reads as many samples as the waveform has, aligned with the first frame.
"""

from __future__ import annotations

import io
import wave
from dataclasses import dataclass
from fractions import Fraction

import av
import numpy as np

from .fmp4 import SoundTrack

PCM16_SCALE = 32767  # full scale of 16-bit PCM: [-1, 1] → [-32767, 32767]
LAYOUTS = {1: "mono", 2: "stereo"}  # the channel counts an audio file or track is written with here


@dataclass(frozen=True)
class Sound:
    """A waveform ``(channels, samples)`` float32 and its ``sample_rate``, and the AAC bit rate it
    takes in an MP4."""

    waveform: np.ndarray
    sample_rate: int
    bitrate: int = 192_000

    @property
    def seconds(self) -> float:
        return self.waveform.shape[-1] / self.sample_rate


def pcm16(waveform: np.ndarray) -> np.ndarray:
    """``(channels, samples)`` float → int16, rounded to nearest and clipped to full scale."""
    return np.clip(np.rint(waveform * PCM16_SCALE), -PCM16_SCALE, PCM16_SCALE).astype(np.int16)


def wav_bytes(waveform: np.ndarray, sample_rate: int) -> bytes:
    """A 16-bit PCM WAV file of ``(channels, samples)`` (stdlib ``wave``: interleaved little-endian)."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(waveform.shape[0])
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(np.ascontiguousarray(pcm16(waveform).T).astype("<i2").tobytes())
    return buffer.getvalue()


def flac_bytes(waveform: np.ndarray, sample_rate: int) -> bytes:
    """A 16-bit FLAC file of ``(channels, samples)`` (FFmpeg's encoder, through PyAV)."""
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="flac") as container:
        stream = container.add_stream("flac", rate=sample_rate, layout=LAYOUTS[waveform.shape[0]])
        stream.format = "s16"
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(pcm16(waveform).T).reshape(1, -1), format="s16",
                                           layout=LAYOUTS[waveform.shape[0]])
        frame.sample_rate, frame.pts = sample_rate, 0
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    return buffer.getvalue()


def add_aac_track(container: av.container.OutputContainer, sound: Sound) -> av.AudioStream:
    """An AAC stream in ``container`` for ``sound`` (before anything is muxed)."""
    stream = container.add_stream("aac", rate=sound.sample_rate, layout=LAYOUTS[sound.waveform.shape[0]])
    stream.bit_rate = sound.bitrate
    stream.time_base = Fraction(1, sound.sample_rate)
    return stream


def aac_packets(stream: av.AudioStream, sound: Sound) -> list[av.Packet]:
    """The whole sound encoded (PyAV cuts it into the encoder's frames of 1024 samples)."""
    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(sound.waveform, np.float32), format="fltp",
                                       layout=LAYOUTS[sound.waveform.shape[0]])
    frame.sample_rate, frame.pts = sound.sample_rate, 0
    return [*stream.encode(frame), *stream.encode(None)]


@dataclass(frozen=True)
class AacPacket:
    """One encoded AAC frame: its presentation time in samples (negative for the priming ones),
    duration and bytes."""

    pts: int
    duration: int
    data: bytes


def aac_fragments(sound: Sound) -> tuple[SoundTrack, list[AacPacket]]:
    """The whole sound encoded for a fragmented MP4: its track's description (the encoder's
    AudioSpecificConfig, its priming) and its packets in order."""
    encoder = av.AudioCodecContext.create("aac", "w")
    encoder.sample_rate, encoder.layout, encoder.format = sound.sample_rate, LAYOUTS[sound.waveform.shape[0]], "fltp"
    encoder.bit_rate, encoder.time_base = sound.bitrate, Fraction(1, sound.sample_rate)
    encoder.flags |= av.codec.context.Flags.global_header  # the AudioSpecificConfig in extradata, for the esds
    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(sound.waveform, np.float32), format="fltp",
                                       layout=LAYOUTS[sound.waveform.shape[0]])
    frame.sample_rate, frame.pts = sound.sample_rate, 0
    # The encoder stamps every packet (the first ones before 0: its priming).
    packets = [AacPacket(p.pts or 0, p.duration or 0, bytes(p)) for p in [*encoder.encode(frame), *encoder.encode(None)]]
    track = SoundTrack(sample_rate=sound.sample_rate, channels=sound.waveform.shape[0],
                       specific_config=encoder.extradata or b"", bitrate=sound.bitrate, priming=-packets[0].pts)
    return track, packets


def read_sound(data: bytes) -> tuple[np.ndarray, int]:
    """The first audio stream of a file (WAV, FLAC, MP4) → ``(channels, samples)`` and its rate:
    int16 for 16-bit PCM and FLAC, float32 for AAC (tests, clients)."""
    with av.open(io.BytesIO(data), mode="r") as container:
        stream = container.streams.audio[0]
        frames = [frame.to_ndarray() for frame in container.decode(stream)]
        rate, channels = stream.rate, stream.channels
    planar = [f if f.shape[0] == channels else f.reshape(-1, channels).T for f in frames]  # packed: interleaved
    return np.concatenate(planar, axis=1), rate
