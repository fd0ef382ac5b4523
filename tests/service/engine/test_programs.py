"""Compiled programs as the service sees them (in-process, each test with its own fresh model so
that its program cache starts empty): warm-up covers every output it names and a warmed request
compiles nothing; strict shapes refuse the rest; the cache stays bounded.

The model is a two-stage Wan decoder (2x in space and time): compiles cost about half those of
the usual tiny model, and it shows that the service takes its scales from the model's config."""

from __future__ import annotations

import re

import numpy as np

from tests.helpers.service_helpers import app_client, latents, make_test_model
from vaeserve.service.client import read_stream

CONTENT = {"Content-Type": "tensor/binary"}
MICRO = dict(dim_mult=(1, 2), temperal_downsample=(True,), scale_factor_temporal=2, scale_factor_spatial=2)
SHAPE = (16, 2, 8, 8)  # -> 3 frames of 16x16
WARM = "16x2x8x8"


def micro_model():
    return make_test_model(**MICRO)


def metric(client, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", client.get("/metrics").text, re.M)
    return float(match.group(1)) if match else 0.0


def decode(client, x: np.ndarray, **params):
    query = {"shape": ",".join(map(str, x.shape)), "dtype": "float32", **params}
    return client.post("/v1/decode", content=x.tobytes(), params=query, headers=CONTENT)


EVERY_OUTPUT = [{"output_type": "npy"}, {"output_type": "pt"}, {"output_type": "pt", "partial_postprocess": "true"},
                {"output_type": "mp4"}, {"output_type": "png"}, {"output_type": "npy", "stream": "true"}]


def test_warmed_requests_compile_nothing():
    # --warmup used to compile the uint8 path only: the first pt-float or stream request of a
    # warmed shape still compiled inside the request.
    with app_client(micro_model(), warmup=[WARM]) as client:
        # Every decode runs as steps: buckets 1 and 2 x (first and next step) x (uint8 frames, the
        # float frames of pt); uint8 serves mp4, npy, png, pt + partial_postprocess and streams.
        assert metric(client, "vaeserve_compiles_total") == 8
        assert metric(client, "vaeserve_programs") == 8
        compiled = client.get("/v1/models").json()["data"][0]["compiled"]
        assert ["stream-step", [2, 16, 1, 8, 8], "next+float"] in compiled
        assert ["stream-step", [1, 16, 1, 8, 8], "next"] in compiled
        for batch in (1, 2):
            for params in EVERY_OUTPUT:
                if params["output_type"] in ("mp4", "png") and batch == 2:
                    continue
                r = decode(client, latents((batch, *SHAPE)), **params)
                assert r.status_code == 200, (params, r.text)
        assert metric(client, "vaeserve_compiles_total") == 8  # nothing compiled inside a request
        frames = np.load(__import__("io").BytesIO(decode(client, latents((1, *SHAPE)), output_type="npy").content))
        assert frames.shape == (1, 3, 16, 16, 3)  # the model's 2x scales, not Wan 2.1's 4x/8x


def test_only_warmed_shapes_and_outputs_are_served():
    with app_client(micro_model(), warmup=[WARM + ":uint8,stream"], shapes="warmed", max_batch=1) as client:
        assert metric(client, "vaeserve_compiles_total") == 2  # the two uint8 steps: every answer but pt's floats
        info = client.get("/v1/models").json()["data"][0]
        assert info["warmed"] == [{"shape": list(SHAPE), "outputs": ["uint8", "stream"]}]
        assert decode(client, latents((1, *SHAPE)), output_type="npy").status_code == 200
        r = decode(client, latents((1, *SHAPE)), output_type="npy", stream="true")
        assert [h["type"] for h, _ in read_stream(iter([r.content]))] == ["frames", "frames", "end"]
        for x, params in (((1, *SHAPE), {"output_type": "pt"}), ((1, 16, 1, 8, 8), {"output_type": "npy"})):
            r = decode(client, latents(x), **params)
            problem = r.json()
            assert r.status_code == 422 and problem["type"].endswith("/shape-not-allowed"), problem
            assert problem["expected"] == [WARM + ":stream,uint8"]
        assert problem["received"] == "16x1x8x8:uint8"
        assert metric(client, "vaeserve_shapes_refused_total") == 2
        assert metric(client, "vaeserve_compiles_total") == 2  # neither a request nor a refusal compiled


def test_listed_shapes_are_served_with_every_output():
    with app_client(micro_model(), shapes=["16x1x8x8"], max_batch=1) as client:
        assert decode(client, latents((1, 16, 1, 8, 8)), output_type="pt").status_code == 200
        r = decode(client, latents((1, *SHAPE)), output_type="npy")
        assert r.status_code == 422 and r.json()["expected"] == ["16x1x8x8:float,stream,uint8"]


def test_program_cache_is_bounded():
    # Every new shape used to compile a program and keep it forever.
    with app_client(micro_model(), max_programs=1, max_batch=1) as client:
        for width in (8, 16):  # one latent frame: one step, one program each
            assert decode(client, latents((1, 16, 1, 8, width)), output_type="npy").status_code == 200
        assert metric(client, "vaeserve_compiles_total") == 2
        assert metric(client, "vaeserve_program_evictions_total") == 1
        assert metric(client, "vaeserve_programs") == 1
        assert client.get("/v1/models").json()["data"][0]["compiled"] == [["stream-step", [1, 16, 1, 8, 16], "first"]]


def test_warmup_larger_than_the_cache_fails_start_up():
    with app_client(micro_model(), warmup=["16x1x8x8:uint8,float"], max_programs=1, max_batch=1,
                    expect_ready=False) as client:
        ready = client.get("/readyz").json()
        assert ready["status"] == "failed" and "max_programs=1" in ready["detail"]


def test_a_framewise_warmup_for_a_model_without_one_fails_start_up():
    with app_client(micro_model(), warmup=["16x1x8x8:framewise"], max_batch=1, expect_ready=False) as client:
        ready = client.get("/readyz").json()
        assert ready["status"] == "failed" and "HunyuanVideo 1.0 only" in ready["detail"], ready
