"""The app in-process (``TestClient``, lifespan run, tiny model): routing, validation, error
mapping, auth, the 500 paths through an injected failing runner, OpenAPI, and the drain an
embedding ASGI server gets from the lifespan."""

from __future__ import annotations

import asyncio
import io
import json
import struct
import threading

import httpx
import numpy as np
import pytest

from tests.helpers.service_helpers import (
    GarbageRunner,
    PoisonRunner,
    app_client,
    latents,
    poisoned,
    settings_for_tests,
)
from vaeserve.service import create_app
from vaeserve.service.client import read_stream
from vaeserve.service.codecs.tensors import npy_bytes
from vaeserve.service.engine.runner import DeviceRunner

PROBLEM = "application/problem+json"
KEY = "s3cret"


def raw_query(x: np.ndarray, **params) -> dict:
    return {"shape": ",".join(map(str, x.shape)), "dtype": "float32", "output_type": "npy", **params}


def post(client, x: np.ndarray, *, headers=None, content_type="tensor/binary", **params):
    return client.post("/v1/decode", content=x.tobytes(), params=raw_query(x, **params),
                       headers={"Content-Type": content_type, **(headers or {})})


def assert_problem(response, status: int, slug: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    body = response.json()
    assert body["type"].endswith("/" + slug) and body["status"] == status, body
    assert body["request_id"] == response.headers["X-Request-Id"]
    return body


@pytest.fixture(scope="module")
def client(tiny_vae):
    with app_client(tiny_vae, runner_factory=PoisonRunner, api_key=KEY) as client:
        client.headers["Authorization"] = f"Bearer {KEY}"
        yield client


# ---- routing and error mapping ------------------------------------------------------------------


def test_unknown_route_and_method_are_problems(client):
    assert_problem(client.get("/nope"), 404, "not-found")
    assert_problem(client.get("/v1/decode"), 405, "method-not-allowed")


def test_bad_parameters_are_422_with_expected_and_received(client):
    x = latents()
    body = assert_problem(post(client, x, output_type="gif"), 422, "invalid-parameter")
    assert body["received"] == "gif" and body["expected"].startswith("output_type: ")
    assert body["detail"].startswith("query.output_type: ")
    assert_problem(post(client, x, fps=0), 422, "invalid-parameter")


def test_an_unknown_query_parameter_is_422_naming_the_nearest_known_one(client):
    # It was ignored: ?outputtype=npy got the default answer, an MP4.
    x = latents()
    query = {k: v for k, v in raw_query(x).items() if k != "output_type"}
    r = client.post("/v1/decode", content=x.tobytes(), params={**query, "outputtype": "npy"},
                    headers={"Content-Type": "tensor/binary"})
    body = assert_problem(r, 422, "unknown-parameter")
    assert body["received"] == "outputtype" and "did you mean 'output_type'?" in body["detail"]
    assert "output_type" in body["expected"] and "shape" in body["expected"]
    far = assert_problem(post(client, x, zzz="1"), 422, "unknown-parameter")
    assert "did you mean" not in far["detail"]  # nothing alike: no guess
    assert_problem(client.get("/v1/models", params={"verbose": "1"}), 422, "unknown-parameter")
    assert_problem(client.post("/v1/encode", content=b"", params={"normalise": "true"}), 422, "unknown-parameter")
    assert post(client, x).status_code == 200  # negative control: the same request, spelt right


def test_a_repeated_query_parameter_is_422_unless_it_takes_a_list(client):
    # The last value was taken silently.
    x = latents()
    for name, values in (("output_type", ["npy", "mp4"]), ("timeout_s", ["1", "30"]), ("dtype", ["float32"] * 2)):
        query = [(k, v) for k, v in raw_query(x).items() if k != name] + [(name, v) for v in values]
        r = client.post("/v1/decode", content=x.tobytes(), params=query, headers={"Content-Type": "tensor/binary"})
        body = assert_problem(r, 422, "repeated-parameter")
        assert body["received"] == values and name in body["detail"]
    # shape takes a list: requests (diffusers' remote_decode) sends one as shape=1&shape=16&...
    query = [(k, v) for k, v in raw_query(x).items() if k != "shape"] + [("shape", str(n)) for n in x.shape]
    r = client.post("/v1/decode", content=x.tobytes(), params=query, headers={"Content-Type": "tensor/binary"})
    assert r.status_code == 200, r.text


def test_a_raw_body_without_dtype_says_dtype_missing(client):
    x = latents()
    query = {k: v for k, v in raw_query(x).items() if k != "dtype"}
    r = client.post("/v1/decode", content=x.tobytes(), params=query, headers={"Content-Type": "tensor/binary"})
    body = assert_problem(r, 422, "missing-dtype")  # was "unsupported dtype None"
    assert body["detail"].startswith("dtype missing") and "dtype=float32" in body["expected"]
    frames = np.zeros((1, 3, 5, 16, 16), np.float32)
    r = client.post("/v1/encode", content=frames.tobytes(), params={"shape": "1,3,5,16,16"},
                    headers={"Content-Type": "tensor/binary"})
    assert_problem(r, 422, "missing-dtype")


def test_early_answers_close_a_connection_whose_body_was_not_read(client):
    x = latents()
    early = post(client, x, content_type="text/plain")  # 415 from the headers: body never read
    assert_problem(early, 415, "unsupported-media-type")
    assert early.headers["connection"] == "close"
    late = post(client, x[:, :8], shape="1,8,2,4,4")  # 422 after reading the body
    assert_problem(late, 422, "invalid-channels")
    assert "connection" not in late.headers


def _safetensors(shape, nbytes: int, header: bytes | None = None) -> bytes:
    header = header or json.dumps({"z": {"dtype": "F32", "shape": shape, "data_offsets": [0, nbytes]}}).encode()
    return struct.pack("<Q", len(header)) + header + b"\0" * nbytes


HOSTILE = [  # id, body, content type, query, slug: each was a 500 or a wrong 200 in the hostile run
    ("raw-65-dims", b"\0" * 4, "tensor/binary", {"shape": ",".join(["1"] * 65), "dtype": "float32"}, "invalid-ndim"),
    ("st-65-dims", _safetensors([1] * 65, 4), "application/x-safetensors", {}, "invalid-ndim"),
    ("st-negative", _safetensors([-1, 16, -2, 4, 4], 2048), "application/x-safetensors", {}, "invalid-shape"),
    ("st-nested", _safetensors(None, 0, b"[" * 20_000 + b"]" * 20_000), "application/x-safetensors", {},
     "invalid-safetensors"),
    ("npy-T0", npy_bytes(np.zeros((1, 16, 0, 4, 4), np.float32)), "application/x-npy", {}, "invalid-shape"),
    ("npy-B0", npy_bytes(np.zeros((0, 16, 2, 4, 4), np.float32)), "application/x-npy", {}, "invalid-shape"),
    ("st-W0", _safetensors([1, 16, 2, 4, 0], 0), "application/x-safetensors", {}, "invalid-shape"),
]


@pytest.mark.parametrize("case", HOSTILE, ids=[c[0] for c in HOSTILE])
def test_hostile_bodies_are_422_and_the_next_request_is_served(client, case):
    _, body, content_type, query, slug = case
    r = client.post("/v1/decode", content=body, params={"output_type": "npy", **query},
                    headers={"Content-Type": content_type})
    assert_problem(r, 422, slug)
    assert post(client, latents()).status_code == 200


@pytest.mark.parametrize("params", [
    {"shift_factor": "nan"}, {"shift_factor": "inf"}, {"shift_factor": "-Infinity"}, {"scaling_factor": "inf"},
    {"shift_factor": "1e39"}, {"scaling_factor": "1e-50"}, {"scaling_factor": "0"}, {"timeout_s": "nan"},
], ids=lambda p: "=".join(next(iter(p.items()))))
def test_factors_that_are_not_finite_float32_are_refused(client, params):
    # Each of these used to answer 200 with black frames (NaN in pt).
    body = assert_problem(post(client, latents(), **params), 422, "invalid-parameter")
    assert "expected" in body and "received" in body


@pytest.mark.parametrize("params", [
    {"scaling_factor": "1e-38"},  # 10 / 1e-38 overflows float32
    {"shift_factor": "3e38", "denormalize": "true"},  # finite after the shift, not after the std
], ids=["scaling", "denormalize"])
def test_finiteness_is_checked_after_scaling_and_denormalizing(client, params):
    x = np.full((1, 16, 2, 4, 4), 10.0, np.float32)
    body = assert_problem(post(client, x, **params), 422, "non-finite")
    assert "after scaling" in body["detail"]


def test_factors_unscale_the_latents_before_the_decode(client):
    """``scaling_factor`` and ``shift_factor`` decode ``z / scaling_factor + shift_factor`` (diffusers'
    remote convention): the same bytes as sending those latents plain."""
    x = latents()
    scaled = post(client, x, scaling_factor="2.5", shift_factor="-0.1")
    assert scaled.status_code == 200, scaled.text
    by_hand = post(client, x / np.float32(2.5) + np.float32(-0.1))
    plain = post(client, x)
    assert scaled.content == by_hand.content
    assert np.mean(_frames(scaled) != _frames(plain)) > 0.5  # the factors did something


def _frames(response) -> np.ndarray:
    return np.load(io.BytesIO(response.content), allow_pickle=False)


def test_a_decode_that_comes_out_non_finite_is_422_naming_the_scaling(client):
    """Finite latents that overflow the network (shift_factor near float32's limit) used to answer
    200 with black frames; the decoder counts NaN/Inf on the device before the uint8 conversion."""
    params = {"shift_factor": "3e38", "scaling_factor": "1e-3"}
    body = assert_problem(post(client, latents(), **params), 422, "non-finite-output")
    assert "scaling_factor=0.001, shift_factor=3e+38, denormalize=false" in body["detail"]
    assert body["received"].endswith("NaN/Inf values in the decoded frames")
    assert int(body["received"].split()[0]) > 0
    # A stream whose first step is already non-finite has sent nothing: an ordinary 422.
    assert_problem(post(client, latents(), stream="true", **params), 422, "non-finite-output")
    # One whose later step overflows (latent frame 0 is finite, frame 1 near float32's limit) has
    # sent its status and its first frames: the problem is its last message.
    x = latents()
    x[:, :, 1:] = 3e38
    r = post(client, x, stream="true")
    assert r.status_code == 200
    messages = list(read_stream(iter([r.content])))
    assert [h["type"] for h, _ in messages] == ["frames", "error"]
    assert messages[1][0]["problem"]["type"].endswith("/non-finite-output")
    # Negative control: the same latents without the shift decode (and the server keeps serving).
    assert post(client, latents(), scaling_factor="1e-3").status_code == 200


# ---- auth -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [f"Bearer {KEY}", f"bearer {KEY}", f"Bearer   {KEY}", f"BEARER {KEY} ", f"Bearer\t{KEY}",
                                   f"\tBearer \t {KEY}\t"])
