"""The service with the image VAEs — AutoencoderKL as SD and as Flux.1, Flux.2, Qwen-Image (small
configs, ``tests/helpers/image_reference``) — behind real uvicorn servers, driven by diffusers' own
``remote_decode`` and ``remote_encode`` unchanged and checked against diffusers' own classes and
``VaeImageProcessor``.

Each model is called as its pipelines call the remote VAE: SD with ``scaling_factor``, Flux.1 with
``scaling_factor`` and ``shift_factor`` (and its packed latents with ``height``/``width``), Flux.2
without scaling, Qwen-Image with ``do_scaling`` alone (the config's per-channel statistics). A
server compiles the uint8 and float decodes of one latent shape at batch 1 (SD's warm-up: uint8 at
batch 1 and 2) and one encode, SD's and Qwen-Image's a float decode at batch 2; the batching test's
server reuses SD's programs (one model, one program cache).
"""

from __future__ import annotations

import io
import threading
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.helpers.frames import assert_uint8_frames_match
from tests.helpers.hunyuan_reference import reference_model, seeded_weights
from tests.helpers.image_reference import CASES, reference_decode, reference_posterior
from tests.helpers.service_helpers import metric, settings_for_tests, thread_server, wait_until
from tests.helpers.wan_reference import write_diffusers_folder
from vaeserve import models
from vaeserve.models.programs import ProgramCache
from vaeserve.service.codecs.video import jpeg_bytes
from vaeserve.service.engine.errors import StartupRefused
from vaeserve.service.engine.runner import DeviceRunner
from vaeserve.service.engine.startup import guard_programs, load_model, warm_up

torch = pytest.importorskip("torch")
remote_utils = pytest.importorskip("diffusers.utils.remote_utils")
from diffusers.image_processor import VaeImageProcessor  # noqa: E402  (after the importorskip)

# name → (case, how its pipelines call remote_decode / remote_encode)
SERVED: dict[str, tuple[str, dict[str, Any]]] = {"sd": ("sd_tiny", {"scaling_factor": 0.18215}),
          "flux1": ("flux1_tiny", {"scaling_factor": 0.3611, "shift_factor": 0.1159}),
          "flux2": ("flux2_tiny", {"do_scaling": False}),
          "qwen-image": ("qwen_tiny", {})}
LATENT_SIZE = (4, 6)  # even: Flux's 2x2 packing
ENCODE_TOLERANCE = 1e-4  # the promise: the service's encode (PNG in, scaled latents out) against diffusers'


@pytest.fixture(scope="module", params=list(SERVED))
def served(request, tmp_path_factory):
    """``(name, vae, reference, server)``: a small full checkpoint loaded from its folder (as
    ``--model DIR``), diffusers' model with the same weights, and a server of it."""
    name = request.param
    config, seed, _, _ = CASES[SERVED[name][0]]
    weights = seeded_weights(config, seed)
    vae = models.load_vae(write_diffusers_folder(tmp_path_factory.mktemp(name), config, weights))
    warmup = [f"{config.z_dim}x{LATENT_SIZE[0]}x{LATENT_SIZE[1]}:uint8"] if name == "sd" else []
    with thread_server(vae, max_batch=2, max_height=64, max_width=64, warmup=warmup) as server:
        yield name, vae, reference_model(config, weights), server


def _latents(vae, batch: int = 1, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, vae.config.z_dim, *LATENT_SIZE)).astype(np.float32)


def _pipeline_latents(name: str, vae, z: np.ndarray) -> np.ndarray:
    """What the pipeline hands its VAE for latents ``z``: ``z / scaling_factor + shift_factor``,
    Qwen-Image's ``z · latents_std + latents_mean``, Flux.2's as they are."""
    options = SERVED[name][1]
    if "scaling_factor" in options:
        return z / np.float32(options["scaling_factor"]) + np.float32(options.get("shift_factor", 0.0))
    if options.get("do_scaling", True):
        per_channel = (1, -1, 1, 1)
        std, mean = (np.asarray(v, np.float32).reshape(per_channel) for v in (vae.config.latents_std,
                                                                                vae.config.latents_mean))
        return z * std + mean
    return z


