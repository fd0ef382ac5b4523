"""Encode bodies as a hostile or careless client sends them: bombs refused from their headers
before a pixel exists, only the promised formats and codecs decoded (415 naming what came
instead), every decode failure a 4xx with its reason, the host-memory budget for decoded frames,
and a byte-mutation fuzz that finds no 5xx.

Codec-level checks call ``service.codecs.frames`` directly; HTTP checks use the app in-process,
and a real uvicorn server where the next request on the same connection matters. Both serve one
encode shape, ``(1, 3, 1, 16, 24)`` (every valid body here is one 16x24 frame): one compile each.
"""

from __future__ import annotations

import asyncio
import http.client
import io
import socket
import struct
import threading
import time
import zlib
from fractions import Fraction

import av
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st
from PIL import Image

from tests.helpers.service_helpers import SAMPLE_VIDEO, TINY, app_client, thread_server
from vaeserve import models
from vaeserve.service.codecs import frames as frames_module
from vaeserve.service.codecs.frames import parse_frames
from vaeserve.service.codecs.mp4 import mp4_header
from vaeserve.service.codecs.tensors import parse_npy
from vaeserve.service.codecs.video import mp4_bytes, read_mp4
from vaeserve.service.http.admission import MemoryBudget
from vaeserve.service.http.problems import ClientGone
from vaeserve.service.limits import Limits
from vaeserve.service.problem import Problem
from vaeserve.service.settings import DEFAULT_VIDEO_CODECS, Settings

CONFIG = models.WanVAEConfig(base_dim=TINY["base_dim"], num_res_blocks=TINY["num_res_blocks"])
SMALL = Limits(channels=16, max_batch=2, max_frames=9, max_height=64, max_width=64)
DEFAULTS = Limits(channels=16, max_batch=4, max_frames=129, max_height=1280, max_width=1280)  # the settings' defaults
PROBLEM = "application/problem+json"
# Every HTTP app here: the default frame and size limits, and the one encode shape it compiles.
SETTINGS = dict(max_frames=129, max_height=1280, max_width=1280, max_body_bytes=1 << 20, max_reading_bytes=1 << 22,
                shapes=["16x1x2x3"], encode_warmup=["3x1x16x24"])


# ---- bodies ---------------------------------------------------------------------------------------


def pixels(height: int = 16, width: int = 24, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def image(fmt: str, rgb: np.ndarray | None = None, **options) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels() if rgb is None else rgb).save(buffer, format=fmt, **options)
    return buffer.getvalue()


def video(frames: np.ndarray, *, codec: str = "libx264", container: str = "mp4", pix_fmt: str = "yuv420p",
          options: dict | None = None, container_options: dict | None = None) -> bytes:
    """``(F, H, W, 3)`` uint8 → a video file made by FFmpeg's own encoders and muxers."""
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container, options=container_options or {}) as out:
        stream = out.add_stream(codec, rate=16)
        assert isinstance(stream, av.VideoStream)
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], pix_fmt
        stream.options = options or {}
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buffer.getvalue()


def clip(frames: int = 5, height: int = 16, width: int = 24, seed: int = 0) -> np.ndarray:
    return np.stack([pixels(height, width, seed + i) for i in range(frames)])


def h264_packets(frames: np.ndarray) -> list[av.Packet]:
    """H.264 packets with their parameter sets in-band (Annex B), as a camera's stream carries them."""
    encoder = av.CodecContext.create("libx264", "w")
    encoder.width, encoder.height, encoder.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
    encoder.time_base = Fraction(1, 16)
    packets = []
    for index, rgb in enumerate(frames):
        frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
        frame.pts, frame.time_base = index, encoder.time_base
        packets += encoder.encode(frame)
    return packets + list(encoder.encode(None))


def size_change_mp4(first: tuple[int, int], then: tuple[int, int]) -> bytes:
    """An MP4 whose header says 5 frames of ``first`` (H, W); frames 3 and 4 switch to ``then``."""
    packets = h264_packets(clip(3, *first)) + h264_packets(clip(2, *then, seed=3))
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as out:
        stream = out.add_stream("h264", rate=16)
        stream.height, stream.width = first
        for index, packet in enumerate(packets):
            packet.stream, packet.pts, packet.dts, packet.time_base = stream, index, index, Fraction(1, 16)
            out.mux(packet)
    return buffer.getvalue()


