"""The service with a MiniMax-H3 model (``AutoencoderKLMiniMaxH3``): a tiny diffusers model, its
``save_pretrained`` folder loaded as ``--model DIR``, behind a real uvicorn server, driven by
diffusers' own ``remote_decode`` and ``remote_encode``.

The decode is the released one (tiles blended, chunks cross-faded; the tiny model's tiles of 16
pixels with 4 of overlap written into its config.json, as ``enable_tiling(16, 16, 4, 4)`` sets
diffusers'): latents (1, 4, 8, 6, 8) are 2 chunks of 2x3 tiles, 26 frames of 24x32. Its uint8 frames
must equal diffusers' tiled decode taken from ImageNet space to [0, 1] and clamped (the pipeline's
pixels), after the latents are denormalised with the config's ``latents_mean``/``latents_std``
(non-trivial here, so that the denormalisation counts). The server compiles one uint8 decode and
one encode; diffusers runs in torch. About 15 s on a 2-core host.
"""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from tests.helpers.frames import assert_uint8_frames_match
from tests.helpers.minimax_h3_reference import seeded_reference
from tests.helpers.service_helpers import latents, thread_server
from vaeserve import models
from vaeserve.models.families.minimax_h3.config import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    TILING_FIELDS,
    AutoencoderKLMiniMaxH3Config,
)
from vaeserve.service.client import decode, decode_stream
from vaeserve.service.codecs.video import read_mp4

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

PROBLEM = "application/problem+json"
TINY = AutoencoderKLMiniMaxH3Config.tiny(latents_mean=(0.1, -0.2, 0.3, 0.0), latents_std=(0.5, 1.5, 0.8, 1.2))
LATENT = (1, 4, 8, 6, 8)  # 2 chunks of 2x3 tiles: 26 frames of 24 x 32
FRAMES = (1, 3, 22, 24, 32)  # 17 + 5 frames: 7 latent frames
ENCODE_TOLERANCE = 1e-4  # the family's parity promise with diffusers


@pytest.fixture(scope="module")
def reference():
    return seeded_reference(TINY)


@pytest.fixture(scope="module")
def server(reference, tmp_path_factory):
    folder = tmp_path_factory.mktemp("minimax-h3")
    reference.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **{k: getattr(TINY, k) for k in TILING_FIELDS}}))
    vae = models.load_vae(folder)
    assert vae.config == TINY and vae.has_encoder
    with thread_server(vae, max_batch=1, max_frames=40, max_height=64, max_width=64, max_body_bytes=2**18,
                       max_reading_bytes=2**20) as server:
        yield server


def _pipeline_uint8(reference, x: np.ndarray) -> np.ndarray:
    """diffusers' tiled decode of ``x`` denormalised, as uint8 ``(B, F, H, W, 3)`` from [0, 1]."""
    mean, std = (torch.tensor(v).reshape(1, -1, 1, 1, 1) for v in (TINY.latents_mean, TINY.latents_std))
    with torch.no_grad():
        frames = reference.decode(torch.from_numpy(x) * std + mean).sample.numpy().astype(np.float64)
    unit = frames * np.reshape(IMAGENET_STD, (1, 3, 1, 1, 1)) + np.reshape(IMAGENET_MEAN, (1, 3, 1, 1, 1))
    return np.round(np.clip(unit, 0, 1) * 255).transpose(0, 2, 3, 4, 1)


def test_models_describe_its_frames(server):
    """Its frame rule is the chunks' (17n + 5 frames for 5n + 2 latent frames), not 1 + 4(T − 1):
    40 frames serve 12 latent frames (39 frames), where 1 + 4(T − 1) would say 10."""
    info = httpx.get(server.url + "/v1/models").json()["data"][0]
    assert info["config"]["_class_name"] == "AutoencoderKLMiniMaxH3" and info["encodes"] is True
    assert info["latents"]["channels"] == 4 and info["latents"]["max_latent_frames"] == 12
    assert TINY.num_output_frames(12) == 39 and TINY.num_output_frames(13) == 43


