"""The sharded context alone: halo exchange and attention inside shard_map, against the whole frame.

Pure data movement, so the halo comparisons are bit-exact.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from vaeserve import sharding
from vaeserve.models.spatial import SingleDeviceContext, zero_pad_hw


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


def _assert_bands_equal_padded_whole(plan, tp: int, pad_band, pad_whole, *, scale: int, extra: int, seed: int):
    """``pad_band`` on each band (rows at ``scale`` x the latent band) equals the matching window of
    ``pad_whole`` on the whole frame whose padded rows are zero; each band grows by ``extra`` rows."""
    shape = [2, 3, 6, 6, 5]
    axis = len(shape) + plan.axis
    shape[axis] = plan.padded * scale
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    whole = x.copy()
    index = [slice(None)] * x.ndim
    index[axis] = slice(plan.size * scale, None)
    whole[tuple(index)] = 0.0  # padded rows are zero at every conv input
    expected_full = np.asarray(pad_whole(jnp.asarray(whole)))
    got = _bands(plan, sharding.make_mesh(tp), pad_band, x, axis)
    local = scale * plan.band
    for rank in range(tp):
        window = [slice(None)] * x.ndim
        window[axis] = slice(rank * local, rank * local + local + extra)
        got_window = [slice(None)] * x.ndim
        got_window[axis] = slice(rank * (local + extra), (rank + 1) * (local + extra))
        np.testing.assert_array_equal(got[tuple(got_window)], expected_full[tuple(window)], err_msg=f"rank {rank}")


@pytest.mark.parametrize("split, size, tp", [("height", 8, 4), ("height", 7, 4), ("width", 5, 3), ("height", 3, 8)])
def test_pad_hw_equals_zero_padding_of_the_whole_frame(split, size, tp):
    plan = sharding.band_layout(size, size, tp, split)
    _assert_bands_equal_padded_whole(plan, tp, lambda ctx, band: ctx.pad_hw(band), zero_pad_hw,
                                     scale=2, extra=2, seed=0)  # at upsampling scale 2; a row above and below


@pytest.mark.parametrize("split, size, tp", [("height", 8, 4), ("height", 5, 4), ("width", 7, 3)])
def test_attend_equals_whole_frame_attention(split, size, tp):
    plan = sharding.band_layout(size, size, tp, split)
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
    np.testing.assert_allclose(got[valid], expected, atol=1e-5, rtol=0)  # sharded against single: the promise


@pytest.mark.parametrize("split, size, tp", [("height", 8, 4), ("height", 5, 4), ("width", 7, 3)])
def test_pad_hw_after_equals_bottom_right_zero_padding_of_the_whole_frame(split, size, tp):
    """The encoder's stride-2 convs: each band gets only the next band's first row (zeros at the
    image's far edge and below padded rows), and one zero column/row on the other axis."""
    from vaeserve.models.spatial import zero_pad_hw_after

    plan = sharding.band_layout(size, size, tp, split)
    _assert_bands_equal_padded_whole(plan, tp, lambda ctx, band: ctx.pad_hw_after(band), zero_pad_hw_after,
                                     scale=4, extra=1, seed=2)  # at the encoder's scale 4 (after one downsampler)


@pytest.mark.parametrize("split, size, tp", [("height", 7, 4), ("height", 34, 8), ("height", 22, 8), ("width", 5, 3)])
def test_pad_hw_reflect_equals_reflect_padding_of_the_whole_frame(split, size, tp):
    """LTX-2.0's reflect padding: every row a real output reads (the image's rows and one beyond each
    edge) is the whole frame's reflect padding — the top band reflects its own row 1, the last real
    row takes row R − 2 (in its band or its halo from above), never a padded row (uneven splits: 7 over
    4; 34 and 22 latent rows over 8, as 1088 and 704 pixel frames give; the last bands wholly padded)."""
    from vaeserve.models.spatial import reflect_pad_hw

    plan = sharding.band_layout(size, size, tp, split)
    scale = 2  # at upsampling scale 2
    shape = [2, 3, 6, 6, 5]
    axis = len(shape) + plan.axis
    shape[axis] = plan.padded * scale
    x = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    real = size * scale
    expected = np.asarray(reflect_pad_hw(jnp.asarray(np.take(x, np.arange(real), axis=axis))))
    got = _bands(plan, sharding.make_mesh(tp), lambda ctx, band: ctx.pad_hw(band, edge="reflect"), x, axis)
    local = scale * plan.band
    checked = 0
    for rank in range(tp):
        for row in range(local + 2):
            global_row = rank * local - 1 + row  # of banded row ``row``; expected holds rows −1 … R
            if -1 <= global_row <= real:
                np.testing.assert_array_equal(np.take(got, rank * (local + 2) + row, axis=axis),
                                              np.take(expected, global_row + 1, axis=axis),
                                              err_msg=f"rank {rank}, row {global_row}")
                checked += 1
    assert checked >= real + 2