def annex_b_two_sizes() -> bytes:
    """Two raw H.264 streams back to back (16x24 x 3 frames, then 16x32 x 2): no container at all."""
    return b"".join(bytes(p) for p in h264_packets(clip(3, 16, 24)) + h264_packets(clip(2, 16, 32)))


def png_of(width: int, height: int, depth: int, colour: int, rows: bytes, *, level: int = 6) -> bytes:
    """A PNG written chunk by chunk (Pillow cannot write 16-bit RGB): any depth and colour type."""
    def chunk(tag: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + tag + payload + struct.pack(">I", zlib.crc32(tag + payload))

    header = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows, level))
            + chunk(b"IEND", b""))


def deep_png(colour: int, depth: int, rgb: np.ndarray) -> bytes:
    """``rgb`` (H, W, 3) uint8 as a PNG of ``depth`` bits (8 or 16) and colour type 0, 2, 4 or 6."""
    channels = {0: rgb[..., :1], 2: rgb, 4: np.concatenate([rgb[..., :1], np.full_like(rgb[..., :1], 255)], -1),
                6: np.concatenate([rgb, np.full_like(rgb[..., :1], 255)], -1)}[colour]
    samples = channels.astype(">u2") * 257 if depth == 16 else channels
    height, width = rgb.shape[:2]
    rows = b"".join(b"\0" + samples[y].tobytes() for y in range(height))
    return png_of(width, height, depth, colour, rows)


def apng() -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels()).save(buffer, format="PNG", save_all=True, append_images=[Image.fromarray(pixels(seed=1))])
    return buffer.getvalue()


def problem_of(body: bytes, media_type: str = "", *, limits: Limits = SMALL,
               codecs: tuple = DEFAULT_VIDEO_CODECS) -> Problem:
    with pytest.raises(Problem) as info:
        parse_frames(body, media_type, None, None, CONFIG, limits, codecs=codecs)
    return info.value


def as_frames(rgb: np.ndarray) -> np.ndarray:
    """uint8 ``(F, H, W, 3)`` → ``(1, 3, F, H, W)`` in [-1, 1], as diffusers' image processor computes it."""
    return (2.0 * (rgb.astype(np.float32) / np.float32(255.0)) - 1.0).transpose(3, 0, 1, 2)[None]


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """The 10 KB MP4 whose 128 black 1280x1280 frames once cost 6 GB to refuse."""
    return video(np.zeros((128, 1280, 1280, 3), np.uint8), options={"preset": "ultrafast", "crf": "51"})


@pytest.fixture
def decodes(monkeypatch) -> list[int]:
    """Counts the frames the MP4 decoder produces, wherever it runs in this process."""
    produced: list[int] = []
    decode = frames_module.decode_mp4

    def counting(body, header, put, deadline=None):
        def put_counted(index, rgb):
            produced.append(index)
            put(index, rgb)
        decode(body, header, put_counted, deadline)

    monkeypatch.setattr(frames_module, "decode_mp4", counting)
    return produced


# ---- bombs: refused from the header ----------------------------------------------------------------


def test_the_10_kb_1280x1280x128_mp4_is_refused_without_decoding_a_frame(bomb, decodes):
    assert len(bomb) < 11_000
    problem = problem_of(bomb, "video/mp4", limits=DEFAULTS)
    assert (problem.status, problem.slug, problem.expected, problem.received) == (
        422, "invalid-frame-count", [125, 129], 128)
    assert decodes == []
    valid = video(clip(1))  # the control: the same path decodes a good body's frame
    assert parse_frames(valid, "video/mp4", None, None, CONFIG, DEFAULTS, codecs=DEFAULT_VIDEO_CODECS).shape == (
        1, 3, 1, 16, 24) and decodes == [0]


def test_a_png_zlib_bomb_is_refused_from_its_ihdr(monkeypatch):
    rows = bytes(1279 * (1 + 1280 * 3))
    bomb = png_of(1280, 1279, 8, 2, rows, level=9)
    assert len(bomb) < 8_000
    monkeypatch.setattr(frames_module, "read_image", lambda *a: pytest.fail("pixels were decoded"))
    problem = problem_of(bomb, "image/png", limits=DEFAULTS)
    assert (problem.slug, problem.expected, problem.received) == ("invalid-height", [1272, 1280], 1279)
    huge = png_of(100_000, 100_000, 8, 2, b"")
    assert problem_of(huge, "image/png", limits=DEFAULTS).slug == "too-large-height"
    jpeg = image("JPEG", pixels(16, 24))
    sof = jpeg.index(b"\xff\xc0")  # the frame header: precision, height, width
    wide = jpeg[:sof + 5] + struct.pack(">HH", 65000, 65000) + jpeg[sof + 9:]
    assert problem_of(wide, "image/jpeg", limits=DEFAULTS).slug == "too-large-height"


