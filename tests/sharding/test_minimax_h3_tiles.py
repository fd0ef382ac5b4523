"""MiniMax-H3's released decode with its tiles spread over the ``tp`` devices of a mesh
(``models/families/minimax_h3/parallel.py``) equals the single-device decode (≤ 1e-5), also when the
tiles do not divide evenly: one video of 3 latent frames (one chunk) at 4x14 latents of the tiny
config is 1x5 tiles, padded to 6 tiles on 2 and 3 devices and to 8 on 4. The control: a spread that
hands its tiles back one place out of order is far off. About 10 s on a 2-core host (four small
compiles, the conftest's 8 fake CPU devices)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vaeserve import models, sharding
from vaeserve.models.families.minimax_h3 import decode as h3
from vaeserve.models.families.minimax_h3.config import AutoencoderKLMiniMaxH3Config
from vaeserve.models.families.minimax_h3.geometry import frame_tiles
from vaeserve.models.families.minimax_h3.parallel import padded_count, spread_over
from vaeserve.sharding.mesh import TP_AXIS, make_mesh

TINY = AutoencoderKLMiniMaxH3Config.tiny()
LATENTS = (1, 3, 4, 14, TINY.z_dim)  # (B, T, h, w, z), channels-last: 1 chunk of 1x5 tiles


@pytest.fixture(scope="module")
def vae():
    return models.init_vae(TINY, seed=0, encoder=False)


def _decode(vae, latents, wrap) -> np.ndarray:
    """The decode as one program, the weights its argument; ``wrap(decoder)`` the tiles' runner."""

    def run(state, z):
        return h3.decode(wrap(nnx.merge(vae.graphdef, state)), z, TINY)

    return np.asarray(jax.jit(run)(vae.state, latents))


@pytest.fixture(scope="module")
def single(vae):
    latents = jnp.asarray(np.random.default_rng(5).standard_normal(LATENTS), jnp.float32)
    rows, columns = frame_tiles(4 * TINY.spatial_scale, 14 * TINY.spatial_scale, TINY)
    assert (len(rows.starts), len(columns.starts), TINY.decode_chunks(3)) == (1, 5, 1)
    return latents, _decode(vae, latents, lambda decoder: decoder)


@pytest.mark.parametrize("devices", [2, 3, 4])
def test_tiles_over_devices_equal_one_device(vae, single, devices):
    latents, expected = single
    mesh = make_mesh(devices, devices=jax.devices()[:devices])
    assert padded_count(5, devices) > 5  # uneven: padded
    got = _decode(vae, latents, lambda decoder: spread_over(decoder, mesh, TP_AXIS))
    assert got.shape == expected.shape and expected.std() > 0.1
    assert float(np.abs(got - expected).max()) <= 1e-5


def test_control_tiles_out_of_order_differ(vae, single):
    latents, expected = single
    mesh = make_mesh(2, devices=jax.devices()[:2])
    got = _decode(vae, latents, lambda decoder: spread_over(lambda b: jnp.roll(decoder(b), 1, axis=0), mesh, TP_AXIS))
    assert float(np.abs(got - expected).max()) > 1e-2


def test_served_programs_over_a_mesh_equal_one_device():
    """The programs a server runs (``sharding.compile_decode``/``compile_encode``, which build the
    family's own: ``models/families/minimax_h3/programs.py``) on a dp = 2 x tp = 2 mesh: two videos
    of 1x3 tiles (6 tiles over 4 devices: uneven) decode, and their first frames encode, as ``VAE.decode``
    and ``VAE.encode`` do on one device (≤ 1e-5). About 15 s (four small compiles)."""
    vae = models.init_vae(TINY, seed=1)
    mesh = make_mesh(2, 2)
    x = np.random.default_rng(7).standard_normal((2, TINY.z_dim, 3, 4, 10)).astype(np.float32)
    expected = np.asarray(vae.decode(x))
    assert expected.shape == (2, 3, 9, 16, 40) and expected.std() > 0.1
    assert float(np.abs(np.asarray(sharding.sharded_decode(vae, x, mesh)) - expected).max()) <= 1e-5
    frames = np.clip(expected[:, :, :1], -1, 1)  # one frame each: the encoder's smallest program
    latents = np.asarray(vae.encode(frames))
    assert latents.shape == (2, TINY.z_dim, 1, 4, 10) and latents.std() > 0.05
    assert float(np.abs(np.asarray(sharding.sharded_encode(vae, frames, mesh)) - latents).max()) <= 1e-5
