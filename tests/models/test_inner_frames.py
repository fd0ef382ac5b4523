"""Frame-level streaming inside a decode step (``inner_frames``): the same frames, less memory.

After each temporal upsampler the decoder's later stages run a few frames at a time in an inner
``lax.scan`` that carries their causal caches. Checked here: the scan helper equals the whole
stage (and carrying nothing does not: the negative control); streamed and whole-step decodes agree
to ≤ 1e-5 for Wan 2.1 and 2.2, frames and carried caches (two programs of the same sums grouped
otherwise, on the nine-tap conv path, whose temp memory the last test weighs), and a step that sees
another past does not; the streamed decode still matches diffusers' committed fixtures;
and the compiled step's temp memory (``memory_analysis()`` on CPU) falls ≥ 2.5x from four frames
per inner step to one. The sharded decode is checked in ``tests/sharding/test_sharded_inner_frames.py``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from tests.helpers.wan_reference import (
    ALL_CASES,
    PARITY_TOL,
    case_config,
    fixture_path,
    seeded_decoder_weights,
    write_diffusers_folder,
)
from vaeserve import models
from vaeserve.models.decode import step_program
from vaeserve.models.estimate import STREAM_MIN_FRAME_BYTES
from vaeserve.models.frame_groups import check_inner_frames, scan_frame_groups, stream_group
from vaeserve.models.layers import CausalConv3d
from vaeserve.models.spatial import SingleDeviceContext

# Two programs of the same frames (another grouping of the same sums: float32 rounding, which each
# CPU's kernels round their own way) agree to the promise of a sharded decode to a single-device one.
SAME_FRAMES = 1e-5
# Activation-dominated (tiny weights, 256x256 frames at 8 channels in the last stage). Wan 2.2 in
# small: residual up blocks, DupUp3D, 2x2 unpatchify, time doubled once (as in tests/sharding).
CONFIGS = {
    "wan21": (models.WanVAEConfig(base_dim=8, num_res_blocks=1), (1, 16, 2, 32, 32)),
    "wan22": (models.WanVAEConfig.wan22(base_dim=8, decoder_base_dim=8, num_res_blocks=1, dim_mult=(1, 2, 2),
                                        temperal_downsample=(False, True), scale_factor_spatial=8,
                                        scale_factor_temporal=2), (1, 48, 2, 16, 16)),
}


def _latents(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.fixture(scope="module")
def steps():
    """``steps(name, inner_frames)``: the compiled later decode step (float output) of each config,
    with the caches and latents it runs on; one compile per (config, inner_frames), shared."""
    cache = {}

    def get(name, inner_frames):
        config, shape = CONFIGS[name]
        if name not in cache:
            vae = models.init_vae(config)
            # Any past will do: random caches of the shapes latent frame 0 leaves (no compile needed).
            _, avals, _ = jax.eval_shape(_program(vae, None), vae.state_avals(), None, _aval(shape, 1))
            leaves, tree = jax.tree.flatten(avals)
            caches = jax.tree.unflatten(tree, [jnp.asarray(_latents(a.shape, seed=i)) for i, a in enumerate(leaves)])
            cache[name] = (vae, caches, _latents(shape)[:, :, 1:2])
        vae, caches, latents = cache[name]
        if (name, inner_frames) not in cache:
            program = jax.jit(_program(vae, inner_frames)).lower(vae.state_avals(), jax.eval_shape(lambda: caches),
                                                                 _aval(shape, 1))
            cache[name, inner_frames] = program.compile()
        return cache[name, inner_frames], vae, caches, latents

    return get


def _aval(shape, frames):
    return jax.ShapeDtypeStruct(shape[:2] + (frames,) + shape[3:], jnp.float32)


def _program(vae, inner_frames):
    """The later decode step on the nine-tap conv path (``SingleDeviceContext``'s default)."""
    return step_program(vae.graphdef, vae.config, jnp.float32, SingleDeviceContext, denormalize=False,
                        output="float", inner_frames=inner_frames)


# -- the scan over frame groups, alone ------------------------------------------------------------
def test_frame_groups_equal_the_whole_causal_conv():
    conv = CausalConv3d(4, 5, rngs=nnx.Rngs(0))
    ctx = SingleDeviceContext()
    x = jnp.asarray(_latents((1, 5, 6, 7, 4)))
    cache = jnp.asarray(_latents((1, 2, 8, 9, 4), seed=1))

    def stage(frames, carried):
        return conv(frames, carried, ctx)

    whole, whole_cache = stage(x, cache)
    for group in (1, 2, 3):  # 3: a scan of one group, then a shorter last group
        y, carried = jax.jit(lambda x, c, g=group: scan_frame_groups(stage, x, c, g))(x, cache)
        assert y.shape == whole.shape
        assert float(jnp.abs(y - whole).max()) <= SAME_FRAMES, group
        assert float(jnp.abs(carried - whole_cache).max()) == 0.0  # the last two padded input frames: copies

    # Negative control: groups that do not carry the caches forward (each sees the step's old
    # past) differ by far more than the tolerance.
    def forgetful(frames, carried):
        return stage(frames, cache)[0], carried

    y, _ = scan_frame_groups(forgetful, x, cache, 1)
    assert float(jnp.abs(y - whole).max()) > 1e-2


def test_group_size_rule():
    assert stream_group(None, STREAM_MIN_FRAME_BYTES) == 1  # large frames: one at a time
    assert stream_group(None, STREAM_MIN_FRAME_BYTES - 1) is None  # small ones: whole steps
    assert stream_group(3, 0) == 3 and stream_group(1, 10**12) == 1  # an explicit choice wins
    for bad in (0, -1, 1.5, True, "1"):
        with pytest.raises(ValueError, match="inner_frames"):
            check_inner_frames(bad)
    vae = models.abstract_vae(CONFIGS["wan21"][0])
    with pytest.raises(ValueError, match="inner_frames"):
        vae.compile((1, 16, 2, 4, 4), inner_frames=0)


# -- decode steps -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", CONFIGS)
def test_streamed_step_equals_the_whole_step(steps, name):
    config, shape = CONFIGS[name]
    whole, vae, caches, latents = steps(name, config.temporal_scale)  # all of the step's frames at once
    streamed = steps(name, 1)[0]
    (frames, new_caches, _), (expected, expected_caches, _) = streamed(vae.state, caches, latents), whole(vae.state, caches, latents)
    assert frames.shape == expected.shape == (1, 3, config.temporal_scale, *[s * config.spatial_scale for s in shape[3:]])
    assert float(jnp.abs(frames - expected).max()) <= SAME_FRAMES
    for got, want in zip(jax.tree.leaves(new_caches), jax.tree.leaves(expected_caches), strict=True):
        assert float(jnp.abs(got - want).max()) <= SAME_FRAMES  # each conv's last inputs: frames computed so far
    assert float(expected.std()) > 0.05  # frames with something in them to disagree about
    # Control: the same step after another past (zero caches) is caught by the same tolerance.
    forgot = streamed(vae.state, jax.tree.map(jnp.zeros_like, caches), latents)[0]
    assert float(jnp.abs(forgot - expected).max()) > 1e-2


def test_streamed_decode_matches_diffusers_fixture(tmp_path):
    """Wan 2.2 in small, time doubled in two stages (nested inner loops), T = 5, one frame per
    inner step (these frames are small: the automatic choice would not stream them)."""
    name, shape = "wan22_small", (1, 48, 5, 3, 3)
    config = case_config(name)
    vae = models.load_vae(write_diffusers_folder(tmp_path, config, seeded_decoder_weights(config, ALL_CASES[name][1])))
    fixture = load_file(str(fixture_path(name, shape)))
    frames = np.asarray(vae.decode(fixture["latents"], inner_frames=1))
    assert np.abs(frames - fixture["frames"]).max() <= PARITY_TOL


# -- memory -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", CONFIGS)
def test_one_frame_per_inner_step_holds_less_than_whole_steps(steps, name):
    config = CONFIGS[name][0]
    whole, one = steps(name, config.temporal_scale)[0].memory_analysis(), steps(name, 1)[0].memory_analysis()
    # The caches are the step's arguments and outputs, equal in both; temp is the activations.
    assert one.argument_size_in_bytes == whole.argument_size_in_bytes
    ratio = whole.temp_size_in_bytes / one.temp_size_in_bytes
    # Four frames per step after the temporal upsamplers (Wan 2.1); two in this small Wan 2.2, whose
    # latent-resolution stages and shortcuts weigh more. Measured with XLA:CPU of jax 0.10.2: 3.17x and
    # 1.38x; of jax 0.12.0.1: 2.54x and 1.09x (its one-frame program keeps more temp: 70.7 MB against
    # 51.4 MB for Wan 2.1). Without inner steps the two programs are the same one: 1.0x.
    assert ratio >= (2.3 if config.temporal_scale == 4 else 1.05), (name, ratio)
