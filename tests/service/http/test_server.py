"""End-to-end tests of the decoding service: a real uvicorn server in a subprocess, real HTTP,
real H.264, the tiny Wan model. One server per module; shapes kept few so compiles stay cheap."""

from __future__ import annotations

import asyncio
import io
import json
import socket

import httpx
import numpy as np
import pytest
import safetensors.numpy

from tests.helpers.frames import assert_uint8_frames_match
from tests.helpers.service_helpers import WARM, latents, start_server
from vaeserve.service.client import DecodeError, decode, decode_stream
from vaeserve.service.codecs.tensors import npy_bytes
from vaeserve.service.codecs.video import read_mp4

PROBLEM = "application/problem+json"
LIMITS = ["--max-frames", "9", "--max-height", "64", "--max-width", "64", "--max-body-bytes", "65536"]


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("logs") / "server.log"
    srv = start_server(tiny_model_dir, log, "--warmup", WARM, "--max-batch", "2", "--max-queue", "4", *LIMITS)
    yield srv
    assert srv.stop() == 0, srv.log()


def post(server, body: bytes, *, content_type="application/octet-stream", timeout=60, headers=None, **params):
    return httpx.post(server.url + "/v1/decode", content=body, params=params, timeout=timeout,
                      headers={"Content-Type": content_type, **(headers or {})})


def luma(frames: np.ndarray) -> np.ndarray:
    return frames.astype(np.float64) @ np.array([0.299, 0.587, 0.114])


def raw(x: np.ndarray, **params) -> dict:
    return {"shape": ",".join(map(str, x.shape)), "dtype": "float32", **params}


# ---- outputs equal the direct decode ------------------------------------------------------------


def test_npy_and_pt_equal_direct_decode(server, tiny_vae):
    x = latents()
    direct = np.asarray(tiny_vae.decode(x, output="uint8"))
    r = post(server, x.tobytes(), **raw(x, output_type="npy"))
    assert r.status_code == 200, r.text
    frames = np.load(io.BytesIO(r.content), allow_pickle=False)
    assert frames.shape == (1, 5, 32, 32, 3) and frames.dtype == np.uint8
    # Same program family on one device; batch padding may move a value by one rounding step.
    assert_uint8_frames_match(frames, direct)
    for name in ("X-Request-Id", "X-Queue-Time-S", "X-Device-Time-S"):
        assert name in r.headers
    assert float(r.headers["X-Device-Time-S"]) > 0

    r = post(server, x.tobytes(), **raw(x, output_type="pt"))
    assert r.status_code == 200 and r.headers["dtype"] == "float16"
    out = np.frombuffer(r.content, np.float16).reshape(json.loads(r.headers["shape"]))
    ref = np.asarray(tiny_vae.decode(x, output="float"))
    assert out.shape == ref.shape == (1, 3, 5, 32, 32)
    assert np.abs(out.astype(np.float32) - ref).max() < 2e-3  # float16 rounding of values in [-1, 1]


def test_denormalize_and_unbatched_input(server, tiny_vae):
    x = latents(seed=1)
    ref = np.asarray(tiny_vae.decode(x, output="uint8", denormalize=True))[0]
    r = post(server, x[0].tobytes(), **raw(x[0], output_type="npy", denormalize="true"))
    assert r.status_code == 200, r.text
    frames = np.load(io.BytesIO(r.content), allow_pickle=False)
    assert frames.shape == (5, 32, 32, 3)  # (C, T, H, W) in -> no batch dim out
    assert_uint8_frames_match(frames, ref)
    plain = np.asarray(tiny_vae.decode(x, output="uint8"))[0]
    assert np.abs(frames.astype(int) - plain).mean() > 5  # negative control: the option did something


def test_npy_and_safetensors_bodies(server):
    x = latents(seed=2)
    want = post(server, x.tobytes(), **raw(x, output_type="npy")).content
    r = post(server, npy_bytes(x), content_type="application/x-npy", output_type="npy")
    assert r.status_code == 200 and r.content == want
    body = safetensors.numpy.save({"latents": x})
    r = post(server, body, content_type="application/x-safetensors", output_type="npy")
    assert r.status_code == 200 and r.content == want