def test_remote_decode_is_diffusers_tiled_decode(server, reference):
    """``remote_decode`` (``do_scaling``: denormalised with latents_mean/std) as uint8 ``pt``,
    ``npy`` from the service's client and its stream equal the pipeline's frames; without the
    denormalisation they do not (the control); an MP4 holds them, lossily."""
    from diffusers.utils.remote_utils import remote_decode

    x = latents(LATENT, seed=5)
    expected = _pipeline_uint8(reference, x)
    assert expected.shape == (1, 26, 24, 32, 3) and expected.std() > 20
    endpoint = server.url + "/v1/decode"
    frames = remote_decode(endpoint=endpoint, tensor=torch.from_numpy(x), output_type="pt", return_type="pt",
                           partial_postprocess=True)
    assert_uint8_frames_match(frames.numpy(), expected)
    assert_uint8_frames_match(decode(server.url, x, output_type="npy", do_scaling=True), expected)
    raw = decode(server.url, x, output_type="npy", do_scaling=False)
    assert np.abs(raw.astype(int) - expected).max() > 20
    # A stream sends a chunk at a time: the first chunk's 17 frames, then the last chunk's 4 with
    # the 5 it read ahead (and the padding's frames cut).
    chunks = list(decode_stream(server.url, x, do_scaling=True))
    assert [c.shape[1] for c in chunks] == [17, 9]
    assert_uint8_frames_match(np.concatenate(chunks, axis=1), expected)

    video = remote_decode(endpoint=endpoint, tensor=torch.from_numpy(x), output_type="mp4", return_type="mp4")
    assert isinstance(video, bytes) and video[4:8] == b"ftyp"
    gray = np.array([0.299, 0.587, 0.114])  # the noise-like frames of random weights lose their colour in H.264
    mp4 = read_mp4(video).astype(np.float64)
    assert mp4.shape == expected.shape[1:] and np.abs(mp4 @ gray - expected[0] @ gray).mean() < 5


def test_too_few_latent_frames_are_refused(server):
    """Two latent frames make no chunk of the released decode: 422 naming the rule, and the
    server keeps serving."""
    x = latents((1, 4, 2, 6, 8))
    r = httpx.post(server.url + "/v1/decode", content=x.tobytes(), timeout=60,
                   params={"shape": "1,4,2,6,8", "dtype": "float32", "output_type": "npy"},
                   headers={"Content-Type": "tensor/binary"})
    assert r.status_code == 422 and r.headers["content-type"] == PROBLEM, r.text
    assert (r.json()["expected"], r.json()["received"]) == ("T ≥ 3", 2)
    assert httpx.get(server.url + "/healthz").status_code == 200


def test_remote_encode_is_diffusers_tiled_encode(server, reference):
    """``remote_encode`` of 17 + 5 frames in [-1, 1]: the posterior mean of diffusers' tiled
    encode of the same frames in ImageNet space (7 latent frames)."""
    from diffusers.utils.remote_utils import remote_encode

    frames = np.random.default_rng(4).uniform(-1, 1, FRAMES).astype(np.float32)
    got = remote_encode(endpoint=server.url + "/v1/encode", image=torch.from_numpy(frames)).numpy()
    imagenet = ((frames + 1) / 2 - np.reshape(IMAGENET_MEAN, (1, 3, 1, 1, 1))) / np.reshape(IMAGENET_STD, (1, 3, 1, 1, 1))
    with torch.no_grad():
        want = reference.encode(torch.from_numpy(imagenet.astype(np.float32))).latent_dist.mode().numpy()
    assert got.shape == want.shape == (1, 4, 7, 6, 8) and want.std() > 0.05
    assert np.abs(got - want).max() <= ENCODE_TOLERANCE
    # The control: the frames taken as ImageNet-normalised already are another picture's latents.
    with torch.no_grad():
        unconverted = reference.encode(torch.from_numpy(frames)).latent_dist.mode().numpy()
    assert np.abs(got - unconverted).max() > 100 * ENCODE_TOLERANCE
