"""Random weights kept on disk (``kept_random_vae``, what ``embedded_vae(weights_cache=...)`` uses):
read back they are the weights a fresh draw gives, bit for bit, in either dtype; a folder holding
another config's weights, or one that cannot be written, never gives wrong weights."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from vaeserve import models
from vaeserve.models import loading
from vaeserve.models.loading import WEIGHTS_NAME, iter_diffusers_tensors, kept_random_vae

CONFIG = models.WanVAEConfig(base_dim=8, num_res_blocks=1)
SEED = 3


def weights(vae) -> dict[str, np.ndarray]:
    return {name: np.asarray(value, np.float32) for name, value in iter_diffusers_tensors(vae)}


def same_weights(a, b) -> bool:
    wa, wb = weights(a), weights(b)
    return wa.keys() == wb.keys() and all(np.array_equal(wa[k], wb[k]) for k in wa)


@pytest.fixture(scope="module")
def drawn():
    return models.init_vae(CONFIG, seed=SEED)


def test_drawn_once_then_read_back(drawn, tmp_path, monkeypatch):
    folder = tmp_path / "tiny-random-weights-seed3"
    first = kept_random_vae(CONFIG, folder, seed=SEED, metadata={"name": "tiny"})
    assert sorted(p.name for p in tmp_path.iterdir()) == [folder.name]  # no staging folder left behind
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", WEIGHTS_NAME]
    assert same_weights(first, drawn) and first.has_encoder

    def no_drawing(*args, **kwargs):
        raise AssertionError("the kept weights should have been read, not drawn")

    monkeypatch.setattr(loading, "init_vae", no_drawing)
    again = kept_random_vae(CONFIG, folder, seed=SEED, metadata={"name": "tiny"})
    assert same_weights(again, drawn) and again.has_encoder
    assert again.metadata["random_weights"] is True and again.metadata["name"] == "tiny"
    half = kept_random_vae(CONFIG, folder, seed=SEED, dtype="bfloat16")
    assert same_weights(half, models.init_vae(CONFIG, seed=SEED, dtype="bfloat16"))


def test_a_folder_of_another_config_is_drawn_again(drawn, tmp_path, caplog):
    folder = tmp_path / "kept"
    other = models.WanVAEConfig(base_dim=8, num_res_blocks=2)  # more tensors than CONFIG's
    kept_random_vae(other, folder, seed=SEED)
    assert not same_weights(models.load_vae(folder), drawn)
    with caplog.at_level(logging.WARNING, logger="vaeserve.models"):
        vae = kept_random_vae(CONFIG, folder, seed=SEED)
    assert "another config" in caplog.text
    assert same_weights(vae, drawn)
    assert json.loads((folder / "config.json").read_text()) == CONFIG.to_dict()


def test_unreadable_weights_are_drawn_again(drawn, tmp_path):
    folder = tmp_path / "kept"
    kept_random_vae(CONFIG, folder, seed=SEED)
    (folder / WEIGHTS_NAME).write_bytes(b"not safetensors")
    assert same_weights(kept_random_vae(CONFIG, folder, seed=SEED), drawn)
    assert same_weights(models.load_vae(folder), drawn)  # and kept again


def test_a_folder_that_cannot_be_written_still_gives_the_weights(drawn, tmp_path, caplog):
    (tmp_path / "a-file").write_text("")
    with caplog.at_level(logging.WARNING, logger="vaeserve.models"):
        vae = kept_random_vae(CONFIG, tmp_path / "a-file" / "kept", seed=SEED)
    assert "cannot keep random weights" in caplog.text
    assert same_weights(vae, drawn)


@pytest.mark.parametrize("config", [CONFIG, models.WanVAEConfig.wan22()], ids=["tiny-2.1", "wan2.2"])
def test_abstract_module_is_the_module_without_values(config):
    """What loading and drawing build on: the module's graph, names, shapes and dtypes, as
    ``nnx.eval_shape`` with a real ``nnx.Rngs`` gives them (the fixed key only skips its counter)."""
    import jax.numpy as jnp
    from flax import nnx

    from vaeserve.models.families.wan.decoder import WanDecoder
    from vaeserve.models.families.wan.encoder import WanEncoder
    from vaeserve.models.vae import abstract_module

    def layout(module):
        graphdef, state = nnx.split(module)
        return graphdef, [(path, var.shape, var.dtype) for path, var in nnx.to_flat_state(state)]

    for module_type in (WanDecoder, WanEncoder):
        for dtype in (jnp.float32, jnp.bfloat16):
            ours = layout(abstract_module(module_type, config, dtype))
            reference = layout(nnx.eval_shape(lambda: module_type(config, rngs=nnx.Rngs(0), dtype=dtype)))  # noqa: B023
            assert ours == reference and len(ours[1]) > 10