def test_mp4_is_h264_and_close_to_frames(server, tiny_vae):
    x = latents(seed=3)
    r = post(server, x.tobytes(), **raw(x, output_type="mp4", fps=8, crf=12))
    assert r.status_code == 200 and r.headers["content-type"] == "video/mp4"
    import av

    with av.open(io.BytesIO(r.content)) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264" and float(stream.average_rate) == 8
        video = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    ref = np.asarray(tiny_vae.decode(x, output="uint8"))[0]
    other = np.asarray(tiny_vae.decode(latents(seed=4), output="uint8"))[0]
    assert video.shape == ref.shape == (5, 32, 32, 3)
    # H.264 is lossy and 4:2:0 halves chroma resolution, which costs a lot on the random model's
    # pixel noise; luma keeps full resolution, so compare luma. A different video is the control.
    err = np.abs(luma(video) - luma(ref)).mean()
    assert err < 4, err
    assert np.abs(luma(video) - luma(other)).mean() > 5 * err


def test_png_frame(server, tiny_vae):
    from PIL import Image

    x = latents(seed=5)
    r = post(server, x.tobytes(), **raw(x, output_type="png", frame=3))
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    image = np.asarray(Image.open(io.BytesIO(r.content)).convert("RGB"))
    ref = np.asarray(tiny_vae.decode(x, output="uint8"))[0, 3]
    assert_uint8_frames_match(image, ref)


def test_stream_chunks_concatenate_to_full_decode(server):
    x = latents((1, 16, 3, 4, 4), seed=6)
    chunks = list(decode_stream(server.url, x))
    assert [c.shape[1] for c in chunks] == [1, 4, 4]  # frame 0 alone, then 4 per latent frame
    full = decode(server.url, x, output_type="npy")
    assert np.array_equal(np.concatenate(chunks, axis=1), full)


# ---- diffusers' own client ----------------------------------------------------------------------


def test_diffusers_remote_decode(server, tiny_vae):
    torch = pytest.importorskip("torch")
    remote_decode = pytest.importorskip("diffusers.utils.remote_utils").remote_decode

    x = latents(seed=7)
    endpoint = server.url + "/v1/decode"
    ref = np.asarray(tiny_vae.decode(x, output="uint8", denormalize=True))[0]  # do_scaling defaults to True
    video = remote_decode(endpoint=endpoint, tensor=torch.from_numpy(x), output_type="mp4", return_type="mp4")
    assert isinstance(video, bytes) and video[4:8] == b"ftyp"
    assert np.abs(luma(read_mp4(video)) - luma(ref)).mean() < 5  # crf 18 default

    frames = remote_decode(endpoint=endpoint, tensor=torch.from_numpy(x), output_type="pt", return_type="pt",
                           partial_postprocess=True)
    assert frames.dtype == torch.uint8 and tuple(frames.shape) == (1, 5, 32, 32, 3)
    assert_uint8_frames_match(frames.numpy()[0], ref)

    floats = remote_decode(endpoint=endpoint, tensor=torch.from_numpy(x), output_type="pt", return_type="pt",
                           do_scaling=False)
    ref_float = np.asarray(tiny_vae.decode(x, output="float"))
    assert floats.dtype == torch.float16 and tuple(floats.shape) == ref_float.shape
    assert np.abs(floats.float().numpy() - ref_float).max() < 2e-3


# ---- scheduling ---------------------------------------------------------------------------------


def test_30_concurrent_requests_all_answered(server):
    # A shape not warmed up: the first batch compiles for seconds, so the 4-slot queue overflows.
    x = latents((1, 16, 3, 4, 4), seed=8)
    before = {s: server.metric("vaeserve_requests_total", route="/v1/decode", status=s) for s in ("200", "429")}

    async def fire():
        async with httpx.AsyncClient(timeout=120) as client:
            calls = [client.post(server.url + "/v1/decode", content=x.tobytes(),
                                 params=raw(x, output_type="npy"), headers={"Content-Type": "tensor/binary"})
                     for _ in range(30)]
            return await asyncio.wait_for(asyncio.gather(*calls), timeout=120)

    responses = asyncio.run(fire())
    statuses = [r.status_code for r in responses]
    # Every request answered, none lost. How many overflow the 4-slot queue depends on how fast the
    # burst arrives against the compile (none, on a machine that compiles faster than 30 requests
    # arrive): the queue limit itself is shown deterministically in test_connections.py.
    assert len(statuses) == 30 and set(statuses) <= {200, 429} and statuses.count(200) >= 1, statuses
    for r in responses:
        if r.status_code == 429:
            assert r.headers["Retry-After"] == "1" and r.headers["content-type"] == PROBLEM
    # Batched or not, every answer is the same decode: up to float rounding, since a batch of 2
    # runs another program than a batch of 1 (~2e-6 apart), which can flip a uint8 at an exact .5.
    answers = [np.load(io.BytesIO(r.content), allow_pickle=False).astype(int) for r in responses if r.status_code == 200]
    for answer in answers[1:]:
        assert np.abs(answer - answers[0]).max() <= 1 and np.mean(answer == answers[0]) > 0.999
    after = {s: server.metric("vaeserve_requests_total", route="/v1/decode", status=s) for s in ("200", "429")}
    assert after["200"] - before["200"] == statuses.count(200)
    assert after["429"] - before["429"] == statuses.count(429)