def _reference_images(name, vae, reference, z) -> tuple[np.ndarray, list[Image.Image]]:
    """diffusers' decode of the latents a pipeline would decode: float (clamped) and its PIL images."""
    decoded = reference_decode(reference, _pipeline_latents(name, vae, z))
    return np.clip(decoded, -1, 1), VaeImageProcessor().postprocess(torch.from_numpy(decoded), output_type="pil")


def _decode(server, z, **options):
    return remote_utils.remote_decode(endpoint=server.url + "/v1/decode", tensor=torch.from_numpy(z), **options)


def test_remote_decode_answers_png_jpeg_and_tensors(served):
    name, vae, reference, server = served
    options = SERVED[name][1]
    z = _latents(vae)
    floats, (want,) = _reference_images(name, vae, reference, z)
    png = _decode(server, z, output_type="pil", image_format="png", **options)
    assert png.format == "png" and png.size == want.size
    assert_uint8_frames_match(np.asarray(png), np.asarray(want))
    assert np.asarray(want).std() > 5  # an image, not a flat field
    jpeg = _decode(server, z, output_type="pil", image_format="jpg", **options)
    assert jpeg.format == "jpeg" and jpeg.size == want.size
    # The JPEG of the very pixels the PNG holds, close to them (quality 95 on a noise-like image).
    assert np.array_equal(np.asarray(jpeg), np.asarray(Image.open(io.BytesIO(jpeg_bytes(np.asarray(png))))))
    assert np.abs(np.asarray(jpeg, np.float64) - np.asarray(want, np.float64)).mean() < 4
    tensor = _decode(server, z, output_type="pt", return_type="pt", **options)
    assert tensor.dtype == torch.float16 and tuple(tensor.shape) == floats.shape
    assert np.abs(tensor.numpy().astype(np.float32) - floats).max() <= 2e-3  # float16 rounding of [-1, 1]
    pixels = _decode(server, z, output_type="pt", return_type="pt", partial_postprocess=True, **options)
    assert pixels.dtype == torch.uint8 and np.array_equal(pixels.numpy()[0], np.asarray(png))
    # diffusers' client with a processor asks for a tensor it turns into PIL images itself.
    processed = _decode(server, z, output_type="pil", processor=VaeImageProcessor(), **options)
    assert np.array_equal(np.asarray(processed[0]), np.asarray(png))
    if name == "flux2":
        return
    # The scaling was applied, not assumed: the same latents unscaled decode to another image.
    unscaled = _decode(server, z, output_type="pil", image_format="png", do_scaling=False)
    assert np.abs(np.asarray(unscaled, np.float64) - np.asarray(png, np.float64)).mean() > 5


@pytest.mark.parametrize("served", ["sd", "qwen-image"], indirect=True)  # both layer families; one compile each
def test_a_batch_of_images_is_one_request(served):
    name, vae, reference, server = served
    options = SERVED[name][1]
    z = _latents(vae, batch=2, seed=1)
    floats, _ = _reference_images(name, vae, reference, z)
    tensor = _decode(server, z, output_type="pt", return_type="pt", **options)
    assert tuple(tensor.shape) == floats.shape == (2, 3, *(vae.config.spatial_scale * s for s in LATENT_SIZE))
    assert np.abs(tensor.numpy().astype(np.float32) - floats).max() <= 2e-3
    with pytest.raises(RuntimeError) as info:  # remote_decode raises response.json(): our problem
        _decode(server, z, output_type="pil", image_format="png", **options)
    problem = info.value.args[0]
    assert (problem["status"], problem["expected"], problem["received"]) == (422, "batch size 1", 2)


def test_remote_encode_gives_scaled_latents(served):
    name, vae, reference, server = served
    options = {k: v for k, v in SERVED[name][1].items() if k != "do_scaling"}
    s = vae.config.spatial_scale
    pixels = np.random.default_rng(3).integers(0, 256, (s * LATENT_SIZE[0], s * LATENT_SIZE[1], 3), np.uint8)
    got = remote_utils.remote_encode(endpoint=server.url + "/v1/encode", image=Image.fromarray(pixels), **options)
    images = VaeImageProcessor(vae_scale_factor=s).preprocess(Image.fromarray(pixels)).numpy()  # (1, 3, H, W), [-1, 1]
    mean, _ = reference_posterior(reference, images)
    want = (mean - np.float32(options.get("shift_factor", 0.0))) * np.float32(options.get("scaling_factor", 1.0))
    assert tuple(got.shape) == want.shape == (1, vae.config.z_dim, *LATENT_SIZE)
    assert np.abs(got.numpy() - want).max() <= ENCODE_TOLERANCE and want.std() > 0.01


