"""One server for several VAEs: ``vaeserve serve --model wan=DIR --model ltx=DIR --model flux1=DIR``
(tiny models of three families, saved by the test) answers each model through its own
``/v1/models/{name}/decode`` (diffusers' ``remote_decode`` unchanged) and through ``?model=``,
exactly as the model decodes alone, and encodes with the model its path names; a name it does not
serve is 404, none of several is 422; a device batch holds requests of one model; the memory guard
counts the other models' resident weights; ``RemoteVAE`` names its model. The three-model server compiles each model's uint8 decode of one
shape and Flux.1's encode of one image size.
"""

from __future__ import annotations

import io
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.helpers.frames import assert_uint8_frames_match
from tests.helpers.image_reference import FLUX1_TINY
from tests.helpers.ltx_reference import LTX090
from tests.helpers.service_helpers import (
    GatedRunner,
    make_test_model,
    marked,
    post_in_thread,
    start_server,
    thread_server,
    wait_until,
)
from vaeserve import models
from vaeserve.service.engine.startup import resident_weight_bytes

torch = pytest.importorskip("torch")
remote_utils = pytest.importorskip("diffusers.utils.remote_utils")

PROBLEM = "application/problem+json"
# name -> (the model, latents it decodes (B, C, T, H, W) or an image model's (B, C, H, W))
MODELS = {"wan": (lambda: make_test_model(), (1, 16, 2, 4, 4)),
          "ltx": (lambda: models.init_vae(LTX090, seed=1), (1, 8, 2, 4, 4)),
          "flux1": (lambda: models.init_vae(FLUX1_TINY, seed=2), (1, 16, 4, 6))}


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    folders = {}
    for name, (make, _) in MODELS.items():
        folders[name] = tmp_path_factory.mktemp(name)
        models.save_vae(make(), folders[name])
    return folders


@pytest.fixture(scope="module")
def server(saved, tmp_path_factory):
    """``vaeserve serve`` with the three models (the first through the helper's ``--model``)."""
    first, *others = [f"{name}={folder}" for name, folder in saved.items()]
    others_flags = [flag for entry in others for flag in ("--model", entry)]
    srv = start_server(Path(first), tmp_path_factory.mktemp("logs") / "server.log", *others_flags,
                       "--max-frames", "9", "--max-height", "64", "--max-width", "64")
    yield srv
    srv.stop()


