"""The small pure functions the decoder is made of, each against a plain NumPy statement of it."""

import jax.numpy as jnp
import numpy as np
from jax import lax

from vaeserve.models.conv import (
    causal_conv3x3x3,
    conv2d_frames,
    downsample2x_conv2d_frames,
    interleave_time,
    rms_norm,
    time_downsample,
    upsample2x_conv2d_frames,
    upsample_nearest_2x,
)
from vaeserve.models.decode import nonfinite_count, to_uint8
from vaeserve.models.spatial import SingleDeviceContext, dot_product_attention

RNG = np.random.default_rng(0)


def test_to_uint8_rounds_and_clamps():
    x = jnp.asarray([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0, 1 / 127.5 - 1])
    assert to_uint8(x).tolist() == [0, 0, 64, 128, 191, 255, 255, 1]


def test_nonfinite_count_counts_nan_and_both_infinities_per_row():
    x = np.zeros((3, 2, 4), np.float32)
    x[0, 0, :3] = [np.nan, np.inf, -np.inf]
    x[2, 1, 3] = np.nan
    x[1] = np.finfo(np.float32).max  # finite, however large
    count = nonfinite_count(jnp.asarray(x))
    assert count.dtype == jnp.int32 and count.tolist() == [3, 0, 1]


def test_interleave_time_puts_first_half_channels_first():
    x = np.arange(2 * 3 * 1 * 1 * 4).reshape(2, 3, 1, 1, 4)  # (B, T, H, W, 2C) with C = 2
    y = np.asarray(interleave_time(jnp.asarray(x)))
    assert y.shape == (2, 6, 1, 1, 2)
    assert np.array_equal(y[:, 0::2], x[..., :2]) and np.array_equal(y[:, 1::2], x[..., 2:])


def test_upsample_nearest_repeats_pixels():
    x = RNG.standard_normal((1, 2, 3, 4, 5)).astype(np.float32)
    expected = x.repeat(2, axis=2).repeat(2, axis=3)
    assert np.array_equal(np.asarray(upsample_nearest_2x(jnp.asarray(x))), expected)


def test_rms_norm_is_l2_normalize_times_sqrt_c():
    x = RNG.standard_normal((2, 3, 6)).astype(np.float32)
    gamma = RNG.standard_normal(6).astype(np.float32)
    expected = x / np.linalg.norm(x, axis=-1, keepdims=True) * np.sqrt(6) * gamma
    assert np.abs(np.asarray(rms_norm(jnp.asarray(x), jnp.asarray(gamma))) - expected).max() < 1e-5
    assert np.array_equal(np.asarray(rms_norm(jnp.zeros((1, 4)), jnp.ones(4))), np.zeros((1, 4)))  # no NaN at 0


def _xla_conv(x, k, dims):
    return lax.conv_general_dilated(x, k, (1,) * (x.ndim - 2), "VALID", dimension_numbers=dims,
                                    precision=lax.Precision.HIGHEST)


def test_tap_matmul_conv_equals_xla_convolution_whole_and_in_row_blocks():
    x = jnp.asarray(RNG.standard_normal((2, 1, 23, 9, 5)).astype(np.float32))
    k = jnp.asarray(RNG.standard_normal((3, 3, 5, 4)).astype(np.float32))
    bias = jnp.asarray(RNG.standard_normal(4).astype(np.float32))
    expected = np.asarray(_xla_conv(x[:, 0], k, ("NHWC", "HWIO", "NHWC")) + bias)[:, None]
    whole = conv2d_frames(x, k, bias, native=False)
    blocked = conv2d_frames(x, k, bias, block_bytes=1, native=False)  # 3 row blocks of 7
    native = conv2d_frames(x, k, bias, native=True)  # the accelerator path, run here on CPU
    assert whole.shape == blocked.shape == native.shape == (2, 1, 21, 7, 4)
    assert np.abs(np.asarray(native) - expected).max() < 1e-6 * np.abs(expected).max() * 10
    assert np.abs(np.asarray(whole) - expected).max() < 1e-6 * np.abs(expected).max() * 10
    assert np.abs(np.asarray(blocked) - np.asarray(whole)).max() == 0  # same sums, blocked or not


def test_causal_conv_equals_conv3d_over_past_and_frames():
    past = jnp.asarray(RNG.standard_normal((1, 2, 19, 6, 3)).astype(np.float32))
    x = jnp.asarray(RNG.standard_normal((1, 4, 19, 6, 3)).astype(np.float32))
    k = jnp.asarray(RNG.standard_normal((3, 3, 3, 3, 2)).astype(np.float32))
    bias = jnp.zeros(2, jnp.float32)
    expected = np.asarray(_xla_conv(jnp.concatenate([past, x], 1), k, ("NDHWC", "DHWIO", "NDHWC")))
    # All frames at once; 2 frames per block (a frame fits); one frame in 8-row blocks.
    for block_bytes, native in ((2**30, False), (3 * 2 * 6 * (9 * 2 + 4 * 3) * 4 * 21, False), (1, False), (1, True)):
        got = np.asarray(causal_conv3x3x3(past, x, k, bias, block_bytes=block_bytes, native=native))
        assert got.shape == (1, 4, 17, 4, 2)
        assert np.abs(got - expected).max() < 1e-6 * np.abs(expected).max() * 10
    # One frame after its past (frame-level streaming's inner step), on both paths.
    for native in (False, True):
        got = np.asarray(causal_conv3x3x3(past, x[:, :1], k, bias, native=native))
        assert np.abs(got - expected[:, :1]).max() < 1e-6 * np.abs(expected).max() * 10


