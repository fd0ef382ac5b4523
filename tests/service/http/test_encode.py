"""``POST /v1/encode`` end to end: a real uvicorn server (in a thread) with the tiny model, diffusers'
own ``remote_encode`` client unchanged, every body format, the errors, the batching of requests
with different options, ``service.client.encode`` and ``vaeserve encode``.

Frames are 16x24 (latents 2x3), F = 5 (one scanned chunk) or 1 (images): few shapes, few compiles.
"""

from __future__ import annotations

import io
import json

import httpx
import numpy as np
import pytest
import safetensors.numpy
from PIL import Image

from tests.helpers.service_helpers import app_client, thread_server
from vaeserve import models, sharding
from vaeserve.service.client import DecodeError, encode as client_encode
from vaeserve.service.codecs.tensors import npy_bytes
from vaeserve.service.codecs.video import mp4_bytes, read_mp4
from vaeserve.service.engine.jobs import EncodeOptions
from vaeserve.service.engine.runner import DeviceRunner

PROBLEM = "application/problem+json"
VIDEO = (1, 3, 5, 16, 24)  # -> latents (1, 16, 2, 2, 3)
TOLERANCE = 1e-5  # the service's (sharded, tp = 1) program against vae.encode's single-device one
SETTINGS = dict(max_batch=2, max_frames=9, max_height=64, max_width=64, encode_warmup=["3x5x16x24"])


def frames(shape=VIDEO, seed: int = 0) -> np.ndarray:
    return np.random.default_rng([seed, *shape]).uniform(-1, 1, shape).astype(np.float32)