def _latents(name: str, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(MODELS[name][1]).astype(np.float32)


def _decode(endpoint: str, x: np.ndarray) -> np.ndarray:
    """diffusers' ``remote_decode`` as a pipeline calls it for uint8 frames, the latents as they are."""
    frames = remote_utils.remote_decode(endpoint=endpoint, tensor=torch.from_numpy(x), output_type="pt",
                                        return_type="pt", partial_postprocess=True, do_scaling=False)
    return frames.numpy()


@pytest.mark.parametrize("name", list(MODELS))
def test_each_model_answers_through_its_endpoint_and_by_name(server, saved, name):
    x = _latents(name)
    expected = np.asarray(models.load_vae(str(saved[name])).decode(x, output="uint8"))
    by_path = _decode(f"{server.url}/v1/models/{name}/decode", x)
    assert_uint8_frames_match(by_path, expected)
    assert expected.std() > 5  # frames, not a flat field
    by_query = _decode(f"{server.url}/v1/decode?model={name}", x)
    assert np.array_equal(by_query, by_path)


def test_models_lists_every_model(server):
    listed = httpx.get(server.url + "/v1/models").json()["data"]
    assert [(entry["id"], entry["latents"]["channels"], entry["latents"]["is_image"]) for entry in listed] == [
        ("wan", 16, False), ("ltx", 8, False), ("flux1", 16, True)]


def test_an_unknown_model_is_404_and_none_of_several_422(server):
    x = _latents("wan")
    query = {"shape": ",".join(map(str, x.shape)), "dtype": "float32", "output_type": "npy"}
    headers = {"Content-Type": "application/octet-stream"}
    for route, named in (("/v1/models/sdxl/decode", {}), ("/v1/decode", {"model": "sdxl"}),
                         ("/v1/models/sdxl/encode", {})):
        url = server.url + route
        answer = httpx.post(url, content=x.tobytes(), params={**query, **named}, headers=headers)
        body = answer.json()
        assert answer.status_code == 404 and answer.headers["content-type"] == PROBLEM, url
        assert body["type"].endswith("/model-not-found") and body["received"] == "sdxl"
        assert body["expected"] == ["wan", "ltx", "flux1"] and "wan, ltx, flux1" in body["detail"]
    unnamed = httpx.post(server.url + "/v1/decode", content=x.tobytes(), params=query, headers=headers)
    assert unnamed.status_code == 422 and unnamed.json()["type"].endswith("/model-not-named")
    assert unnamed.json()["expected"] == ["wan", "ltx", "flux1"]
    clash = httpx.post(server.url + "/v1/models/wan/decode", content=x.tobytes(), params={**query, "model": "ltx"},
                       headers=headers)
    assert clash.status_code == 422 and clash.json()["expected"] == "wan"
    # The server goes on serving.
    assert httpx.get(server.url + "/readyz").status_code == 200


def test_remote_vae_posts_to_its_model(server, saved):
    pytest.importorskip("diffusers")
    from vaeserve.client import RemoteVAE

    x = _latents("ltx", seed=3)
    vae = RemoteVAE(server.url, model="ltx", frames="uint8")
    frames = vae.decode(torch.from_numpy(x)).sample.numpy()  # (B, 3, F, H, W) levels / 127.5 - 1
    levels = np.round((np.moveaxis(frames, 1, -1) + 1) * 127.5).astype(np.uint8)
    assert_uint8_frames_match(levels, np.asarray(models.load_vae(str(saved["ltx"])).decode(x, output="uint8")))
    assert vae.config["_class_name"] == "AutoencoderKLLTXVideo"
    with pytest.raises(ValueError, match="wan"):  # several served: RemoteVAE must be told which
        RemoteVAE(server.url)


def test_the_memory_guard_counts_the_other_models_weights():
    """A decode that fits the device memory alone is refused (422 too-large-for-memory, before
    compiling) beside another model whose weights take most of it; the same request is served by
    a server of the model alone (the control)."""
    wan = make_test_model()
    heavy = models.init_vae(models.WanVAEConfig(base_dim=16, num_res_blocks=1), seed=4)
    others = resident_weight_bytes(heavy)
    limit = others + 2**20  # what the other model's weights leave: 1 MiB, less than the decode needs
    x = _latents("wan", seed=5)
    query = {"shape": ",".join(map(str, x.shape)), "dtype": "float32", "output_type": "npy"}
    headers = {"Content-Type": "application/octet-stream"}
    with thread_server({"wan": wan, "heavy": heavy}, device_memory_bytes=limit) as server:
        refused = httpx.post(server.url + "/v1/models/wan/decode", content=x.tobytes(), params=query,
                             headers=headers)
        body = refused.json()
        assert refused.status_code == 422 and body["type"].endswith("/too-large-for-memory"), body
        assert body["expected"]["bytes"] == f"<= {limit - others}"
        assert body["received"]["bytes"] <= limit  # it would fit the device alone
        assert "other models' weights" in body["detail"]
        info = {entry["id"]: entry for entry in httpx.get(server.url + "/v1/models").json()["data"]}
        assert info["heavy"]["device_memory_bytes"] == limit - resident_weight_bytes(wan)
    with thread_server(wan, device_memory_bytes=limit) as server:
        served = httpx.post(server.url + "/v1/decode", content=x.tobytes(), params=query, headers=headers,
                            timeout=120)
        assert served.status_code == 200, served.text


def test_an_encode_runs_on_the_model_it_names(server, saved):
    from vaeserve.client import encode

    images = np.random.default_rng(6).uniform(-1, 1, (1, 3, 8, 12)).astype(np.float32)
    expected = np.asarray(models.load_vae(str(saved["flux1"])).encode(images))
    got = encode(server.url, images, model="flux1")  # POST /v1/models/flux1/encode
    assert got.shape == expected.shape == (1, 16, 4, 6)
    np.testing.assert_allclose(got, expected, atol=1e-4)
    assert np.abs(expected).max() > 0.1  # latents, not zeros


def test_a_batch_joins_requests_of_one_model_only():
    """Two Wan models of the same shapes behind one device thread: while the device is held, a
    request to each model and a second to the first wait; the device batch of the oldest (model b)
    takes neither of the others, the last runs alone; each answer is its model's own. The control:
    two waiting requests of one model do share a batch."""
    served = {"a": make_test_model(), "b": models.init_vae(models.WanVAEConfig(base_dim=8, num_res_blocks=1), seed=1)}
    x = np.random.default_rng(7).standard_normal((1, 16, 1, 4, 4)).astype(np.float32)  # one decode step
    GatedRunner.reset()
    with thread_server(served, runner_factory=GatedRunner, max_batch=2, max_queue=8) as server:
        def held_then(*posts: tuple[str, str]) -> dict:
            """POST ``marked(x, marker)`` to each model in turn while a first request (C) holds the
            device; the answers by marker."""
            taken = server.metric("vaeserve_batch_size_count")
            results: dict[str, list] = {marker: [] for marker, _ in [("C", "a"), *posts]}
            threads = [post_in_thread(server.url, marked(x, "C"), results["C"], model="a")]
            wait_until(lambda: server.metric("vaeserve_batch_size_count") == taken + 1, "the device to take C")
            for marker, model in posts:
                threads.append(post_in_thread(server.url, marked(x, marker), results[marker], model=model))
            wait_until(lambda: server.metric("vaeserve_queue_depth") == len(posts), "the others to queue")
            for _ in range(1 + len(posts)):  # every request's step, batched or not
                GatedRunner.permits.release()
            for thread in threads:
                thread.join(300)
            return {marker: answers[0] for marker, answers in results.items()}

        apart = held_then(("B", "b"), ("A", "a"))
        assert {marker: answer.headers["X-Batch-Size"] for marker, answer in apart.items()} == {
            "C": "1", "B": "1", "A": "1"}
        for marker, model in (("B", "b"), ("A", "a")):
            got = np.load(io.BytesIO(apart[marker].content))
            assert_uint8_frames_match(got, np.asarray(served[model].decode(marked(x, marker), output="uint8")))
        wrong = np.asarray(served["a"].decode(marked(x, "B"), output="uint8"))  # the control: the other model
        assert np.abs(np.load(io.BytesIO(apart["B"].content)).astype(int) - wrong).max() > 2
        together = held_then(("A", "a"), ("B", "a"))
        assert [together[marker].headers["X-Batch-Size"] for marker in "AB"] == ["2", "2"]