def test_metrics_count_what_was_sent(server):
    x = latents(seed=9)
    ok0 = server.metric("vaeserve_requests_total", route="/v1/decode", status="200")
    frames0 = server.metric("vaeserve_frames_decoded_total")
    hist0 = server.metric("vaeserve_device_seconds_count", operation="decode")
    for _ in range(3):
        assert post(server, x.tobytes(), **raw(x, output_type="npy")).status_code == 200
    assert post(server, b"", content_type="text/plain").status_code == 415
    assert server.metric("vaeserve_requests_total", route="/v1/decode", status="200") - ok0 == 3
    assert server.metric("vaeserve_frames_decoded_total") - frames0 == 15
    assert 1 <= server.metric("vaeserve_device_seconds_count", operation="decode") - hist0 <= 3  # some may share a batch
    assert server.metric("vaeserve_requests_total", route="/v1/decode", status="415") >= 1
    assert server.metric("vaeserve_ready") == 1
    assert server.metric("vaeserve_compiles_total") >= 2  # the warm-up buckets 1 and 2 at least
    assert server.metric("vaeserve_programs") == server.metric("vaeserve_compiles_total")  # none evicted


def test_deadline_gives_504_then_service_recovers(server):
    x = latents(seed=10)
    r = post(server, x.tobytes(), **raw(x, output_type="npy", timeout_s=1e-6))
    assert r.status_code == 504 and r.headers["content-type"] == PROBLEM
    assert r.json()["request_id"] == r.headers["X-Request-Id"]
    assert post(server, x.tobytes(), **raw(x, output_type="npy")).status_code == 200


# ---- operations ---------------------------------------------------------------------------------


def test_health_ready_models_docs(server):
    assert httpx.get(server.url + "/healthz").json() == {"status": "ok"}
    assert httpx.get(server.url + "/readyz").json()["ready"] is True
    info = httpx.get(server.url + "/v1/models").json()["data"][0]
    assert info["config"]["base_dim"] == 8 and info["config"]["z_dim"] == 16
    assert info["mesh"]["tp"] == 1 and info["mesh"]["dp"] == 1 and len(info["mesh"]["devices"]) == 1
    assert info["mesh"]["convs"] == "onednn"  # the CPU default
    assert info["warmed_shapes"] == [[16, 2, 4, 4]] and info["batch_buckets"] == [1, 2]
    assert info["dtype"] == "float32" and info["random_weights"] is False  # loaded from a folder
    assert httpx.get(server.url + "/docs").status_code == 200
    assert "/v1/decode" in httpx.get(server.url + "/openapi.json").json()["paths"]
    r = httpx.get(server.url + "/nope")
    assert r.status_code == 404 and r.headers["content-type"] == PROBLEM


# ---- bad input ------------------------------------------------------------------------------------

GOOD = latents(seed=12)
NAN = GOOD.copy()
NAN[0, 3, 1, 2, 2] = np.nan
INF = GOOD.copy()
INF[0, 0, 0, 0, 0] = np.inf


def _npy_object() -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    return buffer.getvalue()


