"""Fragmented MP4 boxes for one H.264 video track (and an AAC sound track), written as each frame's
packet comes out of the encoder: what a browser plays through Media Source Extensions while the
decode runs.

FFmpeg's MP4 muxer writes a frame's fragment only when the *next* packet arrives (or at the end),
so a stream written through it always lags a frame — a whole decode step when a step yields one
frame. These boxes are written per packet instead: ``init_segment`` (``ftyp`` + a ``moov`` with
no samples and an ``mvex``), then ``fragment`` (``moof`` + ``mdat``, one sample) for every packet,
offsets counted from each ``moof`` (``default-base-is-moof``), as ISO/IEC 14496-12 and -15 lay them
out. The encoder must emit packets in presentation order (no B-frames: libx264's
``tune=zerolatency``), so a sample's decode time is its presentation time and no composition
offsets or edit list are needed. Packets arrive in Annex B form (start codes) and are stored with
4-byte lengths, as the ``avcC`` sample entry declares.

The sound (track 2, ``mp4a`` with its ``esds``) is known whole before the first frame: its AAC
packets follow each frame's fragment up to that frame's end (``sound_fragment``: one ``moof`` +
``mdat`` of several samples). Its media time starts at the encoder's priming samples, which an
edit list skips, so the first sample a player presents is the waveform's first.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

_MATRIX = struct.pack(">9I", 0x10000, 0, 0, 0, 0x10000, 0, 0, 0, 0x40000000)  # identity, 16.16 / 2.30
_KEY_SAMPLE, _OTHER_SAMPLE = 0x02000000, 0x01010000  # depends on no other / depends on others, not a sync sample
_HIGH_PROFILES = {100, 110, 122, 144}  # their avcC carries chroma format and bit depths too


def box(kind: bytes, *payload: bytes) -> bytes:
    body = b"".join(payload)
    return struct.pack(">I", 8 + len(body)) + kind + body


def full_box(kind: bytes, version: int, flags: int, *payload: bytes) -> bytes:
    return box(kind, struct.pack(">I", version << 24 | flags), *payload)


def nal_units(annex_b: bytes) -> list[bytes]:
    """The NAL units of an Annex B byte stream (each after a 3- or 4-byte start code). A start code
    cannot occur inside a unit (emulation prevention), so splitting at them is exact; the zero
    byte of a 4-byte start code is trimmed from the unit before it."""
    starts, at = [], annex_b.find(b"\x00\x00\x01")
    while at >= 0:
        starts.append(at + 3)
        at = annex_b.find(b"\x00\x00\x01", at + 3)
    ends = [start - 3 for start in starts[1:]] + [len(annex_b)]
    return [annex_b[start:end].rstrip(b"\x00") for start, end in zip(starts, ends, strict=True)]


def length_prefixed(annex_b: bytes) -> bytes:
    """An Annex B access unit as MP4 stores it: each NAL unit after its 4-byte length."""
    return b"".join(struct.pack(">I", len(unit)) + unit for unit in nal_units(annex_b))


def avc_configuration(parameter_sets: bytes) -> bytes:
    """The ``avcC`` box from the encoder's Annex B parameter sets (SPS, type 7; PPS, type 8),
    for 8-bit 4:2:0 video (the only kind written here)."""
    units = nal_units(parameter_sets)
    sps = [unit for unit in units if unit[0] & 0x1F == 7]
    pps = [unit for unit in units if unit[0] & 0x1F == 8]
    if not sps or not pps:
        raise ValueError("the encoder's parameter sets hold no SPS and PPS (is its global header on?)")
    profile, constraints, level = sps[0][1:4]
    body = struct.pack(">5B", 1, profile, constraints, level, 0xFC | 3)  # 4-byte NAL lengths
    body += struct.pack(">B", 0xE0 | len(sps)) + b"".join(struct.pack(">H", len(s)) + s for s in sps)
    body += struct.pack(">B", len(pps)) + b"".join(struct.pack(">H", len(p)) + p for p in pps)
    if profile in _HIGH_PROFILES:  # chroma_format_idc 1 (4:2:0), luma and chroma bit depth 8, no SPS extensions
        body += struct.pack(">4B", 0xFC | 1, 0xF8, 0xF8, 0)
    return box(b"avcC", body)


@dataclass(frozen=True)
class SoundTrack:
    """An AAC track's description: its rate (its timescale), channels, the encoder's
    AudioSpecificConfig (its extradata), its bit rate and its priming samples (skipped by the edit list)."""

    sample_rate: int
    channels: int
    specific_config: bytes
    bitrate: int
    priming: int


def _sample_table(sample_entry: bytes) -> bytes:
    """A ``stbl`` describing no samples (the fragments hold them)."""
    empty = struct.pack(">I", 0)
    return box(b"stbl", full_box(b"stsd", 0, 0, struct.pack(">I", 1), sample_entry),
               full_box(b"stts", 0, 0, empty), full_box(b"stsc", 0, 0, empty),
               full_box(b"stsz", 0, 0, empty, empty), full_box(b"stco", 0, 0, empty))


def _track(track_id: int, *, timescale: int, handler: bytes, name: bytes, header: bytes, sample_entry: bytes,
           size: tuple[int, int] = (0, 0), volume: int = 0, edits: bytes = b"") -> bytes:
    """A ``trak`` of no samples: its header, media header, handler and sample description."""
    width, height = size
    media = box(
        b"mdia", full_box(b"mdhd", 0, 0, struct.pack(">4I2H", 0, 0, timescale, 0, 0x55C4, 0)),  # language "und"
        full_box(b"hdlr", 0, 0, struct.pack(">I4s3I", 0, handler, 0, 0, 0), name + b"\0"),
        box(b"minf", header,
            box(b"dinf", full_box(b"dref", 0, 0, struct.pack(">I", 1), full_box(b"url ", 0, 1))),
            _sample_table(sample_entry)))
    return box(b"trak", full_box(b"tkhd", 0, 3, struct.pack(">5I", 0, 0, track_id, 0, 0), bytes(8),
                                 struct.pack(">4H", 0, 0, volume, 0), _MATRIX, struct.pack(">2I", width << 16, height << 16)),
               edits, media)


def _descriptor(tag: int, *payload: bytes) -> bytes:
    body = b"".join(payload)
    return struct.pack(">BB", tag, len(body)) + body  # every one here is shorter than 128 bytes


def aac_description(sound: SoundTrack) -> bytes:
    """The ``mp4a`` sample entry and its ``esds`` (ISO/IEC 14496-1 descriptors: AAC, an audio stream)."""
    decoder_config = _descriptor(0x04, struct.pack(">BB", 0x40, 0x15), bytes(3), struct.pack(">2I", sound.bitrate,
                                 sound.bitrate), _descriptor(0x05, sound.specific_config))
    es = _descriptor(0x03, struct.pack(">HB", 0, 0), decoder_config, _descriptor(0x06, b"\x02"))
    return box(b"mp4a", bytes(6), struct.pack(">H", 1), bytes(8), struct.pack(">HHHH", sound.channels, 16, 0, 0),
               struct.pack(">I", sound.sample_rate << 16), full_box(b"esds", 0, 0, es))


def init_segment(width: int, height: int, *, timescale: int, parameter_sets: bytes,
                 sound: SoundTrack | None = None) -> bytes:
    """``ftyp`` + ``moov`` of one video track (track 1), and a ``sound`` track (2), with no
    samples: what precedes the fragments. ``parameter_sets``: the encoder's SPS and PPS (Annex B,
    its extradata)."""
    sample_entry = box(
        b"avc1", bytes(6), struct.pack(">HHH3I", 1, 0, 0, 0, 0, 0), struct.pack(">HH", width, height),
        struct.pack(">IIIH", 0x480000, 0x480000, 0, 1), bytes(32), struct.pack(">Hh", 0x18, -1),
        avc_configuration(parameter_sets))
    tracks = _track(1, timescale=timescale, handler=b"vide", name=b"VideoHandler", header=full_box(b"vmhd", 0, 1, bytes(8)),
                    sample_entry=sample_entry, size=(width, height))
    extends = full_box(b"trex", 0, 0, struct.pack(">5I", 1, 1, 0, 0, 0))
    if sound is not None:
        # One edit: from media time ``priming`` on, at rate 1 (a duration of 0: the fragments' whole length).
        edits = box(b"edts", full_box(b"elst", 0, 0, struct.pack(">IIiHH", 1, 0, sound.priming, 1, 0)))
        tracks += _track(2, timescale=sound.sample_rate, handler=b"soun", name=b"SoundHandler",
                         header=full_box(b"smhd", 0, 0, bytes(4)), sample_entry=aac_description(sound),
                         volume=0x100, edits=edits)
        extends += full_box(b"trex", 0, 0, struct.pack(">5I", 2, 1, 0, 0, 0))
    movie = box(b"moov", full_box(b"mvhd", 0, 0, struct.pack(">4I", 0, 0, timescale, 0),
                                  struct.pack(">IH", 0x10000, 0x100), bytes(10), _MATRIX, bytes(24),
                                  struct.pack(">I", 3 if sound else 2)),
                tracks, box(b"mvex", extends))
    return box(b"ftyp", b"isom", struct.pack(">I", 0x200), b"isomiso6avc1mp41") + movie


def fragment(sequence: int, decode_time: int, duration: int, sample: bytes, *, keyframe: bool) -> bytes:
    """``moof`` + ``mdat`` of one sample of track 1: ``sample`` is one access unit (Annex B),
    ``decode_time`` and ``duration`` in the track's timescale, ``sequence`` counts from 1."""
    data = length_prefixed(sample)

    def moof(data_offset: int) -> bytes:
        run = full_box(b"trun", 0, 0x000701, struct.pack(">Ii3I", 1, data_offset, duration, len(data),
                                                         _KEY_SAMPLE if keyframe else _OTHER_SAMPLE))
        track = box(b"traf", full_box(b"tfhd", 0, 0x020000, struct.pack(">I", 1)),  # default-base-is-moof
                    full_box(b"tfdt", 1, 0, struct.pack(">Q", decode_time)), run)
        return box(b"moof", full_box(b"mfhd", 0, 0, struct.pack(">I", sequence)), track)

    header = moof(0)
    return moof(len(header) + 8) + box(b"mdat", data)  # the sample starts after the moof and mdat's header


def sound_fragment(sequence: int, decode_time: int, samples: list[tuple[bytes, int]]) -> bytes:
    """``moof`` + ``mdat`` of AAC ``samples`` (each its bytes and duration in samples) of track 2,
    the first at ``decode_time`` (the track's media time: the priming samples count)."""
    data = b"".join(sample for sample, _ in samples)

    def moof(data_offset: int) -> bytes:
        entries = b"".join(struct.pack(">2I", duration, len(sample)) for sample, duration in samples)
        run = full_box(b"trun", 0, 0x000301, struct.pack(">Ii", len(samples), data_offset), entries)
        track = box(b"traf", full_box(b"tfhd", 0, 0x020000, struct.pack(">I", 2)),
                    full_box(b"tfdt", 1, 0, struct.pack(">Q", decode_time)), run)
        return box(b"moof", full_box(b"mfhd", 0, 0, struct.pack(">I", sequence)), track)

    header = moof(0)
    return moof(len(header) + 8) + box(b"mdat", data)
