"""The sharded context alone: halo exchange and attention inside shard_map, against the whole frame.

Pure data movement, so the halo comparisons are bit-exact.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import sharding
from models.spatial import SingleDeviceContext, zero_pad_hw


def _bands(plan, mesh, fn, x, out_axis):
    """Run ``fn(ctx, band)`` on every band of ``x`` (split axis at ``plan.axis``); stack the outputs."""
    axis = x.ndim + plan.axis
    spec = [None] * x.ndim
    spec[axis] = sharding.TP_AXIS
    out_spec = [None] * x.ndim
    out_spec[out_axis] = sharding.TP_AXIS
    ctx = sharding.BandContext(plan)
    run = jax.shard_map(lambda band: fn(ctx, band), mesh=mesh, in_specs=P(*spec), out_specs=P(*out_spec),
                        check_vma=False)
    return np.asarray(jax.jit(run)(x))


@pytest.mark.parametrize("split, size, tp", [("height", 8, 4), ("height", 7, 4), ("width", 5, 3), ("height", 3, 8)])
def test_pad_hw_equals_zero_padding_of_the_whole_frame(split, size, tp):
    plan = sharding.plan_bands(size, size, tp, split)
    mesh = sharding.make_mesh(tp)
    shape = [2, 3, 6, 6, 5]
    axis = len(shape) + plan.axis
    shape[axis] = plan.padded * 2  # at upsampling scale 2
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    whole = x.copy()
    index = [slice(None)] * x.ndim
    index[axis] = slice(plan.size * 2, None)
    whole[tuple(index)] = 0.0  # padded rows are zero at every conv input
    expected_full = np.asarray(zero_pad_hw(jnp.asarray(whole)))
    got = _bands(plan, mesh, lambda ctx, band: ctx.pad_hw(band), x, axis)
    local = 2 * plan.band
    for rank in range(tp):
        window = [slice(None)] * x.ndim
        window[axis] = slice(rank * local, rank * local + local + 2)
        got_window = [slice(None)] * x.ndim
        got_window[axis] = slice(rank * (local + 2), (rank + 1) * (local + 2))
        np.testing.assert_array_equal(got[tuple(got_window)], expected_full[tuple(window)], err_msg=f"rank {rank}")


@pytest.mark.parametrize("split, size, tp", [("height", 8, 4), ("height", 5, 4), ("width", 7, 3)])
def test_attend_equals_whole_frame_attention(split, size, tp):
    plan = sharding.plan_bands(size, size, tp, split)
    mesh = sharding.make_mesh(tp)
    axis = 1 if split == "height" else 2
    shape = [3, size, size, 8]
    shape[axis] = plan.padded
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    spec = [None] * 4
    spec[axis] = sharding.TP_AXIS
    ctx = sharding.BandContext(plan, query_chunk=4)  # several query blocks per band
    run = jax.shard_map(ctx.attend, mesh=mesh, in_specs=(P(*spec),) * 3, out_specs=P(*spec), check_vma=False)
    got = np.asarray(jax.jit(run)(q, k, v))
    valid = [slice(None)] * 4
    valid[axis] = slice(0, size)
    valid = tuple(valid)
    expected = np.asarray(SingleDeviceContext().attend(q[valid], k[valid], v[valid]))
    np.testing.assert_allclose(got[valid], expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("split, size, tp", [("height", 8, 4), ("height", 5, 4), ("width", 7, 3)])
def test_pad_hw_after_equals_bottom_right_zero_padding_of_the_whole_frame(split, size, tp):
    """The encoder's stride-2 convs: each band gets only the next band's first row (zeros at the
    image's far edge and below padded rows), and one zero column/row on the other axis."""
    from models.spatial import zero_pad_hw_after

    plan = sharding.plan_bands(size, size, tp, split)
    mesh = sharding.make_mesh(tp)
    shape = [2, 3, 6, 6, 5]
    axis = len(shape) + plan.axis
    shape[axis] = plan.padded * 4  # at the encoder's scale 4 (after one downsampler)
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    whole = x.copy()
    index = [slice(None)] * x.ndim
    index[axis] = slice(plan.size * 4, None)
    whole[tuple(index)] = 0.0
    expected_full = np.asarray(zero_pad_hw_after(jnp.asarray(whole)))
    got = _bands(plan, mesh, lambda ctx, band: ctx.pad_hw_after(band), x, axis)
    local = 4 * plan.band
    for rank in range(tp):
        window = [slice(None)] * x.ndim
        window[axis] = slice(rank * local, rank * local + local + 1)
        got_window = [slice(None)] * x.ndim
        got_window[axis] = slice(rank * (local + 1), (rank + 1) * (local + 1))
        np.testing.assert_array_equal(got[tuple(got_window)], expected_full[tuple(window)], err_msg=f"rank {rank}")
