"""The noise an LTX decode draws: what resnets inject has the learned per-channel scale, a seed gives
one answer, and ``noise_scale`` mixes noise into the latents as the pipelines do (LTX-2's before
its latents are denormalized). The parity tests run with the noise scales at 0 (diffusers' init)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.helpers.ltx_reference import LTX090, LTX095, LTX2_SHARD, seeded_weights
from tests.helpers.wan_reference import seeded_latents, write_diffusers_folder
from vaeserve import models
from vaeserve.models.decode import decode_conditions
from vaeserve.models.families.ltx.layers import INJECTED_NOISE, LATENT_NOISE, Resnet, Step
from vaeserve.models.spatial import SingleDeviceContext, frame_normal

SHAPE = (2, 8, 2, 3, 2)


def test_injected_noise_has_the_learned_per_channel_scale():
    """A resnet whose second conv's noise scale is ``s`` (the first's 0): its output moves by
    ``noise · s[c]``, one standard normal map per row over the frame, the same in every frame and
    channel, drawn from the row's key for that resnet."""
    width, index = 4, 3
    resnet = Resnet(width, width, causal=True, edge="zero", scale=1, eps=1e-6, noise=True, noise_index=index,
                    rngs=nnx.Rngs(0))
    scale = jnp.asarray([0.5, -1.0, 2.0, 0.25])
    x = jax.random.normal(jax.random.key(1), (2, 3, 16, 16, width))
    keys = jnp.stack([jax.random.PRNGKey(7), jax.random.PRNGKey(8)])

    def weights(scale2):
        resnet.per_channel_scale2[...] = scale2
        return nnx.split(nnx.clone(resnet))

    graphdef, scaled = weights(scale)
    _, unscaled = weights(jnp.zeros(width))

    @jax.jit
    def run(state, noise_keys):
        return nnx.merge(graphdef, state)(x, None, SingleDeviceContext(), Step(True, 3), noise_keys=noise_keys)[0]

    quiet, noisy = run(scaled, None), run(scaled, keys)
    noise = (noisy - quiet) / scale  # (B, T, H, W, C): one map per row
    assert float(jnp.abs(noise - noise[:, :1, :, :, :1]).max()) <= 1e-5
    layer_keys = jax.vmap(lambda k: jax.random.fold_in(jax.random.fold_in(k, INJECTED_NOISE), 2 * index + 1))(keys)
    expected = frame_normal(layer_keys, (16, 16, 1))
    assert float(jnp.abs(noise[:, 0] - expected).max()) <= 1e-5
    assert 0.8 < float(noise[:, 0].std()) < 1.2 and float(jnp.abs(noise[0, 0] - noise[1, 0]).max()) > 1
    # Control: the scale is what moves it (no scale, no noise).
    assert float(jnp.abs(run(unscaled, keys) - quiet).max()) == 0


@pytest.fixture(scope="module")
def noisy(tmp_path_factory):
    """The sharding tests' model (LTX-2.0's decoder, timestep-conditioned, injecting noise in one up
    block) with nonzero noise scales and the checkpoint's latents statistics."""
    weights = seeded_weights(LTX2_SHARD, 31, encoder=False)
    rng = np.random.default_rng(5)
    for name in weights:
        if "per_channel_scale" in name:
            weights[name] = (0.5 * rng.standard_normal(weights[name].shape)).astype(np.float32)
    return models.load_vae(write_diffusers_folder(tmp_path_factory.mktemp("noisy"), LTX2_SHARD, weights))


def test_a_seed_gives_one_answer(noisy):
    latents = seeded_latents(SHAPE, 3)
    first = np.asarray(noisy.decode(latents, timestep=0.05, seed=11))
    assert np.array_equal(first, np.asarray(noisy.decode(latents, timestep=0.05, seed=11)))
    assert np.abs(first - np.asarray(noisy.decode(latents, timestep=0.05, seed=12))).max() > 1e-2


def test_noise_scale_mixes_noise_into_the_latents(noisy):
    """``(1 − s)·z + s·n`` with latent frame ``t``'s noise from ``fold_in(key, t)``; LTX-2 pipelines mix
    before denormalizing, so in the decoder's terms ``n`` is noise · std + mean. The decode with
    ``noise_scale`` equals the decode (same seed: the same injected noise) of latents mixed by hand."""
    latents, s, seed = seeded_latents(SHAPE, 4), 0.3, 9
    key = jnp.asarray(np.tile(decode_conditions(noisy.config, 1, seed=seed).keys, (SHAPE[0], 1)))
    noise = jnp.stack([frame_normal(jax.vmap(lambda k, t=t: jax.random.fold_in(jax.random.fold_in(k, LATENT_NOISE), t))(key),
                                    (SHAPE[3], SHAPE[4], SHAPE[1])) for t in range(SHAPE[2])], axis=1)  # (B, T, H, W, C)
    std, mean = np.asarray(noisy.config.latents_std), np.asarray(noisy.config.latents_mean)
    assert np.abs(mean).max() > 0.05 and np.abs(std - 1).max() > 0.05  # statistics to see
    noise = np.moveaxis(np.asarray(noise) * std + mean, -1, 1)
    by_hand = (1 - s) * latents + s * noise
    mixed = np.asarray(noisy.decode(latents, timestep=0.05, noise_scale=s, seed=seed))
    assert np.abs(mixed - np.asarray(noisy.decode(by_hand, timestep=0.05, noise_scale=0.0, seed=seed))).max() <= 1e-5
    assert np.abs(mixed - np.asarray(noisy.decode(latents, timestep=0.05, seed=seed))).max() > 1e-2


def test_decoders_without_conditions_refuse_them():
    assert decode_conditions(LTX090, 2) is None
    with pytest.raises(ValueError, match="takes no timestep"):
        decode_conditions(LTX090, 2, timestep=0.05)
    with pytest.raises(ValueError, match="takes no timestep"):
        decode_conditions(models.WanVAEConfig(), 1, seed=1)
    with pytest.raises(ValueError, match="noise_scale"):
        decode_conditions(LTX2_SHARD, 1, noise_scale=1.5)
    with pytest.raises(ValueError, match=r"timestep must be a finite number in \[0.0, 1.0\]"):
        decode_conditions(LTX2_SHARD, 1, timestep=1.5)
    noise_only = dataclasses.replace(LTX095, timestep_conditioning=False)  # injects noise, takes a seed only
    for name in ("timestep", "noise_scale"):
        with pytest.raises(ValueError, match=f"not timestep-conditioned; received {name}"):
            decode_conditions(noise_only, 1, **{name: 0.05})
    assert decode_conditions(noise_only, 1, seed=3).keys.tolist() == [[0, 3]]
    conditions = decode_conditions(LTX2_SHARD, 3, seed=4, defaults={"decode_timestep": 0.025})
    assert conditions is not None and np.all(conditions.timestep == np.float32(0.025))
    assert np.all(conditions.noise_scale == 0) and conditions.keys.shape == (3, 2)
