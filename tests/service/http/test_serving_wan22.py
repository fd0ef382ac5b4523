"""The service with a Wan 2.2 model: channels, scales and limits come from the loaded config.

A small full 2.2 checkpoint (48 latent channels, 16x: 8x and 2x2 patches; encoder included)
behind a real uvicorn server, driven by diffusers' own ``remote_decode`` and ``remote_encode``;
``vaeserve encode`` on it; and the embedded ``wan2.2`` selected by ``VAESERVE_MODEL``, as
``--model wan2.2`` does. Encodes use one frame shape (1, 3, 1, 32, 48): one compile each side.
"""

from __future__ import annotations

import io

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.helpers.frames import assert_uint8_frames_match
from tests.helpers.service_helpers import app_client, latents, thread_server
from vaeserve import models
from vaeserve.models.decode import to_uint8
from vaeserve.service.codecs.video import read_mp4

PROBLEM = "application/problem+json"
LATENT = (1, 48, 2, 3, 2)  # -> (1, 5, 48, 32, 3) frames
IMAGE = (32, 48)  # (H, W) of the encoded frames -> latents (1, 48, 1, 2, 3)
ENCODE_TOLERANCE = 1e-5  # the service's (sharded, tp = 1) encode against vae.encode's single-device one


@pytest.fixture(scope="module")
def folder22(tmp_path_factory):
    """A small full Wan 2.2 checkpoint (decoder and encoder) as a diffusers folder."""
    folder = tmp_path_factory.mktemp("wan22")
    config = models.WanVAEConfig.wan22(base_dim=8, decoder_base_dim=8, num_res_blocks=1)
    models.save_vae(models.init_vae(config, seed=0), folder)
    return folder


@pytest.fixture(scope="module")
def vae22(folder22):
    """The folder loaded back, as ``--model DIR`` would: both halves."""
    vae = models.load_vae(folder22)
    assert vae.has_encoder and vae.metadata["encoder_parameters"] > 0
    return vae


@pytest.fixture(scope="module")
def server(vae22):
    with thread_server(vae22, max_height=64, max_width=64) as server:
        yield server


def _post(server, x: np.ndarray, **params) -> httpx.Response:
    query = {"shape": ",".join(map(str, x.shape)), "dtype": "float32", "output_type": "npy", **params}
    return httpx.post(server.url + "/v1/decode", content=x.tobytes(), params=query,
                      headers={"Content-Type": "tensor/binary"}, timeout=120)


def test_models_shows_the_2_2_latents_and_limits(server):
    info = httpx.get(server.url + "/v1/models").json()["data"][0]
    config = models.WanVAEConfig.wan22(base_dim=8, decoder_base_dim=8, num_res_blocks=1)
    assert info["latents"] == {"is_image": False, "layout": "(B, C, T, H, W)", "channels": 48, "spatial_scale": 16,
                               "temporal_scale": 4, "max_batch": 2, "max_latent_frames": 3, "max_latent_height": 4,
                               "max_latent_width": 4, "max_height": 64, "max_width": 64,
                               "latents_mean": list(config.latents_mean), "latents_std": list(config.latents_std),
                               "causal": True, "framewise": False}
    assert info["config"]["is_residual"] is True and info["config"]["patch_size"] == 2
    assert info["encodes"] is True


def test_errors_name_the_model_channels_and_scale(server):
    wrong = _post(server, latents((1, 16, 2, 3, 2)))
    assert wrong.status_code == 422 and wrong.headers["content-type"] == PROBLEM
    body = wrong.json()
    assert body["expected"] == 48 and body["received"] == 16 and "48 channels" in body["detail"]
    # 5 latent rows are 80 pixels at 16x (40 at Wan 2.1's 8x): over max_height = 64
    tall = _post(server, latents((1, 48, 2, 5, 2))).json()
    assert tall["type"].endswith("/too-large-height") and tall["received"] == 80 and tall["expected"] == "height <= 64"


def test_diffusers_remote_decode_mp4_and_pt(server, vae22):
    torch = pytest.importorskip("torch")
    remote_decode = pytest.importorskip("diffusers.utils.remote_utils").remote_decode

    x = latents(LATENT, seed=5)
    endpoint = server.url + "/v1/decode"
    # One reference program (float, as given) for both requests; do_scaling (the default) denormalizes.
    mean, std = (np.asarray(v, np.float32).reshape(1, 48, 1, 1, 1)
                 for v in (vae22.config.latents_mean, vae22.config.latents_std))
    ref = np.asarray(to_uint8(np.moveaxis(np.asarray(vae22.decode(x * std + mean)), 1, -1)))[0]
    assert ref.shape == (5, 48, 32, 3)
    video = remote_decode(endpoint=endpoint, tensor=torch.from_numpy(x), output_type="mp4", return_type="mp4")
    assert isinstance(video, bytes) and video[4:8] == b"ftyp"
    decoded = read_mp4(video).astype(np.float64) @ np.array([0.299, 0.587, 0.114])
    assert decoded.shape == (5, 48, 32)
    assert np.abs(decoded - ref.astype(np.float64) @ np.array([0.299, 0.587, 0.114])).mean() < 5

    frames = remote_decode(endpoint=endpoint, tensor=torch.from_numpy(x), output_type="pt", return_type="pt",
                           partial_postprocess=True)
    assert_uint8_frames_match(frames.numpy()[0], ref)

    floats = remote_decode(endpoint=endpoint, tensor=torch.from_numpy(x), output_type="pt", return_type="pt",
                           do_scaling=False)
    ref_float = np.asarray(vae22.decode(x, output="float"))
    assert tuple(floats.shape) == ref_float.shape == (1, 3, 5, 48, 32)
    assert np.abs(floats.float().numpy() - ref_float).max() < 2e-3


