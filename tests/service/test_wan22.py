"""The service with a Wan 2.2 model: channels, scales and limits come from the loaded config.

A small 2.2 model (48 latent channels, 16x: 8x decoder and 2x2 patches) behind a real uvicorn
server, driven by diffusers' own ``remote_decode``; and the embedded ``wan2.2`` selected by
``VAESERVE_MODEL``, as ``--model wan2.2`` does.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest

import models
from models.decode import to_uint8
from service import codec
from tests.helpers.service_helpers import app_client, latents, thread_server

PROBLEM = "application/problem+json"
LATENT = (1, 48, 2, 3, 2)  # -> (1, 5, 48, 32, 3) frames


@pytest.fixture(scope="module")
def vae22(tmp_path_factory):
    """A small Wan 2.2 saved as a diffusers folder and loaded back (as ``--model DIR`` would)."""
    folder = tmp_path_factory.mktemp("wan22")
    config = models.WanVAEConfig.wan22(base_dim=8, decoder_base_dim=8, num_res_blocks=1)
    models.save_vae(models.init_vae(config, seed=0), folder)
    return models.load_vae(folder)


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
    assert info["latents"] == {"channels": 48, "spatial_scale": 16, "temporal_scale": 4, "max_batch": 2,
                               "max_latent_frames": 3, "max_latent_height": 4, "max_latent_width": 4}
    assert info["config"]["is_residual"] is True and info["config"]["patch_size"] == 2


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
    from diffusers.utils.remote_utils import remote_decode

    x = latents(LATENT, seed=5)
    endpoint = server.url + "/v1/decode"
    # One reference program (float, as given) for both requests; do_scaling (the default) denormalizes.
    mean, std = (np.asarray(v, np.float32).reshape(1, 48, 1, 1, 1)
                 for v in (vae22.config.latents_mean, vae22.config.latents_std))
    ref = np.asarray(to_uint8(np.moveaxis(np.asarray(vae22.decode(x * std + mean)), 1, -1)))[0]
    assert ref.shape == (5, 48, 32, 3)
    video = remote_decode(endpoint=endpoint, tensor=torch.from_numpy(x), output_type="mp4", return_type="mp4")
    assert isinstance(video, bytes) and video[4:8] == b"ftyp"
    decoded = codec.decode_mp4(video).astype(np.float64) @ np.array([0.299, 0.587, 0.114])
    assert decoded.shape == (5, 48, 32)
    assert np.abs(decoded - ref.astype(np.float64) @ np.array([0.299, 0.587, 0.114])).mean() < 5

    frames = remote_decode(endpoint=endpoint, tensor=torch.from_numpy(x), output_type="pt", return_type="pt",
                           partial_postprocess=True)
    assert frames.dtype == torch.uint8 and np.abs(frames.numpy()[0].astype(int) - ref).max() <= 1

    floats = remote_decode(endpoint=endpoint, tensor=torch.from_numpy(x), output_type="pt", return_type="pt",
                           do_scaling=False)
    ref_float = np.asarray(vae22.decode(x, output="float"))
    assert tuple(floats.shape) == ref_float.shape == (1, 3, 5, 48, 32)
    assert np.abs(floats.float().numpy() - ref_float).max() < 2e-3


def test_embedded_wan22_from_the_environment(monkeypatch):
    """``VAESERVE_MODEL=wan2.2``: the real 2.2 architecture (555 M parameters), random weights."""
    monkeypatch.setenv("VAESERVE_MODEL", "wan2.2")
    with app_client(None, max_height=1280, max_width=1280, max_frames=121) as client:
        info = client.get("/v1/models").json()["data"][0]
        assert info["id"] == "wan2.2" and info["random_weights"] is True
        assert info["config"] == models.WanVAEConfig.wan22().to_dict()
        assert info["latents"]["channels"] == 48 and info["latents"]["spatial_scale"] == 16
        # TI2V-5B's native 1280x704x121 is the largest request these limits allow
        assert (info["latents"]["max_latent_frames"], info["latents"]["max_latent_width"]) == (31, 80)
        r = client.post("/v1/decode", content=latents((1, 16, 1, 1, 1)).tobytes(),
                        params={"shape": "1,16,1,1,1", "dtype": "float32"}, headers={"Content-Type": "tensor/binary"})
        assert r.status_code == 422 and r.json()["expected"] == 48