def _native_convs(x, k, bias, rounded):
    """Each native conv of ``x``, the kernel ``k`` (3-D, or its first time tap) and ``bias``."""
    return {"causal": causal_conv3x3x3(None, x, k, bias, native=True, rounded_sums=rounded),
            "2d": conv2d_frames(x, k[0], bias, native=True, rounded_sums=rounded),
            "up": upsample2x_conv2d_frames(x, k[0], bias, native=True, rounded_sums=rounded),
            "down": downsample2x_conv2d_frames(x[:, :, 1:, :], k[0], bias, native=True, rounded_sums=rounded)}


def test_rounded_sums_round_each_native_conv_once_more_in_bfloat16_only():
    """The GPU's native convs return bfloat16 sums and add the bias after: within one bfloat16
    rounding of the float32-sum path, yet not equal to it (the control: rounding is really
    asked for); float32 operands give the same bits either way."""
    x32 = RNG.standard_normal((1, 3, 10, 9, 16)).astype(np.float32)
    k32 = (RNG.standard_normal((3, 3, 3, 16, 8)) / 12).astype(np.float32)
    bias32 = RNG.standard_normal(8).astype(np.float32)
    for dtype in (jnp.bfloat16, jnp.float32):
        x, k, bias = (jnp.asarray(a, dtype) for a in (x32, k32, bias32))
        exact, rounded = _native_convs(x, k, bias, False), _native_convs(x, k, bias, True)
        for name in exact:
            want, got = np.asarray(exact[name], np.float32), np.asarray(rounded[name], np.float32)
            assert want.shape == got.shape, name
            if dtype == jnp.float32:
                assert np.array_equal(want, got), name
            else:
                step = np.abs(want) * 2.0**-7 + 2.0**-7  # two bfloat16 roundings, the bias's included
                assert np.all(np.abs(got - want) <= step), name
                assert np.abs(got - want).max() > 0, name


def test_weight_bound_convs_read_the_kernel_as_stored(monkeypatch):
    """A conv with a large kernel and few output pixels (a deep layer at a low resolution) runs as
    one im2col matmul against the kernel as stored: the same values as XLA's conv, and no folded
    copy of the kernel in the compiled program — which the nine-tap matmul makes on every call
    (the control: the same conv over more pixels)."""
    import jax

    import vaeserve.models.conv as conv

    monkeypatch.setattr(conv, "IM2COL_MIN_KERNEL_BYTES", 9 * 16 * 24 * 4)  # the test's kernels are "large"
    k = jnp.asarray(RNG.standard_normal((3, 3, 3, 16, 24)).astype(np.float32))
    bias = jnp.asarray(RNG.standard_normal(24).astype(np.float32))
    folded = "f32[48,216]"  # the nine-tap matmul's kernel: (3·C, 9·O)
    for frames, rows, weight_bound in ((1, 5, True), (2, 3, True), (4, 12, False)):
        past = jnp.asarray(RNG.standard_normal((1, 2, rows + 2, 6, 16)).astype(np.float32))
        x = jnp.asarray(RNG.standard_normal((1, frames, rows + 2, 6, 16)).astype(np.float32))
        assert conv.weight_bound(frames * rows * 4, k) is weight_bound
        expected = np.asarray(_xla_conv(jnp.concatenate([past, x], 1), k, ("NDHWC", "DHWIO", "NDHWC")) + bias)
        run = jax.jit(lambda p, x, k, b: causal_conv3x3x3(p, x, k, b, native=False))
        got = np.asarray(run(past, x, k, bias))
        assert np.abs(got - expected).max() < 1e-6 * np.abs(expected).max() * 10
        assert (folded in run.lower(past, x, k, bias).compile().as_text()) is not weight_bound
        # A conv of each frame (a 3x3 kernel) takes the same path.
        expected = np.asarray(_xla_conv(x[:, 0], k[1], ("NHWC", "HWIO", "NHWC")) + bias)[:, None]
        got = np.asarray(conv2d_frames(x[:, :1], k[1], bias, native=False))
        assert np.abs(got - expected).max() < 1e-6 * np.abs(expected).max() * 10