BAD = [
    # id, body, content type, params, status, slug, expected, received
    ("ndim", GOOD[0, 0].tobytes(), None, {"shape": "2,4,4"}, 422, "invalid-ndim", None, [2, 4, 4]),
    ("channels", GOOD[:, :8].tobytes(), None, {"shape": "1,8,2,4,4"}, 422, "invalid-channels", 16, 8),
    ("dtype", GOOD.tobytes(), None, {"shape": "1,16,2,4,4", "dtype": "int32"}, 422, "invalid-dtype", None, "int32"),
    ("length", GOOD.tobytes()[:-4], None, {"shape": "1,16,2,4,4"}, 422, "body-length-mismatch", 2048, 2044),
    ("frames", latents((1, 16, 4, 4, 4)).tobytes(), None, {"shape": "1,16,4,4,4"}, 422, "too-many-frames",
     "frames <= 9", 13),
    ("height", latents((1, 16, 1, 9, 4)).tobytes(), None, {"shape": "1,16,1,9,4"}, 422, "too-large-height",
     "height <= 64", 72),
    ("width", latents((1, 16, 1, 4, 9)).tobytes(), None, {"shape": "1,16,1,4,9"}, 422, "too-large-width",
     "width <= 64", 72),
    ("batch", latents((3, 16, 1, 4, 4)).tobytes(), None, {"shape": "3,16,1,4,4"}, 422, "too-large-batch",
     "batch <= 2", 3),
    ("nan", NAN.tobytes(), None, {"shape": "1,16,2,4,4"}, 422, "non-finite", "finite values", None),
    ("inf", INF.tobytes(), None, {"shape": "1,16,2,4,4"}, 422, "non-finite", "finite values", None),
    ("content-type", GOOD.tobytes(), "text/plain", {}, 415, "unsupported-media-type", None, "text/plain"),
    ("pickle", _npy_object(), "application/x-npy", {}, 422, "invalid-npy", None, None),
    ("no-shape", GOOD.tobytes(), None, {"shape": None}, 422, "missing-shape", None, None),
    ("output-type", GOOD.tobytes(), None, {"output_type": "gif"}, 422, "invalid-parameter", None, "gif"),
    ("mp4-batch", latents((2, 16, 2, 4, 4)).tobytes(), None, {"shape": "2,16,2,4,4", "output_type": "mp4"}, 422,
     "batch-not-supported", "batch size 1", 2),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_is_problem_json(server, case):
    _, body, content_type, params, status, slug, expected, received = case
    query = {"shape": "1,16,2,4,4", "dtype": "float32", "output_type": "npy", **params}
    r = post(server, body, content_type=content_type or "application/octet-stream",
             **{k: v for k, v in query.items() if v is not None})
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == PROBLEM
    problem = r.json()
    assert problem["status"] == status and problem["type"].endswith("/" + slug), problem
    assert problem["request_id"] == r.headers["X-Request-Id"] and problem["detail"]
    assert "expected" in problem
    if expected is not None:
        assert problem["expected"] == expected
    if received is not None:
        assert problem["received"] == received


def test_after_bad_inputs_a_good_request_works(server, tiny_vae):
    r = post(server, GOOD.tobytes(), **raw(GOOD, output_type="npy"))
    assert r.status_code == 200
    frames = np.load(io.BytesIO(r.content), allow_pickle=False)
    assert_uint8_frames_match(frames, np.asarray(tiny_vae.decode(GOOD, output="uint8")))


def test_413_from_headers_before_reading_the_body(server):
    # Announce a gigabyte and send none of it: the answer must come without waiting for the body.
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(b"POST /v1/decode?shape=1,16,2,4,4&dtype=float32 HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/octet-stream\r\nContent-Length: 1000000000\r\n\r\n")
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            part = sock.recv(65536)
            if not part:
                break
            reply += part
    # No timing needed: a server that waited for the body would answer 408 after its read timeout.
    head, _, body = reply.decode("latin-1").partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 413"), reply
    assert "application/problem+json" in head
    problem = json.loads(body)
    assert problem["received"] == 1_000_000_000 and problem["expected"] == "<= 65536 bytes"


def test_client_helper_raises_problem(server):
    with pytest.raises(DecodeError) as info:
        decode(server.url, latents((1, 16, 4, 4, 4)), output_type="npy")
    assert info.value.problem["status"] == 422


def test_413_for_chunked_body_over_the_limit(server):
    def chunks():  # no Content-Length: the limit is enforced while reading
        for _ in range(20):
            yield b"\0" * 8192

    r = httpx.post(server.url + "/v1/decode", content=chunks(), params={"shape": "1,16,2,4,4", "dtype": "float32"},
                   headers={"Content-Type": "tensor/binary"}, timeout=30)
    assert r.status_code == 413 and r.json()["expected"] == "<= 65536 bytes"


@pytest.mark.parametrize("mode", [["--concurrency", "3"], ["--rate", "40"]], ids=["closed", "open"])
def test_loadtest_reports_what_it_sent(server, tmp_path, mode, capsys):
    from vaeserve.service.cli.loadtest import main

    out = tmp_path / "lt.json"
    answered0 = {status: server.metric("vaeserve_requests_total", route="/v1/decode", status=status)
                 for status in ("200", "429")}
    assert main(["--url", server.url, *mode, "--requests", "12", "--duration", "30", "--warmup", "1",
                 "--shape", "1x16x2x4x4", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    summary = result["summary"]
    assert summary["requests"] == len(result["samples"]) == 12
    # What it reports is what the server answered (the warm-up request aside). Open loop, 40 req/s
    # may overflow the 4-slot queue when the host is slow: 429s are answers too, counted as such.
    warm_ups = 1 + len(result["warmup"]["buckets"])  # one per batch bucket, then --warmup 1
    answered = {status: int(server.metric("vaeserve_requests_total", route="/v1/decode", status=status)
                            - answered0[status]) - (status == "200") * warm_ups
                for status in ("200", "429")}
    assert summary["by_status"] == {status: n for status, n in answered.items() if n}, answered
    assert summary["ok"] == answered["200"] >= 1
    if mode[0] == "--concurrency":  # 3 at a time never fill 4 slots
        assert summary["by_status"] == {"200": 12}
    assert 0 < summary["latency_s"]["p50"] <= summary["latency_s"]["p95"] <= summary["latency_s"]["p99"]
    assert summary["frames_per_s"] == pytest.approx(5 * summary["requests_per_s"])
    assert summary["bytes_per_response"] == 5 * 32 * 32 * 3  # uint8 frames, pt + partial_postprocess
    assert "p50" in capsys.readouterr().out


def test_loadtest_compiles_every_batch_bucket_before_it_measures(server, tmp_path, capsys):
    from vaeserve.service.cli.loadtest import main

    # A shape the server was not warmed with: its programs are compiled by the loadtest's warm-up,
    # the decode's two steps (latent frame 0, then one more) per batch bucket (max_batch 2: buckets
    # 1 and 2, both reachable by 2 clients).
    out = tmp_path / "lt.json"
    compiles0 = server.metric("vaeserve_compiles_total")
    assert main(["--url", server.url, "--concurrency", "2", "--requests", "6", "--warmup", "1",
                 "--shape", "1x16x2x4x6", "--output-type", "npy", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["warmup"] == {"buckets": [1, 2], "skipped": {}, "requests": 1}
    assert result["compiles_in_window"] == 0 and server.metric("vaeserve_compiles_total") == compiles0 + 4
    compiled = httpx.get(server.url + "/v1/models").json()["data"][0]["compiled"]
    assert {(p[1][0], p[2]) for p in compiled if p[0] == "stream-step" and p[1][1:] == [16, 1, 4, 6]} == {
        (1, "first"), (1, "next"), (2, "first"), (2, "next")}
    summary = result["summary"]
    assert summary["ok"] == 6 and set(summary["batch_sizes"]) <= {"1", "2"}
    # Queue and device time beside the latency, from the answers' headers.
    assert all(s["queue_s"] >= 0 and s["device_s"] > 0 and s["batch_size"] in (1, 2) for s in result["samples"])
    assert 0 < summary["device_s"]["p50"] <= summary["latency_s"]["max"]
    text = capsys.readouterr().out
    assert "batch buckets [1, 2] compiled first" in text and "device    p50" in text and "compiles  none" in text


def test_loadtest_refuses_a_window_with_a_compile_in_it(monkeypatch, tmp_path, capsys):
    from vaeserve.service.cli import loadtest

    async def window_with_a_compile(args):
        return {"config": {}, "warmup": {}, "compiles_in_window": 1, "summary": {"ok": 5}, "samples": []}

    monkeypatch.setattr(loadtest, "run", window_with_a_compile)
    out = tmp_path / "lt.json"
    assert loadtest.main(["--json", str(out)]) == 3
    captured = capsys.readouterr()
    assert "compiled 1 program(s) during the measured window" in captured.err and "latency" not in captured.out
    assert json.loads(out.read_text())["compiles_in_window"] == 1  # the samples are kept
    assert loadtest.buckets_used([1, 2, 4, 8], 8, 1, 4) == [1, 2, 4]  # 4 clients of one latent each
    assert loadtest.buckets_used([1, 2, 4, 8], 8, 1, None) == [1, 2, 4, 8]  # open loop: any
    assert loadtest.buckets_used([2, 4, 6], 6, 1, 3) == [2, 4]  # dp = 2: a batch of 3 pads to 4
