"""MiniMax-H3's VAE (``models/families/minimax_h3/``) against diffusers' ``AutoencoderKLMiniMaxH3``,
float32, at a tiny config whose tiles are shrunk to 16 pixels with 4 of overlap (diffusers'
``enable_tiling(16, 16, 4, 4)``), so the released geometry's every rule runs at small shapes.

The decode (tiling on, as released) of 2 videos of 8 latent frames at 6x8 latents (24x32 pixels:
2x3 tiles with widened overlaps; 2 temporal chunks, the last latent frame repeated and its frames
cut off) must match to ≤ 1e-4 (measured ≤ 1e-6); its controls, a hard cut instead of the tiles'
blends and the untiled decode (each chunk's whole frame one attention: RoPE over the frame, not
the tile), must miss by far more. The encode (tiled) of one frame and of 17·1 + 5 frames matches
too, and a server's tile settings (``--tile-size``, ``--tile-overlap``) give diffusers' decode at
that geometry. The model is loaded from diffusers' ``save_pretrained`` folder. diffusers runs live
(skipped without it). About 50 s for the file on a 2-core host that other work shared (load 9), most
of it compiling.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.helpers.minimax_h3_reference import seeded_reference
from vaeserve import models
from vaeserve.models.families.minimax_h3 import decode as h3
from vaeserve.models.families.minimax_h3.config import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    TILING_FIELDS,
    AutoencoderKLMiniMaxH3Config,
)
from vaeserve.models.families.minimax_h3.geometry import Tiles, split_tiles
from vaeserve.models.loading import WeightsError, build_vae
from vaeserve.service.engine.errors import StartupRefused
from vaeserve.service.engine.startup import set_tiling
from vaeserve.service.settings import Settings

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

TOLERANCE = 1e-4
TINY = AutoencoderKLMiniMaxH3Config.tiny()
TILES = {name: getattr(TINY, name) for name in TILING_FIELDS}
LATENTS = (2, TINY.z_dim, 8, 6, 8)  # (B, z, T, h, w): 2 chunks, 2x3 tiles of 16 px over 24x32
ENCODES = [(1, 3, 1, 24, 32), (1, 3, 22, 24, 32)]  # one frame; 17·1 + 5 frames


@pytest.fixture(scope="module")
def reference():
    return seeded_reference(TINY)


@pytest.fixture(scope="module")
def folder(reference, tmp_path_factory):
    path = tmp_path_factory.mktemp("minimax-h3")
    reference.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def loaded(folder):
    return models.load_vae(folder)


def _ncthw(x) -> np.ndarray:
    return np.asarray(x).transpose(0, 4, 1, 2, 3)


def _nthwc(x) -> jax.Array:
    return jnp.asarray(np.asarray(x).transpose(0, 2, 3, 4, 1))


def _decode(vae, latents: np.ndarray, *, per_step: int | None = None, tiled: bool = True) -> np.ndarray:
    decoder = nnx.merge(vae.graphdef, vae.state)
    run = decoder if per_step is None else h3.in_steps(decoder, per_step)
    return _ncthw(jax.jit(lambda z: h3.decode(run, z, TINY, tiled=tiled))(_nthwc(latents)))


def _encode(vae, frames: np.ndarray) -> np.ndarray:
    encoder = nnx.merge(vae.encoder_graphdef, vae.encoder_state)
    return _ncthw(jax.jit(lambda x: h3.encode(encoder, x, TINY))(_nthwc(frames)))


def _diff(a, b) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


def _seeded(shape, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_loads_save_pretrained_folder(reference, folder, loaded):
    assert dataclasses.replace(loaded.config, **TILES) == TINY  # config.json holds no tiles: the release's
    assert loaded.config.tile_sample_min_height == 256 and loaded.has_encoder
    assert loaded.metadata["parameters"] + loaded.metadata["encoder_parameters"] == \
        sum(p.numel() for p in reference.parameters())
    # The control: a checkpoint missing one tensor is refused, naming it.
    tensors = dict(models.loading._read_safetensors([folder / models.loading.WEIGHTS_NAME]))
    del tensors["decoder.transformer_blocks.1.attn.to_k.weight"]
    with pytest.raises(WeightsError, match=r"transformer_blocks\.1\.attn\.to_k\.weight"):
        build_vae(loaded.config, tensors, dtype="float32", metadata={})


def test_pixels_are_imagenet_normalised():
    """Eager, no compile: the decoder's ImageNet space ↔ [0, 1], and the clamp."""
    frames = np.random.default_rng(6).uniform(0, 1, (2, 3, 4, 4, 3)).astype(np.float32)
    assert _diff(h3.to_unit_range(h3.from_unit_range(frames)), frames) <= 1e-6
    white = h3.from_unit_range(np.ones(3, np.float32))
    assert _diff(white, (1 - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])) <= 1e-6
    assert _diff(h3.to_unit_range(white + 1), np.ones(3)) == 0  # the control: clamped, not 1 + std


