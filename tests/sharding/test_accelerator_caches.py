"""The accelerators' causal caches, run on this CPU: native XLA convolutions at tp = 2, whose caches
are built window-free and travel between steps flattened (``models.conv.next_cache``,
``stored_cache``), as on a TPU or GPU that trades halos. A CPU mesh takes its own path (nine-tap
matmuls, caches kept as frames), so here the accelerators' path is forced (``VAE.conv_path``)
and checked against the single-device decode: float32, max abs ≤ 1e-5, within one program (the
scan's carry) and across stream steps (caches returned sharded, ``cache_spec``). The control: the
same decode restoring a flattened cache in the wrong order fails it.
"""

import numpy as np
import pytest

from tests.helpers.sharding_helpers import TINY, WIDTH, make_latents
from vaeserve import models, sharding
from vaeserve.models import conv, layers
from vaeserve.models.conv import ConvPath

SHAPE = (1, 3, 8, WIDTH)  # latent frame 0, then two more: the caches carry across steps
TOLERANCE = 1e-5


@pytest.fixture
def native(monkeypatch):
    """A fresh model (its own program cache: these programs must not serve the CPU path's tests)
    whose sharded programs take the accelerators' path."""
    vae = models.init_vae(models.WanVAEConfig(**TINY), seed=0)
    monkeypatch.setattr(vae, "conv_path", lambda platform: ConvPath(native_conv=True, rounded_conv_sums=False,
                                                                    onednn_conv=False))
    return vae


def _decode(vae) -> np.ndarray:
    return np.asarray(sharding.sharded_decode(vae, make_latents(*SHAPE), sharding.make_mesh(2), split="height"))


def test_flattened_caches_decode_exactly(native, reference, monkeypatch):
    flats: list[bool] = []

    def spy(frames, *, flat):  # the path really taken: caches flattened, not kept as frames
        flats.append(flat)
        return conv.stored_cache(frames, flat=flat)

    monkeypatch.setattr(layers, "stored_cache", spy)
    got = _decode(native)
    assert flats and all(flats)
    assert float(np.abs(got - reference(SHAPE)).max()) <= TOLERANCE
    steps = list(sharding.sharded_decode_stream(native, make_latents(*SHAPE), sharding.make_mesh(2), split="height",
                                                output="float"))
    assert [step.frames.shape[2] for step in steps] == [1, 4, 4]
    streamed = np.concatenate([step.frames for step in steps], axis=2)
    assert float(np.abs(streamed - reference(SHAPE)).max()) <= TOLERANCE


def test_a_cache_restored_in_the_wrong_order_fails(native, reference, monkeypatch):
    def misordered(cache, like):  # the flattened (W+2)·C read as C·(W+2)
        return cache.reshape(*cache.shape[:3], like.shape[4], like.shape[3]).swapaxes(-1, -2)

    monkeypatch.setattr(layers, "cache_frames", misordered)
    assert float(np.abs(_decode(native) - reference(SHAPE)).max()) > 1e-2