def test_16_bit_pngs_of_every_colour_type_are_refused_alike():
    rgb = pixels()
    for colour in (0, 2, 4, 6):
        problem = problem_of(deep_png(colour, 16, rgb), "image/png")
        assert (problem.status, problem.slug, problem.expected) == (422, "unsupported-bit-depth",
                                                                     "8 bits per channel or fewer"), colour
        assert problem.received.startswith("16-bit"), problem.received
        eight = parse_frames(deep_png(colour, 8, rgb), "image/png", None, None, CONFIG, SMALL,
                             codecs=DEFAULT_VIDEO_CODECS)  # the control: the same writer at 8 bits
        want = rgb if colour in (2, 6) else np.repeat(rgb[..., :1], 3, axis=-1)
        assert np.array_equal(eight, as_frames(want[None])), colour
    sof = image("JPEG").index(b"\xff\xc0")
    twelve = bytearray(image("JPEG"))
    twelve[sof + 4] = 12  # the sample precision of the frame header
    assert problem_of(bytes(twelve), "image/jpeg").slug == "unsupported-bit-depth"


# ---- only the promised formats and codecs ----------------------------------------------------------


def _ts() -> bytes:
    return video(clip(1), container="mpegts")


@pytest.mark.parametrize("make,media_type,received", [
    (lambda: image("BMP"), "image/png", "a BMP image"), (lambda: image("TIFF"), "image/png", "a TIFF image"),
    (lambda: image("WEBP"), "image/jpeg", "a WebP image"), (lambda: image("GIF"), "image/png", "a GIF image"),
    (lambda: image("PPM"), "image/png", "a PNM image"), (lambda: image("SGI"), "image/png", "an SGI image"),
    (lambda: image("DDS"), "image/png", "a DDS image"), (lambda: image("TGA"), "image/png", "unrecognized bytes"),
    (lambda: image("PCX"), "image/jpeg", "unrecognized bytes"), (lambda: b"Image type: RGB image\r\n\x1a" + bytes(64), "image/png", "unrecognized"),
    (lambda: image("JPEG2000"), "image/jpeg", "a JPEG 2000 image"), (lambda: image("ICO"), "image/png", "an ICO"),
    (apng, "image/png", "an animated PNG of 2 frames"), (_ts, "video/mp4", "an MPEG-TS video"),
    (lambda: image("PNG"), "video/mp4", "a PNG image"), (lambda: image("JPEG"), "image/png", "a JPEG image"),
    (lambda: video(clip(1), container="matroska"), "video/quicktime", "a Matroska/WebM video"),
    (annex_b_two_sizes, "video/mp4", "an H.264/H.265 elementary stream"),
    (lambda: b"ffconcat version 1.0\nfile http://example.com/x.mp4\n", "video/mp4", "an FFmpeg concat playlist"),
    (lambda: image("BMP"), "", "a BMP image"), (_ts, "application/octet-stream", "an MPEG-TS video"),
    (lambda: image("WEBP"), "", "a WebP image"),
], ids=["bmp", "tiff", "webp", "gif", "ppm", "sgi", "dds", "tga", "pcx", "im", "jp2", "ico", "apng", "mpegts",
        "png-as-mp4", "jpeg-as-png", "mkv-as-mov", "annex-b", "ffconcat", "bmp-sniffed", "ts-sniffed", "webp-sniffed"])
def test_formats_not_promised_are_415_naming_what_came(make, media_type, received):
    problem = problem_of(make(), media_type)
    assert (problem.status, problem.slug) == (415, "unsupported-media-type"), problem.detail
    assert problem.received.startswith(received), problem.received
    assert "image/png" in problem.expected and "video/mp4" in problem.expected


