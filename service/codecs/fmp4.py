"""Fragmented MP4 boxes for one H.264 video track, written as each frame's packet comes out of the
encoder: what a browser plays through Media Source Extensions while the decode runs.

FFmpeg's MP4 muxer writes a frame's fragment only when the *next* packet arrives (or at the end),
so a stream written through it always lags a frame — a whole decode step when a step yields one
frame. These boxes are written per packet instead: ``init_segment`` (``ftyp`` + a ``moov`` with
no samples and an ``mvex``), then ``fragment`` (``moof`` + ``mdat``, one sample) for every packet,
offsets counted from each ``moof`` (``default-base-is-moof``), as ISO/IEC 14496-12 and -15 lay them
out. The encoder must emit packets in presentation order (no B-frames: libx264's
``tune=zerolatency``), so a sample's decode time is its presentation time and no composition
offsets or edit list are needed. Packets arrive in Annex B form (start codes) and are stored with
4-byte lengths, as the ``avcC`` sample entry declares.
"""

from __future__ import annotations

import struct

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


def init_segment(width: int, height: int, *, timescale: int, parameter_sets: bytes) -> bytes:
    """``ftyp`` + ``moov`` of one video track (track 1) with no samples: what precedes the
    fragments. ``parameter_sets``: the encoder's SPS and PPS (Annex B, its extradata)."""
    sample_entry = box(
        b"avc1", bytes(6), struct.pack(">HHH3I", 1, 0, 0, 0, 0, 0), struct.pack(">HH", width, height),
        struct.pack(">IIIH", 0x480000, 0x480000, 0, 1), bytes(32), struct.pack(">Hh", 0x18, -1),
        avc_configuration(parameter_sets))
    empty = struct.pack(">I", 0)
    sample_table = box(b"stbl", full_box(b"stsd", 0, 0, struct.pack(">I", 1), sample_entry),
                       full_box(b"stts", 0, 0, empty), full_box(b"stsc", 0, 0, empty),
                       full_box(b"stsz", 0, 0, empty, empty), full_box(b"stco", 0, 0, empty))
    media = box(
        b"mdia", full_box(b"mdhd", 0, 0, struct.pack(">4I2H", 0, 0, timescale, 0, 0x55C4, 0)),  # language "und"
        full_box(b"hdlr", 0, 0, struct.pack(">I4s3I", 0, b"vide", 0, 0, 0), b"VideoHandler\0"),
        box(b"minf", full_box(b"vmhd", 0, 1, bytes(8)),
            box(b"dinf", full_box(b"dref", 0, 0, struct.pack(">I", 1), full_box(b"url ", 0, 1))), sample_table))
    track = box(b"trak", full_box(b"tkhd", 0, 3, struct.pack(">5I", 0, 0, 1, 0, 0), bytes(8),
                                  struct.pack(">4H", 0, 0, 0, 0), _MATRIX, struct.pack(">2I", width << 16, height << 16)),
                media)
    movie = box(b"moov", full_box(b"mvhd", 0, 0, struct.pack(">4I", 0, 0, timescale, 0),
                                  struct.pack(">IH", 0x10000, 0x100), bytes(10), _MATRIX, bytes(24),
                                  struct.pack(">I", 2)),
                track, box(b"mvex", full_box(b"trex", 0, 0, struct.pack(">5I", 1, 1, 0, 0, 0))))
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