def pixels(height: int = 16, width: int = 24, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def as_frames(rgb: np.ndarray) -> np.ndarray:
    """uint8 ``(F, H, W, 3)`` or ``(H, W, 3)`` → ``(1, 3, F, H, W)`` the way diffusers' image processor converts."""
    video = rgb if rgb.ndim == 4 else rgb[None]
    return (2.0 * (video.astype(np.float32) / 255.0) - 1.0).transpose(3, 0, 1, 2)[None]


def png(rgb: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="PNG")
    return buffer.getvalue()


def latents_of(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    return np.frombuffer(response.content, "<f4").reshape(json.loads(response.headers["shape"]))


def post(server, body: bytes, *, content_type: str | None = None, **params) -> httpx.Response:
    headers = {"Content-Type": content_type} if content_type else {}
    return httpx.post(server.url + "/v1/encode", content=body, params=params, headers=headers, timeout=120)


def assert_problem(response: httpx.Response, status: int, slug: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    body = response.json()
    assert body["type"].endswith("/" + slug), body
    return body


def close(got: np.ndarray, want: np.ndarray) -> bool:
    return got.shape == want.shape and float(np.abs(got - want).max()) <= TOLERANCE


@pytest.fixture(scope="module")
def server(tiny_vae):
    with thread_server(tiny_vae, **SETTINGS) as srv:
        yield srv


# ---- diffusers' client, unchanged ---------------------------------------------------------------


def test_diffusers_remote_encode_with_a_tensor(server, tiny_vae):
    torch = pytest.importorskip("torch")
    remote_encode = pytest.importorskip("diffusers.utils.remote_utils").remote_encode

    x = frames(seed=1)
    out = remote_encode(endpoint=server.url + "/v1/encode", image=torch.from_numpy(x))
    assert out.dtype == torch.float32 and tuple(out.shape) == (1, 16, 2, 2, 3)
    assert close(out.numpy(), np.asarray(tiny_vae.encode(x)))
    scaled = remote_encode(endpoint=server.url + "/v1/encode", image=torch.from_numpy(x), scaling_factor=0.5,
                           shift_factor=0.25)
    assert close(scaled.numpy(), (np.asarray(tiny_vae.encode(x)) - 0.25) * 0.5)
    half = remote_encode(endpoint=server.url + "/v1/encode", image=torch.from_numpy(x).to(torch.bfloat16))
    assert close(half.numpy(), np.asarray(tiny_vae.encode(torch.from_numpy(x).to(torch.bfloat16).float().numpy())))


def test_diffusers_remote_encode_with_a_pil_image(server, tiny_vae):
    pytest.importorskip("torch")
    remote_encode = pytest.importorskip("diffusers.utils.remote_utils").remote_encode

    rgb = pixels(seed=2)
    out = remote_encode(endpoint=server.url + "/v1/encode", image=Image.fromarray(rgb))  # a PNG, no Content-Type
    assert tuple(out.shape) == (1, 16, 1, 2, 3)
    assert close(out.numpy(), np.asarray(tiny_vae.encode(as_frames(rgb))))
    with pytest.raises(RuntimeError) as info:  # remote_encode raises response.json(): our problem body
        remote_encode(endpoint=server.url + "/v1/encode", image=Image.fromarray(pixels(12, 24)))
    assert "invalid-height" in str(info.value) and "[8, 16]" in str(info.value)


# ---- body formats and options -------------------------------------------------------------------


def test_jpeg_mp4_npy_safetensors_and_four_dim_bodies(server, tiny_vae):
    rgb = pixels(seed=3)
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="JPEG", quality=90)
    seen = np.asarray(Image.open(io.BytesIO(buffer.getvalue())).convert("RGB"))  # Pillow's decode, as the server's
    image_latents = latents_of(post(server, buffer.getvalue(), content_type="image/jpeg"))
    assert close(image_latents, np.asarray(tiny_vae.encode(as_frames(seen))))

    video = np.stack([pixels(seed=10 + i) for i in range(5)])
    mp4 = mp4_bytes(video, fps=16, crf=18)
    decoded = read_mp4(mp4)  # the pixels the server sees after H.264
    for content_type in ("video/mp4", None):  # explicit, and sniffed from the 'ftyp' box
        assert close(latents_of(post(server, mp4, content_type=content_type)), np.asarray(tiny_vae.encode(as_frames(decoded))))

    x = frames(seed=4)
    npy = httpx.post(server.url + "/v1/encode", content=npy_bytes(x), params={"output_type": "npy"},
                     headers={"Content-Type": "application/x-npy"}, timeout=120)
    assert npy.headers["content-type"] == "application/x-npy"
    out = np.load(io.BytesIO(npy.content), allow_pickle=False)
    assert close(out, np.asarray(tiny_vae.encode(x)))
    body = safetensors.numpy.save({"frames": x.astype(np.float16)})
    st = httpx.post(server.url + "/v1/encode", content=body, params={"output_type": "safetensors"},
                    headers={"Content-Type": "application/x-safetensors"}, timeout=120)
    assert close(safetensors.numpy.load(st.content)["latents"], np.asarray(tiny_vae.encode(x.astype(np.float16))))

    still = frames((1, 3, 16, 24), seed=5)  # (B, 3, H, W): one frame each
    out = latents_of(post(server, still.tobytes(), shape="1,3,16,24", dtype="float32"))  # no Content-Type
    assert close(out, np.asarray(tiny_vae.encode(still[:, :, None])))


def test_sample_seed_and_normalize(server, tiny_vae):
    x = frames(seed=6)
    query = {"shape": ",".join(map(str, VIDEO)), "dtype": "float32"}
    answer = post(server, x.tobytes(), **query, sample="true", seed=3)
    sampled = latents_of(answer)
    assert answer.headers["X-Seed"] == "3"
    assert close(sampled, np.asarray(tiny_vae.encode(x, sample=True, seed=3)))
    assert not close(sampled, np.asarray(tiny_vae.encode(x)))
    fresh = post(server, x.tobytes(), **query, sample="true")  # no seed: the one drawn is in X-Seed
    assert close(latents_of(fresh), np.asarray(tiny_vae.encode(x, sample=True, seed=int(fresh.headers["X-Seed"]))))
    assert "X-Seed" not in post(server, x.tobytes(), **query).headers  # the mean takes no seed
    normalized = latents_of(post(server, x.tobytes(), **query, normalize="true"))
    assert close(normalized, np.asarray(tiny_vae.encode(x, normalize=True)))


def test_scaling_and_shift_factors_give_diffusers_scaled_latents(server, tiny_vae):
    """``(z − shift_factor) · scaling_factor``, as diffusers' remote encode convention has it."""
    x = frames(seed=6)
    query = {"shape": ",".join(map(str, VIDEO)), "dtype": "float32"}
    plain = np.asarray(tiny_vae.encode(x))
    scaled = latents_of(post(server, x.tobytes(), **query, scaling_factor="0.5", shift_factor="0.25"))
    assert close(scaled, (plain - 0.25) * 0.5)
    assert np.abs(scaled - plain).max() > 0.1  # the factors did something


@pytest.mark.parametrize("factors", [{"scaling_factor": "3e38", "shift_factor": "-1"},
                                     {"scaling_factor": "10", "shift_factor": "-3e38"}], ids=["some", "all"])
def test_factors_that_overflow_the_latents_are_422_naming_them(server, factors):
    # The hostile run: 200 with non-finite latents (26 of 2048 for scaling_factor=3e38, whose
    # latents reached 1.13; with shift_factor=-3e38&scaling_factor=10, all of them). The tiny
    # model's latents stay below 1.1, so the first case shifts them first. Decode refuses such
    # factors with 422.
    x = frames(seed=6)
    query = {"shape": ",".join(map(str, VIDEO)), "dtype": "float32"}
    problem = assert_problem(post(server, x.tobytes(), **query, **factors), 422, "non-finite")
    named = f"scaling_factor={float(factors['scaling_factor'])}, shift_factor={float(factors['shift_factor'])}"
    assert problem["detail"].endswith(f"after scaling ({named})"), problem
    assert problem["expected"] == "finite values" and problem["received"].endswith("non-finite of 192")
    # The same shape of problem as a decode's latents that overflow once scaled.
    decoded = httpx.post(server.url + "/v1/decode", content=np.full((1, 16, 2, 2, 3), 10, np.float32).tobytes(),
                         params={"shape": "1,16,2,2,3", "dtype": "float32", "scaling_factor": "1e-38"}, timeout=120,
                         headers={"Content-Type": "application/octet-stream"})
    assert set(assert_problem(decoded, 422, "non-finite")) == set(problem)
    assert latents_of(post(server, x.tobytes(), **query, scaling_factor="1e30")).shape == (1, 16, 2, 2, 3)


def test_requests_with_different_options_share_one_device_batch(tiny_vae):
    """What the worker does with two queued encode jobs of one shape: one runner call, each
    request's rows with its own options, each equal to encoding that request alone."""
    runner = DeviceRunner(tiny_vae, sharding.make_mesh(1), max_batch=2, dp=1)
    a, b = frames(seed=7), frames(seed=8)
    requests = [(EncodeOptions(sample=True, seed=9), 1), (EncodeOptions(normalize=True), 1)]
    out = runner.encode(np.concatenate([a, b]), requests)
    assert close(out[:1], np.asarray(tiny_vae.encode(a, sample=True, seed=9)))
    assert close(out[1:], np.asarray(tiny_vae.encode(b, normalize=True)))
    # The form in which process 0 of a multi-host slice sends them: JSON lists.
    assert np.array_equal(runner.encode(np.concatenate([a, b]), json.loads(json.dumps(requests))), out)


def test_python_client(server, tiny_vae):
    x = frames(seed=1)
    assert close(client_encode(server.url, x), np.asarray(tiny_vae.encode(x)))
    rgb = pixels(seed=2)
    assert close(client_encode(server.url, png(rgb), normalize=True),
                 np.asarray(tiny_vae.encode(as_frames(rgb), normalize=True)))
    with pytest.raises(DecodeError) as info:
        client_encode(server.url, frames((1, 3, 3, 16, 24)))
    assert info.value.problem["expected"] == [1, 5]


# ---- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body,params,content_type,status,slug,expected",
    [(frames((1, 3, 4, 16, 24)).tobytes(), {"shape": "1,3,4,16,24", "dtype": "float32"}, None, 422,
      "invalid-frame-count", [1, 5]),
     (frames((1, 3, 1, 20, 24)).tobytes(), {"shape": "1,3,1,20,24", "dtype": "float32"}, None, 422,
      "invalid-height", [16, 24]),
     (frames((1, 4, 1, 16, 24)).tobytes(), {"shape": "1,4,1,16,24", "dtype": "float32"}, None, 422,
      "invalid-channels", 3),
     (frames((1, 3, 1, 16, 24)).tobytes()[:-4], {"shape": "1,3,1,16,24", "dtype": "float32"}, None, 422,
      "body-length-mismatch", 1152 * 4),
     (np.full(VIDEO, np.nan, np.float32).tobytes(), {"shape": "1,3,5,16,24", "dtype": "float32"}, None, 422,
      "non-finite", "finite values"),
     (frames((1, 3, 13, 16, 24)).tobytes(), {"shape": "1,3,13,16,24", "dtype": "float32"}, None, 422,
      "too-many-frames", "frames <= 9"),
     (b"\x89PNG\r\n\x1a\n" + b"\0" * 64, {}, "image/png", 422, "invalid-image", "a readable PNG image"),
     (b"\0" * 64, {}, "application/octet-stream", 422, "missing-shape", "shape=B,3,F,H,W&dtype=float32"),
     (b"\0" * 64, {}, "text/plain", 415, "unsupported-media-type", None)],
    ids=["frames-4", "height-20", "channels-4", "short-body", "nan", "frames-over-limit", "corrupt-png",
         "unrecognized-body", "text"],
)
def test_bad_bodies_are_problems_with_expected_and_received(server, body, params, content_type, status, slug,
                                                            expected):
    problem = assert_problem(post(server, body, content_type=content_type, **params), status, slug)
    if expected is not None:
        assert problem["expected"] == expected, problem
    if status == 415:  # the media types the encode reads, sounds among them
        assert {"image/png", "video/mp4", "audio/wav", "audio/flac"} <= set(problem["expected"]), problem
    assert latents_of(post(server, frames().tobytes(), shape="1,3,5,16,24", dtype="float32")).shape[2] == 2


def test_metrics_and_models_list_the_encode_programs(server):
    before = server.metric("vaeserve_frames_encoded_total")
    latents_of(post(server, frames(seed=12).tobytes(), shape="1,3,5,16,24", dtype="float32"))
    assert server.metric("vaeserve_frames_encoded_total") == before + 5
    compiled = httpx.get(server.url + "/v1/models").json()["data"][0]["compiled"]
    assert ["encode", [1, 3, 5, 16, 24], "latents"] in compiled and ["encode", [2, 3, 5, 16, 24], "latents"] in compiled


def test_decode_only_checkpoint_answers_501_and_auth_applies():
    vae = models.init_vae(models.WanVAEConfig(base_dim=8, num_res_blocks=1), encoder=False)
    with app_client(vae, api_key="k") as client:
        assert_problem(client.post("/v1/encode", content=png(pixels())), 401, "unauthorized")
        body = assert_problem(client.post("/v1/encode", content=png(pixels()), headers={"Authorization": "Bearer k"}),
                              501, "no-encoder")
        assert body["expected"] == "a full VAE checkpoint"


# ---- vaeserve encode --------------------------------------------------------------------------------


def test_command_line_encode(tiny_model_dir, tiny_vae, tmp_path):
    from vaeserve.service.cli import main

    rgb = pixels(seed=13)
    (tmp_path / "first.png").write_bytes(png(rgb))
    assert main(["encode", str(tmp_path / "first.png"), "-o", str(tmp_path / "z.safetensors"),
                 "--model", str(tiny_model_dir)]) == 0
    written = safetensors.numpy.load_file(str(tmp_path / "z.safetensors"))["latents"]
    assert close(written, np.asarray(tiny_vae.encode(as_frames(rgb))))
    with pytest.raises(SystemExit, match="frame count must be 1 \\+ 4k"):
        np.save(tmp_path / "bad.npy", frames((1, 3, 2, 16, 24)))
        main(["encode", str(tmp_path / "bad.npy"), "-o", str(tmp_path / "out.npy"), "--model", str(tiny_model_dir)])