def test_tile_and_chunk_geometry_is_diffusers():
    """Pure arithmetic, no compile: the tiles of the released geometry and the chunk counts."""
    released = AutoencoderKLMiniMaxH3Config()
    model = diffusers.AutoencoderKLMiniMaxH3.__new__(diffusers.AutoencoderKLMiniMaxH3)
    model.spatial_compression_ratio = 16
    for length in (16, 256, 272, 720, 768, 1280, 1344, 1920):
        starts, sizes, overlaps = model._split_tiles(length, 256, 64)
        tiles = split_tiles(length, 256, 64, 16)
        assert (list(tiles.starts), [tiles.size] * len(tiles.starts), list(tiles.overlaps)) == (starts, sizes, overlaps)
    assert split_tiles(768, 256, 64, 16) == Tiles((0, 160, 336, 512), 256, (96, 80, 80))  # widened
    assert [released.num_output_frames(5 * n + 2) for n in (1, 2, 12)] == [22, 39, 209]
    assert [released.encoded_latent_frames(17 * n + 5) for n in (1, 2, 12)] == [7, 12, 62]
    assert released.decode_chunks(53) == 11 and released.padding_latent_frames(53) == 4


def test_decode_matches_diffusers_tiled(reference, loaded, monkeypatch):
    latents = _seeded(LATENTS, 1)
    with torch.no_grad():
        expected = reference.decode(torch.from_numpy(latents)).sample.numpy()
    assert expected.shape == (2, 3, TINY.num_output_frames(8), 24, 32) and expected.std() > 0.1
    assert _diff(_decode(loaded, latents), expected) <= TOLERANCE
    # The controls: a hard cut where the tiles and chunks blend, and one attention over the frame.
    monkeypatch.setattr(h3, "blend", lambda a, b, extent, axis: b)
    assert _diff(_decode(loaded, latents), expected) > 100 * TOLERANCE
    monkeypatch.undo()
    assert _diff(_decode(loaded, latents, tiled=False), expected) > 100 * TOLERANCE


def test_untiled_decode_matches_diffusers_without_tiling(reference, loaded):
    latents = _seeded(LATENTS, 2)
    reference.disable_tiling()
    try:
        with torch.no_grad():
            expected = reference.decode(torch.from_numpy(latents)).sample.numpy()
    finally:
        reference.enable_tiling()
    assert _diff(_decode(loaded, latents, tiled=False), expected) <= TOLERANCE


@pytest.mark.parametrize("shape", ENCODES, ids=["1-frame", "22-frames"])
def test_encode_matches_diffusers_tiled(reference, loaded, shape):
    frames = _seeded(shape, 3)
    with torch.no_grad():
        expected = reference.encode(torch.from_numpy(frames)).latent_dist.parameters.numpy()
    assert expected.shape[2] == TINY.encoded_latent_frames(shape[2]) and expected.shape[3:] == (6, 8)
    assert _diff(_encode(loaded, frames), expected) <= TOLERANCE


def test_tiles_run_in_steps_alike(loaded):
    """``in_steps`` (a memory bound: the tiles in groups) changes nothing but the grouping."""
    latents = _seeded((1, *LATENTS[1:]), 4)
    whole, grouped = _decode(loaded, latents), _decode(loaded, latents, per_step=5)
    assert _diff(whole, grouped) <= 1e-6 and math.isfinite(float(whole.std()))


def test_served_tiles_are_the_settings_and_diffusers_at_them(reference, folder):
    """``--tile-size 12 --tile-overlap 8`` (``set_tiling``, as a server starts) reaches the model's
    programs: its decode is diffusers' ``enable_tiling(12, 12, 8, 8)`` (4x4 tiles over 24x32), not
    the default tiles' picture (the control); a geometry the decode cannot run, or another one for a
    model that has compiled programs already, refuses to start."""
    vae = models.load_vae(folder)  # its own programs: the module's ``loaded`` keeps the released tiles
    set_tiling(vae, Settings(tile_size=12, tile_overlap=8, tiles_per_step=3))
    assert (vae.config.tile_sample_min_width, vae.config.tile_sample_min_overlap_height, vae.config.tiles_per_step) \
        == (12, 8, 3)
    latents = _seeded((1, *LATENTS[1:]), 5)
    reference.enable_tiling(12, 12, 8, 8)
    try:
        with torch.no_grad():
            expected = reference.decode(torch.from_numpy(latents)).sample.numpy()
    finally:
        reference.enable_tiling(*TILES.values())
    served = np.asarray(vae.decode(latents))  # [-1, 1]: ImageNet space taken to [0, 1], clamped
    mean, std = (np.asarray(v, np.float32)[:, None, None, None] for v in (IMAGENET_MEAN, IMAGENET_STD))
    assert _diff(served, 2 * np.clip(expected * std + mean, 0, 1) - 1) <= 2 * TOLERANCE
    released = 2 * np.clip(_decode(vae, latents) * std + mean, 0, 1) - 1  # TINY's tiles, the same weights
    assert _diff(served, released) > 100 * TOLERANCE
    with pytest.raises(StartupRefused, match="tile 10 with overlap 8; expected multiples of 4"):
        set_tiling(models.load_vae(folder), Settings(tile_size=10, tile_overlap=8))
    with pytest.raises(StartupRefused, match="compiled programs of its own tiles"):
        set_tiling(vae, Settings(tile_size=20))
