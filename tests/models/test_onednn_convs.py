"""The CPU's oneDNN convolutions (``VAE.cpu_convs = "onednn"``, the default): the programs really
run oneDNN's convolution (its custom call in the compiled HLO), each conv equals the nine-tap
matmul's to float32 rounding, a conv bound by its kernel stays on the im2col path, and a whole
decode equals the nine-tap path's (``"matmul"``), and XLA cannot serialize a program that calls
oneDNN (what keeps such programs out of ``--compile-cache``). Controls: compiled without the
compiler options, the same program has no oneDNN call (and serializes); a perturbed kernel is
caught by the same tolerance."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import serialize_executable

from tests.helpers.ltx_reference import LTX095
from vaeserve import models
from vaeserve.models.conv import (
    IM2COL_MIN_KERNEL_BYTES,
    causal_conv3x3x3,
    compiler_options_for,
    conv2d_frames,
    downsample2x_causal_conv3x3x3,
    downsample2x_conv2d_frames,
)

ONEDNN_CALL = "__onednn$convolution"
RNG = np.random.default_rng(0)


def _normal(*shape: int, scale: float = 1.0) -> jax.Array:
    return jnp.asarray(scale * RNG.standard_normal(shape), jnp.float32)


ARGS = (_normal(1, 2, 10, 12, 8), _normal(1, 3, 10, 12, 8), _normal(3, 3, 3, 8, 6, scale=0.1), _normal(6))
CONVS = {  # each of (past, padded frames (B, T, H+2, W+2, C), a 3x3x3 kernel, bias) and onednn
    "causal": lambda p, x, k, b, onednn: causal_conv3x3x3(p, x, k, b, native=False, onednn=onednn),
    "causal, clip start": lambda p, x, k, b, onednn: causal_conv3x3x3(None, x, k, b, start="replicate",
                                                                      native=False, onednn=onednn),
    "2d": lambda p, x, k, b, onednn: conv2d_frames(x, k[0], b, native=False, onednn=onednn),
    "downsample 2d": lambda p, x, k, b, onednn: downsample2x_conv2d_frames(x[:, :, 1:, 1:], k[0], b, native=False,
                                                                           onednn=onednn),
    "downsample causal": lambda p, x, k, b, onednn: downsample2x_causal_conv3x3x3(p, x, k, b, time_stride=2,
                                                                                  native=False, onednn=onednn),
}


def _program_text(vae: models.VAE, key) -> str:
    program = vae.programs.peek(key)
    assert program is not None
    return program.as_text() or ""


def _compiled(fn, options: dict, *args: jax.Array) -> jax.stages.Compiled:
    """``fn`` compiled for ``args`` (arguments, not constants: XLA would fold a conv of constants)."""
    return jax.jit(fn, compiler_options=options).lower(*args).compile()


@pytest.mark.parametrize("name", CONVS)
def test_each_conv_runs_as_onednns_and_equals_the_nine_tap_matmul(name):
    conv = CONVS[name]
    onednn = _compiled(lambda *a: conv(*a, onednn=True), compiler_options_for("cpu", "onednn"), *ARGS)
    assert ONEDNN_CALL in (onednn.as_text() or "")  # (at larger sizes XLA may pick its own for a 2-D conv)
    expected = np.asarray(jax.jit(lambda *a: conv(*a, onednn=False))(*ARGS))  # the nine-tap matmuls
    got = np.asarray(onednn(*ARGS))
    scale = np.abs(expected).max()
    assert got.shape == expected.shape and np.abs(got - expected).max() <= 1e-6 * scale
    # Controls: compiled without the options the same program calls XLA's own convolution (the
    # same values); a kernel off by one part in a thousand is caught by the same tolerance.
    plain = _compiled(lambda *a: conv(*a, onednn=True), {}, *ARGS)
    assert ONEDNN_CALL not in (plain.as_text() or "")
    assert np.abs(np.asarray(plain(*ARGS)) - expected).max() <= 1e-6 * scale
    past, x, kernel, bias = ARGS
    off = np.asarray(jax.jit(lambda *a: conv(*a, onednn=False))(past, x, kernel * 1.001, bias))
    assert np.abs(off - expected).max() > 1e-6 * scale
    assert compiler_options_for("cpu", "matmul") == compiler_options_for("tpu", "onednn") == {}


def test_xla_cannot_serialize_a_program_that_calls_onednn():
    """What the start-up's note on ``--compile-cache`` rests on (``service.engine.startup``): JAX's
    persistent cache serializes every program it keeps, and XLA:CPU fails on oneDNN's calls (a
    ``std::bad_alloc``). A JAX that can should make this test fail, and the note go."""
    conv = CONVS["causal"]
    onednn = _compiled(lambda *a: conv(*a, onednn=True), compiler_options_for("cpu", "onednn"), *ARGS)
    with pytest.raises(MemoryError, match="bad_alloc"):
        serialize_executable.serialize(onednn)
    plain = _compiled(lambda *a: conv(*a, onednn=True), {}, *ARGS)  # control: XLA's own conv serializes
    payload, in_tree, out_tree = serialize_executable.serialize(plain)
    back = serialize_executable.deserialize_and_load(payload, in_tree, out_tree,
                                                     execution_devices=plain.runtime_executable().local_devices())
    np.testing.assert_array_equal(np.asarray(back(*ARGS)), np.asarray(plain(*ARGS)))


def test_a_conv_bound_by_its_kernel_stays_on_the_im2col_path():
    """oneDNN would reorder the kernel into its layout on every call (at 1024 channels, 113 MB)."""
    channels = 128  # 3·3·3·128·128·4 bytes = 1.8 MB per (3,3,3) kernel; 4 MB needs more
    cout = 2 * IM2COL_MIN_KERNEL_BYTES // (27 * channels * 4)
    x, k = _normal(1, 1, 4, 4, channels), _normal(3, 3, 3, channels, cout, scale=0.01)
    past, bias = _normal(1, 2, 4, 4, channels), _normal(cout)
    args = (past, x, k, bias)
    compiled = _compiled(lambda *a: causal_conv3x3x3(*a, native=False, onednn=True),
                         compiler_options_for("cpu", "onednn"), *args)
    assert ONEDNN_CALL not in (compiled.as_text() or "")
    expected = np.asarray(jax.jit(lambda *a: causal_conv3x3x3(*a, native=False))(*args))
    assert np.abs(np.asarray(compiled(*args)) - expected).max() <= 1e-6 * np.abs(expected).max()


@pytest.mark.parametrize("config, shape, conditions", [
    (models.WanVAEConfig(base_dim=8, num_res_blocks=1), (1, 16, 3, 8, 8), {}),
    (LTX095, (1, 8, 3, 4, 4), {"timestep": 0.05, "noise_scale": 0.0, "seed": 0}),
], ids=["wan2.1", "ltx-video"])
def test_a_decode_with_onednn_convs_equals_the_nine_tap_paths(config, shape, conditions):
    latents = _normal(*shape)
    nine_tap = models.init_vae(config, encoder=False)
    nine_tap.cpu_convs = "matmul"
    onednn = models.init_vae(config, encoder=False)
    assert onednn.cpu_convs == "onednn"  # the default
    expected = np.asarray(nine_tap.decode(latents, **conditions))
    got = np.asarray(onednn.decode(latents, **conditions))
    assert len(onednn.programs) >= 1 and all(ONEDNN_CALL in _program_text(onednn, key) for key in onednn.programs.keys())
    assert not any(ONEDNN_CALL in _program_text(nine_tap, key) for key in nine_tap.programs.keys())
    assert np.abs(got - expected).max() <= 1e-5
    # Control: the nine-tap path with one kernel scaled by 1.001 (its compiled program, other
    # weights) is caught by the same tolerance.
    kernel_path = next(p for p, x in jax.tree_util.tree_leaves_with_path(nine_tap.state) if x.ndim == 5)
    nine_tap.state = jax.tree_util.tree_map_with_path(lambda p, x: x * 1.001 if p == kernel_path else x,
                                                      nine_tap.state)
    assert np.abs(np.asarray(nine_tap.decode(latents, **conditions)) - expected).max() > 1e-5
    with pytest.raises(ValueError, match="before the first compile"):
        onednn.cpu_convs = "matmul"
    with pytest.raises(ValueError, match="one of"):
        models.init_vae(config, encoder=False).cpu_convs = "eigen"