@pytest.mark.parametrize("served", ["flux1"], indirect=True)
def test_flux_packed_latents_with_height_and_width(served):
    """Flux's pipelines hand ``remote_decode`` packed latents ``(B, H·W/4, 64)`` and the image size."""
    name, vae, _, server = served
    z = _latents(vae, seed=4)
    b, c, h, w = z.shape  # FluxPipeline._pack_latents
    packed = z.reshape(b, c, h // 2, 2, w // 2, 2).transpose(0, 2, 4, 1, 3, 5).reshape(b, h // 2 * (w // 2), c * 4)
    s = vae.config.spatial_scale
    unpacked = _decode(server, z, output_type="pil", image_format="png", **SERVED[name][1])
    got = _decode(server, np.ascontiguousarray(packed), output_type="pil", image_format="png", height=s * h,
                  width=s * w, **SERVED[name][1])
    assert np.array_equal(np.asarray(got), np.asarray(unpacked))
    with pytest.raises(RuntimeError) as info:  # a size its tokens do not make
        _decode(server, np.ascontiguousarray(packed), output_type="pil", height=s * h, width=2 * s * w)
    assert info.value.args[0]["received"] == list(packed.shape)


@pytest.mark.parametrize("served", ["sd"], indirect=True)
def test_models_describes_an_image_model(served):
    _, vae, _, server = served
    info = httpx.get(server.url + "/v1/models").json()["data"][0]
    s = vae.config.spatial_scale
    assert info["latents"] | {"latents_mean": None, "latents_std": None} == {
        "is_image": True, "layout": "(B, C, H, W)", "channels": 4, "spatial_scale": s, "temporal_scale": None,
        "max_batch": 2, "max_latent_frames": None, "max_latent_height": 64 // s, "max_latent_width": 64 // s,
        "max_height": 64, "max_width": 64, "latents_mean": None, "latents_std": None, "causal": False,
        "framewise": False}
    assert info["latents"]["latents_std"] == [pytest.approx(1 / 0.18215)] * 4
    assert info["warmed"] == [{"shape": [4, *LATENT_SIZE], "outputs": ["uint8"]}]
    assert ["decode", [2, 4, *LATENT_SIZE], "uint8"] in info["compiled"]  # every batch bucket warmed


@pytest.mark.parametrize("served", ["sd"], indirect=True)
@pytest.mark.parametrize("params,body_shape,slug,received", [
    ({"output_type": "mp4"}, (1, 4, *LATENT_SIZE), "invalid-parameter", "output_type=mp4"),
    ({"stream": "true"}, (1, 4, *LATENT_SIZE), "invalid-parameter", "stream=true"),
    ({"output_type": "npy"}, (1, 4, 1, *LATENT_SIZE), "invalid-ndim", [1, 4, 1, *LATENT_SIZE]),
    ({"output_type": "npy"}, (1, 16, *LATENT_SIZE), "invalid-channels", 16),
    ({"output_type": "npy"}, (1, 4, 17, 6), "too-large-height", 68),  # 17 latent rows at 4x: 68 pixels
])
def test_what_an_image_model_refuses(served, params, body_shape, slug, received):
    _, _, _, server = served
    z = np.zeros(body_shape, np.float32)
    r = httpx.post(server.url + "/v1/decode", content=z.tobytes(), timeout=60, headers={"Content-Type": "tensor/binary"},
                   params={"shape": ",".join(map(str, body_shape)), "dtype": "float32", **params})
    assert r.status_code == 422, r.text
    assert (r.json()["type"].rsplit("/", 1)[-1], r.json()["received"]) == (slug, received)


@pytest.mark.parametrize("served", ["sd"], indirect=True)
def test_one_unbatched_image_and_npy(served):
    _, vae, _, server = served
    z = _latents(vae, seed=5)
    r = httpx.post(server.url + "/v1/decode", content=z[0].tobytes(), timeout=60, headers={"Content-Type": "tensor/binary"},
                   params={"shape": ",".join(map(str, z.shape[1:])), "dtype": "float32", "output_type": "npy"})
    assert r.status_code == 200, r.text
    images = np.load(io.BytesIO(r.content), allow_pickle=False)
    assert images.shape == (*(vae.config.spatial_scale * s for s in LATENT_SIZE), 3)  # (C, H, W) in: no batch dim out
    default = httpx.post(server.url + "/v1/decode", content=z.tobytes(), timeout=60, headers={"Content-Type": "tensor/binary"},
                         params={"shape": ",".join(map(str, z.shape)), "dtype": "float32"})
    assert default.headers["content-type"] == "image/png"  # an image model's answer without output_type
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(default.content))), images)