def _pixels(height: int, width: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def _as_frames(rgb: np.ndarray) -> np.ndarray:
    """uint8 ``(H, W, 3)`` → ``(1, 3, 1, H, W)`` in [-1, 1], as diffusers' image processor converts."""
    return (2.0 * (rgb.astype(np.float32) / 255.0) - 1.0).transpose(2, 0, 1)[None, :, None]


def _png(rgb: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="PNG")
    return buffer.getvalue()


def test_diffusers_remote_encode_tensor_and_image(server, vae22):
    """diffusers' client unchanged: a tensor (raw bytes, no Content-Type) and a PIL image (a PNG)
    give 48-channel latents at 1/16 of the size, equal to ``vae.encode`` of the same frames."""
    torch = pytest.importorskip("torch")
    remote_encode = pytest.importorskip("diffusers.utils.remote_utils").remote_encode

    endpoint = server.url + "/v1/encode"
    rgb = _pixels(*IMAGE, seed=3)
    tensor = np.random.default_rng(4).uniform(-1, 1, (1, 3, 1, *IMAGE)).astype(np.float32)
    for sent, frames in ((Image.fromarray(rgb), _as_frames(rgb)), (torch.from_numpy(tensor), tensor)):
        got = remote_encode(endpoint=endpoint, image=sent)
        want = np.asarray(vae22.encode(frames))
        assert tuple(got.shape) == want.shape == (1, 48, 1, 2, 3) and got.dtype == torch.float32
        assert np.abs(got.numpy() - want).max() <= ENCODE_TOLERANCE
        assert want.std() > 0.05
    with pytest.raises(RuntimeError) as info:  # remote_encode raises response.json(): our problem body
        remote_encode(endpoint=endpoint, image=Image.fromarray(_pixels(40, 48, seed=5)))
    assert "invalid-height" in str(info.value) and "multiple of 16" in str(info.value)
    assert "'expected': [32, 48]" in str(info.value) and "'received': 40" in str(info.value)


def test_encode_errors_name_the_frame_channels_and_the_16x_sizes(server):
    """Frames are RGB (3 channels) although the patchified encoder takes 12; sizes are multiples of 16."""
    def post(shape):
        x = np.zeros(shape, np.float32)
        return httpx.post(server.url + "/v1/encode", content=x.tobytes(), timeout=120,
                          params={"shape": ",".join(map(str, shape)), "dtype": "float32"})

    twelve = post((1, 12, 1, 16, 16))
    assert twelve.status_code == 422 and twelve.headers["content-type"] == PROBLEM
    assert (twelve.json()["expected"], twelve.json()["received"]) == (3, 12)
    narrow = post((1, 3, 1, 32, 40)).json()
    assert narrow["type"].endswith("/invalid-width") and (narrow["expected"], narrow["received"]) == ([32, 48], 40)


def test_command_line_encode(folder22, vae22, tmp_path):
    from vaeserve.service.cli import main

    rgb = _pixels(*IMAGE, seed=6)
    (tmp_path / "first.png").write_bytes(_png(rgb))
    assert main(["encode", str(tmp_path / "first.png"), "-o", str(tmp_path / "z.npy"), "--model", str(folder22)]) == 0
    written = np.load(tmp_path / "z.npy", allow_pickle=False)
    want = np.asarray(vae22.encode(_as_frames(rgb)))
    assert written.shape == want.shape == (1, 48, 1, 2, 3)
    assert np.abs(written - want).max() <= ENCODE_TOLERANCE
    (tmp_path / "tall.png").write_bytes(_png(_pixels(40, 48, seed=7)))
    with pytest.raises(SystemExit, match=r"multiple of 16: expected \[32, 48\], received 40"):
        main(["encode", str(tmp_path / "tall.png"), "-o", str(tmp_path / "out.npy"), "--model", str(folder22)])


def test_embedded_wan22_from_the_environment(monkeypatch):
    """``VAESERVE_MODEL=wan2.2``: the real 2.2 architecture (555 M parameters), random weights."""
    monkeypatch.setenv("VAESERVE_MODEL", "wan2.2")
    with app_client(None, max_height=1280, max_width=1280, max_frames=121) as client:
        info = client.get("/v1/models").json()["data"][0]
        assert info["id"] == "wan2.2" and info["random_weights"] is True and info["encodes"] is True
        assert info["config"] == models.WanVAEConfig.wan22().to_dict()
        assert info["latents"]["channels"] == 48 and info["latents"]["spatial_scale"] == 16
        # TI2V-5B's native 1280x704x121 is the largest request these limits allow
        assert (info["latents"]["max_latent_frames"], info["latents"]["max_latent_width"]) == (31, 80)
        r = client.post("/v1/decode", content=latents((1, 16, 1, 1, 1)).tobytes(),
                        params={"shape": "1,16,1,1,1", "dtype": "float32"}, headers={"Content-Type": "tensor/binary"})
        assert r.status_code == 422 and r.json()["expected"] == 48