def test_attention_chunks_and_masks_exactly():
    q, k, v = (jnp.asarray(RNG.standard_normal((2, 10, 4)).astype(np.float32)) for _ in range(3))
    scores = np.einsum("nqc,nkc->nqk", q, k) / 2.0
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    expected = np.einsum("nqk,nkc->nqc", weights / weights.sum(-1, keepdims=True), v)
    assert np.abs(np.asarray(dot_product_attention(q, k, v)) - expected).max() < 1e-5
    assert np.abs(np.asarray(dot_product_attention(q, k, v, query_chunk=3)) - expected).max() < 1e-5
    # Masked keys are as if absent: the same as attending over the first 6 keys only.
    valid = jnp.arange(10) < 6
    masked = dot_product_attention(q, k, v, key_valid=valid)
    assert np.abs(np.asarray(masked) - np.asarray(dot_product_attention(q, k[:, :6], v[:, :6]))).max() < 1e-5


def test_single_device_context_zero_pads_and_attends_over_the_frame():
    ctx = SingleDeviceContext()
    x = jnp.ones((1, 2, 3, 4, 5))
    padded = np.asarray(ctx.pad_hw(x))
    assert padded.shape == (1, 2, 5, 6, 5) and padded.sum() == x.size
    q = jnp.asarray(RNG.standard_normal((1, 2, 3, 4)).astype(np.float32))
    flat = dot_product_attention(q.reshape(1, 6, 4), q.reshape(1, 6, 4), q.reshape(1, 6, 4))
    assert np.abs(np.asarray(ctx.attend(q, q, q)).reshape(1, 6, 4) - np.asarray(flat)).max() == 0
    after = np.asarray(ctx.pad_hw_after(x))  # the encoder's strided convs: bottom/right only
    assert after.shape == (1, 2, 4, 5, 5) and after[:, :, :3, :4].min() == 1 and after.sum() == x.size

def test_upsample_conv_from_low_resolution_equals_upsample_then_conv():
    """The phase decomposition (4/9 of the FLOPs, no upsampled activation) is the same function."""
    x = jnp.asarray(RNG.standard_normal((1, 2, 19, 7, 6)).astype(np.float32))
    k = jnp.asarray(RNG.standard_normal((3, 3, 6, 4)).astype(np.float32))
    bias = jnp.asarray(RNG.standard_normal(4).astype(np.float32))
    up = upsample_nearest_2x(x)
    expected = np.asarray(_xla_conv(jnp.pad(up[:, 0], ((0, 0), (1, 1), (1, 1), (0, 0))), k, ("NHWC", "HWIO", "NHWC")) + bias)
    padded = jnp.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1), (0, 0)))
    for block_bytes, native in ((2**30, False), (1, False), (2**30, True)):
        got = np.asarray(upsample2x_conv2d_frames(padded, k, bias, block_bytes=block_bytes, native=native))
        assert got.shape == (1, 2, 38, 14, 4)
        assert np.abs(got[:, 0] - expected).max() < 1e-5 * np.abs(expected).max()


def test_downsample_conv_equals_the_strided_xla_convolution():
    """Space-to-depth + 2x2 taps is diffusers' ZeroPad2d((0, 1, 0, 1)) + Conv2d(3, stride=2)."""
    x = jnp.asarray(RNG.standard_normal((2, 3, 22, 10, 5)).astype(np.float32))
    k = jnp.asarray(RNG.standard_normal((3, 3, 5, 4)).astype(np.float32))
    bias = jnp.asarray(RNG.standard_normal(4).astype(np.float32))
    padded = jnp.pad(x, ((0, 0), (0, 0), (0, 1), (0, 1), (0, 0)))
    expected = lax.conv_general_dilated(padded.reshape(6, 23, 11, 5), k, (2, 2), "VALID",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"), precision=lax.Precision.HIGHEST)
    expected = np.asarray(expected + bias).reshape(2, 3, 11, 5, 4)
    # Whole, in row blocks (block_bytes=1), and the accelerator path run here on CPU.
    for block_bytes, native in ((2**30, False), (1, False), (2**30, True)):
        got = np.asarray(downsample2x_conv2d_frames(padded, k, bias, block_bytes=block_bytes, native=native))
        assert got.shape == (2, 3, 11, 5, 4)
        assert np.abs(got - expected).max() < 1e-5 * np.abs(expected).max()
    # Negative control: the symmetric padding of an ordinary 3x3 conv is a different function.
    shifted = np.asarray(downsample2x_conv2d_frames(jnp.pad(x, ((0, 0), (0, 0), (1, 0), (1, 0), (0, 0))), k, bias,
                                                    native=False))
    assert np.abs(shifted - expected).max() > 0.1


def test_time_downsample_reads_frames_2t_to_2t_plus_2_of_past_and_chunk():
    past = RNG.standard_normal((1, 1, 2, 3, 4)).astype(np.float32)
    x = RNG.standard_normal((1, 4, 2, 3, 4)).astype(np.float32)
    k = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    bias = RNG.standard_normal(5).astype(np.float32)
    seq = np.concatenate([past, x], axis=1)
    expected = np.stack([sum(seq[:, 2 * t + i] @ k[i] for i in range(3)) + bias for t in range(2)], axis=1)
    got = np.asarray(time_downsample(jnp.asarray(past), jnp.asarray(x), jnp.asarray(k), jnp.asarray(bias)))
    assert got.shape == (1, 2, 2, 3, 5)
    assert np.abs(got - expected).max() < 1e-5
