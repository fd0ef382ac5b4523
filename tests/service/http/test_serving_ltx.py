"""The service with an LTX decoder that takes conditions: a timestep-conditioned LTX-2.0 decoder that
injects noise (``LTX2_SHARD``, seeded random weights: its noise scales are not 0, so the seed
shows in every answer).

``timestep``, ``noise_scale`` and ``seed`` are query parameters; the answer equals ``vae.decode``
with the same ones (uint8, exactly), names its seed in ``X-Seed`` (a fresh one when none is
given), and the conditions are arguments of the compiled step programs, not part of them: a
second timestep compiles nothing. A device batch of requests with different conditions gives
each request what it gets alone. One app serves every test of the module (buckets 1 and 2).
"""

from __future__ import annotations

import dataclasses
import io
import json

import numpy as np
import pytest

from tests.helpers.ltx_reference import LTX095, LTX2_SHARD
from tests.helpers.service_helpers import app_client
from vaeserve import models, sharding
from vaeserve.service.client import read_stream
from vaeserve.service.engine.jobs import DecodeOptions
from vaeserve.service.engine.runner import DeviceRunner

SHAPE = (1, 8, 2, 4, 4)  # -> 5 frames of 16 x 16
WARM = "8x2x4x4:uint8"
PIPELINE_TIMESTEP = 0.025  # the checkpoint's pipeline's decode_timestep: the default a request gets


@pytest.fixture(scope="module")
def ltx():
    """The decoder, with its pipeline's default timestep in its metadata (as a pipeline folder gives it)."""
    return models.init_vae(LTX2_SHARD, seed=3, encoder=False, metadata={"decode_timestep": PIPELINE_TIMESTEP})


@pytest.fixture(scope="module")
def client(ltx):
    """Warmed up for ``SHAPE``'s uint8 steps at both buckets: a request of it compiles nothing."""
    with app_client(ltx, warmup=[WARM]) as client:
        yield client


def latents(seed: int = 0, shape=SHAPE) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape, np.float32)


def post(client, x: np.ndarray, **params):
    query = {"shape": ",".join(map(str, x.shape)), "dtype": "float32", "output_type": "npy", **params}
    return client.post("/v1/decode", content=x.tobytes(), params=query,
                       headers={"Content-Type": "application/octet-stream"})


def frames(response) -> np.ndarray:
    assert response.status_code == 200, response.text
    return np.load(io.BytesIO(response.content), allow_pickle=False)


def reference(vae, x: np.ndarray, **conditions) -> np.ndarray:
    """``vae.decode``'s uint8 frames ``(B, F, H, W, 3)``: the Python API's answer."""
    return np.asarray(vae.decode(x, output="uint8", **conditions))


def test_models_describe_the_conditions(client):
    info = client.get("/v1/models").json()["data"][0]
    assert info["decode_conditions"] == {
        "timestep_conditioned": True, "injects_noise": True, "default_timestep": PIPELINE_TIMESTEP,
        "default_noise_scale": 0.0, "timestep_range": [0.0, 1.0], "seed_range": [0, 2**32]}


def test_a_decode_over_http_is_the_python_apis(client, ltx):
    """timestep=t, seed=s over HTTP gives exactly ``vae.decode(latents, timestep=t, seed=s)``; a
    different timestep (the control) or seed gives another answer, the same seed the same one."""
    x = latents(1)
    answer = post(client, x, timestep=0.3, seed=5)
    assert answer.headers["X-Seed"] == "5"
    served = frames(answer)
    assert served.shape == (1, 5, 16, 16, 3)
    assert np.array_equal(served, reference(ltx, x, timestep=0.3, seed=5))
    assert np.array_equal(served, frames(post(client, x, timestep=0.3, seed=5)))
    assert np.abs(served.astype(int) - frames(post(client, x, timestep=0.6, seed=5))).max() > 2
    assert np.abs(served.astype(int) - frames(post(client, x, timestep=0.3, seed=6))).max() > 2


def test_without_a_seed_the_answer_names_a_fresh_one(client, ltx):
    """No seed: a fresh one, in X-Seed, that reproduces the answer; no timestep: the pipeline's."""
    x = latents(2)
    first, second = post(client, x), post(client, x)
    seed = int(first.headers["X-Seed"])
    assert 0 <= seed < 2**32 and second.headers["X-Seed"] != first.headers["X-Seed"]
    assert np.array_equal(frames(first), reference(ltx, x, timestep=PIPELINE_TIMESTEP, seed=seed))
    assert np.array_equal(frames(first), frames(post(client, x, seed=seed)))