def test_bearer_token_accepted(client, value):
    assert client.get("/v1/models", headers={"Authorization": value}).status_code == 200


@pytest.mark.parametrize("value", [f"Bearer {KEY}\xa0", f"Bearer \x85{KEY}", f"Bearer {KEY}x", f"Bearer {KEY[:-1]}",
                                   KEY, f"Basic {KEY}", "Bearer", f"Bearer{KEY}", f"Bearer\v{KEY}"])
def test_bearer_token_compared_exactly(client, value):
    # str.strip() used to forgive Unicode spaces (NBSP, NEL) around the token.
    r = client.get("/v1/models", headers={"Authorization": value.encode("latin-1")})
    body = assert_problem(r, 401, "unauthorized")
    assert body["expected"] == "Authorization: Bearer <key>" and r.headers["WWW-Authenticate"].startswith("Bearer")


def test_probes_and_metrics_need_no_key(client):
    for path in ("/healthz", "/readyz", "/metrics"):
        assert client.get(path, headers={"Authorization": ""}).status_code == 200


# ---- the 500 paths, through a runner that fails -------------------------------------------------


def test_device_error_is_500_with_request_id_then_next_succeeds(client):
    x = latents(seed=11)
    r = post(client, poisoned(x), headers={"X-Request-Id": "fault-1"})
    body = assert_problem(r, 500, "device-error")
    assert body["request_id"] == "fault-1" and "fault-1" in body["detail"]
    assert post(client, x).status_code == 200


