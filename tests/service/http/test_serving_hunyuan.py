"""The service with HunyuanVideo 1.0 and 1.5 models: the latents it describes, diffusers' own
``remote_decode`` and ``remote_encode`` unchanged, streams.

Small full checkpoints (decoder and encoder; ``tests/helpers/hunyuan_reference``) behind real
uvicorn servers. ``remote_decode`` sends ``do_scaling`` by default, without a ``scaling_factor``:
the service then divides by the config's ``scaling_factor`` (HunyuanVideo's normalisation), as
Hugging Face's HunyuanVideo endpoint does; an explicit ``scaling_factor`` is applied instead. 1.5
streams frame by frame; 1.0 (its statistics span the clip) decodes the whole clip, then streams it
in the same chunks. Each server compiles one uint8 decode, one encode (and 1.5 its two stream
steps); the references one float decode and one encode each.
"""

from __future__ import annotations

import httpx
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.helpers.hunyuan_reference import CASES, FRAMEWISE_CASE, FRAMEWISE_SHAPE, HY10_TINY, HY15_TINY, seeded_weights
from tests.helpers.service_helpers import app_client, latents, thread_server
from tests.helpers.wan_reference import fixture_path, write_diffusers_folder
from vaeserve import models
from vaeserve.models.decode import to_uint8
from vaeserve.service.cli import main
from vaeserve.service.client import decode, decode_stream
from vaeserve.service.codecs.video import read_mp4

CONFIGS = {"hy10": HY10_TINY, "hy15": HY15_TINY}
LATENT = (1, 16, 3, 3, 2)  # 9 frames; 1.0: 24 x 16, 1.5: 48 x 32
ENCODE_TOLERANCE = 1e-5  # the service's (sharded, tp = 1) encode against vae.encode's single-device one


@pytest.fixture(scope="module", params=["hy10", "hy15"])
def served(request, tmp_path_factory):
    """``(name, vae, server)``: a small full checkpoint loaded from its folder (as ``--model DIR``)."""
    name, config = request.param, CONFIGS[request.param]
    folder = write_diffusers_folder(tmp_path_factory.mktemp(name), config, seeded_weights(config, 21))
    vae = models.load_vae(folder)
    with thread_server(vae, max_batch=1, max_frames=9, max_height=64, max_width=64) as server:
        yield name, vae, server


def _reference_uint8(vae, x: np.ndarray, *, scaled: bool = True) -> np.ndarray:
    """``vae.decode`` of latents scaled as the service scales them by default (÷ scaling_factor),
    or as they are (``scaled=False``)."""
    frames = vae.decode(x / np.float32(vae.config.scaling_factor) if scaled else x)
    return np.asarray(to_uint8(jnp.moveaxis(frames, 1, -1)))[0]


def _uint8(frames: np.ndarray) -> np.ndarray:
    """Float frames ``(B, 3, F, H, W)`` (diffusers' decode, unclamped) as the service's uint8 ``(B, F, H, W, 3)``."""
    return np.asarray(to_uint8(jnp.moveaxis(jnp.clip(jnp.asarray(frames), -1, 1), 1, -1)))


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


def test_models_describe_the_latents(served):
    name, vae, server = served
    info = httpx.get(server.url + "/v1/models").json()["data"][0]
    config = vae.config
    assert info["config"]["_class_name"] == config.class_name
    assert info["latents"] == {
        "is_image": False, "layout": "(B, C, T, H, W)", "channels": 16, "spatial_scale": config.spatial_scale,
        "temporal_scale": 4, "max_batch": 1, "max_latent_frames": 3, "max_latent_height": 64 // config.spatial_scale,
        "max_latent_width": 64 // config.spatial_scale, "max_height": 64, "max_width": 64,
        "latents_mean": [0.0] * 16, "latents_std": [pytest.approx(1 / config.scaling_factor)] * 16,
        "causal": name == "hy15", "framewise": name == "hy10"}
    assert info["encodes"] is True


