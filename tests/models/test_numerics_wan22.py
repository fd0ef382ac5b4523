"""Wan 2.2's data-movement functions against NumPy transcriptions of diffusers' torch code."""

import jax.numpy as jnp
import numpy as np
import pytest

from vaeserve.models.layers import average_down, duplicate_up, patchify, unpatchify

RNG = np.random.default_rng(0)


def _diffusers_dup_up(x, cout, factor_t, factor_s, first_chunk):
    """diffusers' DupUp3D.forward on NCTHW, step by step (repeat_interleave, view, permute, view)."""
    b, c, t, h, w = x.shape
    repeats = cout * factor_t * factor_s * factor_s // c
    x = np.repeat(x, repeats, axis=1)
    x = x.reshape(b, cout, factor_t, factor_s, factor_s, t, h, w).transpose(0, 1, 5, 2, 6, 3, 7, 4)
    x = x.reshape(b, cout, t * factor_t, h * factor_s, w * factor_s)
    return x[:, :, factor_t - 1:] if first_chunk else x


def _diffusers_unpatchify(x, p):
    b, cp, f, h, w = x.shape
    x = x.reshape(b, cp // (p * p), p, p, f, h, w).transpose(0, 1, 4, 5, 3, 6, 2)
    return x.reshape(b, cp // (p * p), f, h * p, w * p)


def _ncthw(x):
    return np.moveaxis(x, -1, 1)


@pytest.mark.parametrize("cin, cout, factor_t, first_chunk", [
    (8, 8, 2, False), (8, 8, 2, True), (8, 4, 2, True), (8, 4, 1, False), (6, 12, 2, False)])
def test_duplicate_up_is_diffusers_dup_up_3d(cin, cout, factor_t, first_chunk):
    x = RNG.standard_normal((2, 3, 4, 5, cin)).astype(np.float32)  # (B, T, H, W, C)
    got = np.asarray(duplicate_up(jnp.asarray(x), cout, factor_t=factor_t, factor_s=2, first_chunk=first_chunk))
    expected = _diffusers_dup_up(_ncthw(x), cout, factor_t, 2, first_chunk)
    assert np.array_equal(_ncthw(got), expected)
    assert got.shape == (2, 3 * factor_t - (factor_t - 1 if first_chunk else 0), 8, 10, cout)


def test_duplicate_up_refuses_channels_that_do_not_divide():
    with pytest.raises(ValueError, match="do not divide"):
        duplicate_up(jnp.zeros((1, 1, 1, 1, 24)), 16, factor_t=1, factor_s=2, first_chunk=False)


def test_unpatchify_puts_the_column_offset_first_and_inverts_patchify():
    x = RNG.standard_normal((2, 3, 4, 5, 12)).astype(np.float32)
    got = np.asarray(unpatchify(jnp.asarray(x), 2))
    assert np.array_equal(_ncthw(got), _diffusers_unpatchify(_ncthw(x), 2))
    # channel c·4 + r·2 + q lands at (row 2h + q, column 2w + r)
    assert got[0, 0, 2 * 1 + 1, 2 * 3 + 0, 2] == x[0, 0, 1, 3, 2 * 4 + 0 * 2 + 1]
    assert np.array_equal(np.asarray(unpatchify(jnp.asarray(x), 1)), x)


def test_patchify_is_diffusers_patchify_and_inverts_unpatchify():
    frames = RNG.standard_normal((2, 3, 8, 10, 3)).astype(np.float32)  # (B, T, 2H, 2W, 3)
    got = np.asarray(patchify(jnp.asarray(frames), 2))
    b, c, f, hp, wp = _ncthw(frames).shape
    expected = _ncthw(frames).reshape(b, c, f, hp // 2, 2, wp // 2, 2).transpose(0, 1, 6, 4, 2, 3, 5)
    assert np.array_equal(_ncthw(got), expected.reshape(b, c * 4, f, hp // 2, wp // 2))
    assert np.array_equal(np.asarray(unpatchify(jnp.asarray(got), 2)), frames)


def _diffusers_avg_down(x, cout, factor_t, factor_s):
    """diffusers' AvgDown3D.forward on NCTHW, step by step (front time padding, view, permute, view, mean)."""
    pad_t = (factor_t - x.shape[2] % factor_t) % factor_t
    x = np.pad(x, ((0, 0), (0, 0), (pad_t, 0), (0, 0), (0, 0)))
    b, c, t, h, w = x.shape
    factor = factor_t * factor_s * factor_s
    x = x.reshape(b, c, t // factor_t, factor_t, h // factor_s, factor_s, w // factor_s, factor_s)
    x = x.transpose(0, 1, 3, 5, 7, 2, 4, 6).reshape(b, c * factor, t // factor_t, h // factor_s, w // factor_s)
    return x.reshape(b, cout, c * factor // cout, t // factor_t, h // factor_s, w // factor_s).mean(axis=2)


@pytest.mark.parametrize("cin, cout, factor_t, factor_s, frames", [
    (16, 16, 2, 2, 1), (16, 32, 2, 2, 4), (16, 32, 2, 2, 1), (32, 64, 1, 2, 3), (64, 64, 1, 1, 4), (12, 8, 2, 2, 5)],
    ids=["first-chunk", "widening-chunk", "widening-first-chunk", "space-only", "identity", "narrowing-odd-frames"])
def test_average_down_is_diffusers_avg_down_3d(cin, cout, factor_t, factor_s, frames):
    x = RNG.standard_normal((2, frames, 4, 6, cin)).astype(np.float32)  # (B, T, H, W, C)
    got = np.asarray(average_down(jnp.asarray(x), cout, factor_t=factor_t, factor_s=factor_s))
    expected = _diffusers_avg_down(_ncthw(x), cout, factor_t, factor_s)
    assert got.shape == (2, -(-frames // factor_t), 4 // factor_s, 6 // factor_s, cout)
    assert np.abs(_ncthw(got) - expected).max() <= 1e-5  # means of up to 8 values, summed in another order


def test_average_down_pads_the_first_chunk_in_front():
    """One frame, doubled width: output channel 2c averages the zero frame's sub-positions of input
    channel c (it is 0), 2c + 1 the real frame's 2x2 block."""
    x = RNG.standard_normal((1, 1, 2, 2, 3)).astype(np.float32)
    got = np.asarray(average_down(jnp.asarray(x), 6, factor_t=2, factor_s=2))
    assert np.array_equal(got[..., 0::2], np.zeros((1, 1, 1, 1, 3), np.float32))
    assert np.allclose(got[0, 0, 0, 0, 1::2], x[0, 0].mean(axis=(0, 1)), atol=1e-5, rtol=0)


def test_average_down_refuses_groups_that_do_not_divide():
    with pytest.raises(ValueError, match="must split into 48 groups"):
        average_down(jnp.zeros((1, 1, 2, 2, 20)), 48, factor_t=2, factor_s=2)