def test_stream_device_error_in_band_after_the_first_chunk(client):
    x = poisoned(latents((1, 16, 3, 4, 4), seed=12))
    r = post(client, x, stream="true")
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-vaeserve-stream"
    messages = list(read_stream(iter([r.content])))
    assert [h["type"] for h, _ in messages] == ["frames", "error"]
    assert messages[1][0]["problem"]["type"].endswith("/device-error")


def test_internal_error_is_a_500_problem(tiny_vae):
    with app_client(tiny_vae, runner_factory=GarbageRunner) as client:
        body = assert_problem(post(client, latents(), output_type="mp4"), 500, "internal-error")
        assert body["request_id"] in body["detail"]
        metrics = client.get("/metrics").text
        assert 'vaeserve_requests_total{route="/v1/decode",status="500"} 1.0' in metrics


def test_failed_start_up_fails_liveness_and_readiness(tiny_vae):
    def broken(*args, **kwargs):
        raise RuntimeError("no devices today")

    app = create_app(settings_for_tests(), vae=tiny_vae, runner_factory=broken)
    from fastapi.testclient import TestClient

    with TestClient(app) as client:
        for _ in range(200):
            if client.get("/healthz").status_code == 503:
                break
            threading.Event().wait(0.05)
        ready = client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["status"] == "failed"
        assert "no devices today" in ready.json()["detail"]
        assert_problem(post(client, latents()), 503, "unavailable")