class GatedRunner(DeviceRunner):
    """A real runner that holds its first decode until ``release`` is set: requests sent meanwhile queue."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.entered, self.release = threading.Event(), threading.Event()

    def decode_stream(self, latents, **options):
        if not self.entered.is_set():
            self.entered.set()
            self.release.wait(60)
        yield from super().decode_stream(latents, **options)


@pytest.mark.parametrize("served", ["sd"], indirect=True)
def test_small_image_requests_batch_on_the_device(served):
    """Two one-image requests queued behind a running one ride in one device batch (the bucket of
    2, compiled by the module's warm-up), each answered with its own image."""
    _, vae, _, _ = served
    runners: list[GatedRunner] = []

    def factory(*args, **kwargs):
        runners.append(GatedRunner(*args, **kwargs))
        return runners[-1]

    zs = [_latents(vae, seed=10 + i) for i in range(3)]
    answers: dict[int, httpx.Response] = {}
    with thread_server(vae, runner_factory=factory, max_batch=2, max_height=64, max_width=64) as server:
        def post(i: int) -> None:
            answers[i] = httpx.post(server.url + "/v1/decode", content=zs[i].tobytes(), timeout=120,
                                    headers={"Content-Type": "tensor/binary"},
                                    params={"shape": ",".join(map(str, zs[i].shape)), "dtype": "float32",
                                            "output_type": "npy"})
        threads = [threading.Thread(target=post, args=(0,))]
        threads[0].start()
        assert runners[0].entered.wait(60)
        threads += [threading.Thread(target=post, args=(i,)) for i in (1, 2)]
        for thread in threads[1:]:
            thread.start()
        wait_until(lambda: metric(server.url, "vaeserve_queue_depth") == 2, "two requests queued")
        runners[0].release.set()
        for thread in threads:
            thread.join(120)
    assert [answers[i].headers["X-Batch-Size"] for i in range(3)] == ["1", "2", "2"]
    for i, z in enumerate(zs):
        assert_uint8_frames_match(np.load(io.BytesIO(answers[i].content))[0], np.asarray(vae.decode(z, output="uint8"))[0])


@pytest.mark.parametrize("served", ["sd"], indirect=True)
def test_warm_up_checks_image_programs_against_device_memory(served):
    """The memory check reads each warm-up program of an image shape as it is compiled and refuses
    one that cannot fit (a program cache of its own: the module's programs are compiled already)."""
    _, vae, _, _ = served
    shape = f"4x{LATENT_SIZE[0]}x{LATENT_SIZE[1]}"
    kept, vae.programs = vae.programs, ProgramCache()
    try:
        settings = settings_for_tests(warmup=[shape + ":uint8"], device_memory_bytes=10_000)
        model = load_model(settings, vae=vae)
        guard_programs(model)
        with pytest.raises(StartupRefused, match=r"the decode of latents \(1, 4, 4, 6\) at tp=1, dp=1 needs"):
            warm_up(model, settings)
    finally:
        vae.programs = kept
    roomy = settings_for_tests(warmup=[shape], device_memory_bytes=2**40)
    warm_up(load_model(roomy, vae=vae), roomy)  # uint8 and float: an image model warms up no stream
    with pytest.raises(ValueError, match="no stream"):
        stream = settings_for_tests(warmup=[shape + ":stream"])
        warm_up(load_model(stream, vae=vae), stream)