def test_promised_codecs_decode_exactly_as_pyav_does():
    rgb = clip(5)
    for codec, options in (("libx264", {}), ("libx265", {"x265-params": "log-level=none"}), ("mpeg4", {})):
        body = video(rgb, codec=codec, options=options)
        got = parse_frames(body, "video/mp4", None, None, CONFIG, SMALL, codecs=DEFAULT_VIDEO_CODECS)
        assert np.array_equal(got, as_frames(read_mp4(body))), codec
    quicktime = video(rgb, container="mov")
    assert quicktime[4:12] == b"ftypqt  "
    assert np.array_equal(parse_frames(quicktime, "video/quicktime", None, None, CONFIG, SMALL,
                                       codecs=DEFAULT_VIDEO_CODECS), as_frames(read_mp4(quicktime)))
    with open(SAMPLE_VIDEO, "rb") as sample:  # a real video: MPEG-4 Part 2, as OpenCV's mp4v writes it
        header = mp4_header(sample.read(), DEFAULT_VIDEO_CODECS, 129)
    assert (header.frames, header.height, header.width, header.codec) == (81, 480, 832, "mpeg4")


def test_other_codecs_are_415_unless_enabled_and_deep_video_is_refused():
    vp9 = video(clip(5), codec="libvpx-vp9")
    problem = problem_of(vp9, "video/mp4")
    assert (problem.status, problem.slug, problem.received) == (415, "unsupported-video-codec", "vp9")
    assert problem.expected == ["H.264/AVC", "H.265/HEVC", "MPEG-4 Part 2"]
    assert parse_frames(vp9, "video/mp4", None, None, CONFIG, SMALL, codecs=("vp9",)).shape == (1, 3, 5, 16, 24)
    mjpeg = video(clip(1), codec="mjpeg", pix_fmt="yuvj420p")
    assert problem_of(mjpeg, "video/mp4").received == "mjpeg"
    # H.264's High 10: libx265's 10-bit packets are, rarely, refused by FFmpeg's own MP4 muxer
    # (PatchWelcomeError) while the test builds its input; the refusal reads the depth, not the codec.
    ten_bit = video(clip(1), codec="libx264", pix_fmt="yuv420p10le")
    problem = problem_of(ten_bit, "video/mp4")
    assert (problem.slug, problem.received) == ("unsupported-bit-depth", "yuv420p10le")


def test_a_fragmented_mp4_is_counted_from_its_packets():
    rgb = clip(5)
    fragmented = video(rgb, container_options={"movflags": "frag_keyframe+empty_moov"})
    with av.open(io.BytesIO(fragmented), format="mp4") as container:
        assert container.streams.video[0].frames == 0  # the header does not count them
    got = parse_frames(fragmented, "video/mp4", None, None, CONFIG, SMALL, codecs=DEFAULT_VIDEO_CODECS)
    assert np.array_equal(got, as_frames(read_mp4(fragmented)))
    long = video(clip(13), container_options={"movflags": "frag_keyframe+empty_moov"})
    problem = problem_of(long, "video/mp4")  # counted up to the limit, no further
    assert (problem.slug, problem.received) == ("too-many-frames", "more than 9")


# ---- every decode failure is a 4xx with its reason ---------------------------------------------------


def test_a_frame_size_change_mid_stream_is_422_naming_it():
    smaller = problem_of(size_change_mp4((16, 24), (16, 16)), "video/mp4")
    assert (smaller.status, smaller.slug, smaller.received) == (422, "invalid-video", "16x16")
    assert "frame 3 is 16x16 (the frame size changes): the MP4 declares 5 frames of 24x16" in smaller.detail
    larger = problem_of(size_change_mp4((16, 24), (256, 320)), "video/mp4")  # over the decoder's max_pixels
    assert (larger.status, larger.slug) == (422, "invalid-video") and larger.received.endswith("of 5 frames decoded")
    assert "does not decode after" in larger.detail and "a frame larger than declared" in larger.detail