# ---- headers of a decode answer --------------------------------------------------------------------


def test_batch_size_header_counts_latents(client):
    r = post(client, latents((2, 16, 2, 4, 4), seed=13))
    assert r.status_code == 200 and r.headers["X-Batch-Size"] == "2"  # one request, two latents


# ---- OpenAPI ------------------------------------------------------------------------------------


def test_openapi_declares_bodies_and_media_types(client):
    spec = client.get("/openapi.json").json()
    decode = spec["paths"]["/v1/decode"]["post"]
    assert set(decode["requestBody"]["content"]) == {
        "application/octet-stream", "tensor/binary", "application/x-npy", "application/x-safetensors"}
    ok = set(decode["responses"]["200"]["content"])
    assert "application/json" not in ok and {"video/mp4", "application/x-vaeserve-stream"} <= ok
    for code in ("401", "413", "415", "422", "429", "500", "503", "504"):
        assert set(decode["responses"][code]["content"]) == {PROBLEM}
    metrics = spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert [media.split(";")[0] for media in metrics] == ["text/plain"]


def test_openapi_declares_the_bearer_scheme_on_the_api_routes(client):
    # /docs can send the key only if the document declares how it is sent.
    spec = client.get("/openapi.json").json()
    assert spec["components"]["securitySchemes"]["bearer"] == {
        "type": "http", "scheme": "bearer", "description": spec["components"]["securitySchemes"]["bearer"]["description"]}
    for path, method in (("/v1/decode", "post"), ("/v1/encode", "post"), ("/v1/models", "get")):
        operation = spec["paths"][path][method]
        assert operation["security"] == [{"bearer": []}], path
        assert "authorization" not in {p["name"].lower() for p in operation.get("parameters", [])}
    for path in ("/healthz", "/readyz", "/metrics"):  # the probes need no key
        assert "security" not in spec["paths"][path]["get"]


# ---- embedding: the lifespan drains ----------------------------------------------------------------


class SlowRunner(DeviceRunner):
    started = threading.Event()

    def decode_stream(self, latents, **options):
        SlowRunner.started.set()
        threading.Event().wait(1.0)  # long enough to shut down while it runs
        yield from super().decode_stream(latents, **options)


def test_lifespan_shutdown_drains_for_any_asgi_server(tiny_vae):
    """What uvicorn, hypercorn or a test harness does: lifespan startup, requests, lifespan
    shutdown while one is in flight. The in-flight one finishes; new ones get 503."""
    app = create_app(settings_for_tests(), vae=tiny_vae, runner_factory=SlowRunner)
    x = latents(seed=14)

    async def scenario():
        inbox: asyncio.Queue = asyncio.Queue()
        outbox: asyncio.Queue = asyncio.Queue()
        lifespan = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}},
                                           inbox.get, outbox.put))
        await inbox.put({"type": "lifespan.startup"})
        assert (await outbox.get())["type"] == "lifespan.startup.complete"
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client:
            while (await client.get("/readyz")).status_code != 200:
                await asyncio.sleep(0.05)
            in_flight = asyncio.create_task(client.post("/v1/decode", content=x.tobytes(), params=raw_query(x),
                                                        headers={"Content-Type": "tensor/binary"}))
            await asyncio.to_thread(SlowRunner.started.wait, 60)
            await inbox.put({"type": "lifespan.shutdown"})
            await asyncio.sleep(0.1)
            ready = await client.get("/readyz")
            late = await client.post("/v1/decode", content=x.tobytes(), params=raw_query(x),
                                     headers={"Content-Type": "tensor/binary"})
            done = await in_flight
        assert (await outbox.get())["type"] == "lifespan.shutdown.complete"
        await lifespan
        return ready, late, done

    ready, late, done = asyncio.run(scenario())
    assert ready.status_code == 503 and ready.json()["status"] == "draining"
    assert_problem(late, 503, "unavailable")
    assert done.status_code == 200, done.text
    assert json.loads(done.headers["X-Batch-Size"]) == 1