def test_diffusers_remote_decode_with_the_configs_scaling(served):
    """``remote_decode`` as HF's HunyuanVideo endpoint is called: mp4 and uint8 ``pt``, the config's
    scaling by default, the same frames with ``scaling_factor`` given explicitly; the stream's
    chunks concatenate to the same frames."""
    torch = pytest.importorskip("torch")
    from diffusers.utils.remote_utils import remote_decode

    name, vae, server = served
    x = latents(LATENT, seed=5)
    endpoint = server.url + "/v1/decode"
    ref = _reference_uint8(vae, x)
    frames = remote_decode(endpoint=endpoint, tensor=torch.from_numpy(x), output_type="pt", return_type="pt",
                           partial_postprocess=True)
    assert frames.dtype == torch.uint8 and tuple(frames.shape[1:]) == ref.shape
    assert np.abs(frames.numpy()[0].astype(int) - ref).max() <= 1 and ref.std() > 20
    explicit = remote_decode(endpoint=endpoint, tensor=torch.from_numpy(x), output_type="pt", return_type="pt",
                             partial_postprocess=True, scaling_factor=vae.config.scaling_factor)
    # The default multiplies by the config's latents_std (1 / scaling_factor) where the explicit
    # factor divides: float32 rounding apart, so a level may differ, no more.
    assert np.abs(explicit.numpy().astype(int) - frames.numpy().astype(int)).max() <= 1
    unscaled = remote_decode(endpoint=endpoint, tensor=torch.from_numpy(x), output_type="pt", return_type="pt",
                             partial_postprocess=True, do_scaling=False)
    # The scaling was applied, not assumed: without it the frames are the unscaled latents' (1.5's
    # factor, 1.037, moves them by a few levels only, so each is compared with its own reference).
    unscaled_ref = _reference_uint8(vae, x, scaled=False)
    assert np.abs(unscaled.numpy()[0].astype(int) - unscaled_ref).max() <= 1
    assert np.abs(unscaled_ref.astype(int) - ref).max() > 2

    video = remote_decode(endpoint=endpoint, tensor=torch.from_numpy(x), output_type="mp4", return_type="mp4")
    assert isinstance(video, bytes) and video[4:8] == b"ftyp"
    gray = read_mp4(video).astype(np.float64) @ np.array([0.299, 0.587, 0.114])
    assert np.abs(gray - ref.astype(np.float64) @ np.array([0.299, 0.587, 0.114])).mean() < 5

    chunks = list(decode_stream(server.url, x, do_scaling=True))
    assert [c.shape[1] for c in chunks] == [1, 4, 4]  # 1.0 too: the whole clip, then the same chunks
    assert np.array_equal(np.concatenate(chunks, axis=1), decode(server.url, x, output_type="npy", do_scaling=True))


def test_diffusers_remote_encode(served):
    torch = pytest.importorskip("torch")
    from diffusers.utils.remote_utils import remote_encode

    _, vae, server = served
    s = vae.config.spatial_scale
    frames = np.random.default_rng(4).uniform(-1, 1, (1, 3, 1, 2 * s, 3 * s)).astype(np.float32)
    got = remote_encode(endpoint=server.url + "/v1/encode", image=torch.from_numpy(frames))
    want = np.asarray(vae.encode(frames))
    assert tuple(got.shape) == want.shape == (1, 16, 1, 2, 3)
    assert np.abs(got.numpy() - want).max() <= ENCODE_TOLERANCE and want.std() > 0.05
    scaled = remote_encode(endpoint=server.url + "/v1/encode", image=torch.from_numpy(frames),
                           scaling_factor=vae.config.scaling_factor)
    assert np.abs(scaled.numpy() - want * vae.config.scaling_factor).max() <= ENCODE_TOLERANCE


@pytest.mark.parametrize("served", ["hy15"], indirect=True)
def test_framewise_is_refused_where_the_model_has_none(served):
    _, _, server = served
    r = httpx.post(server.url + "/v1/decode", content=latents(LATENT).tobytes(), timeout=60,
                   params={"shape": "1,16,3,3,2", "dtype": "float32", "framewise": "true", "output_type": "npy"},
                   headers={"Content-Type": "tensor/binary"})
    assert r.status_code == 422, r.text
    assert (r.json()["expected"], r.json()["received"]) == ("framewise=false", "framewise=true")
    assert "HunyuanVideo 1.0" in r.json()["detail"] and "hunyuan1.5" in r.json()["detail"]
    assert httpx.get(server.url + "/healthz").status_code == 200