def test_truncated_and_damaged_mp4s_are_422_with_the_reason():
    body = mp4_bytes(clip(5), fps=16, crf=18)  # faststart: the index first, then the frames
    mdat = body.index(b"mdat")
    cut = problem_of(body[: mdat + (len(body) - mdat) // 2], "video/mp4")
    assert cut.slug == "invalid-video" and "truncated" in cut.detail, cut.detail
    assert problem_of(body[:mdat // 2], "video/mp4").status in (415, 422)  # the index itself cut
    for end in range(8, len(body), max(1, len(body) // 40)):  # every cut is a 4xx, never anything else
        assert problem_of(body[:end], "video/mp4").status in (415, 422), end


# ---- honest messages --------------------------------------------------------------------------------


def test_a_body_that_is_not_a_npy_says_what_it_is():
    with pytest.raises(Problem) as info:
        parse_npy(image("PNG"), check=lambda shape: None)
    assert info.value.slug == "invalid-npy" and "not a .npy file: it is a PNG image" in info.value.detail
    assert "pickle" not in info.value.detail
    buffer = io.BytesIO()
    np.save(buffer, np.array([object()], dtype=object), allow_pickle=True)
    with pytest.raises(Problem) as info:
        parse_npy(buffer.getvalue(), check=lambda shape: None)
    assert "Python objects (pickled data)" in info.value.detail


# ---- the host-memory budget --------------------------------------------------------------------------


class Client:
    """What the budget reads of a request: ``receive()``, which answers ``http.disconnect`` once
    the client has left (``leave()``)."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()

    async def receive(self) -> dict:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    def leave(self) -> None:
        self.gone.set()


def test_the_budget_serves_waiters_in_turn_and_gives_up_at_the_deadline():
    async def scenario() -> None:
        reported: list[int] = []
        budget = MemoryBudget(10, reported.append)
        later = time.monotonic() + 30
        await budget.acquire(6, deadline=later, retry_after_s=1, receive=Client().receive)
        big = asyncio.ensure_future(budget.acquire(6, deadline=later, retry_after_s=1, receive=Client().receive))
        small = asyncio.ensure_future(budget.acquire(2, deadline=later, retry_after_s=1, receive=Client().receive))
        await asyncio.sleep(0.05)
        assert not big.done() and not small.done()  # 2 would fit, but it waits its turn behind 6
        budget.release(6)
        await asyncio.sleep(0.01)
        assert big.done() and small.done() and budget.used == 8
        with pytest.raises(Problem) as info:  # 8 + 6 > 10 until the deadline
            await budget.acquire(6, deadline=time.monotonic() + 0.1, retry_after_s=7, receive=Client().receive)
        assert (info.value.status, info.value.slug, info.value.headers["Retry-After"]) == (503, "busy-host-memory", "7")
        assert budget.used == 8 and not budget._waiting
        leaving = Client()
        waiter = asyncio.ensure_future(budget.acquire(6, deadline=later, retry_after_s=1, receive=leaving.receive))
        await asyncio.sleep(0.01)
        leaving.leave()
        with pytest.raises(ClientGone):
            await waiter
        cancelled = asyncio.ensure_future(budget.acquire(4, deadline=later, retry_after_s=1, receive=Client().receive))
        budget.release(2)  # 6 used: the 4 fits and is granted ...
        cancelled.cancel()  # ... but its request is cancelled before it runs: handed back
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert budget.used == 6 and reported[-1] == 6
        budget.release(6)
        assert budget.used == 0 and reported[-1] == 0

    asyncio.run(scenario())


def test_the_former_budget_setting_is_read_as_the_host_account():
    with pytest.warns(DeprecationWarning, match="now host_memory_bytes"):
        assert Settings(max_decoded_bytes=2**30).host_memory_bytes == 2**30
    with pytest.warns(DeprecationWarning, match="ignored"):
        assert Settings(max_buffered_bytes=2**30).host_memory_bytes is None
    with pytest.raises(ValueError, match="literal_error"):
        Settings(video_codecs=["mjpeg"])


@pytest.fixture(scope="module")
def client(tiny_vae):
    with app_client(tiny_vae, **SETTINGS) as client:
        yield client


def assert_problem(response, status: int, slug: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    body = response.json()
    assert body["type"].endswith("/" + slug), body
    return body


def test_over_http_the_bomb_is_refused_without_decoding_and_odd_bodies_are_4xx(client, bomb, decodes):
    body = assert_problem(client.post("/v1/encode", content=bomb, headers={"Content-Type": "video/mp4"}), 422,
                          "invalid-frame-count")
    assert body["received"] == 128 and decodes == []
    assert_problem(client.post("/v1/encode", content=bomb), 422, "invalid-frame-count")  # sniffed: the same
    assert_problem(client.post("/v1/encode", content=image("BMP"), headers={"Content-Type": "image/png"}), 415,
                   "unsupported-media-type")
    assert_problem(client.post("/v1/decode", content=image("PNG"), headers={"Content-Type": "application/x-npy"}),
                   422, "invalid-npy")
    assert client.post("/v1/encode", content=video(clip(1))).status_code == 200 and decodes == [0]


def test_encodes_wait_for_decoding_memory_up_to_their_deadline_then_503(client):
    state = client.app.state.service
    budget = state.host
    body = image("PNG")
    client.portal.call(setattr, budget, "used", budget.limit)  # as if other encodes held all of it
    try:
        start = time.monotonic()
        refused = client.post("/v1/encode", content=body, params={"timeout_s": 0.5})
        assert time.monotonic() - start >= 0.5
        problem = assert_problem(refused, 503, "busy-host-memory")
        assert refused.headers["Retry-After"] == "1" and problem["received"] == "0 bytes free"
        answers: list = []
        waiting = threading.Thread(target=lambda: answers.append(client.post("/v1/encode", content=body)))
        waiting.start()
        time.sleep(0.5)
        assert not answers  # still waiting for room
        client.portal.call(budget.release, budget.limit)
        waiting.join(30)
        assert answers[0].status_code == 200, answers[0].text
    finally:
        client.portal.call(setattr, budget, "used", 0)
    assert client.get("/metrics").text.count("vaeserve_host_memory_bytes 0.0") == 1


# ---- the connection survives every refusal (a real server) --------------------------------------------


@pytest.fixture(scope="module")
def server(tiny_vae):
    with thread_server(tiny_vae, **SETTINGS) as srv:
        yield srv


def exchange(sock: socket.socket, body: bytes, content_type: str | None) -> tuple[http.client.HTTPResponse, bytes]:
    """One encode request on an open connection, and its answer read to the end."""
    head = f"POST /v1/encode HTTP/1.1\r\nHost: test\r\nContent-Length: {len(body)}\r\n"
    head += f"Content-Type: {content_type}\r\n" if content_type else ""
    sock.sendall((head + "\r\n").encode() + body)
    response = http.client.HTTPResponse(sock)
    response.begin()
    return response, response.read()


def test_after_each_refusal_the_next_request_on_the_connection_is_served(server):
    refused = [(size_change_mp4((16, 24), (16, 16)), "video/mp4", 422), (image("BMP"), "image/png", 415),
               (image("TIFF"), "image/png", 415), (image("WEBP"), "image/jpeg", 415), (_ts(), "video/mp4", 415),
               (image("PNG"), "video/mp4", 415), (deep_png(2, 16, pixels()), "image/png", 422),
               (annex_b_two_sizes(), "video/mp4", 415), (image("BMP"), None, 415)]
    with socket.create_connection(server.address, timeout=60) as sock:
        for body, content_type, status in refused:
            response, answer = exchange(sock, body, content_type)
            assert response.status == status and response.getheader("Content-Type") == PROBLEM, answer
            assert response.getheader("Connection") != "close"
            served, latents = exchange(sock, image("PNG"), "image/png")
            assert served.status == 200 and len(latents) == 16 * 2 * 3 * 4, latents  # float32 (1, 16, 1, 2, 3)


# ---- fuzz: mutated PNG, JPEG and MP4 bodies never get a 5xx ----------------------------------------------

SEEDS = {"image/png": image("PNG"), "image/jpeg": image("JPEG", quality=90), "video/mp4": video(clip(1))}
mutations = st.tuples(
    st.sampled_from(sorted(SEEDS)),
    st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), min_size=1, max_size=6),
    st.one_of(st.none(), st.integers(0, 1 << 16)),  # a cut, sometimes
)


@settings(max_examples=120, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(mutation=mutations)
def test_mutated_bodies_never_get_a_5xx(client, mutation):
    media_type, edits, cut = mutation
    body = bytearray(SEEDS[media_type])
    for position, value in edits:
        body[position % len(body)] = value
    if cut is not None:
        body = body[: cut % (len(body) + 1)]
    for content_type in (media_type, None):  # declared, and sniffed
        response = client.post("/v1/encode", content=bytes(body), headers={"Content-Type": content_type} if content_type else {})
        assert response.status_code < 500, (media_type, edits, cut, response.text)
        event(f"{media_type} ({'declared' if content_type else 'sniffed'}): {response.status_code}")
        if response.status_code != 200:
            assert response.headers["content-type"] == PROBLEM