def test_the_conditions_are_arguments_of_the_compiled_steps(client, ltx):
    """Requests of the warmed shape with any timestep, noise scale and seed run the programs the
    warm-up compiled; a stream and an MP4 of the same latents run them too, with the same frames."""
    x = latents(3)
    expected = reference(ltx, x, timestep=0.9, noise_scale=0.4, seed=2)  # the whole decode: a program of its own
    compiles = ltx.programs.compiles
    frames(post(client, x, timestep=0.1, seed=1))
    assert np.array_equal(frames(post(client, x, timestep=0.9, noise_scale=0.4, seed=2)), expected)
    stream = post(client, x, timestep=0.9, noise_scale=0.4, seed=2, stream="true")
    assert stream.status_code == 200 and stream.headers["X-Seed"] == "2"
    chunks = [np.frombuffer(payload, np.uint8).reshape(header["shape"])
              for header, payload in read_stream(iter([stream.content])) if header["type"] == "frames"]
    assert len(chunks) > 1 and np.array_equal(np.concatenate(chunks, axis=1), expected)
    mp4 = post(client, x, timestep=0.9, seed=2, output_type="mp4")
    assert mp4.status_code == 200 and mp4.headers["content-type"] == "video/mp4" and mp4.headers["X-Seed"] == "2"
    assert ltx.programs.compiles == compiles


@pytest.mark.parametrize(("params", "where"), [
    ({"timestep": "1.5"}, "timestep"), ({"timestep": "nan"}, "timestep"), ({"timestep": "-0.1"}, "timestep"),
    ({"noise_scale": "2"}, "noise_scale"), ({"noise_scale": "inf"}, "noise_scale"),
    ({"seed": "-1"}, "seed"), ({"seed": str(2**32)}, "seed"), ({"seed": "1.5"}, "seed"),
])
def test_conditions_out_of_range_are_refused(client, params, where):
    answer = post(client, latents(), **params)
    assert answer.status_code == 422 and answer.headers["content-type"] == "application/problem+json"
    problem = answer.json()
    assert problem["type"].endswith("/invalid-parameter") and problem["expected"].startswith(where)
    assert problem["received"] == params[where] and problem["detail"].startswith(f"query.{where}: ")
    if params[where] == "1.5" and where == "timestep":  # a bound said as every problem says one
        assert problem["expected"] == "timestep <= 1.0"


def test_a_decoder_that_takes_no_conditions_refuses_them(tiny_vae):
    """A Wan decoder takes no timestep, noise scale or seed: 422, naming what it got, before the body is read."""
    with app_client(tiny_vae) as wan:
        info = wan.get("/v1/models").json()["data"][0]
        assert info["decode_conditions"] is None
        answer = post(wan, latents(shape=(1, 16, 2, 4, 4)), timestep=0.05, seed=3)
        assert answer.status_code == 422 and "X-Seed" not in answer.headers
        problem = answer.json()
        assert problem["type"].endswith("/invalid-parameter") and "takes no timestep" in problem["detail"]
        assert problem["expected"] == "no timestep, noise_scale or seed"
        assert problem["received"] == {"timestep": 0.05, "seed": 3}


def test_a_decoder_that_only_injects_noise_takes_only_a_seed():
    """LTX-Video 0.9.5's decoder with noise injection and no timestep conditioning: a seed, no
    timestep or noise scale (422 naming them, before the body is read)."""
    noise_only = dataclasses.replace(LTX095, timestep_conditioning=False)
    with app_client(models.init_vae(noise_only, encoder=False)) as served:
        info = served.get("/v1/models").json()["data"][0]["decode_conditions"]
        assert info["timestep_conditioned"] is False and info["injects_noise"] is True
        assert info["default_timestep"] is None and info["default_noise_scale"] is None
        answer = post(served, latents(), timestep=0.05, noise_scale=0.1, seed=3)
        assert answer.status_code == 422 and "not timestep-conditioned" in answer.json()["detail"]
        assert answer.json()["expected"] == "seed only"
        assert answer.json()["received"] == {"timestep": 0.05, "noise_scale": 0.1}


def test_a_batch_of_different_conditions_gives_each_request_its_own_answer(client, ltx):
    """Two requests in one device batch, each with its own timestep, noise scale and seed (the
    worker's ``conditions``), run the warmed programs of bucket 2: each one's rows are what
    ``vae.decode`` gives it alone."""
    a, b = latents(4), latents(5)
    options_a = DecodeOptions(timestep=0.2, noise_scale=0.0, seed=7)
    options_b = DecodeOptions(timestep=0.7, noise_scale=0.5, seed=8)
    alone_a, alone_b = reference(ltx, a, **options_a._asdict()), reference(ltx, b, **options_b._asdict())
    compiles = ltx.programs.compiles
    runner = DeviceRunner(ltx, sharding.make_mesh(1, 1), max_batch=2, dp=1)
    # As the options travel to the other processes of a multi-host slice: JSON lists.
    requests = json.loads(json.dumps([(options_a, 1), (options_b, 1)]))
    steps = list(runner.decode_stream(np.concatenate([a, b]), conditions=requests))
    batched = np.concatenate([step.frames for step in steps], axis=1)
    assert batched.shape == (2, 5, 16, 16, 3) and all(not step.nonfinite.any() for step in steps)
    assert np.array_equal(batched[:1], alone_a) and np.array_equal(batched[1:], alone_b)
    assert np.abs(alone_a.astype(int) - alone_b).max() > 2
    assert ltx.programs.compiles == compiles