def test_framewise_decode_is_diffusers_default_served(tmp_path):
    """``framewise=true`` on a 1.0 clip of three tiles: diffusers' default decode (the committed
    fixture), not the model's whole-clip decode, from programs compiled at warm-up only
    (``--warmup ...:framewise --shapes warmed``): uint8 frames, the float tensor, the stream."""
    fixture = load_file(str(fixture_path(FRAMEWISE_CASE + "_framewise", FRAMEWISE_SHAPE)))
    config, seed = CASES[FRAMEWISE_CASE][:2]
    folder = write_diffusers_folder(tmp_path / "hy10", config, seeded_weights(config, seed))
    vae = models.load_vae(folder)
    x, shape = fixture["latents"], FRAMEWISE_SHAPE[1:]
    tiled = _uint8(fixture["framewise"])[0]
    whole = _uint8(fixture["frames"])[0]
    assert np.abs(tiled.astype(int) - whole).max() > 20  # the two decodes differ: the test can tell them apart
    warmup = "x".join(map(str, shape)) + ":framewise"
    with thread_server(vae, max_batch=1, max_frames=25, max_height=64, max_width=64, warmup=[warmup],
                       shapes="warmed") as server:
        compiled = httpx.get(server.url + "/v1/models").json()["data"][0]["compiled"]
        assert sorted(compiled) == [["decode", [1, *shape], "float+framewise"], ["decode", [1, *shape], "uint8+framewise"]]
        frames = decode(server.url, x, output_type="npy", framewise=True)[0]
        assert frames.shape == tiled.shape and np.abs(frames.astype(int) - tiled).max() <= 1
        chunks = list(decode_stream(server.url, x, framewise=True))
        assert [c.shape[1] for c in chunks] == [1, 4, 4, 4, 4, 4, 4]
        assert np.array_equal(np.concatenate(chunks, axis=1)[0], frames)
        tensor = decode(server.url, x, output_type="pt", framewise=True)  # float16, as diffusers' remote_decode takes it
        assert _max_diff(tensor, np.clip(fixture["framewise"], -1, 1)) <= 1e-3
        assert _max_diff(tensor, np.clip(fixture["frames"], -1, 1)) > 0.1
        refused = httpx.post(server.url + "/v1/decode", content=x.tobytes(), timeout=60, headers={"Content-Type": "tensor/binary"},
                             params={"shape": ",".join(map(str, x.shape)), "dtype": "float32", "output_type": "npy"})
        assert refused.status_code == 422 and refused.json()["received"].endswith(":uint8"), refused.text
        assert httpx.get(server.url + "/v1/models").json()["data"][0]["compiled"] == compiled  # nothing compiled since
    np.save(tmp_path / "z.npy", x)
    assert main(["decode", str(tmp_path / "z.npy"), "-o", str(tmp_path / "f.npy"), "--model", str(folder), "--framewise"]) == 0
    assert np.array_equal(np.load(tmp_path / "f.npy")[0], frames)  # the offline CLI's option too
def test_errors_name_the_models_channels(served):
    _, vae, server = served
    x = latents((1, 32, 2, 2, 2))
    r = httpx.post(server.url + "/v1/decode", content=x.tobytes(), timeout=60,
                   params={"shape": "1,32,2,2,2", "dtype": "float32"}, headers={"Content-Type": "tensor/binary"})
    assert r.status_code == 422 and r.json()["expected"] == 16 and r.json()["received"] == 32


def test_embedded_hunyuan10_from_the_environment(monkeypatch):
    """``VAESERVE_MODEL=hunyuan1.0``: the real architecture (146 M decoder parameters), random weights."""
    monkeypatch.setenv("VAESERVE_MODEL", "hunyuan1.0")
    with app_client(None, max_height=720, max_width=1280, max_frames=129) as client:
        info = client.get("/v1/models").json()["data"][0]
        assert info["id"] == "hunyuan1.0" and info["random_weights"] is True and info["encodes"] is True
        assert info["config"] == models.HunyuanVideoConfig().to_dict()
        assert info["latents"]["causal"] is False and info["latents"]["latents_std"][0] == pytest.approx(2.0965, 1e-4)
        assert (info["latents"]["max_latent_frames"], info["latents"]["max_latent_height"]) == (33, 90)
